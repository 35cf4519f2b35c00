//! C API: the device data queue — creation, pushes from host threads, close, statistics, and
//! the graph's queue pop.

use super::boundary::{c_slice, guard};
use super::handles::{self, Object};
use super::types::*;
use crate::runtime::{lock_for_call, DeviceQueue, Error};
use std::ffi::{c_char, c_void, CStr};
use std::time::Duration;

/// Creates a device data queue on `runtime`: `capacity` slots (1 .. 65536), each one batch of
/// `num_buffers` device buffers of `sizes[i]` bytes, taken from the runtime's pool now (they
/// count against its memory limit while the queue lives). Host threads fill it with
/// `gkrt_queue_push`; graphs empty it (`gkrt_graph_add_queue_pop`), waiting up to
/// `pop_timeout_ms` for a batch. `name` (may be NULL) appears in messages. `*out` receives a
/// handle the caller releases with `gkrt_queue_release`; the queue keeps the runtime alive.
/// GKRT_STATUS_INVALID_ARGUMENT for a capacity or size out of range, or NULL arrays;
/// GKRT_STATUS_OUT_OF_MEMORY when the slots do not fit. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_queue_create(
    runtime: *mut gkrt_runtime,
    name: *const c_char,
    capacity: usize,
    sizes: *const u64,
    num_buffers: usize,
    pop_timeout_ms: u32,
    out: *mut *mut gkrt_queue,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        if out.is_null() {
            return Err(Error::InvalidArgument("out (gkrt_queue **) is NULL".into()));
        }
        // SAFETY: the C contract: `sizes` holds `num_buffers` elements (or is NULL when 0).
        let sizes = unsafe { c_slice(sizes, num_buffers, "sizes")? };
        let name = if name.is_null() {
            "unnamed".to_string()
        } else {
            // SAFETY: the C contract: a non-NULL `name` is a NUL-terminated string.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        let q = DeviceQueue::new(
            rt,
            &name,
            capacity,
            sizes,
            Duration::from_millis(pop_timeout_ms as u64),
        )?;
        let handle = handles::register(Object::Queue(q))? as *mut gkrt_queue;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { *out = handle };
        Ok(())
    })
}

/// Releases a queue handle. Graphs that pop from the queue keep it alive until they are
/// released; its device slots and pinned staging go back once the last user is gone. Waiters
/// still blocked keep it alive too: close it first to wake them. NULL is a no-op.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_queue_release(queue: *mut gkrt_queue) -> gkrt_status {
    if queue.is_null() {
        return gkrt_status::GKRT_STATUS_OK;
    }
    guard(|| handles::release(queue as usize, "queue"))
}

/// Pushes one batch: `buffers[i]` points to `sizes[i]` bytes of host memory (the sizes given
/// at creation), `num_buffers` of them. The batch is copied, on the queue's own copy stream,
/// into the next free slot: with `pinned` non-zero the buffers are page-locked host memory
/// (`cuMemHostAlloc`, or any memory on the host backend) copied directly, and this returns when
/// the copy is done; otherwise they are copied into the slot's pinned staging area first and
/// the call returns once the device copy is queued. Either way the caller may reuse its buffers
/// when this returns. Blocks up to `timeout_ms` while the queue is full: then
/// GKRT_STATUS_INVALID_STATE with "timed out" in the message. A closed queue (before or while
/// waiting): GKRT_STATUS_INVALID_STATE with "closed" in the message. GKRT_STATUS_INVALID_ARGUMENT
/// for a wrong number of buffers or a NULL one. Thread-safe; pushes from several threads are
/// taken one at a time, in the order they get the queue.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_queue_push(
    queue: *mut gkrt_queue,
    buffers: *const *const c_void,
    num_buffers: usize,
    pinned: u32,
    timeout_ms: u32,
) -> gkrt_status {
    guard(|| {
        let q = handles::queue(queue as usize)?;
        let sizes = q.sizes();
        // Checked before any slice of the caller's memory exists.
        q.check_push(&vec![0; num_buffers])?;
        // SAFETY: the C contract: `buffers` holds `num_buffers` pointers.
        let ptrs = unsafe { c_slice(buffers, num_buffers, "buffers")? };
        let mut batch: Vec<&[u8]> = Vec::with_capacity(ptrs.len());
        for (i, (&p, &size)) in ptrs.iter().zip(sizes).enumerate() {
            if p.is_null() {
                return Err(Error::InvalidArgument(format!(
                    "queue '{}': buffer {i} of the push is NULL",
                    q.name()
                )));
            }
            // SAFETY: the C contract: buffer i holds the queue's size i bytes.
            batch.push(unsafe { std::slice::from_raw_parts(p as *const u8, size as usize) });
        }
        q.push(
            &batch,
            pinned != 0,
            Duration::from_millis(timeout_ms as u64),
        )
    })
}

/// Closes a queue: later pushes fail; pops take the batches still queued, then fail; every
/// push and pop waiting now wakes (and fails with "closed" in its message, unless a pop finds a
/// batch). Closing twice is fine. Thread-safe.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_queue_close(queue: *mut gkrt_queue) -> gkrt_status {
    guard(|| {
        handles::queue(queue as usize)?.close();
        Ok(())
    })
}

/// The queue's counters: pushes, pops, bytes pushed, and the time each side waited.
/// GKRT_STATUS_INVALID_ARGUMENT for a NULL `out`. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_queue_get_stats(
    queue: *const gkrt_queue,
    out: *mut gkrt_queue_stats,
) -> gkrt_status {
    guard(|| {
        let q = handles::queue(queue as usize)?;
        // SAFETY: the C contract: `out` is NULL or valid for a write.
        let out = unsafe { out.as_mut() }
            .ok_or_else(|| Error::InvalidArgument("out (gkrt_queue_stats *) is NULL".into()))?;
        let s = q.stats();
        *out = gkrt_queue_stats {
            pushes: s.pushes,
            pops: s.pops,
            bytes_pushed: s.bytes_pushed,
            push_wait_ns: s.push_wait_ns,
            pop_wait_ns: s.pop_wait_ns,
        };
        Ok(())
    })
}

/// Makes every run of a finalized graph pop one batch of `queue` into the input or parameter
/// tensors `tensors` (one per buffer of the batch, in order, sizes equal): at the start of each
/// run (`gkrt_runtime_run` or `gkrt_runtime_run_async`) the graph takes the queue's next batch,
/// waiting up to the queue's pop timeout on the host for one to be pushed, and those tensors
/// are bound to the slot's device buffers — the nodes read the batch in place, with no copy.
/// The run waits for the slot's copy on the device, not on the host; once the run is queued the
/// slot is free for the next push, whose copy waits for the run on the device. A run that fails
/// before it is queued leaves its batch at the queue's head; a run that finds the queue empty
/// past the timeout, or closed and empty, fails with GKRT_STATUS_INVALID_STATE ("timed out" /
/// "closed"). Planned graphs replayed as CUDA graphs keep one capture per slot (each made at the
/// slot's first run after the first). Errors, naming the queue or tensor:
/// GKRT_STATUS_INVALID_ARGUMENT for a queue of another runtime, a count or size that differs
/// from the queue's, an intermediate or output, a tensor popped into already;
/// GKRT_STATUS_INVALID_STATE for a graph not finalized or one that swaps (as for binding).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_add_queue_pop(
    graph: *mut gkrt_graph,
    queue: *mut gkrt_queue,
    tensors: *const gkrt_tensor,
    num_tensors: usize,
) -> gkrt_status {
    guard(|| {
        let g = handles::graph(graph as usize)?;
        let q = handles::queue(queue as usize)?;
        // SAFETY: the C contract: `tensors` holds `num_tensors` ids.
        let ids = unsafe { c_slice(tensors, num_tensors, "tensors")? };
        let mut g = lock_for_call(&g, "graph")?;
        g.add_queue_pop(q, ids)
    })
}
