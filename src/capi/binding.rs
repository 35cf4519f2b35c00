//! C API: binding a graph's inputs, parameters and outputs to device memory the host owns.

use super::boundary::guard;
use super::handles;
use super::types::*;
use crate::runtime::{lock_for_call, Error};
use std::ffi::c_void;

/// Binds an input, parameter or output tensor of a finalized graph to `bytes` bytes of device
/// memory at `device_ptr` that the host owns (from `cuMemAlloc`, PyTorch's `data_ptr()`,
/// `gkrt_malloc`, ...; `bytes` at least the tensor's size). Runs then read and write the tensor
/// there, in place: no copy, no pool memory. The host keeps the memory alive while it is bound;
/// gkrt never swaps, moves or frees a bound tensor, and bound tensors are outside the memory
/// budget: they hold no pool memory (so they are not in `gkrt_runtime_stats`' allocated bytes),
/// and the planned arena and the swap plan never place or move them. An input or parameter's
/// contents are the memory's own from the bind on (it counts as written). A block the tensor
/// held in the pool before goes back to it. Call again with another pointer to rebind between
/// runs; `gkrt_graph_write_tensor` / `gkrt_graph_read_tensor` still work and copy into or out of
/// the bound memory. A planned graph replayed as a CUDA graph keeps one capture per set of bound
/// addresses (up to 16): after a rebind to addresses it has not run with, its next run captures
/// again (the cost of an ordinary run plus the capture); rebinding to addresses seen before
/// replays their capture. A rebind while an asynchronous run is in flight applies to later runs:
/// the host keeps the old memory alive until that run has finished (`gkrt_graph_wait`).
/// Errors, each with the tensor named in the message: GKRT_STATUS_INVALID_ARGUMENT for a NULL
/// `device_ptr`, `bytes` smaller than the tensor, an intermediate, or a tensor of another graph;
/// GKRT_STATUS_INVALID_STATE for a graph not finalized yet, or one that swaps (its working set
/// exceeds the memory limit: its swap plan moves persistent tensors, so nothing can be bound).
/// gkrt cannot tell a made-up device address from a real one (the driver cannot either): the
/// pointer is the caller's contract. The graph is locked for the call (calls on one graph from
/// several threads are serialised).
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_graph_bind_tensor(
    graph: *mut gkrt_graph,
    tensor: gkrt_tensor,
    device_ptr: *mut c_void,
    bytes: usize,
) -> gkrt_status {
    guard(|| {
        let g = handles::graph(graph as usize)?;
        let mut g = lock_for_call(&g, "graph")?;
        g.bind(tensor, device_ptr as u64, bytes as u64)
    })
}

/// Unbinds a tensor bound by `gkrt_graph_bind_tensor` (a no-op for one that is not bound).
/// Waits until no work gkrt queued uses the memory, so the host may free it once this
/// returns. The tensor then has no contents: write it, or let a run produce it (into a block
/// of the pool, as if it had never been bound). Errors as for `gkrt_graph_bind_tensor`.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_graph_unbind_tensor(
    graph: *mut gkrt_graph,
    tensor: gkrt_tensor,
) -> gkrt_status {
    guard(|| {
        let g = handles::graph(graph as usize)?;
        let mut g = lock_for_call(&g, "graph")?;
        g.unbind(tensor)
    })
}

/// Whether a tensor is bound: `*out` receives 1 or 0. GKRT_STATUS_INVALID_ARGUMENT for a
/// NULL `out` or a tensor of another graph.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_tensor_is_bound(
    graph: *const gkrt_graph,
    tensor: gkrt_tensor,
    out: *mut u32,
) -> gkrt_status {
    guard(|| {
        let g = handles::graph(graph as usize)?;
        // SAFETY: the C contract: `out` is NULL or valid for a write.
        let out = unsafe { out.as_mut() }
            .ok_or_else(|| Error::InvalidArgument("out (uint32_t *) is NULL".into()))?;
        let g = lock_for_call(&g, "graph")?;
        let t = g.graph.tensor_index(tensor)?;
        *out = g.is_bound(t) as u32;
        Ok(())
    })
}
