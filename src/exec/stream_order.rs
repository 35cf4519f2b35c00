//! What the streams' own order already guarantees, so that a run leaves out the syncs that add
//! nothing (`GKRT_EXEC_ELIDE`, on by default; `RuntimeGraph::elide_implied_syncs`).
//!
//! Each record and wait is a command the device's front end processes between two kernels: on
//! the H200 a swapping GPT-2 step left 5–40 µs between nodes where its unconstrained step
//! leaves 1.3 (session 12, run 9). Three kinds are implied by an earlier one:
//! - **the compute marker.** A copy waits for the compute work queued so far through an event
//!   recorded on the compute stream. When nothing was queued on the compute stream since the
//!   marker's last record (several copies queued between two launches), that record already
//!   covers it: it is not recorded again, and a copy stream that has waited for it already does
//!   not wait again.
//! - **a wait for an earlier copy.** Each copy stream runs its copies in order, so once the
//!   compute stream has waited for the event recorded after a stream's k-th copy, it has waited
//!   for every earlier one on that stream. Sets of waits (the blocks a release schedule gives
//!   back before one step, every pending block taken back) wait for the newest first.
//! - **timing pairs.** Consecutive waits share one pair of timing events (for the copy-wait
//!   statistic) instead of one pair each.
//!
//! Only events whose last record this run is known are judged (the tensors' copy events,
//! numbered as they are recorded); any other event is waited for as before. Results are the
//! same bits either way: every dependency the full set of syncs makes is still made.

use crate::device::EventId;
use std::collections::HashMap;

/// The two copy streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CopyStream {
    In = 0,
    Out = 1,
}

#[derive(Debug)]
pub(super) struct StreamOrder {
    on: bool,
    /// Per copy stream: events recorded on it this run.
    recorded: [u64; 2],
    /// Per event: the copy stream and number of its last record this run.
    seq: HashMap<EventId, (CopyStream, u64)>,
    /// Per copy stream: the newest record the compute stream has waited for (0: none).
    compute_waited: [u64; 2],
    /// Records of the compute marker this run; whether compute work was queued since the last.
    marker_records: u64,
    compute_dirty: bool,
    /// Per copy stream: the marker record it last waited for (0: none this run).
    copy_waited_marker: [u64; 2],
}

impl StreamOrder {
    pub(super) fn new(on: bool) -> StreamOrder {
        StreamOrder {
            on,
            recorded: [0; 2],
            seq: HashMap::new(),
            compute_waited: [0; 2],
            marker_records: 0,
            // The compute stream may hold anything when a run begins.
            compute_dirty: true,
            copy_waited_marker: [0; 2],
        }
    }

    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// `event` was just recorded on `stream` (after a copy, or after waits on it). Every record
    /// of an event judged here must be reported, or a later one would be taken for the earlier.
    pub(super) fn recorded(&mut self, event: EventId, stream: CopyStream) {
        let s = stream as usize;
        self.recorded[s] += 1;
        self.seq.insert(event, (stream, self.recorded[s]));
    }

    /// True when the compute stream has waited already for a record on the same copy stream at
    /// least as new as `event`'s last one: waiting for it adds nothing.
    pub(super) fn compute_has_waited(&self, event: EventId) -> bool {
        self.on
            && self
                .seq
                .get(&event)
                .is_some_and(|&(s, k)| k <= self.compute_waited[s as usize])
    }

    /// The compute stream waits for `event` from now on.
    pub(super) fn compute_waits(&mut self, event: EventId) {
        if let Some(&(s, k)) = self.seq.get(&event) {
            let w = &mut self.compute_waited[s as usize];
            *w = (*w).max(k);
        }
        self.compute_dirty = true;
    }

    /// Work (a kernel, a wait) was queued on the compute stream.
    pub(super) fn compute_queued(&mut self) {
        self.compute_dirty = true;
    }

    /// Whether the marker must be recorded again before a copy waits for compute.
    pub(super) fn marker_stale(&self) -> bool {
        !self.on || self.compute_dirty || self.marker_records == 0
    }

    /// The marker was recorded on the compute stream (by any caller).
    pub(super) fn marker_recorded(&mut self) {
        self.marker_records += 1;
        self.compute_dirty = false;
    }

    /// Whether copy stream `stream` must wait for the marker's last record.
    pub(super) fn copy_must_wait_marker(&self, stream: CopyStream) -> bool {
        !self.on || self.copy_waited_marker[stream as usize] != self.marker_records
    }

    pub(super) fn copy_waited_marker(&mut self, stream: CopyStream) {
        self.copy_waited_marker[stream as usize] = self.marker_records;
    }

    /// Sorts `events` so that the newest record of each copy stream comes first (unknown
    /// events after them, in their order): waited for in this order, the older ones on a
    /// stream are implied by the first.
    pub(super) fn newest_first(&self, events: &mut [EventId]) {
        if !self.on {
            return;
        }
        events.sort_by_key(|e| match self.seq.get(e) {
            Some(&(_, k)) => (0, std::cmp::Reverse(k)),
            None => (1, std::cmp::Reverse(0)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_a_copy_implies_every_earlier_copy_on_its_stream_only() {
        let mut o = StreamOrder::new(true);
        let (a, b, c) = (EventId(1), EventId(2), EventId(3));
        o.recorded(a, CopyStream::Out);
        o.recorded(c, CopyStream::In);
        o.recorded(b, CopyStream::Out);
        assert!(!o.compute_has_waited(a));
        o.compute_waits(b);
        assert!(o.compute_has_waited(a), "a was copied out before b");
        assert!(o.compute_has_waited(b));
        assert!(!o.compute_has_waited(c), "another stream");
        assert!(
            !o.compute_has_waited(EventId(9)),
            "an event not recorded this run"
        );
        // Recorded again after the wait: a newer copy, not waited for.
        o.recorded(a, CopyStream::Out);
        assert!(!o.compute_has_waited(a));
        let mut events = vec![EventId(9), b, c, a];
        o.newest_first(&mut events);
        assert_eq!(events, vec![a, b, c, EventId(9)]);
    }

    #[test]
    fn the_marker_is_recorded_again_only_after_compute_work() {
        let mut o = StreamOrder::new(true);
        assert!(o.marker_stale(), "a run starts with unknown compute work");
        o.marker_recorded();
        assert!(!o.marker_stale());
        assert!(o.copy_must_wait_marker(CopyStream::Out));
        o.copy_waited_marker(CopyStream::Out);
        assert!(!o.copy_must_wait_marker(CopyStream::Out));
        assert!(o.copy_must_wait_marker(CopyStream::In));
        o.compute_queued();
        assert!(o.marker_stale());
        o.marker_recorded();
        assert!(o.copy_must_wait_marker(CopyStream::Out), "a newer record");
        o.compute_waits(EventId(4));
        assert!(o.marker_stale(), "a wait is compute work");
    }

    #[test]
    fn off_every_sync_is_made() {
        let mut o = StreamOrder::new(false);
        o.recorded(EventId(1), CopyStream::In);
        o.compute_waits(EventId(1));
        assert!(!o.compute_has_waited(EventId(1)));
        o.marker_recorded();
        assert!(o.marker_stale());
        o.copy_waited_marker(CopyStream::In);
        assert!(o.copy_must_wait_marker(CopyStream::In));
    }
}
