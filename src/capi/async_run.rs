//! C API: asynchronous runs on the host's stream, their wait, and streams gkrt makes for the
//! host.

use super::boundary::guard;
use super::handles;
use super::types::*;
use crate::runtime::{lock_for_call, Error};
use std::ffi::c_void;

/// Queues one run of a finalized graph of this runtime and returns without waiting for it. The
/// run starts after the work queued so far on `stream` (a native stream: `CUstream` on CUDA; on
/// the host backend a stream from `gkrt_stream_create` or another token gkrt handed out; NULL:
/// gkrt's own compute stream), and work queued on `stream` after this call runs after the run:
/// the host orders its later work on that stream, or waits with `gkrt_graph_wait`. gkrt runs the
/// graph on its compute stream, joined to `stream` by events, so transient buffers go back to
/// the pool in stream order, never before the device is done with them. Two asynchronous runs of
/// one graph in flight are ordered (run in the order queued, whatever their streams); a
/// synchronous run, a tensor write or read, an unbind or the graph's release waits for them first.
/// Errors found while queueing (as for `gkrt_runtime_run`) are returned here, after the queued
/// part has drained; a failure on the device (a kernel fault, a host callback returning
/// non-zero on the host backend) is returned by `gkrt_graph_wait`, or by the next call that waits
/// for the compute stream (a synchronous run, a tensor write or read, `gkrt_runtime_synchronize`).
/// A graph that swaps (its working set exceeds the memory limit) runs only synchronously:
/// GKRT_STATUS_INVALID_STATE. GKRT_STATUS_INVALID_ARGUMENT for a graph of another runtime or a
/// stream the host backend does not know. The graph is locked for the call; `stream` must stay
/// valid until the run has finished.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_runtime_run_async(
    runtime: *mut gkrt_runtime,
    graph: *mut gkrt_graph,
    stream: *mut c_void,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        let g = handles::graph(graph as usize)?;
        let mut g = lock_for_call(&g, "graph")?;
        if g.runtime().serial() != rt.serial() {
            return Err(Error::InvalidArgument(
                "the graph belongs to another runtime".into(),
            ));
        }
        g.run_async(stream)
    })
}

/// Waits until the graph's asynchronous runs (and whatever gkrt queued before them on its
/// compute stream) have finished, and returns a failure the device raised in them
/// (GKRT_STATUS_CALLBACK_FAILED for a host callback, GKRT_STATUS_DEVICE for a device error).
/// Returns at once after a synchronous run. GKRT_STATUS_INVALID_STATE for a graph that was never
/// run; GKRT_STATUS_INVALID_ARGUMENT for a graph of another runtime.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_graph_wait(
    runtime: *mut gkrt_runtime,
    graph: *mut gkrt_graph,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        let g = handles::graph(graph as usize)?;
        let mut g = lock_for_call(&g, "graph")?;
        if g.runtime().serial() != rt.serial() {
            return Err(Error::InvalidArgument(
                "the graph belongs to another runtime".into(),
            ));
        }
        g.wait()
    })
}

/// Makes a stream on the runtime's device: `*out` receives its native handle (a `CUstream` on
/// CUDA, a token on the host backend) for `gkrt_runtime_run_async`, `gkrt_launch_kernel`,
/// `gkrt_malloc` and the rest. It lives until the runtime is released (gkrt destroys it then).
/// GKRT_STATUS_INVALID_ARGUMENT for a NULL `out`. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_stream_create(
    runtime: *mut gkrt_runtime,
    out: *mut *mut c_void,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        if out.is_null() {
            return Err(Error::InvalidArgument("out (void **) is NULL".into()));
        }
        let stream = rt.create_stream()?;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { *out = stream };
        Ok(())
    })
}

/// Blocks until the work queued on `stream` (NULL: gkrt's compute stream) has run, and returns
/// the first failure raised there since the last wait. GKRT_STATUS_INVALID_ARGUMENT for a stream
/// the host backend does not know. Thread-safe.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_stream_synchronize(
    runtime: *mut gkrt_runtime,
    stream: *mut c_void,
) -> gkrt_status {
    guard(|| handles::runtime(runtime as usize)?.synchronize_stream(stream))
}
