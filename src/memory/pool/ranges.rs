//! Virtual ranges: one reserved address range per stream, grown by mapping pages under the
//! blocks placed in it. Reserving the range, placing a request where it needs the fewest new
//! pages, and mapping them (recycling free pages first when the budget or the slack rule says so).

use super::alias::AliasMove;
use super::block::{Block, Kind, State};
use super::cold_search::{ColdKey, ColdSearch};
use super::free_index::Held;
use super::pages::PageMap;
use super::recycle::Moving;
use super::tlsf::NIL;
use super::{pages32, Pool, PoolBacking, PoolError};
use crate::device::{DeviceError, VirtualMemory};
use crate::memory::history::Action;

/// Cold blocks looked at when no mapped free block fits.
pub(super) const COLD_SCAN: usize = 32;
/// Runs of mapped pages inside a cold block whose ends are tried as placements.
pub(super) const MAPPED_RUNS_TRIED: usize = 4;

/// What `Pool::map_runs` does when the device is out of memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum OnOom {
    /// Give the device every free page and idle segment the pool holds, then retry once.
    Reclaim,
    /// Fail: the caller can do without these pages.
    Fail,
}

impl Pool {
    /// Pages `[p0, p1)` of range `r` that a block at `[addr, addr + size)` touches.
    #[inline]
    pub(super) fn touched(&self, r: u32, addr: u64, size: u64) -> (u64, u64) {
        // Pages are a power of two: shifts, not divisions (this is on the allocation path).
        let base = self.segs[r].base;
        let shift = self.page.trailing_zeros();
        (
            (addr - base) >> shift,
            (addr + size - base + (self.page - 1)) >> shift,
        )
    }

    /// Pages `[p0, p1)` of range `r` lying wholly inside `[addr, addr + size)` (p0 ≥ p1: none).
    #[inline]
    pub(super) fn interior(&self, r: u32, addr: u64, size: u64) -> (u64, u64) {
        let base = self.segs[r].base;
        let shift = self.page.trailing_zeros();
        (
            (addr - base + (self.page - 1)) >> shift,
            (addr + size - base) >> shift,
        )
    }

    pub(super) fn pages_of(&self, r: u32) -> &PageMap {
        self.segs[r]
            .pages
            .as_ref()
            .expect("a virtual range has a page map")
    }

    /// The stream's range, reserving it on first use; `None` if the device cannot reserve one.
    pub(super) fn ensure_range(&mut self, vm: &dyn VirtualMemory, si: u32) -> Option<u32> {
        let st = &self.streams[si as usize];
        if st.range != NIL {
            return Some(st.range);
        }
        if st.range_failed {
            return None;
        }
        let g = vm.granularity();
        // Pages are the device's granularity; `chunk_pages` decides how many one physical
        // allocation covers.
        let page = g.max(self.config.alignment);
        let usable = g.is_power_of_two() && page >= self.config.alignment;
        if !usable || (self.page != 0 && page != self.page) {
            log::warn!("gkrt pool: the device's granularity {g} is unusable; using plain segments");
            self.streams[si as usize].range_failed = true;
            return None;
        }
        let size = self.config.reserve_bytes(page);
        let base = match vm.reserve(size) {
            // Pages are counted from the base: granularity alignment is all mapping needs.
            Ok(base)
                if base.is_multiple_of(g.max(self.config.alignment))
                    && !self.overlaps_tracked(base, size) =>
            {
                base
            }
            Ok(base) => {
                log::warn!("gkrt pool: reserved range {base:#x} is unusable; using plain segments");
                let _ = vm.unreserve(base, size);
                self.streams[si as usize].range_failed = true;
                return None;
            }
            Err(e) => {
                log::warn!(
                    "gkrt pool: reserving {size} bytes of address space failed ({e}); using plain segments"
                );
                self.streams[si as usize].range_failed = true;
                return None;
            }
        };
        self.page = page;
        let i = self.add_segment(base, size, Kind::Virtual, si);
        let r = self.blocks[i].seg;
        self.segs[r].pages = Some(PageMap::new(size / page));
        self.blocks[i].unmapped = pages32(size / page);
        self.link(i);
        self.streams[si as usize].range = r;
        Some(r)
    }

    /// Allocation in the stream's virtual range when no mapped free block fits (`alloc_inner`
    /// tried those, and the start of the range's last block: not tried again here, the state
    /// is the same; a range reserved here has no mapped page, so no mapped start either);
    /// `Ok(None)`: the range cannot hold it (use plain segments).
    /// `first`: `first_cold_fit(si, rounded)`, found already.
    pub(super) fn alloc_virtual(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        si: u32,
        (bytes, rounded): (u64, u64),
        first: Option<ColdKey>,
    ) -> Result<Option<u32>, PoolError> {
        let Some(r) = self.ensure_range(vm, si) else {
            return Ok(None);
        };
        self.cold_placements += 1;
        let Some((cand, pos, need)) = self.place_cold(si, r, rounded, first) else {
            return Ok(None);
        };
        // With no page to map nothing reads the cold set before the carve: `cand`'s entry can
        // wait there for a piece of it.
        let held = if need == 0 {
            self.unlink_held(cand)
        } else {
            self.unlink(cand);
            None
        };
        let (p0, p1) = self.touched(r, pos, rounded);
        debug_assert_eq!(need, self.pages_of(r).count_unmapped(p0, p1));
        if need > 0 {
            if let Err(e) = self.map_pages(backing, vm, r, cand, (p0, p1), need, (bytes, rounded)) {
                // Pages mapped before the failure stay mapped inside the (still free) block.
                self.relink_counted(r, cand);
                return Err(e);
            }
        }
        let total = self.blocks[cand].unmapped as u64 - need;
        Ok(Some(self.carve_cold(r, cand, pos, rounded, total, held)))
    }

    /// Carves `[pos, pos + size)` out of the unlinked free block `cand` of range `r`, every page
    /// under it mapped, the rest of the block keeping `total` unmapped pages: the pieces around
    /// it are linked with their counts, and the carved block (unlinked) is returned. `held`:
    /// `cand`'s cold set entry, left for the larger piece (`unlink_held`).
    #[inline(always)]
    pub(super) fn carve_cold(
        &mut self,
        r: u32,
        cand: u32,
        pos: u64,
        size: u64,
        total: u64,
        held: Option<Held>,
    ) -> u32 {
        let (addr, bsize) = (self.blocks[cand].addr, self.blocks[cand].size);
        let mut block = cand;
        let mut low = None;
        if pos > addr {
            low = Some(cand);
            block = self.cut(cand, pos - addr);
        }
        let mut high = None;
        if pos + size < addr + bsize {
            high = Some(self.cut(block, size));
        }
        let count = |p: &Pool, i: u32| {
            let b = &p.blocks[i];
            let (q0, q1) = p.interior(r, b.addr, b.size);
            if q0 < q1 {
                p.pages_of(r).count_unmapped(q0, q1)
            } else {
                0
            }
        };
        match (low, high) {
            (Some(l), Some(h)) => {
                // Count the smaller piece page by page, deduce the other.
                let (small, big) = if self.blocks[l].size <= self.blocks[h].size {
                    (l, h)
                } else {
                    (h, l)
                };
                // (Nothing to count when the block had no unmapped page: a carve in a warm block.)
                let n = if total == 0 { 0 } else { count(self, small) };
                self.blocks[small].unmapped = pages32(n);
                self.blocks[big].unmapped = pages32(total - n);
                // In the order `l`, `h` (the warm lists keep it); the held entry to the
                // larger piece, the likelier to stay cold.
                if big == l {
                    self.link_held(l, held);
                    self.link(h);
                } else {
                    self.link(l);
                    self.link_held(h, held);
                }
            }
            (Some(p), None) | (None, Some(p)) => {
                self.blocks[p].unmapped = pages32(total);
                self.link_held(p, held);
            }
            (None, None) => {
                debug_assert_eq!(total, 0);
                self.drop_held(held);
            }
        }
        self.blocks[block].unmapped = 0;
        block
    }

    /// The cold placement `first_cold_fit` found (`first`), taken without the rest of the
    /// search when it needs no new page: a cold hole's end holding the request on mapped pages
    /// (the steady passes of resnet_infer_sizes, lstm_train and infer_batches place nearly all
    /// their cold requests so, at the end of one hole). `place_cold` would choose it: an earlier
    /// set entry has no such end, a later one is larger or lies above, and the range's last
    /// block wins only if it is smaller (then this returns `None`, for the full search). Carved
    /// as `alloc_virtual` carves it, the same records included.
    pub(super) fn take_cold_end(&mut self, si: u32, size: u64, first: ColdKey) -> Option<u32> {
        let ((need, bsize, pos), cand) = first;
        let r = self.streams[si as usize].range;
        let t = &self.blocks[self.segs[r].tail];
        if need > 0 || (t.cold && t.state == State::Free && t.size >= size && t.size < bsize) {
            return None;
        }
        #[cfg(all(test, debug_assertions))]
        assert_eq!(
            self.place_cold(si, r, size, Some(first)),
            Some((cand, pos, 0)),
            "take_cold_end differs from place_cold"
        );
        self.cold_placements += 1;
        let held = self.unlink_held(cand);
        let total = self.blocks[cand].unmapped as u64;
        Some(self.carve_cold(r, cand, pos, size, total, held))
    }

    /// The common cold placement in one step: no other cold block has an end that holds `size`
    /// bytes with no new page (`first_cold_fit` found none; on most traces with page moves, the
    /// holes they left hold few of the requests that reach here), and the range's last block
    /// (free) has `size` mapped bytes at its start — `place_cold` would choose exactly that: an
    /// end needing no page beats every other, and the tail's high end lies above. The block is
    /// carved there; the rest stays the last block with the same unmapped pages (none of them is
    /// under the carved part). The caller has made sure that no other cold block holds the
    /// request at an end with no new page.
    ///
    /// `CARVE_NEW`: the carved part takes a new record and the tail keeps its own (the form
    /// taken while the stream has no other cold block); otherwise the tail's record becomes the
    /// carved block and the rest a new record, as `alloc_virtual` leaves them. Records are
    /// chosen as before each shortcut so that every later choice is the same: recycling breaks
    /// ties between victims by record index (`recycle_victims`; llama_train's placements
    /// changed when this form was not kept, session 13). A constant, so that the common form
    /// costs no more than before (callgrind: a run-time flag added 2–4 instructions per
    /// operation on traces with no cold block).
    pub(super) fn take_tail_prefix<const CARVE_NEW: bool>(
        &mut self,
        si: u32,
        r: u32,
        size: u64,
    ) -> Option<u32> {
        let t = self.segs[r].tail;
        let b = &self.blocks[t];
        debug_assert!(self
            .first_cold_fit(si, size)
            .is_none_or(|((unmapped, _, _), _)| unmapped > 0));
        if b.state != State::Free || !b.cold || b.size <= size {
            return None;
        }
        let (p0, p1) = self.touched(r, b.addr, size);
        if !self.pages_of(r).all_mapped(p0, p1) {
            return None;
        }
        // Unit tests hold this shortcut to the full search's choice.
        #[cfg(all(test, debug_assertions))]
        assert_eq!(
            self.place_cold(si, r, size, self.first_cold_fit(si, size)),
            Some((t, b.addr, 0)),
            "take_tail_prefix differs from place_cold"
        );
        if !CARVE_NEW {
            // The rest becomes the last block under a new record, with the tail's unmapped
            // pages (none is under the carved part); being the range's last block it joins no
            // ordered set.
            let mut rest = b.free_piece(b.addr + size, b.size - size, t, NIL);
            rest.unmapped = b.unmapped;
            rest.cold = true;
            let j = self.blocks.insert(rest);
            self.segs[r].tail = j;
            let b = &mut self.blocks[t];
            b.next = j;
            b.size = size;
            b.unmapped = 0;
            b.cold = false;
            return Some(t);
        }
        // Carve a new block off the low end; the tail keeps its record, its unmapped pages
        // (none of them is under the carved part) and its index (being the range's last block,
        // it is in no ordered set), so nothing is unlinked or linked.
        let low = b.free_piece(b.addr, size, b.prev, t);
        let prev = b.prev;
        let j = self.blocks.insert(low);
        if prev != NIL {
            self.blocks[prev].next = j;
        } else {
            self.segs[r].first = j;
        }
        let b = &mut self.blocks[t];
        b.prev = j;
        b.addr += size;
        b.size -= size;
        Some(j)
    }

    /// The first step of `place_cold`, taken before it: the ends of the cold blocks of `si`
    /// that may need no new page (those `place_cold` looks at, in the set's order) offered
    /// until one needs none. Returns the best so far: with no new page, the block `place_cold`
    /// chooses among the set's (an end needing no page beats every end needing some, and an
    /// earlier entry is smaller, or as large and lower) — and, when there is none, the range
    /// tail's mapped start is taken directly (`take_tail_prefix`).
    pub(super) fn first_cold_fit(&self, si: u32, size: u64) -> Option<ColdKey> {
        let st = &self.streams[si as usize];
        if st.cold.is_empty() {
            return None;
        }
        let r = st.range;
        let pages = self.pages_of(r);
        let mut best = ColdSearch::new(pages, self.segs[r].base, self.page, size);
        for &(_, _, i) in st.cold.at_least(size).take(COLD_SCAN) {
            let b = &self.blocks[i];
            if !self.may_need_no_page(b, size) {
                continue;
            }
            best.offer_ends(i, b);
            if best.needs_no_page() {
                break;
            }
        }
        best.best()
    }

    /// Whether the bytes of free block `b` outside its unmapped pages can hold `size`: only then
    /// can an end of it need no new page (on llama_train 9 in 10 cold entries looked at cannot:
    /// session 12).
    #[inline(always)]
    fn may_need_no_page(&self, b: &Block, size: u64) -> bool {
        size <= b.size.saturating_sub(b.unmapped as u64 * self.page)
    }

    /// Where to put `size` bytes among the cold blocks of `si` (and the range's tail): the
    /// low or high end of a block, fewest unmapped pages first, then best fit, then lowest
    /// address. Returns the block, the position and the unmapped pages the request touches
    /// there (counted already: the caller maps them). `first`: `first_cold_fit(si, size)`.
    pub(super) fn place_cold(
        &self,
        si: u32,
        r: u32,
        size: u64,
        first: Option<ColdKey>,
    ) -> Option<(u32, u64, u64)> {
        let st = &self.streams[si as usize];
        let pages = self.pages_of(r);
        let base = self.segs[r].base;
        let mut best = ColdSearch::new(pages, base, self.page, size).resume(first);
        let tail = self.segs[r].tail;
        let tail = self.blocks[tail].cold.then_some(tail);
        let fits = |&i: &u32| {
            let b = &self.blocks[i];
            b.state == State::Free && b.size >= size
        };
        let in_set = || {
            st.cold
                .at_least(size)
                .take(COLD_SCAN)
                .map(|&(_, _, i)| i)
                .filter(fits)
        };
        let candidates = || in_set().chain(tail.filter(fits));
        // The set comes in (size, addr) order: once an end needs no new page, every later
        // entry loses to it (a larger block on size, an equal one on address, lying above),
        // so the rest is not looked at; only the tail, out of that order, still may win. Every
        // key needing new pages loses to one needing none, so a first pass (`first_cold_fit`,
        // its best so far resumed here) offers only the entries that can have such an end.
        // Only if neither they nor the tail have one are the others offered too (the best of
        // all offers does not depend on their order).
        debug_assert_eq!(first, self.first_cold_fit(si, size));
        if let Some(t) = tail.filter(fits) {
            best.offer_ends(t, &self.blocks[t]);
        }
        if !best.needs_no_page() {
            for i in in_set() {
                let b = &self.blocks[i];
                if !self.may_need_no_page(b, size) {
                    best.offer_ends(i, b);
                }
            }
        }
        #[cfg(all(test, debug_assertions))]
        {
            // Unit tests check the early stop and the skipped counts against counting every
            // end of every candidate.
            let mut all: Option<((u64, u64, u64), u32)> = None;
            for i in candidates() {
                let b = &self.blocks[i];
                for pos in [b.addr, b.addr + b.size - size] {
                    let (p0, p1) = self.touched(r, pos, size);
                    let key = (pages.count_unmapped(p0, p1), b.size, pos);
                    if all.is_none_or(|(k, _)| key < k) {
                        all = Some((key, i));
                    }
                }
            }
            assert_eq!(
                best.best(),
                all,
                "place_cold's shortcuts changed the choice"
            );
        }
        if best.needs_pages() {
            // No end of a block avoids new pages: try the ends of the runs of mapped pages
            // inside large blocks, so mapped memory in the middle of a block is used where it
            // is rather than moved to an end (which moves pages back and forth every step on
            // a trace like GPT-2's: BENCHMARKS.md §3).
            //
            // A position needing no page lies on mapped pages: at most one edge page on either
            // side of a run of the block's own. So the blocks with enough mapped pages go first;
            // once one of them gives such a position the others cannot (and larger blocks lose
            // to it on size). Only when none does are the rest offered: every block once, and
            // the best of all offers does not depend on their order.
            let least = size.div_ceil(self.page);
            // The runs of mapped pages `[q0, q1)` of block `i` offered to `best`.
            let offer_runs = |best: &mut ColdSearch, i: u32, (q0, q1): (u64, u64)| {
                let b = &self.blocks[i];
                let (lo_end, hi_end) = (b.addr, b.addr + b.size);
                let mut runs = 0;
                pages.each_run(q0, q1, true, |(p, n)| {
                    let (lo, hi) = (base + p * self.page, base + (p + n) * self.page);
                    // A request inside the run touches only its mapped pages: no count.
                    if lo + size <= hi {
                        best.offer_mapped(i, lo, b.size);
                        best.offer_mapped(i, hi - size, b.size);
                        runs += 1;
                        return runs < MAPPED_RUNS_TRIED;
                    }
                    if lo + size <= hi_end {
                        best.offer(i, lo, b.size);
                    }
                    if hi >= lo_end + size {
                        best.offer(i, hi - size, b.size);
                    }
                    runs += 1;
                    runs < MAPPED_RUNS_TRIED
                });
            };
            // Block `i`'s interior pages and how many of them are mapped, if it is large enough
            // and any is.
            let inside = |i: u32| {
                let b = &self.blocks[i];
                let (q0, q1) = self.interior(r, b.addr, b.size);
                let mapped = q1.saturating_sub(q0).saturating_sub(b.unmapped as u64);
                (b.size > size + self.page && mapped > 0).then_some(((q0, q1), mapped))
            };
            #[cfg(all(test, debug_assertions))]
            let mut every = ColdSearch::new(pages, base, self.page, size).resume(best.best());
            #[cfg(all(test, debug_assertions))]
            for i in candidates() {
                if let Some((q, _)) = inside(i) {
                    offer_runs(&mut every, i, q);
                }
            }
            for holds in [true, false] {
                for i in candidates() {
                    let Some((q, mapped)) = inside(i) else {
                        continue;
                    };
                    let may_hold = mapped + 2 >= least;
                    if may_hold == holds && !best.beats_block(self.blocks[i].size) {
                        offer_runs(&mut best, i, q);
                    }
                }
                if best.needs_no_page() {
                    break;
                }
            }
            // Unit tests hold the two rounds to one round over every block.
            #[cfg(all(test, debug_assertions))]
            assert_eq!(best.best(), every.best(), "the rounds changed the choice");
        }
        best.chosen()
    }

    /// Maps the unmapped pages among `[p0, p1)` of range `r` (`need` of them) for a block to be
    /// placed in the free block `cand`, recycling free pages first when the budget or the slack
    /// rule says so.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn map_pages(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        r: u32,
        cand: u32,
        (p0, p1): (u64, u64),
        need: u64,
        (bytes, rounded): (u64, u64),
    ) -> Result<(), PoolError> {
        let placing = Some((cand, p0, p1));
        if !self.moves.started_lifetime() {
            // The first pages (since the start or `release_cached`): the move budget's lifetime
            // share starts here.
            self.moves.note_start(backing.now_ns());
        }
        let page = self.page;
        let add = need * page;
        let limit = self.config.memory_limit;
        let over_limit = |p: &Pool| {
            p.stats
                .reserved_bytes
                .checked_add(add)
                .is_none_or(|t| t > limit)
        };
        let mut must = 0;
        if over_limit(self) {
            let excess = (self.stats.reserved_bytes + add).saturating_sub(limit);
            must = excess.div_ceil(page);
        }
        let mut want = must;
        let mut repeat = false;
        let mut startup = false;
        let mut at_peak = false;
        let mut empty_only = false;
        // With aliases, a move keeps the chunks it takes mapped until they are placed
        // (`alias.rs`), and switching one back to its shadow here costs nothing.
        let aliasing = self.aliasing(vm);
        let mut alias = (aliasing && must > 0).then(|| AliasMove {
            targets: self.switch_targets(r, p0, p1),
            switch_only: false,
        });
        let hw = self
            .high_water
            .max(self.stats.allocated_bytes + self.pending_bytes + rounded);
        // A request raising the high-water mark makes the footprint later steps keep: no slack
        // (`tight_peaks`).
        let slack_permille = if self.config.tight_peaks && hw > self.high_water {
            0
        } else {
            self.config.recycle_slack_permille
        };
        // Growth that alone exceeds the slack counts too (on a small heap, a granule may).
        let slack_bytes = hw / 1000 * slack_permille;
        if add >= self.config.recycle_min_bytes.min(slack_bytes) {
            // No move below the most ever mapped: there a move lowers no peak, it only costs time.
            let cap = self.cap_over(hw, slack_permille).max(self.mapped_peak);
            let mut slack = (self.mapped_pages + need).saturating_sub(cap);
            if slack == 0 && must == 0 {
                // Within the cap, the pages a stream at rest left mapped in its empty range go
                // before the most ever mapped rises, and no others: moving one costs what
                // mapping a new one does (`empty_range_moves`).
                let rise = (self.mapped_pages + need).saturating_sub(self.mapped_peak);
                slack = self.pages_in_empty_ranges(r).min(rise);
                empty_only = slack > 0;
            }
            // Only while moves have paid for themselves (move_budget.rs).
            let (now, permille) = (backing.now_ns(), self.config.recycle_time_permille);
            if slack > must {
                let targets = if aliasing {
                    self.switch_targets(r, p0, p1)
                } else {
                    Vec::new()
                };
                // Start-up moves (an experiment, off by default): the first step held tight,
                // outside the budget and uncharged (BENCHMARKS.md, session 25).
                startup = self.config.startup_moves
                    && !self.moves.startup_over
                    && self.moves.startup_moved < hw;
                // A request that brings the program to its own peak, raising it or reaching
                // it again, or one of a step that raised it (`new_step.rs`): its moves are
                // not asked of the bucket (move_budget.rs).
                let peak = self.stats.allocated_bytes + rounded;
                let new_step = self.config.new_step_moves && self.new_step.is_new();
                at_peak = self.config.peak_moves
                    && permille > 0
                    && (peak >= self.program_peak() || new_step)
                    && self.moves.allows_at_peak(peak.max(self.program_peak()));
                if startup || at_peak || self.moves.allows(now, permille) {
                    want = slack;
                    // With aliases a move back is a switch, free: `alias_moves_again` lets
                    // pages a move placed move again without the lifetime share.
                    repeat = startup
                        || at_peak
                        || self.moves.allows_repeat(now, permille)
                        || (aliasing && self.moves_again_allowed());
                    alias = aliasing.then_some(AliasMove {
                        targets,
                        switch_only: false,
                    });
                } else if !targets.is_empty() {
                    // Chunks whose shadows lie here move back for free: the budget is not
                    // asked, and nothing else moves.
                    want = slack;
                    alias = Some(AliasMove {
                        targets,
                        switch_only: true,
                    });
                }
            }
        }
        // A slack-rule move is timed from here to the end of the mapping.
        let started = (want > must).then(|| backing.now_ns());
        let mut moved = 0;
        if want > 0 {
            let moving = Moving {
                bucket: want > must && !(startup || at_peak),
                victims_of: self.own_stream_victims(r),
                empty_only,
            };
            let recycled = self.recycle(
                backing,
                vm,
                want,
                must,
                placing.into(),
                repeat,
                alias.as_ref(),
                moving,
            );
            match recycled {
                Ok(n) => moved = n.saturating_sub(must),
                Err(e) => {
                    let _ = self.release_donors(vm);
                    return Err(e);
                }
            }
        }
        if over_limit(self) {
            let released = self.release_idle_segments(backing);
            if released.is_err() || over_limit(self) {
                let _ = self.release_donors(vm);
                released?;
                return Err(self.oom(bytes));
            }
        }
        // Donors switched or aliased into [p0, p1), shadows there unmapped, the rest unmapped
        // (the budget counted the donors gone and these pages to map: what is left for
        // `map_runs` is fewer).
        let unmaps = self.aliases.unmaps;
        self.place_donors(vm, r, (p0, p1))?;
        let undone = must == 0 && self.aliases.unmaps > unmaps;
        let base = self.segs[r].base;
        let runs = self.pages_of(r).runs(p0, p1, false);
        let mapped = self.map_runs(backing, vm, r, base, &runs, placing, bytes, OnOom::Reclaim);
        if undone {
            // Not the budget's unmapping: a move (this one or an earlier one) undone.
            self.moves.note_undone();
        }
        // Pages placed at the program's peak stay free to move: they are where the program's
        // peak put them, not one end of a back-and-forth.
        if moved > 0 && mapped.is_ok() && !at_peak {
            self.segs[r]
                .pages
                .as_mut()
                .expect("range")
                .mark_moved(p0, p1);
        }
        // Spares left by recycling that the new pages did not reuse go back to the device.
        let trimmed = vm.trim();
        if startup {
            self.moves.startup_moved += moved * page;
            if moved > 0 {
                let si = self.blocks[self.segs[r].first].owner as usize;
                self.streams[si].moved_at_start = true;
            }
        } else if at_peak {
            // Bounded by their own allowance, not charged to the bucket (move_budget.rs).
            self.moves.note_peak_move(moved * page);
        } else if let Some(t0) = started {
            self.moves.charge(backing.now_ns().saturating_sub(t0));
        }
        if want > must && log::log_enabled!(log::Level::Debug) {
            // Why each slack-rule move was made, and what it cost: the figures a live program's
            // page maps are read against (the host replay's device is always idle).
            log::debug!(
                "gkrt pool: slack move for {bytes} bytes: wanted {want} pages, moved {moved}, must {must}; at peak {at_peak}, startup {startup}, repeat {repeat}; {} ns, device waits so far {}; budget {:?}",
                started.map_or(0, |t0| backing.now_ns().saturating_sub(t0)),
                self.stats.device_wait_count,
                self.moves
            );
        }
        mapped?;
        Ok(trimmed?)
    }

    /// The slack rule's cap, in pages, over `hw` bytes in use: `recycle_slack_permille` of it
    /// more, and at least one granule (the rounding of the top of used memory).
    pub(super) fn slack_cap(&self, hw: u64) -> u64 {
        self.cap_over(hw, self.config.recycle_slack_permille)
    }

    /// Pages that may be mapped over `hw` bytes in use with `permille` thousandths of slack:
    /// at least one page more than `hw` needs.
    pub(super) fn cap_over(&self, hw: u64, permille: u64) -> u64 {
        let allowed = hw + hw / 1000 * permille;
        allowed.div_ceil(self.page).max(hw.div_ceil(self.page) + 1)
    }

    /// Links the free block `t` of range `r` again with its unmapped pages counted afresh.
    pub(super) fn relink_counted(&mut self, r: u32, t: u32) {
        let (addr, size) = (self.blocks[t].addr, self.blocks[t].size);
        let (q0, q1) = self.interior(r, addr, size);
        let n = if q0 < q1 {
            self.pages_of(r).count_unmapped(q0, q1)
        } else {
            0
        };
        self.blocks[t].unmapped = pages32(n);
        self.link(t);
    }

    /// Maps `runs` of range `r` (at `base`) for a request of `bytes`. When the device is out
    /// of memory, `on_oom` says whether the pool first gives it every free page and idle
    /// segment it holds (waiting for the device where it must) and retries — what a request
    /// needs — or fails at once, leaving what it holds alone: what a plan's optional gathering
    /// needs, which then is not followed (`epoch_follow.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn map_runs(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        r: u32,
        base: u64,
        runs: &[(u64, u64)],
        placing: Option<(u32, u64, u64)>,
        bytes: u64,
        on_oom: OnOom,
    ) -> Result<(), PoolError> {
        let page = self.page;
        for &(p, n) in runs {
            let mut at = p;
            while at < p + n {
                // Full chunks of the size the heap has grown to, then one of what is left.
                let c = self.chunk_pages(p + n - at);
                let left = p + n - at;
                let (size, count) = if left >= c { (c, left / c) } else { (left, 1) };
                let addr = base + at * page;
                let mut result = vm.map(addr, size * page, count);
                if let (Err(DeviceError::OutOfMemory { .. }), OnOom::Reclaim) = (&result, on_oom) {
                    // Give the device every free page and idle segment we hold, then retry.
                    self.recycle_all(backing, vm, placing.into())?;
                    vm.trim()?;
                    self.release_idle_segments(backing)?;
                    result = vm.map(addr, size * page, count);
                }
                match result {
                    Ok(()) => {}
                    Err(DeviceError::OutOfMemory { .. }) => return Err(self.oom(bytes)),
                    Err(e) => return Err(PoolError::Device(e)),
                }
                let pages = self.segs[r].pages.as_mut().expect("range");
                for k in 0..count {
                    pages.map_chunk(at + k * size, at + (k + 1) * size);
                }
                let n = size * count;
                at += n;
                self.count_mapped(r, addr, n);
            }
        }
        Ok(())
    }

    /// `n` pages from `addr` of range `r` were made usable (the page map says so already):
    /// the mapped count, its peak, reserved bytes and their peak, the history.
    pub(super) fn count_mapped(&mut self, r: u32, addr: u64, n: u64) {
        let page = self.page;
        self.mapped_pages += n;
        self.mapped_peak = self.mapped_peak.max(self.mapped_pages);
        let s = &mut self.stats;
        s.reserved_bytes += n * page;
        s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
        s.page_map_count += n;
        let stream = self.streams[self.blocks[self.segs[r].first].owner as usize]
            .stream
            .0;
        self.note(Action::SegmentMap, addr, n * page, stream);
    }
}
