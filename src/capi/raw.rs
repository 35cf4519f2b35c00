//! C API: raw pool use — `gkrt_malloc` / `gkrt_free` on a stream, and the entry points PyTorch's
//! pluggable allocator loads from a shared library (`gkrt_torch_alloc` / `gkrt_torch_free`).
//!
//! The PyTorch entry points carry no runtime handle, so they use a process-wide runtime per
//! device ordinal, created on first use from the environment (`runtime/process.rs`; the
//! variables: `runtime/env.rs`).

use super::boundary::guard;
use super::handles::{self, Object};
use super::types::*;
use crate::runtime::{process_runtime, Error};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Allocates `size` bytes of device memory from the runtime's pool, for use in stream order on
/// `stream`, like `cuMemAllocAsync`: the native stream handle (`CUstream` / `cudaStream_t` on
/// CUDA, where NULL is the legacy default stream; on the host backend NULL is its default stream,
/// and the only other streams it knows are the tokens gkrt hands out: a host callback's
/// `args->stream`, the runtime's compute stream). The memory counts against the runtime's memory
/// limit and shows in `gkrt_runtime_stats`. On success `*out` receives the address (aligned to
/// 256 bytes), which the caller owns and returns with `gkrt_free`; on failure `*out` is left
/// untouched: GKRT_STATUS_INVALID_ARGUMENT for a NULL or unknown runtime, a NULL `out`, a size of
/// 0 or a stream the host backend does not know (on CUDA the stream must be a valid `CUstream`
/// or NULL: like the driver, gkrt cannot tell a made-up handle from a real one); GKRT_STATUS_OUT_OF_MEMORY (with the sizes and the
/// limit in the message) when the limit or the device is exhausted. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_malloc(
    runtime: *mut gkrt_runtime,
    size: usize,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> gkrt_status {
    guard(|| {
        // The common case (the handle names the runtime's own home, nobody holds it) without
        // the pinned handle's `Result`; every other case, errors included, below.
        if !out.is_null() {
            if let Some(mut pin) = handles::pin_own_home(runtime as usize) {
                let (r, st) = pin.parts();
                let p = r.raw_alloc_in(st, size as u64, stream)?;
                // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
                unsafe { *out = p as *mut c_void };
                return Ok(());
            }
        }
        let mut rt = handles::pin_runtime(runtime as usize)?;
        if out.is_null() {
            return Err(Error::InvalidArgument("out (void **) is NULL".into()));
        }
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        let publish = |p: u64| unsafe { *out = p as *mut c_void };
        // The handle's own home: its pin locked the state too.
        if let Some((r, st)) = rt.with_state() {
            publish(r.raw_alloc_in(st, size as u64, stream)?);
            return Ok(());
        }
        if let Some(mut st) = rt.try_lock_for_call() {
            publish(rt.raw_alloc_in(&mut st, size as u64, stream)?);
            return Ok(());
        }
        // Busy (a graph run, another thread): wait without pinning the handle's slot.
        publish(rt.into_owned().raw_alloc(size as u64, stream)?);
        Ok(())
    })
}

/// Returns memory from `gkrt_malloc` to the runtime's pool, in stream order on `stream` like
/// `cuMemFreeAsync`: work queued on `stream` before this call may still use it; freed on the
/// stream it was allocated on, the block is reusable by the next allocation there at once;
/// freed on another stream, the allocation stream first waits (on the device) for the work
/// queued on `stream`; either way it also waits for the work queued so far on each stream named
/// with `gkrt_record_stream`. A NULL `ptr` is a no-op. GKRT_STATUS_INVALID_ARGUMENT (the memory
/// stays as it was) for a NULL or unknown runtime, a pointer that is not the start of a live
/// `gkrt_malloc` block of this runtime (never allocated, freed already, or a graph's tensor), or
/// an unknown stream; the device's status when the wait for a named stream cannot be set up (one
/// destroyed since, say): the block stays live, the names are dropped, and a second free frees
/// it. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_free(
    runtime: *mut gkrt_runtime,
    ptr: *mut c_void,
    stream: *mut c_void,
) -> gkrt_status {
    guard(|| {
        // As in `gkrt_malloc`: the common case first, everything else below.
        if !ptr.is_null() {
            if let Some(mut pin) = handles::pin_own_home(runtime as usize) {
                let (r, st) = pin.parts();
                return r.raw_free_in(st, ptr as u64, stream, None);
            }
        }
        let mut rt = handles::pin_runtime(runtime as usize)?;
        if ptr.is_null() {
            return Ok(());
        }
        if let Some((r, st)) = rt.with_state() {
            return r.raw_free_in(st, ptr as u64, stream, None);
        }
        if let Some(mut st) = rt.try_lock_for_call() {
            return rt.raw_free_in(&mut st, ptr as u64, stream, None);
        }
        rt.into_owned().raw_free(ptr as u64, stream, None)
    })
}

/// Names `stream` (the native stream handle; NULL: the default stream) as a user of the block
/// at `ptr` from `gkrt_malloc` (or `gkrt_torch_alloc`, through `gkrt_torch_runtime`'s handle)
/// besides the stream it was allocated on, as PyTorch's `Tensor.record_stream` does for its own
/// allocator: when the block is freed, on whichever stream, its allocation stream first waits
/// (on the device) for the work queued on `stream` by then, so no later allocation there can
/// overtake that work. Naming the allocation stream itself, or a stream twice, changes nothing.
/// GKRT_STATUS_INVALID_ARGUMENT (nothing changed) for a NULL or unknown runtime, a pointer that
/// is not the start of a live `gkrt_malloc` block of this runtime, or a stream the host backend
/// does not know (on CUDA the stream must be a valid `CUstream` or NULL, as for `gkrt_malloc`).
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_record_stream(
    runtime: *mut gkrt_runtime,
    ptr: *mut c_void,
    stream: *mut c_void,
) -> gkrt_status {
    guard(|| handles::runtime(runtime as usize)?.raw_record_stream(ptr as u64, stream))
}

/// PyTorch's pluggable-allocator `alloc`: `size` bytes on `device` for use on `stream`
/// (`cudaStream_t`), from the process-wide runtime of that device (its `GKRT_*` environment
/// variables, such as `GKRT_MEMORY_LIMIT` and `GKRT_LOG_LEVEL`, are listed in
/// `src/runtime/env.rs`). Returns NULL for a size of 0, and on failure — then the reason
/// is logged to stderr and kept as the thread's last error (`gkrt_last_error_message`).
/// Load it with `torch.cuda.memory.CUDAPluggableAllocator(path_to_libgkrt, "gkrt_torch_alloc",
/// "gkrt_torch_free")`. Thread-safe.
#[no_mangle]
pub extern "C" fn gkrt_torch_alloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    let mut out = std::ptr::null_mut();
    let status = guard(|| {
        let rt = process_runtime(device)?;
        out = rt.raw_alloc(size as u64, stream)? as *mut c_void;
        Ok(())
    });
    if status != gkrt_status::GKRT_STATUS_OK {
        report("gkrt_torch_alloc");
    }
    out
}

/// PyTorch's pluggable-allocator `free`: returns `ptr` (from `gkrt_torch_alloc` with the same
/// `size` and `device`) in stream order on `stream`. NULL is a no-op. A pointer gkrt does not
/// know, or a size that differs from the allocation's, is logged to stderr (and kept as the
/// thread's last error); a known pointer is freed even when the size disagrees. Thread-safe.
#[no_mangle]
pub extern "C" fn gkrt_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    if ptr.is_null() {
        return;
    }
    let status = guard(|| process_runtime(device)?.raw_free(ptr as u64, stream, Some(size as u64)));
    if status != gkrt_status::GKRT_STATUS_OK {
        report("gkrt_torch_free");
    }
}

fn report(what: &str) {
    let mut buf = vec![0u8; 1024];
    // SAFETY: buf has buf.len() writable bytes.
    let n = unsafe { super::boundary::gkrt_last_error_message(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n.min(buf.len() - 1));
    let msg = String::from_utf8_lossy(&buf);
    // Heard even with logging off: PyTorch sees only a null pointer.
    let text = format!("{what} failed: {msg}");
    crate::runtime::log_always(log::Level::Error, &text);
}

/// A new handle to the process-wide runtime of `device` that the PyTorch entry points use
/// (created now if needed), so its statistics can be read with `gkrt_runtime_stats`, its peaks
/// reset with `gkrt_runtime_reset_peak_stats`, and so on. The caller owns the handle and releases
/// it with `gkrt_runtime_release`; the runtime itself lives until the process ends. `*out` is
/// written only on success; GKRT_STATUS_NO_DEVICE when the runtime cannot be created (the
/// message says why), GKRT_STATUS_INVALID_ARGUMENT for a NULL `out` or a negative device.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_torch_runtime(
    device: c_int,
    out: *mut *mut gkrt_runtime,
) -> gkrt_status {
    guard(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument(
                "out (gkrt_runtime **) is NULL".into(),
            ));
        }
        let rt = process_runtime(device)?;
        let handle = handles::register(Object::Runtime(Arc::clone(rt)))? as *mut gkrt_runtime;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { *out = handle };
        Ok(())
    })
}

/// Returns every free block the pool caches to the device: plain segments that are wholly free
/// and free pages of virtual ranges (waiting for the device to be idle first). `*released`
/// (may be NULL) receives the bytes given back. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_runtime_release_cached(
    runtime: *mut gkrt_runtime,
    released: *mut u64,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        let n = rt.release_cached()?;
        // SAFETY: the C contract: `released` is NULL or valid for a write.
        if let Some(out) = unsafe { released.as_mut() } {
            *out = n;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::pool::tests::replay::{load_trace, Ev};

    /// The PyTorch entry points on the host backend: NULL and zero sizes, round trips, unknown
    /// pointers reported, statistics through a handle to the process-wide runtime.
    #[test]
    fn torch_entry_points_round_trip_on_the_process_runtime() {
        // Device 63 is used by no other test; GKRT_DEVICE is read when it is created.
        std::env::set_var("GKRT_DEVICE", "host");
        let dev = 63;
        assert!(gkrt_torch_alloc(0, dev, std::ptr::null_mut()).is_null());
        gkrt_torch_free(std::ptr::null_mut(), 0, dev, std::ptr::null_mut());
        let p = gkrt_torch_alloc(1000, dev, std::ptr::null_mut());
        assert!(!p.is_null() && (p as usize).is_multiple_of(256));
        // This runtime's pool may wait for the device to move pages (`pool_recycle_waits`).
        let waits = process_runtime(dev)
            .unwrap()
            .lock()
            .pool
            .config()
            .recycle_waits;
        assert_eq!(
            waits,
            std::env::var("GKRT_POOL_RECYCLE_WAIT").map_or(true, |v| v != "0")
        );
        let q = gkrt_torch_alloc(5 << 20, dev, std::ptr::null_mut());
        assert!(!q.is_null());
        let mut rt = std::ptr::null_mut();
        assert_eq!(
            unsafe { gkrt_torch_runtime(dev, &mut rt) },
            gkrt_status::GKRT_STATUS_OK
        );
        let mut s = gkrt_stats::default();
        assert_eq!(
            unsafe { super::super::gkrt_runtime_stats(rt, &mut s) },
            gkrt_status::GKRT_STATUS_OK
        );
        assert_eq!(s.allocated_bytes, 1024 + (5 << 20));
        gkrt_torch_free(p, 1000, dev, std::ptr::null_mut());
        gkrt_torch_free(q, 5 << 20, dev, std::ptr::null_mut());
        // A second free is reported, not a crash.
        gkrt_torch_free(q, 5 << 20, dev, std::ptr::null_mut());
        let mut msg = [0u8; 256];
        let n = unsafe { super::super::gkrt_last_error_message(msg.as_mut_ptr().cast(), 256) };
        assert!(String::from_utf8_lossy(&msg[..n.min(255)]).contains("already freed"));
        assert_eq!(
            unsafe { super::super::gkrt_runtime_stats(rt, &mut s) },
            gkrt_status::GKRT_STATUS_OK
        );
        assert_eq!(s.allocated_bytes, 0);
        let mut released = 0;
        assert_eq!(
            unsafe { gkrt_runtime_release_cached(rt, &mut released) },
            gkrt_status::GKRT_STATUS_OK
        );
        assert!(released > 0);
        assert_eq!(
            super::super::gkrt_runtime_release(rt),
            gkrt_status::GKRT_STATUS_OK
        );
        // The process-wide runtime outlives the handle.
        let r = gkrt_torch_alloc(64, dev, std::ptr::null_mut());
        assert!(!r.is_null());
        gkrt_torch_free(r, 64, dev, std::ptr::null_mut());
        assert!(gkrt_torch_alloc(64, -1, std::ptr::null_mut()).is_null());
    }

    /// The C path's own instructions, for callgrind (ignored; BENCHMARKS.md §3, session 14): the
    /// trace `GKRT_TRACE` replayed `GKRT_PASSES` times (default 2) through `gkrt_malloc` /
    /// `gkrt_free` on a host runtime, every status checked. The host backend's pool grows by
    /// plain segments, so what this measures beyond the host replay (`replay_traces`) is the
    /// entry points' work: the handle, the state lock, the stream, the results.
    #[test]
    #[ignore]
    fn capi_replay_for_callgrind() {
        let path = std::env::var("GKRT_TRACE").expect("GKRT_TRACE names a trace");
        let passes: usize = std::env::var("GKRT_PASSES").map_or(2, |v| v.parse().unwrap());
        // Ids made dense by the host replay's reader; the ones never freed are freed after each pass.
        let (evs, unfreed) = load_trace(&path);
        let mut cfg = std::mem::MaybeUninit::<gkrt_config>::zeroed();
        // SAFETY: `cfg` is valid for a write of the struct.
        let mut cfg = unsafe {
            assert_eq!(
                super::super::gkrt_config_init(cfg.as_mut_ptr()),
                gkrt_status::GKRT_STATUS_OK
            );
            cfg.assume_init()
        };
        cfg.device = GKRT_DEVICE_HOST;
        let mut rt = std::ptr::null_mut();
        // SAFETY: valid config and out-pointer; every pointer freed below came from gkrt_malloc.
        unsafe {
            assert_eq!(
                super::super::gkrt_runtime_create(&cfg, &mut rt),
                gkrt_status::GKRT_STATUS_OK
            );
            let mut ptrs = vec![std::ptr::null_mut(); evs.len()];
            let null = std::ptr::null_mut();
            for _ in 0..passes {
                for e in &evs {
                    let st = match *e {
                        Ev::A(i, bytes, _) => {
                            gkrt_malloc(rt, bytes as usize, null, &mut ptrs[i as usize])
                        }
                        Ev::F(i) => gkrt_free(rt, ptrs[i as usize], null),
                    };
                    assert_eq!(st, gkrt_status::GKRT_STATUS_OK);
                }
                for &i in &unfreed {
                    assert_eq!(
                        gkrt_free(rt, ptrs[i as usize], null),
                        gkrt_status::GKRT_STATUS_OK
                    );
                }
            }
        }
        assert_eq!(
            super::super::gkrt_runtime_release(rt),
            gkrt_status::GKRT_STATUS_OK
        );
    }
}
