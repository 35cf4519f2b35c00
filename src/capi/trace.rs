//! C API: traces of runs in Chrome's trace-event JSON.

use super::boundary::{c_str, guard};
use super::handles;
use super::types::*;
use std::ffi::c_char;

/// Starts collecting a trace of the runtime's runs: from now on every run is timed with device
/// events (one at each node boundary on the compute stream — a node starts where the previous
/// one ended unless a wait came between — and a pair around each swap copy) and, when it ends,
/// adds its times to the trace. A trace already being collected is dropped and a new one
/// started. Tracing costs the events (taken from pools the runtime keeps, created once), a few
/// numbers recorded per node, and, per run, reading each event once after the run has finished;
/// names and JSON are made by `gkrt_runtime_trace_end`. The events are never waited on: tracing
/// adds no dependency between streams. Runs are not timed while no trace is collected.
/// Thread-safe (takes the runtime's lock).
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_runtime_trace_begin(runtime: *mut gkrt_runtime) -> gkrt_status {
    guard(|| handles::runtime(runtime as usize)?.trace_begin())
}

/// Stops collecting and writes the trace to the file `path` (created or truncated) as Chrome's
/// trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open: one track per
/// stream ("compute stream", "copy in", "copy out", and "communication", empty until
/// collectives exist), a slice per node (named as messages name it, with its input and output
/// bytes), per swap copy (the tensor and its bytes) and per recompute; counter tracks
/// "allocated bytes", "reserved bytes", "pinned bytes" and "pending free bytes" (blocks freed
/// behind a copy out, not yet reusable), sampled before each node and at a run's end where they
/// changed; instants for fallback evictions and failed runs ("out of memory" with the message);
/// per run a metadata event "gkrt_run": the host call's interval ("began", "ended"), the tensors
/// on the device at its start ("resident") and every change after ("changes": [time, tensor,
/// 1 on / 0 off]: allocation, free, a copy in's start, a copy out's end), and per graph one
/// "gkrt_tensors" naming its tensors. Times are µs since `gkrt_runtime_trace_begin`; device
/// times come from events, each run placed at the host time it began. A replayed planned graph
/// is one slice "graph replay". No trace being
/// collected is GKRT_STATUS_INVALID_STATE; `path` must be UTF-8; a file that cannot be written
/// is GKRT_STATUS_INVALID_ARGUMENT naming it (the trace is then dropped). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_runtime_trace_end(
    runtime: *mut gkrt_runtime,
    path: *const c_char,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        // SAFETY: the C contract: a non-NULL `path` is a NUL-terminated string.
        let path = unsafe { c_str(path, "path") }?;
        rt.trace_end(std::path::Path::new(path))
    })
}
