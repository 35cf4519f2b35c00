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
//!   statistic) instead of one pair each; the events only waited for (the tensors' copy events,
//!   the marker) are made without timing (`Device::create_sync_event`).
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

/// A stream that waits for copies: the compute stream or a copy stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waiter {
    Compute = 0,
    CopyIn = 1,
    CopyOut = 2,
}

#[derive(Debug)]
pub(super) struct StreamOrder {
    on: bool,
    /// Per copy stream: events recorded on it this run.
    recorded: [u64; 2],
    /// Per event: the copy stream and number of its last record this run.
    seq: HashMap<EventId, (CopyStream, u64)>,
    /// Per waiting stream and copy stream: the newest record it has waited for (0: none).
    waited: [[u64; 2]; 3],
    /// Every copy event recorded before this run has completed (the graph's runs end with its
    /// streams synchronised): a wait for one adds nothing.
    earlier_done: bool,
    /// Records of the compute marker this run; whether compute work was queued since the last.
    marker_records: u64,
    compute_dirty: bool,
    /// Per copy stream: the marker record it last waited for (0: none this run).
    copy_waited_marker: [u64; 2],
    /// Per copy stream: the newest record seen complete (every older one is complete too).
    seen_done: [u64; 2],
}

impl StreamOrder {
    pub(super) fn new(on: bool, earlier_done: bool) -> StreamOrder {
        StreamOrder {
            on,
            recorded: [0; 2],
            seq: HashMap::new(),
            waited: [[0; 2]; 3],
            earlier_done,
            marker_records: 0,
            // The compute stream may hold anything when a run begins.
            compute_dirty: true,
            copy_waited_marker: [0; 2],
            seen_done: [0; 2],
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
        self.has_waited(Waiter::Compute, event, false)
    }

    /// True when a wait of `waiter` for `event` adds nothing: it waited for a record on the same
    /// copy stream at least as new already, or `event` was last recorded on `waiter`'s own copy
    /// stream (which runs in order), or — `copy_event`: it is a tensor's copy event — it was
    /// not recorded this run and every earlier copy has completed.
    pub(super) fn has_waited(&self, waiter: Waiter, event: EventId, copy_event: bool) -> bool {
        if !self.on {
            return false;
        }
        match self.seq.get(&event) {
            Some(&(s, k)) => {
                let own = matches!(
                    (waiter, s),
                    (Waiter::CopyIn, CopyStream::In) | (Waiter::CopyOut, CopyStream::Out)
                );
                own || k <= self.waited[waiter as usize][s as usize]
            }
            None => copy_event && self.earlier_done,
        }
    }

    /// The compute stream waits for `event` from now on.
    pub(super) fn compute_waits(&mut self, event: EventId) {
        self.waits(Waiter::Compute, event);
        self.compute_dirty = true;
    }

    /// `waiter` waits for `event` from now on.
    pub(super) fn waits(&mut self, waiter: Waiter, event: EventId) {
        if let Some(&(s, k)) = self.seq.get(&event) {
            let w = &mut self.waited[waiter as usize][s as usize];
            *w = (*w).max(k);
        }
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

    /// The copy stream and number of `event`'s last record this run, if one was reported.
    pub(super) fn copy_record(&self, event: EventId) -> Option<(CopyStream, u64)> {
        self.seq.get(&event).copied()
    }

    /// Whether `event`'s last record is at most as new as one seen complete on its stream.
    pub(super) fn known_done(&self, event: EventId) -> bool {
        self.seq
            .get(&event)
            .is_some_and(|&(s, k)| k <= self.seen_done[s as usize])
    }

    /// `event` was seen complete: so is every older record on its copy stream.
    pub(super) fn saw_done(&mut self, event: EventId) {
        if let Some(&(s, k)) = self.seq.get(&event) {
            let d = &mut self.seen_done[s as usize];
            *d = (*d).max(k);
        }
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
        let mut o = StreamOrder::new(true, false);
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
    fn a_copy_seen_done_implies_the_older_ones_on_its_stream() {
        let mut o = StreamOrder::new(false, true);
        let (a, b, c) = (EventId(1), EventId(2), EventId(3));
        o.recorded(a, CopyStream::Out);
        o.recorded(c, CopyStream::In);
        o.recorded(b, CopyStream::Out);
        assert_eq!(o.copy_record(b), Some((CopyStream::Out, 2)));
        assert_eq!(o.copy_record(EventId(9)), None);
        o.saw_done(b);
        assert!(o.known_done(a) && o.known_done(b));
        assert!(!o.known_done(c), "another stream");
        o.recorded(a, CopyStream::Out);
        assert!(!o.known_done(a), "recorded again since");
    }

    #[test]
    fn copy_streams_wait_once_per_record_and_never_for_earlier_runs_when_settled() {
        let mut o = StreamOrder::new(true, true);
        let (a, b, c) = (EventId(1), EventId(2), EventId(3));
        o.recorded(a, CopyStream::Out);
        o.recorded(b, CopyStream::Out);
        o.recorded(c, CopyStream::In);
        assert!(!o.has_waited(Waiter::CopyIn, a, true));
        o.waits(Waiter::CopyIn, b);
        assert!(
            o.has_waited(Waiter::CopyIn, a, true),
            "older on the same stream"
        );
        assert!(!o.has_waited(Waiter::Compute, a, true), "another waiter");
        assert!(
            o.has_waited(Waiter::CopyIn, c, true),
            "its own stream runs in order"
        );
        assert!(!o.has_waited(Waiter::CopyOut, c, true));
        let earlier = EventId(7);
        assert!(
            o.has_waited(Waiter::CopyOut, earlier, true),
            "an earlier run's copy"
        );
        assert!(
            !o.has_waited(Waiter::CopyOut, earlier, false),
            "not a copy event"
        );
        let unsettled = StreamOrder::new(true, false);
        assert!(!unsettled.has_waited(Waiter::Compute, earlier, true));
        let off = StreamOrder::new(false, true);
        assert!(!off.has_waited(Waiter::CopyIn, earlier, true));
    }

    #[test]
    fn the_marker_is_recorded_again_only_after_compute_work() {
        let mut o = StreamOrder::new(true, false);
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
        let mut o = StreamOrder::new(false, true);
        o.recorded(EventId(1), CopyStream::In);
        o.compute_waits(EventId(1));
        assert!(!o.compute_has_waited(EventId(1)));
        o.marker_recorded();
        assert!(o.marker_stale());
        o.copy_waited_marker(CopyStream::In);
        assert!(o.copy_must_wait_marker(CopyStream::In));
    }
}
