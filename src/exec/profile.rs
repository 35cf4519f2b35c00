//! Timing events of a profiled run (the first run of a swapping graph, or any run while the
//! runtime traces), and what a trace needs of the run besides times: the pool's bytes when they
//! change, the fallback's evictions, and every change of a tensor's residency.
//!
//! Kept cheap on the hot path (the trace's overhead goal is 2% of a step):
//! - in a traced run the compute stream gets **one event per node boundary**: a node starts at
//!   the event that ended the previous node (or recompute) when nothing else was queued on the
//!   compute stream in between; after a wait on a copy or a collective the next node gets a
//!   start event of its own, so a node's slice never contains a wait. (Runs profiled only for
//!   the swap tuning record a start per node: `share_boundaries`.) Copies keep a pair each: every copy is preceded by its
//!   stream's wait for the compute stream, which must not count as the copy.
//! - every event comes from pools owned here, created on first use and recycled by every later
//!   profiled run (`reset`); nothing is created once the pools have grown to the run's size.
//! - the pool's bytes are recorded only when they changed since the last sample;
//! - records are plain numbers pushed on vectors that keep their capacity across runs: no
//!   formatting, no names (the trace resolves them when it is written).
//!
//! No event recorded here is ever waited on by any stream: timing adds no dependency between
//! streams.

use crate::device::{Device, EventId, StreamId};
use crate::error::Result;

/// When a record took effect, in device time: at one of the run's compute-stream events, or at
/// the start or end of one of its copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// `stamps[i]`: where the compute stream had got to.
    Stamp(u32),
    CopyStart(u32),
    CopyEnd(u32),
}

/// The pool's bytes at an anchor: allocated, reserved, pinned pool reserved, and blocks freed
/// pending a copy's event (not in "allocated", still not reusable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemorySample {
    pub at: Anchor,
    pub allocated: u64,
    pub reserved: u64,
    pub pinned: u64,
    pub pending: u64,
}

#[derive(Default, Debug)]
pub struct RunProfile {
    /// Per node: the events around its last timed launch (on the compute stream: two of
    /// `stamps`, shared with its neighbours; a collective: a pair of its own). Entries past the
    /// run's `reached` are stale.
    pub nodes: Vec<(EventId, EventId)>,
    /// Per node: its start and end as indices into `stamps` (`u32::MAX`: not on the compute
    /// stream, see `nodes`).
    pub node_stamps: Vec<(u32, u32)>,
    /// (start, end, bytes, host to device, tensor)
    pub copies: Vec<(EventId, EventId, u64, bool, u32)>,
    /// (start stamp, end stamp, node run again, tensor rebuilt)
    pub recomputes: Vec<(u32, u32, u32, u32)>,
    /// The pool's bytes, recorded when they changed (and once at the run's start).
    pub memory: Vec<MemorySample>,
    /// (node being made room for, tensor evicted by the fallback)
    pub evictions: Vec<(u32, u32)>,
    /// (node about to launch, pool pages mapped, pool waits for the device) since the previous
    /// launch, where either changed: what the pool's page moves cost shows as the compute
    /// stream idling before that node (`scripts/gpu/timeline.py` reads them).
    pub pool_moves: Vec<(u32, u64, u64)>,
    /// The pool's page-map and device-wait counts at the last sample.
    pool_counts: (u64, u64),
    /// (tensor, when, on the device from then on (true) or no more (false))
    pub residency: Vec<(u32, Anchor, bool)>,
    /// Tensors on the device (or arriving) when the run began.
    pub resident_at_start: Vec<u32>,
    /// (node, host ns from the executor's start when its own launch was queued, compute-stream
    /// syncs queued since the previous node's launch): where the host, not the device, was late.
    pub host_launches: Vec<(u32, u64, u32)>,
    /// The compute stream's events, in the order recorded this run (`stamps_used` of them).
    stamps: Vec<EventId>,
    stamps_used: usize,
    /// True while nothing has been queued on the compute stream since the last stamp.
    compute_at_stamp: bool,
    /// Whether a node may start at the previous node's end stamp (traced runs). Runs profiled
    /// only for the swap tuning give every node a start stamp of its own, recorded just before
    /// its launch, so the host's work between launches (pinned slots taken at a first run)
    /// never counts in the node costs the tuner compares.
    share_boundaries: bool,
    spare_pairs: Vec<(EventId, EventId)>,
    /// Pairs lent to collectives this run (returned by `reset`).
    lent_pairs: Vec<(EventId, EventId)>,
}

impl RunProfile {
    /// Every event it holds, for destruction.
    pub fn events(&self) -> impl Iterator<Item = EventId> + '_ {
        let pairs = self
            .copies
            .iter()
            .map(|&(a, b, ..)| (a, b))
            .chain(self.spare_pairs.iter().copied())
            .chain(self.lent_pairs.iter().copied())
            .flat_map(|(a, b)| [a, b]);
        self.stamps.iter().copied().chain(pairs)
    }

    /// The compute stream's events recorded by the last profiled run.
    pub fn stamps(&self) -> &[EventId] {
        &self.stamps[..self.stamps_used]
    }

    /// Before a profiled run: every event back to its pool, the records emptied (capacity kept).
    pub(super) fn reset(&mut self) {
        let used = self.copies.drain(..).map(|(a, b, ..)| (a, b));
        self.spare_pairs.extend(used);
        self.spare_pairs.append(&mut self.lent_pairs);
        self.recomputes.clear();
        self.memory.clear();
        self.evictions.clear();
        self.pool_moves.clear();
        self.residency.clear();
        self.resident_at_start.clear();
        self.host_launches.clear();
        self.stamps_used = 0;
        self.compute_at_stamp = false;
    }

    /// Records the next compute-stream event on `stream` and returns its index.
    pub(super) fn stamp(&mut self, device: &dyn Device, stream: StreamId) -> Result<u32> {
        if self.stamps_used == self.stamps.len() {
            self.stamps.push(device.create_event()?);
        }
        let i = self.stamps_used;
        device.record_event(self.stamps[i], stream)?;
        self.stamps_used += 1;
        self.compute_at_stamp = true;
        Ok(i as u32)
    }

    /// Traced runs share node boundaries; other profiled runs do not (see the field).
    pub fn share_boundaries(&mut self, share: bool) {
        self.share_boundaries = share;
    }

    /// Where work queued now on the compute stream starts: the last stamp when boundaries are
    /// shared and nothing was queued after it, else a new one.
    pub(super) fn start_stamp(&mut self, device: &dyn Device, stream: StreamId) -> Result<u32> {
        if self.share_boundaries && self.compute_at_stamp && self.stamps_used > 0 {
            return Ok(self.stamps_used as u32 - 1);
        }
        self.stamp(device, stream)
    }

    /// Something other than timed work (a wait) was queued on the compute stream.
    pub(super) fn compute_queued(&mut self) {
        self.compute_at_stamp = false;
    }

    /// Where a change made now takes effect on the compute stream: at the last stamp, or, when
    /// a wait was queued after it, at the next one (the change comes after the wait).
    pub(super) fn here(&self) -> Anchor {
        let next = self.stamps_used as u32;
        Anchor::Stamp(if self.compute_at_stamp {
            next.saturating_sub(1)
        } else {
            next
        })
    }

    /// Node `n` was timed from stamp `a` to stamp `b`.
    pub(super) fn set_node(&mut self, n: usize, a: u32, b: u32) {
        let pair = (self.stamps[a as usize], self.stamps[b as usize]);
        self.set_node_events(n, pair, (a, b));
    }

    fn set_node_events(&mut self, n: usize, pair: (EventId, EventId), stamps: (u32, u32)) {
        if self.nodes.len() <= n {
            // Nodes not timed (absorbed into a later collective) get an empty span.
            self.nodes.resize(n + 1, (pair.0, pair.0));
            self.node_stamps.resize(n + 1, (u32::MAX, u32::MAX));
        }
        self.nodes[n] = pair;
        self.node_stamps[n] = stamps;
    }

    /// A pair of events of its own for collective node `n` (timed on its stream).
    pub(super) fn collective_pair(
        &mut self,
        device: &dyn Device,
        n: usize,
    ) -> Result<(EventId, EventId)> {
        let pair = self.pair(device)?;
        self.lent_pairs.push(pair);
        self.set_node_events(n, pair, (u32::MAX, u32::MAX));
        Ok(pair)
    }

    /// A pair for a copy (pushed on `copies` by the caller once recorded).
    pub(super) fn pair(&mut self, device: &dyn Device) -> Result<(EventId, EventId)> {
        match self.spare_pairs.pop() {
            Some(pair) => Ok(pair),
            None => Ok((device.create_event()?, device.create_event()?)),
        }
    }

    /// The pool's page-map and device-wait counts now, before node `node`'s launch (or at the
    /// run's end): recorded with the node when they moved since the last call. `start`: the
    /// run's first call, which only sets the counts.
    pub(super) fn pool_counts(&mut self, node: u32, maps: u64, waits: u64, start: bool) {
        let (m0, w0) = std::mem::replace(&mut self.pool_counts, (maps, waits));
        if !start && (maps, waits) != (m0, w0) {
            let (dm, dw) = (maps.saturating_sub(m0), waits.saturating_sub(w0));
            self.pool_moves.push((node, dm, dw));
        }
    }

    /// The pool's bytes now, at anchor `at`, unless unchanged since the last sample.
    pub(super) fn sample(
        &mut self,
        at: Anchor,
        allocated: u64,
        reserved: u64,
        pinned: u64,
        pending: u64,
    ) {
        let s = MemorySample {
            at,
            allocated,
            reserved,
            pinned,
            pending,
        };
        match self.memory.last_mut() {
            Some(last)
                if (last.allocated, last.reserved, last.pinned, last.pending)
                    == (allocated, reserved, pinned, pending) => {}
            // A later change at the same anchor supersedes the earlier one.
            Some(last) if last.at == at => *last = s,
            _ => self.memory.push(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::host::{HostDevice, HostOptions};

    fn device() -> HostDevice {
        HostDevice::new(HostOptions {
            jitter_us: 0,
            seed: 1,
            total_memory: 0,
        })
    }

    #[test]
    fn neighbouring_nodes_share_a_stamp_unless_a_wait_came_between() {
        let d = device();
        let s = d.create_stream().unwrap();
        let mut p = RunProfile::default();
        p.share_boundaries(true);
        for run in 0..2 {
            p.reset();
            // Node 0: a fresh start; node 1 starts at node 0's end.
            let a = p.start_stamp(&d, s).unwrap();
            let b = p.stamp(&d, s).unwrap();
            p.set_node(0, a, b);
            assert_eq!(
                p.here(),
                Anchor::Stamp(b),
                "a change now happens at node 0's end"
            );
            let c = p.start_stamp(&d, s).unwrap();
            assert_eq!(c, b);
            let e = p.stamp(&d, s).unwrap();
            p.set_node(1, c, e);
            // A wait: node 2 gets a start of its own, and changes made now come after the wait.
            p.compute_queued();
            assert_eq!(p.here(), Anchor::Stamp(e + 1));
            let f = p.start_stamp(&d, s).unwrap();
            assert_eq!(f, e + 1);
            let g = p.stamp(&d, s).unwrap();
            p.set_node(2, f, g);
            assert_eq!(
                p.stamps().len(),
                5,
                "run {run}: five events for three nodes and a wait"
            );
            assert_eq!(p.nodes[1].0, p.nodes[0].1);
            assert_ne!(p.nodes[2].0, p.nodes[1].1);
        }
        d.stream_synchronize(s).unwrap();
        // The second run recorded the first run's events again: none was created for it.
        assert_eq!(p.events().count(), 5);
        // Not shared (a run profiled for the tuning): a start stamp per node.
        p.share_boundaries(false);
        p.reset();
        let a = p.start_stamp(&d, s).unwrap();
        let b = p.stamp(&d, s).unwrap();
        assert_ne!(p.start_stamp(&d, s).unwrap(), b);
        assert_eq!(a, 0);
        d.stream_synchronize(s).unwrap();
        for e in p.events().collect::<Vec<_>>() {
            d.destroy_event(e).unwrap();
        }
    }

    #[test]
    fn memory_is_sampled_only_when_it_changed() {
        let mut p = RunProfile::default();
        p.sample(Anchor::Stamp(0), 10, 20, 0, 0);
        p.sample(Anchor::Stamp(1), 10, 20, 0, 0); // unchanged: not recorded
        p.sample(Anchor::Stamp(2), 30, 40, 0, 0);
        p.sample(Anchor::Stamp(2), 50, 60, 0, 5); // same anchor: supersedes
        let got: Vec<(Anchor, u64, u64)> = p
            .memory
            .iter()
            .map(|m| (m.at, m.allocated, m.pending))
            .collect();
        assert_eq!(
            got,
            vec![(Anchor::Stamp(0), 10, 0), (Anchor::Stamp(2), 50, 5)]
        );
    }
}
