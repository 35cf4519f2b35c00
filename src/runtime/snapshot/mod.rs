//! Memory snapshots of a runtime in the format of PyTorch's (`torch.cuda.memory._snapshot()`,
//! the pickle `_dump_snapshot` writes), so `torch.cuda._memory_viz` and PyTorch's memory viewer
//! read them unchanged: `{"segments": [...], "device_traces": [[...]]}`.
//!
//! - `labels.rs`: who each block belongs to (tensor and node, workspace, arena, `gkrt_malloc`),
//!   as the blocks' and events' frames.
//! - `pickle.rs`: the pickle writer.
//! - here: the history switch and the snapshot itself.
//!
//! The snapshot covers the device pool (the pinned pool holds host memory and is not shown).
//! Segments are plain segments and virtual ranges (reported up to the end of what they use,
//! `is_expandable` true); block states are `active_allocated`, `active_awaiting_free` (freed,
//! waiting for a copy's event) and `inactive`. `device_traces` has one list per device ordinal
//! up to the runtime's, the runtime's holding the recorded history (empty when history is
//! off): PyTorch's actions (`alloc`, `free_requested`, `free_completed`, `segment_alloc`,
//! `segment_free`, `segment_map`, `segment_unmap`, `oom`) and gkrt's `swap_out` / `swap_in`.
//! An `oom` entry's `device_free` is 0: the pool does not ask the device at that moment.

mod labels;
mod pickle;

pub(crate) use labels::{Labels, LABEL_RAW};

use super::{Error, Result, Runtime, State};
use crate::memory::pool::ViewState;
use pickle::Value;

/// Most events a history may hold (40 bytes each: 640 MiB).
pub(crate) const MAX_HISTORY_EVENTS: u64 = 1 << 24;

impl Runtime {
    /// Starts recording the pool's events into a new ring of `capacity` events (the last
    /// `capacity` are kept), or stops with 0. Either way what was recorded is dropped.
    pub fn record_history(&self, capacity: u64) -> Result<()> {
        if capacity > MAX_HISTORY_EVENTS {
            return Err(Error::InvalidArgument(format!(
                "history capacity {capacity} events is more than {MAX_HISTORY_EVENTS} allowed"
            )));
        }
        self.lock_for_call()?.pool.record_history(capacity as usize);
        Ok(())
    }

    /// The snapshot as a pickle.
    pub fn snapshot_pickle(&self) -> Result<Vec<u8>> {
        let st = self.lock_for_call()?;
        Ok(pickle::to_bytes(&snapshot(
            &st,
            self.config().device_ordinal,
        )))
    }

    /// Writes the snapshot's pickle to `path` (created or truncated).
    pub fn dump_snapshot(&self, path: &std::path::Path) -> Result<()> {
        let bytes = self.snapshot_pickle()?;
        std::fs::write(path, bytes).map_err(|e| {
            Error::InvalidArgument(format!(
                "writing the memory snapshot to '{}': {e}",
                path.display()
            ))
        })
    }
}

fn frames(labels: &Labels, label: u32) -> Value {
    Value::List(
        labels
            .frames(label)
            .into_iter()
            .map(|f| {
                Value::Dict(vec![
                    ("filename", f.filename.into()),
                    ("line", f.line.into()),
                    ("name", f.name.into()),
                ])
            })
            .collect(),
    )
}

fn snapshot(st: &State, device: u32) -> Value {
    let labels = &st.labels;
    let segments = st
        .pool
        .segments_view()
        .into_iter()
        .map(|seg| {
            let sum = |f: &dyn Fn(&crate::memory::pool::BlockView) -> u64| -> u64 {
                seg.blocks.iter().map(f).sum()
            };
            let allocated = sum(&|b| (b.state == ViewState::Allocated) as u64 * b.size);
            let active = sum(&|b| (b.state != ViewState::Free) as u64 * b.size);
            let requested = sum(&|b| (b.state != ViewState::Free) as u64 * b.requested);
            let blocks = seg
                .blocks
                .iter()
                .map(|b| {
                    let state = match b.state {
                        ViewState::Allocated => "active_allocated",
                        ViewState::AwaitingFree => "active_awaiting_free",
                        ViewState::Free => "inactive",
                    };
                    let frames = match b.state {
                        ViewState::Free => Value::List(vec![]),
                        _ => frames(labels, b.label),
                    };
                    Value::Dict(vec![
                        ("address", b.addr.into()),
                        ("size", b.size.into()),
                        ("requested_size", b.requested.into()),
                        ("state", state.into()),
                        ("frames", frames),
                    ])
                })
                .collect();
            Value::Dict(vec![
                ("device", device.into()),
                ("address", seg.addr.into()),
                ("total_size", seg.size.into()),
                ("allocated_size", allocated.into()),
                ("active_size", active.into()),
                ("requested_size", requested.into()),
                ("stream", seg.stream.into()),
                (
                    "segment_type",
                    if seg.small { "small" } else { "large" }.into(),
                ),
                (
                    "segment_pool_id",
                    Value::Tuple(vec![Value::Int(0), Value::Int(0)]),
                ),
                ("is_expandable", seg.expandable.into()),
                ("frames", Value::List(vec![])),
                ("blocks", Value::List(blocks)),
            ])
        })
        .collect();
    let trace = match st.pool.history() {
        None => vec![],
        Some(h) => h
            .events()
            .map(|e| {
                let mut entry = vec![
                    ("action", e.action.name().into()),
                    ("addr", e.addr.into()),
                    ("size", e.size.into()),
                    ("stream", e.stream.into()),
                    ("time_us", (h.nanos(e.ticks) / 1000).into()),
                    ("frames", frames(labels, e.label)),
                ];
                if e.action == crate::memory::history::Action::Oom {
                    entry.push(("device_free", Value::Int(0)));
                }
                Value::Dict(entry)
            })
            .collect(),
    };
    let mut device_traces: Vec<Value> = (0..device).map(|_| Value::List(vec![])).collect();
    device_traces.push(Value::List(trace));
    Value::Dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(device_traces)),
    ])
}
