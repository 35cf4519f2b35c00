//! Page recycling: unmapping mapped pages that lie wholly inside free blocks so their memory can
//! be mapped where it is needed — for the budget, and for the slack rule (see the pool's module
//! comment). Which blocks give up pages (after the program's first step, for the slack rule and
//! epoch plans, only those of the stream asking and of streams at rest), and when that needs a
//! wait for the device.

use super::alias::AliasMove;
use super::block::Kind;
use super::markers::MARKERS_IN_FLIGHT;
use super::tlsf::{CLASSES, NIL};
use super::{pages32, Pool, PoolBacking, PoolError};
use crate::device::{StreamId, VirtualMemory};
use crate::memory::history::Action;

/// What a recycling for the slack rule or a plan's gathering may do (`recycle`'s last
/// argument; the default for the budget's, which may take any page and always wait).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Moving {
    /// A move the time bucket pays for: after the program's first step it may not wait for
    /// the device (`PoolConfig::recycle_waits`).
    pub(super) bucket: bool,
    /// When the slack rule or a gathering moves pages: only this stream's ranges and empty
    /// ones give them up (`Pool::own_stream_victims`); None, every range.
    pub(super) victims_of: Option<StreamId>,
    /// A move within the slack rule's cap, for the pages of empty ranges alone
    /// (`PoolConfig::empty_range_moves`): no other range gives any.
    pub(super) empty_only: bool,
}

/// The pages a recycling leaves where they are: those about to be used.
#[derive(Clone, Copy, Debug)]
pub(super) enum Keep {
    /// Every mapped page inside a free block may go.
    Nothing,
    /// A block being placed (unlinked, so no list holds it) and the pages `[p0, p1)` it is
    /// about to use; its other pages are victims too.
    Placing(u32, u64, u64),
    /// An epoch plan gathering pages in range `r`: the pages `[p0, p1)` its allocations span.
    Span(u32, u64, u64),
}

impl From<Option<(u32, u64, u64)>> for Keep {
    /// A placement's block and pages (`Pool::map_runs`'s form), or nothing.
    fn from(placing: Option<(u32, u64, u64)>) -> Keep {
        placing.map_or(Keep::Nothing, |(i, p0, p1)| Keep::Placing(i, p0, p1))
    }
}

impl Keep {
    /// The block being placed, if any.
    fn placing(self) -> Option<u32> {
        match self {
            Keep::Placing(i, _, _) => Some(i),
            _ => None,
        }
    }
}

impl Pool {
    /// Mapped pages lying wholly inside the free block `i` of a range.
    pub(super) fn mapped_interior(&self, i: u32) -> u64 {
        let b = &self.blocks[i];
        let r = self.streams[b.owner as usize].range;
        let (q0, q1) = self.interior(r, b.addr, b.size);
        q1.saturating_sub(q0) - b.unmapped as u64
    }

    /// Unmaps up to `want` mapped pages lying wholly inside free blocks of every range, each
    /// block from its high end; returns the pages unmapped. Blocks the device is known to be done
    /// with (their last free is older than a completed marker) go first, largest first, and need
    /// no wait; the others are unmapped only to reach `must` (the budget), after waiting for the
    /// device once (`quiesce`). `keep` says which pages stay (`Keep`). Beyond
    /// `must`, pages an earlier slack-rule move placed are taken only with `repeat`. With
    /// `alias` (`alias.rs`) the chunks taken stay mapped as donors for `map_pages` to place,
    /// those whose shadows lie under the block being placed first. `moving` bounds the part
    /// beyond `must` (`Moving`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn recycle(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        want: u64,
        must: u64,
        keep: Keep,
        repeat: bool,
        alias: Option<&AliasMove>,
        moving: Moving,
    ) -> Result<u64, PoolError> {
        let waits = self.slack_may_wait(moving);
        // (Holding markers, the device's progress is not looked at: `hold_markers`.)
        let look = !self.hold_markers;
        for si in 0..self.streams.len() as u32 {
            if look && self.streams[si as usize].range != NIL {
                if !waits && must < want {
                    // A fresh marker passed at once means the device is idle: nothing to wait for.
                    // It must come after the latest frees even when the usual markers have not
                    // been seen complete yet (a slow round trip), so the cap is doubled here.
                    self.mark_capped(backing, si, 2 * MARKERS_IN_FLIGHT);
                    self.spin_on_newest_marker(backing, si);
                }
                self.poll_markers(backing, si);
            }
        }
        let done = self.recycle_victims(vm, want, must, keep, repeat, alias, moving)?;
        // Let the blocks skipped this time become known-idle for the next time.
        for si in 0..self.streams.len() as u32 {
            let st = &self.streams[si as usize];
            if look && st.range != NIL && st.markers.is_empty() {
                self.mark(backing, si);
            }
        }
        Ok(done)
    }

    /// Every mapped page inside a free block unmapped but those `keep` holds, waiting for the
    /// device where needed (`release_cached`, and a mapping the device refused for memory).
    pub(super) fn recycle_all(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        keep: Keep,
    ) -> Result<u64, PoolError> {
        let all = u64::MAX;
        self.recycle(backing, vm, all, all, keep, true, None, Moving::default())
    }

    /// Whether the slack rule may wait for the device: with `recycle_waits`, but for a move the
    /// time bucket pays for after the program's first step (`PoolConfig::recycle_waits`).
    fn slack_may_wait(&self, moving: Moving) -> bool {
        self.config.recycle_waits && !(moving.bucket && self.moves.is_steady())
    }

    /// The stream whose ranges alone, with the empty ones, may give up pages to a slack-rule
    /// move or a plan's gathering in range `r` (`PoolConfig::own_stream_moves`): after the
    /// program's first step, another stream's range in use keeps its free pages, which that
    /// stream's next step would take back. None: every range may.
    pub(super) fn own_stream_victims(&self, r: u32) -> Option<StreamId> {
        if !self.config.own_stream_moves || !self.moves.is_steady() {
            return None;
        }
        let si = self.blocks[self.segs[r].first].owner as usize;
        Some(self.streams[si].stream)
    }

    /// Mapped pages lying inside the empty ranges of streams other than range `r`'s: free
    /// pages a stream at rest keeps (a warm-up allocation's), which recycling may take
    /// (`PoolConfig::empty_range_moves`). 0 with the rule off.
    pub(super) fn pages_in_empty_ranges(&self, r: u32) -> u64 {
        if !self.config.empty_range_moves {
            return 0;
        }
        self.streams
            .iter()
            .filter(|st| st.range != NIL && st.range != r && self.range_is_empty(st.range))
            .map(|st| self.mapped_interior(self.segs[st.range].first))
            .sum()
    }

    /// The mapped chunks `(first page, pages)` lying wholly inside the free block `i`, from its
    /// high end, but those under the pages `keep` holds there.
    fn victim_chunks(&self, i: u32, keep: Keep) -> Vec<(u64, u64)> {
        let b = &self.blocks[i];
        let r = self.streams[b.owner as usize].range;
        let (q0, q1) = self.interior(r, b.addr, b.size);
        let keep = match keep {
            Keep::Placing(j, k0, k1) if j == i => (k0, k1),
            Keep::Span(g, k0, k1) if g == r => (k0, k1),
            _ => (q1, q1),
        };
        let mut chunks = Vec::new();
        let pages = self.pages_of(r);
        for (lo, hi) in [(keep.1.max(q0), q1), (q0, keep.0.min(q1))] {
            if lo < hi {
                pages.each_chunk_down(lo, hi, |c| {
                    chunks.push(c);
                    true
                });
            }
        }
        chunks
    }

    /// `recycle_majority_moves`: whether the pages the slack rule could move now — from victims
    /// the device is done with (any, when it may wait), not placed by an earlier move unless
    /// `repeat` — are fewer than half of the `soft` pages over the cap, when those are more than
    /// one physical allocation (`chunk_pages`). The peak then still grows by more than the move
    /// saves, and the pages taken leave holes later steps need again (bert_train: ARCHITECTURE.md,
    /// "The pool's fragmentation").
    /// Chunks whose shadows lie under the block being placed (`targets`) count whatever moved
    /// them before: switching them back is free.
    /// (`only_targets`: a switch-only move, where nothing else may move.)
    fn majority_short(
        &self,
        victims: &[(bool, u64, u32)],
        soft: u64,
        keep: Keep,
        (repeat, targets, only_targets): (bool, &[u64], bool),
        may_wait: bool,
    ) -> bool {
        if soft <= self.chunk_pages(soft) {
            // Growth of at most one physical allocation over the cap (a cache grown a row at a
            // time) is moved as without the rule: such small moves keep the pages they save
            // (kv_growth, host replay on the model clock: 1.084 with them, 1.117 without).
            return false;
        }
        let mut movable = 0u64;
        for &(idle, _, i) in victims {
            if !idle && !may_wait {
                continue;
            }
            let r = self.streams[self.blocks[i].owner as usize].range;
            let base = self.segs[r].base;
            for (start, k) in self.victim_chunks(i, keep) {
                let target = targets.contains(&(base + start * self.page));
                let other =
                    !only_targets && (repeat || !self.pages_of(r).any_moved(start, start + k));
                if target || other {
                    movable += k;
                }
            }
            if 2 * movable >= soft {
                return false;
            }
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn recycle_victims(
        &mut self,
        vm: &dyn VirtualMemory,
        want: u64,
        must: u64,
        keep: Keep,
        repeat: bool,
        alias: Option<&AliasMove>,
        moving: Moving,
    ) -> Result<u64, PoolError> {
        // Constant for the call: the config, the kind of move and whether a step has ended.
        let may_wait = self.slack_may_wait(moving);
        let mut victims: Vec<(u64, u32)> = Vec::new();
        let mut avail = 0u64;
        let targets: &[u64] = alias.map_or(&[], |a| &a.targets);
        // Free blocks holding a target chunk seen so far: the scan goes on until all are.
        let mut found = 0usize;
        let holds_target = |p: &Pool, i: u32| {
            let b = &p.blocks[i];
            targets
                .iter()
                .filter(|&&t| t >= b.addr && t < b.addr + b.size)
                .count()
        };
        // For empty ranges alone: not the range being placed in, which may look empty while
        // its one free block is cut.
        let empty_only = (moving.empty_only && must == 0).then(|| match keep {
            Keep::Placing(i, _, _) => self.streams[self.blocks[i].owner as usize].range,
            Keep::Span(r, _, _) => r,
            Keep::Nothing => NIL,
        });
        if let Some(i) = keep.placing().filter(|_| empty_only.is_none()) {
            victims.push((self.mapped_interior(i), i));
        }
        // Another stream's range in use keeps its pages from the slack rule after the first
        // step (`own_stream_victims`); the budget (`must`) takes them wherever they are.
        let only = if must == 0 { moving.victims_of } else { None };
        for st in &self.streams {
            if st.range == NIL
                || empty_only.is_some_and(|placing| placing == st.range)
                || ((empty_only.is_some() || only.is_some_and(|s| s != st.stream))
                    && !self.range_is_empty(st.range))
            {
                continue;
            }
            let tail = self.segs[st.range].tail;
            let tail = self.blocks[tail].cold.then_some(tail);
            for i in st.cold.iter().map(|&(_, _, i)| i).chain(tail) {
                let mapped = self.mapped_interior(i);
                if mapped > 0 {
                    victims.push((mapped, i));
                    avail += mapped;
                    found += holds_target(self, i);
                }
            }
            let classes = &st.warm[Kind::Virtual as usize];
            let mut c = classes.last_at_or_below(CLASSES - 1);
            while let Some(k) = c {
                let mut cur = classes.head(k);
                while cur != NIL {
                    let mapped = self.mapped_interior(cur);
                    if mapped > 0 {
                        victims.push((mapped, cur));
                        avail += mapped;
                        found += holds_target(self, cur);
                    }
                    cur = self.blocks[cur].fnext;
                }
                if avail >= want.saturating_mul(2) && avail >= want && found >= targets.len() {
                    break;
                }
                c = if k == 0 {
                    None
                } else {
                    classes.last_at_or_below(k - 1)
                };
            }
        }
        if victims.is_empty() {
            return Ok(0);
        }
        // Idle ones first, then most mapped pages first: the unreserved tail of a range counts
        // only what is mapped in it, so the pages just above the used part (reused soonest) go
        // last.
        let mut victims: Vec<(bool, u64, u32)> = victims
            .into_iter()
            .map(|(mapped, i)| (self.idle_on_device(i), mapped, i))
            .collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        if log::log_enabled!(log::Level::Trace) {
            let idle = victims.iter().filter(|v| v.0).count();
            let streams: Vec<(usize, u64)> = self
                .streams
                .iter()
                .map(|s| (s.markers.len(), s.safe_epoch))
                .collect();
            let epochs: Vec<u64> = victims
                .iter()
                .map(|v| self.blocks[v.2].freed_epoch)
                .collect();
            log::trace!(
                "pool recycle: want {want} must {must}, {} victims ({idle} idle, freed epochs {epochs:?}), epoch {}, streams (markers, safe epoch) {streams:?}",
                victims.len(),
                self.epoch
            );
        }
        let page = self.page;
        let mut want = want;
        let switch_only = alias.is_some_and(|a| a.switch_only);
        if want > must && self.config.recycle_majority_moves {
            // Switch-only: nothing but the targets may move.
            let movable = (repeat, targets, switch_only);
            if self.majority_short(&victims, want - must, keep, movable, may_wait) {
                // The soft part would save less than the peak still grows: map instead.
                want = must;
                self.moves.declined += 1;
            }
        }
        let as_donors = alias.is_some();
        let mut done = 0u64;
        if !targets.is_empty() && want > 0 {
            // First the chunks that go back to their shadows under the block being placed:
            // free moves, from blocks idle on the device only (as any move without a wait).
            for &(idle, _, i) in &victims {
                if !idle || done >= want {
                    continue;
                }
                let r = self.streams[self.blocks[i].owner as usize].range;
                let base = self.segs[r].base;
                let chunks: Vec<(u64, u64)> = self
                    .victim_chunks(i, keep)
                    .into_iter()
                    .filter(|&(start, _)| targets.contains(&(base + start * page)))
                    .collect();
                let mut took = 0;
                let mut failed = None;
                for (start, k) in chunks {
                    if let Err(e) = self.retire_chunk(vm, base + start * page, k, as_donors) {
                        failed = Some(e);
                        break;
                    }
                    self.count_unmapped(r, i, start, k);
                    took += k;
                }
                done += took;
                self.add_unmapped(i, took, keep);
                if let Some(e) = failed {
                    return Err(PoolError::Device(e));
                }
            }
        }
        if switch_only {
            // The budget declined every other move: only what the budget itself needs.
            want = must.max(done.min(want));
        }
        let mut quiet = false;
        let mut skipped = false;
        for (idle, _, i) in victims {
            if done >= want {
                break;
            }
            if !idle && !quiet && done >= must && !may_wait {
                // Only the soft goal is left, and it may not wait for the device.
                break;
            }
            let r = self.streams[self.blocks[i].owner as usize].range;
            let chunks = self.victim_chunks(i, keep);
            let base = self.segs[r].base;
            let mut took = 0;
            let mut failed = None;
            // From the high end; a chunk goes whole (the last one may overshoot `want`).
            for (start, k) in chunks {
                if done >= want {
                    break;
                }
                // Pages the slack rule moved stay where they are unless moving pays over the
                // long run (`MoveBudget::allows_repeat`): moved back and forth between steps,
                // they would cost remaps every step for memory saved only in between.
                if done >= must && !repeat && self.pages_of(r).any_moved(start, start + k) {
                    skipped = true;
                    continue;
                }
                if !idle && !quiet {
                    if self.no_device_waits {
                        // (`alloc_no_wait`: the victims left are none of them idle.)
                        break;
                    }
                    if let Err(e) = vm.quiesce() {
                        failed = Some(e);
                        break;
                    }
                    quiet = true;
                    self.stats.device_wait_count += 1;
                }
                if let Err(e) = self.retire_chunk(vm, base + start * page, k, as_donors) {
                    failed = Some(e);
                    break;
                }
                self.count_unmapped(r, i, start, k);
                done += k;
                took += k;
            }
            self.add_unmapped(i, took, keep);
            if let Some(e) = failed {
                return Err(PoolError::Device(e));
            }
        }
        if done > 0 {
            self.stats.recycle_count += 1;
        }
        if skipped && done < want {
            self.moves.declined += 1;
        }
        Ok(done)
    }

    /// The chunk of `k` pages at page `start` of range `r`, inside free block `i`, left its
    /// address: the page map and the statistics.
    fn count_unmapped(&mut self, r: u32, i: u32, start: u64, k: u64) {
        let page = self.page;
        self.segs[r]
            .pages
            .as_mut()
            .expect("range")
            .unmap_chunks(start, start + k);
        self.mapped_pages -= k;
        let s = &mut self.stats;
        s.reserved_bytes -= k * page;
        s.page_unmap_count += k;
        let stream = self.streams[self.blocks[i].owner as usize].stream.0;
        let base = self.segs[r].base;
        self.note(Action::SegmentUnmap, base + start * page, k * page, stream);
    }

    /// Free block `i` lost `took` mapped pages (relinked: it may turn cold), unless it is the
    /// block being placed, which no index holds.
    fn add_unmapped(&mut self, i: u32, took: u64, keep: Keep) {
        if took > 0 && keep.placing() == Some(i) {
            self.blocks[i].unmapped += pages32(took);
        } else if took > 0 {
            self.unlink(i);
            self.blocks[i].unmapped += pages32(took);
            self.link(i);
        }
    }
}
