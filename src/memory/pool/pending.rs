//! Blocks freed after an event (`free_after_event`): parked, out of every free index, until the
//! event is seen complete (polled, never waited on) or the caller vouches for it
//! (`assume_complete`), and meanwhile reusable on the same stream through `take_pending`.

use super::block::{Kind, State};
use super::stream::{lane_key, Lane};
use super::{round_up, Pool, PoolBacking, PoolError};
use crate::device::{EventId, StreamId};
use crate::memory::history::Action;

impl Pool {
    /// Frees a block whose last use was on another stream: it becomes reusable only once
    /// `event` (recorded after that use) completes. Events are polled lazily, never waited on.
    pub fn free_after_event(
        &mut self,
        _backing: &dyn PoolBacking,
        addr: u64,
        event: EventId,
    ) -> Result<(), PoolError> {
        self.park(addr, event)
    }

    pub(super) fn park(&mut self, addr: u64, event: EventId) -> Result<(), PoolError> {
        let idx = self.take_live(addr)?;
        self.note_block(Action::FreeRequested, idx);
        let size = self.blocks[idx].size;
        self.blocks[idx].state = State::Pending;
        self.blocks[idx].fprev = event.0;
        // Parking order, for `take_pending` (the field is reset when the block is freed).
        self.park_seq += 1;
        self.blocks[idx].freed_epoch = self.park_seq;
        self.pending_bytes += size;
        self.pending_blocks += 1;
        self.pending.entry(event).or_default().push(idx);
        Ok(())
    }

    /// Bytes freed with `free_after_event` whose event has not been seen complete yet.
    pub fn pending_free_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Number of blocks freed with `free_after_event` whose event has not been seen complete.
    pub fn pending_free_blocks(&self) -> u64 {
        self.pending_blocks
    }

    /// Allocates `bytes` on `stream` from a block pending on an event, without waiting: the
    /// smallest pending block of that stream large enough and at most 1/8 larger (the oldest
    /// of equal ones, whose copy ends first), split if larger (the rest stays pending on the
    /// same event). Returns the
    /// address and the event: the caller makes the stream that will use the block wait for it
    /// (`cuStreamWaitEvent`) before any use. `None` when no single pending block is large
    /// enough. Blocks of `stream`'s working lane, for a request of that lane (`take_pending_in`).
    pub fn take_pending(&mut self, bytes: u64, stream: StreamId) -> Option<(u64, EventId)> {
        self.take_pending_in(bytes, stream, Lane::Working)
    }

    /// `take_pending` for a request of `stream`'s `lane`, from blocks of that lane only: a
    /// lasting request given a working-lane block would hold it there for good, and the working
    /// lane's range could no longer empty between epochs (`stream.rs`, `Lane`).
    pub fn take_pending_in(
        &mut self,
        bytes: u64,
        stream: StreamId,
        lane: Lane,
    ) -> Option<(u64, EventId)> {
        let rounded = round_up(bytes, self.config.alignment)?;
        let si = *self.stream_index.get(&lane_key(stream, lane))?;
        let mut best: Option<(u64, u64, EventId, usize)> = None;
        for (&event, blocks) in &self.pending {
            for (pos, &i) in blocks.iter().enumerate() {
                let b = &self.blocks[i];
                // A close fit only: splitting a much larger block leaves pieces that keep
                // pending memory from coalescing, which can force fallback evictions where
                // waiting for all pending copies needs none (BENCHMARKS.md §3, "Figures the
                // runtime's and the C API's comments used to quote").
                if b.owner != si || b.size < rounded || b.size - rounded > rounded / 8 {
                    continue;
                }
                let key = (b.size, b.freed_epoch);
                if best.is_none_or(|(size, seq, _, _)| key < (size, seq)) {
                    best = Some((b.size, b.freed_epoch, event, pos));
                }
            }
        }
        let (size, _, event, pos) = best?;
        let blocks = self.pending.get_mut(&event).expect("found above");
        let idx = blocks.swap_remove(pos);
        if blocks.is_empty() {
            self.pending.remove(&event);
        }
        self.pending_bytes -= size;
        self.pending_blocks -= 1;
        if size > rounded {
            // The rest stays pending on the same event (it counts as a busy block of its segment).
            let j = self.cut(idx, rounded);
            let rest = &mut self.blocks[j];
            rest.state = State::Pending;
            rest.fprev = event.0;
            let rest_size = rest.size;
            self.pending_bytes += rest_size;
            self.pending_blocks += 1;
            self.pending.entry(event).or_default().push(j);
            if self.blocks[j].kind != Kind::Virtual {
                self.mark_busy(self.blocks[j].seg);
            }
        }
        Some((self.hand_out(idx, bytes, 0), event))
    }

    /// Frees the blocks whose events have completed (polled, never waited on): before a dry run
    /// from the pool as it is, which counts every pending block as busy for good. Also while
    /// events are held.
    pub fn poll_pending(&mut self, backing: &dyn PoolBacking) {
        self.complete_polled(backing);
    }

    /// While `on`, the pool's own calls never poll events: a pending block goes back only when
    /// its caller says (`assume_complete`, `take_pending`, `poll_pending`). A run following a
    /// release schedule (`plan::swap_release`) holds them so that the pool sees the pending
    /// blocks its dry run saw, whatever the device has finished.
    pub fn hold_events(&mut self, on: bool) {
        self.hold_events = on;
    }

    /// While `on`, the pool records no marker event and polls none (`markers.rs`): the free
    /// blocks it counts idle on the device, whose pages recycling may move without waiting,
    /// stay those it knew idle when it began, and every block freed meanwhile counts busy — as
    /// in a dry run, whose backing records no marker and sees no event complete. A run
    /// following a release schedule holds them too (`GKRT_SWAP_RELEASE_HOLD_MARKERS`): with the
    /// device's progress in its choices (moving idle pages at once where the dry run waits for
    /// the device, or moves none), its first run left another layout of mapped pages than its
    /// dry run's, and the steady runs mapped pages where the dry run mapped none
    /// (`plan/pool_fidelity_tests.rs`).
    pub fn hold_markers(&mut self, on: bool) {
        self.hold_markers = on;
    }

    /// Whether some block is pending on `event`.
    pub fn is_pending_on(&self, event: EventId) -> bool {
        self.pending.contains_key(&event)
    }

    /// Events that blocks are pending on (each once).
    pub fn pending_events(&self) -> Vec<EventId> {
        self.pending.keys().copied().collect()
    }

    /// Frees the blocks pending on `event` now. The caller guarantees that the stream owning
    /// them waits for the event before any later work (e.g. by `cuStreamWaitEvent`), so reuse
    /// on that stream is ordered after whatever the event guards — no host wait needed.
    pub fn assume_complete(&mut self, event: EventId) {
        for i in self.pending.remove(&event).unwrap_or_default() {
            self.note_block(Action::FreeCompleted, i);
            self.pending_bytes -= self.blocks[i].size;
            self.pending_blocks -= 1;
            self.free_block(i);
        }
    }

    pub(super) fn process_events(&mut self, backing: &dyn PoolBacking) {
        if !self.hold_events {
            self.complete_polled(backing);
        }
    }

    fn complete_polled(&mut self, backing: &dyn PoolBacking) {
        if self.pending.is_empty() {
            return;
        }
        let done: Vec<EventId> = self
            .pending
            .keys()
            .copied()
            .filter(|&e| backing.event_complete(e))
            .collect();
        for e in done {
            self.assume_complete(e);
        }
    }
}
