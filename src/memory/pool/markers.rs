//! Marker events: which stream-ordered frees the device has passed. Every so many frees on a
//! stream with a virtual range the pool records an event there and polls it later; a free
//! older than a completed marker is known done on the device, so its pages can be unmapped
//! without waiting.

use super::tlsf::NIL;
use super::{Pool, PoolBacking};

/// Markers in flight per stream, at most (the slack rule's own may take it to twice that).
pub(super) const MARKERS_IN_FLIGHT: usize = 8;
/// Polls a spin makes before its time bound can end it: a thread descheduled just after the
/// spin began has lost its window to the scheduler, not to the device, which has gone on
/// meanwhile. A few polls cost far less than the bound (cuEventQuery: about a microsecond).
/// (The test fake's idle device passes a marker at its third poll; with the bound alone, CI's
/// loaded test run once saw a spin end before it.)
const SPIN_POLLS: u32 = 4;

impl Pool {
    /// Counts a stream-ordered free of block `i`; every `marker_every` frees on a stream with a
    /// virtual range, records a marker there, unless one was recorded less than
    /// `marker_min_interval_ns` ago.
    #[inline]
    pub(super) fn note_free(&mut self, backing: &dyn PoolBacking, i: u32) {
        let si = self.blocks[i].owner;
        let st = &mut self.streams[si as usize];
        if st.range == NIL || self.hold_markers {
            return;
        }
        st.frees += 1;
        if st.frees >= self.config.marker_every {
            st.frees = 0;
            self.mark_if_due(backing, si);
        }
    }

    #[inline(never)]
    pub(super) fn mark_if_due(&mut self, backing: &dyn PoolBacking, si: u32) {
        let now = std::time::Instant::now();
        let min = std::time::Duration::from_nanos(self.config.marker_min_interval_ns);
        let st = &mut self.streams[si as usize];
        if st.last_marker.is_some_and(|t| now.duration_since(t) < min) {
            return;
        }
        st.last_marker = Some(now);
        self.mark(backing, si);
    }

    /// Records a marker on the stream `si` (unless too many are in flight).
    pub(super) fn mark(&mut self, backing: &dyn PoolBacking, si: u32) {
        self.mark_capped(backing, si, MARKERS_IN_FLIGHT);
    }

    pub(super) fn mark_capped(&mut self, backing: &dyn PoolBacking, si: u32, cap: usize) {
        self.poll_markers(backing, si);
        let st = &mut self.streams[si as usize];
        if st.markers.len() >= cap {
            return;
        }
        let reuse = st.spare_markers.pop();
        // On failure the backing has given a re-recorded event back itself.
        if let Some(e) = backing.record_marker(st.stream, reuse) {
            self.epoch += 1;
            st.markers.push_back((e, self.epoch));
        }
    }

    /// Polls stream `si`'s newest marker for up to `recycle_spin_ns` (see there), and at least
    /// `SPIN_POLLS` times; never waits on the device. After a miss (a busy device) the next 1,
    /// 2, 4 … 64 opportunities are skipped, so a device that stays busy costs few spins; a hit
    /// resets the backoff.
    pub(super) fn spin_on_newest_marker(&mut self, backing: &dyn PoolBacking, si: u32) {
        let spin = self.config.recycle_spin_ns;
        let st = &mut self.streams[si as usize];
        let Some(&(e, _)) = st.markers.back() else {
            return;
        };
        if spin == 0 {
            return;
        }
        if st.spin_skip > 0 {
            st.spin_skip -= 1;
            return;
        }
        let start = std::time::Instant::now();
        let mut polls = 0;
        while !backing.event_complete(e) {
            polls += 1;
            if polls >= SPIN_POLLS && start.elapsed().as_nanos() as u64 >= spin {
                let st = &mut self.streams[si as usize];
                st.spin_skip = 1 << st.spin_misses.min(6);
                st.spin_misses += 1;
                return;
            }
            std::hint::spin_loop();
        }
        self.streams[si as usize].spin_misses = 0;
    }

    /// Advances stream `si`'s safe epoch past every completed marker.
    pub(super) fn poll_markers(&mut self, backing: &dyn PoolBacking, si: u32) {
        let st = &mut self.streams[si as usize];
        while let Some(&(e, epoch)) = st.markers.front() {
            if !backing.event_complete(e) {
                break;
            }
            st.safe_epoch = epoch;
            st.markers.pop_front();
            st.spare_markers.push(e);
        }
    }

    /// True when the device is known to be done with the memory of free block `i`.
    pub(super) fn idle_on_device(&self, i: u32) -> bool {
        let b = &self.blocks[i];
        b.freed_epoch == 0 || b.freed_epoch < self.streams[b.owner as usize].safe_epoch
    }
}
