//! What a stream does when the plan it follows is left (`epochs.rs`): the plan is counted, what
//! it was kept for stays or goes, the epoch that left it is learnt, and the stream waits longer
//! with each miss before it follows or logs again.

use super::{Epochs, Mode, MAX_WAIT};

impl Epochs {
    /// The plan followed was left: it is counted. An epoch's kept epoch stays, a variant that
    /// a later epoch may be (each found again or followed to its end is the newest; the oldest
    /// of a first size and floor go beyond `VARIANTS`) — unless it was left where its own
    /// size's place was not free (`outdated`); the epoch that left it is learnt by the
    /// recording, as a variant whatever its size (`parted`): over a floor the recording goes on
    /// again while plans are followed (`choose`), over an empty floor the next epoch like it is
    /// logged (`relearn`). A period's goes (`leave_period` records again at once).
    pub(super) fn note_left_plan(&mut self) {
        self.left += 1;
        self.in_row = 0;
        self.plan = None;
        let outdated = std::mem::take(&mut self.outdated);
        // A plan not started for want of pages (`keep_unmapped_plan`) has nothing to learn.
        let Some(k) = self.following.take() else {
            return;
        };
        if k.is_epoch() {
            self.parted = Some((k.first_size(), k.hash));
        }
        if k.is_epoch() && !self.recording && self.quick {
            self.relearn = Some((k.first_size(), k.hash));
        }
        if outdated || !k.is_epoch() {
            if let Some(i) = self.listed(Some(k)) {
                self.kept.remove(i);
            }
        }
    }

    /// The plan followed was left (or could not start): it is counted (`note_left_plan`), and
    /// 2^misses − 1 epochs (at most `MAX_WAIT`) pass before the next is followed or logged.
    pub(super) fn miss(&mut self) {
        self.note_left_plan();
        self.misses += 1;
        self.wait = (1u32 << self.misses.min(10)).min(MAX_WAIT) - 1;
        self.mode = if self.wait == 0 {
            Mode::Ready
        } else {
            Mode::Waiting
        };
    }

    /// The plan chosen was not followed (or not switched to) for want of mapped pages: its kept
    /// epoch stays as it is, and a later epoch like it chooses it again after the wait; no epoch
    /// is logged in its place (`relearn`), as the plan fits its epoch.
    pub(in crate::memory::pool) fn keep_unmapped_plan(&mut self) {
        self.following = None;
    }

    /// The plan being followed was left at this allocation, of `size` bytes: the rest of the
    /// epoch is placed as usual. Where the plan has that size, its place was not free — the
    /// epoch frees its blocks otherwise than the log did — and the kept epoch goes when the
    /// epoch ends (`note_left_plan`), so that the recording keeps the epoch as it now is.
    pub(in crate::memory::pool) fn leave(&mut self, size: u64) {
        let next = self.next as usize;
        self.outdated = self
            .plan
            .as_ref()
            .is_some_and(|p| next < p.young && p.sizes[next] == size);
        self.mode = Mode::Left;
    }
}
