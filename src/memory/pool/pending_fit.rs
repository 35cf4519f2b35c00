//! Best fit over free and pending blocks together: a block pending on a copy that fits a
//! request more closely than any warm free block is taken (the caller's stream waits for the
//! copy), as best fit would take it were it already free. The pool's dry run frees such blocks
//! at once, so this is the placement the swap plan was fitted with; taking the free block
//! instead puts small tensors into the large holes the dry run kept whole (GPT-2 at a third of
//! its working set on the H200: every step the pool moved ~550 MiB of pages, after a device
//! wait, for the logits' gradient, where the dry run moved none).

use super::block::Kind;
use super::block::State;
use super::stream::{lane_key, Lane};
use super::{round_up, Pool, PoolBacking};
use crate::device::{EventId, StreamId};

impl Pool {
    /// With `PoolConfig::pending_best_fit` (else `None`): `take_pending` (its close-fit rule,
    /// the wait left to the caller) when the smallest
    /// block of `stream` pending on an event that holds `bytes` is smaller than the block a
    /// plain allocation would take: the best warm free block, or, when none fits, the range's
    /// free tail or new pages. `None`: allocate normally. Completed events are processed first,
    /// so a block still pending is one whose copy the device has not finished.
    pub fn take_pending_if_closer(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
    ) -> Option<(u64, EventId)> {
        if !self.config.pending_best_fit || self.pending.is_empty() {
            return None;
        }
        self.process_events(backing);
        let rounded = round_up(bytes, self.config.alignment)?;
        let si = *self.stream_index.get(&lane_key(stream, Lane::Working))?;
        let pending = self.smallest_pending(si, rounded)?;
        if self
            .warm_fit_size(si, rounded)
            .is_some_and(|free| free <= pending)
        {
            return None;
        }
        self.take_pending(bytes, stream)
    }

    /// The smallest block of stream `si` pending on an event with at least `rounded` bytes.
    fn smallest_pending(&self, si: u32, rounded: u64) -> Option<u64> {
        self.pending
            .values()
            .flatten()
            .map(|&i| &self.blocks[i])
            .filter(|b| b.owner == si && b.state == State::Pending && b.size >= rounded)
            .map(|b| b.size)
            .min()
    }

    /// The size of the warm free block `alloc` would carve `rounded` bytes of stream `si` from
    /// (`take_fit`'s search, without taking it): virtual ranges first when the stream grows by
    /// one, as `alloc_inner` looks. `None` when no warm block fits.
    pub(super) fn warm_fit_size(&self, si: u32, rounded: u64) -> Option<u64> {
        let kind = if self.streams[si as usize].virtual_growth {
            Kind::Virtual
        } else if rounded <= self.config.small_request_max {
            Kind::Small
        } else {
            Kind::Large
        };
        self.peek_fit(si, kind, rounded)
            .map(|i| self.blocks[i].size)
    }
}
