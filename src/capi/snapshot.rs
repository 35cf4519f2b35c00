//! C API: memory snapshots in PyTorch's format, and the history they carry.

use super::boundary::{c_str, guard};
use super::handles;
use super::types::*;
use std::ffi::c_char;

/// Records the runtime's pool events — allocations, frees, segments and pages taken and given
/// back, out-of-memory failures, swaps — into a ring of the last `capacity` events, for the
/// `device_traces` of `gkrt_runtime_dump_snapshot`; 0 stops recording. Each call starts an
/// empty ring (what was recorded is dropped). The ring is allocated here, once: recording costs
/// a few stores per event and no allocation, and nothing while it is off (the default).
/// `capacity` above 16,777,216 (2^24, 640 MiB of events) is GKRT_STATUS_INVALID_ARGUMENT.
/// Thread-safe (takes the runtime's lock).
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_runtime_record_history(
    runtime: *mut gkrt_runtime,
    capacity: u64,
) -> gkrt_status {
    guard(|| handles::runtime(runtime as usize)?.record_history(capacity))
}

/// Writes a snapshot of the runtime's device memory to the file `path` (created or truncated),
/// as the pickle PyTorch's `torch.cuda.memory._dump_snapshot` writes, so
/// `torch.cuda._memory_viz` and PyTorch's memory viewer read it: `segments` (each plain segment
/// and virtual range with its blocks in address order; a block's `frames` name the tensor and
/// the node that writes it, a node's workspace, a planned arena, or `gkrt_malloc`) and
/// `device_traces` (the events recorded since `gkrt_runtime_record_history`; empty lists when
/// off). The sum of the `active_allocated` blocks' sizes equals `gkrt_stats.allocated_bytes`.
/// Pinned host memory is not included. `path` must be UTF-8; a file that cannot be written is
/// GKRT_STATUS_INVALID_ARGUMENT naming it. Thread-safe (takes the runtime's lock).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_runtime_dump_snapshot(
    runtime: *mut gkrt_runtime,
    path: *const c_char,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        // SAFETY: the C contract: a non-NULL `path` is a NUL-terminated string.
        let path = unsafe { c_str(path, "path") }?;
        rt.dump_snapshot(std::path::Path::new(path))
    })
}
