//! Following epoch plans (`epochs.rs`): at an epoch's first allocation the plan is chosen and
//! its pages gathered — into an empty range, or around the floor's blocks — then each
//! allocation is carved at its planned place; and an epoch the recording found is kept with the
//! range's allocated blocks as its floor.

use super::block::State;
use super::epoch_plan::{Plan, Terms};
use super::epochs::Mode;
use super::ranges::OnOom;
use super::recycle::{Keep, Moving};
use super::tlsf::NIL;
use super::{Pool, PoolBacking, PoolError};
use crate::device::VirtualMemory;

impl Pool {
    /// The range `r` of stream `si` has emptied.
    #[inline(never)]
    pub(super) fn range_emptied(&mut self, si: u32) {
        self.streams[si as usize].epochs.on_empty();
        self.moves.note_steady();
        if self.streams[si as usize].moved_at_start {
            // The range start-up moves held has emptied: its first step is over.
            self.moves.startup_over = true;
        }
    }

    /// The allocated blocks of range `r`, but `except`: address, size.
    fn allocated_in_but(&self, r: u32, except: u32) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut i = self.segs[r].first;
        while i != NIL {
            let b = &self.blocks[i];
            if b.state == State::Allocated && i != except {
                out.push((b.addr, b.size));
            }
            i = b.next;
        }
        out
    }

    fn allocated_in(&self, r: u32) -> Vec<(u64, u64)> {
        self.allocated_in_but(r, NIL)
    }

    /// Stream `si`'s recording found an epoch ending at the free of block `freed` (still
    /// marked allocated): it is kept with the range's other allocated blocks as its floor.
    #[inline(never)]
    pub(super) fn keep_found_epoch(&mut self, si: u32, freed: u32) {
        self.moves.note_steady();
        let r = self.streams[si as usize].range;
        let mut floor = Vec::new();
        if r != NIL {
            let base = self.segs[r].base;
            floor = self.allocated_in_but(r, freed);
            for b in &mut floor {
                b.0 -= base;
            }
        }
        self.streams[si as usize].epochs.keep_ended(floor);
    }

    /// Allocation `rounded` on stream `si` (range `r`) while its epochs are ready to follow a
    /// plan or following one: the planned block, or `None` (placed as usual; the plan is left).
    #[inline(never)]
    pub(super) fn alloc_planned(
        &mut self,
        backing: &dyn PoolBacking,
        si: u32,
        rounded: u64,
    ) -> Result<Option<u32>, PoolError> {
        let r = self.streams[si as usize].range;
        let e = &mut self.streams[si as usize].epochs;
        if e.mode == Mode::Following
            && e.following_period()
            && e.plan.as_ref().is_some_and(|p| e.next as usize == p.young)
        {
            // A period's turn followed to its end: this allocation starts the next.
            e.end_turn();
        }
        if e.mode == Mode::Steering {
            return Ok(self.steer(si, r, rounded));
        }
        if self.streams[si as usize].epochs.mode == Mode::Ready {
            // A steering turn's slots its carried allocations did not take go back.
            self.release_holds(si);
            if self.streams[si as usize].epochs.period_pending() {
                if r != NIL {
                    let floor = self.logged_floor(si, r);
                    let (base, align) = (self.segs[r].base, self.config.alignment);
                    self.streams[si as usize]
                        .epochs
                        .keep_period(&floor, base, align);
                } else {
                    self.streams[si as usize].epochs.forget_period();
                }
            }
            if self.streams[si as usize].epochs.stale() && r != NIL {
                let blocks = self.allocated_in(r);
                self.streams[si as usize].epochs.recount(blocks.into_iter());
            }
            let terms = self.plan_terms();
            let seq_before = self.stats.alloc_count;
            let planned = self.streams[si as usize].epochs.planned;
            let t0 = log::log_enabled!(log::Level::Debug).then(|| backing.now_ns());
            let chose = self.streams[si as usize]
                .epochs
                .choose(rounded, terms, seq_before);
            let e = &self.streams[si as usize].epochs;
            if let Some(t0) = t0.filter(|_| e.planned > planned) {
                // What a plan costs the allocation that makes it: the figure a live program's
                // slow steps are read against.
                let (young, floor) = e
                    .plan
                    .as_ref()
                    .map_or((0, 0), |p| (p.young, p.sizes.len() - p.young));
                log::debug!(
                    "gkrt pool: planned an epoch of {young} allocations over {floor} kept blocks in {} ns",
                    backing.now_ns().saturating_sub(t0)
                );
            }
            if !chose {
                // Logged (`hand_out`), placed as usual — but a period's carry, steered.
                if self.hold_slots(backing, si, r)? {
                    return Ok(self.steer(si, r, rounded));
                }
                return Ok(None);
            }
            let plan = self.streams[si as usize].epochs.plan.clone();
            let gathered = match (backing.vmm(), plan) {
                (Some(vm), Some(plan)) if r != NIL => {
                    if !self.pin_floor(si, r, &plan) {
                        log::debug!("gkrt pool: an epoch plan's floor block is not where it was");
                        false
                    } else {
                        let mapped = if self.range_is_empty(r) {
                            self.gather_pages(backing, vm, &plan, r)?
                        } else {
                            self.gather_around_floor(backing, vm, &plan, r)?
                        };
                        if !mapped {
                            // The plan fits its epoch, but its pages cannot be mapped now (its
                            // footprint over what the pool may map, or the device full): the
                            // epoch stays kept with its plan, so that finding it again costs
                            // no new plan (a pass of 70,000 allocations: 130 ms).
                            self.streams[si as usize].epochs.keep_unmapped_plan();
                        }
                        mapped
                    }
                }
                _ => false,
            };
            if !gathered {
                self.leave_plan(si, r, rounded);
                return Ok(None);
            }
        }
        let mut placed = self.take_planned(si, r, rounded);
        if placed.is_none() && self.switch_variant(backing, si, r, rounded)? {
            placed = self.take_planned(si, r, rounded);
        }
        let e = &mut self.streams[si as usize].epochs;
        match placed {
            Some(i) => {
                e.placed[e.next as usize] = i;
                e.next += 1;
                Ok(Some(i))
            }
            None => {
                log::debug!(
                    "gkrt pool: epoch plan left at its allocation {} of {} ({rounded} bytes)",
                    e.next,
                    e.plan.as_ref().map_or(0, |p| p.young)
                );
                self.leave_plan(si, r, rounded);
                Ok(None)
            }
        }
    }

    /// The plan stream `si` follows in range `r` is left at this allocation: an epoch's for the
    /// rest of the epoch; a period's for good, the stream recording again (its live figures
    /// counted afresh first when they missed the turn's blocks).
    fn leave_plan(&mut self, si: u32, r: u32, rounded: u64) {
        let seq_before = self.stats.alloc_count;
        if !self.streams[si as usize].epochs.following_period() {
            self.streams[si as usize].epochs.leave(rounded);
            return;
        }
        if !self.streams[si as usize].epochs.is_recording() && r != NIL {
            let blocks = self.allocated_in(r);
            self.streams[si as usize].epochs.recount(blocks.into_iter());
        }
        self.streams[si as usize].epochs.leave_period(seq_before);
    }

    /// What the pool's plans are made to.
    fn plan_terms(&self) -> Terms {
        Terms {
            align: self.config.alignment,
            page: self.page,
            room_permille: self.config.plan_room_permille,
        }
    }

    /// The plan followed has not `rounded` bytes next: stream `si` goes on with a variant's
    /// that has (`Epochs::variant_at`), its floor's anchors found and its pages mapped. False
    /// when there is none, or those fail (the plan is then left).
    fn switch_variant(
        &mut self,
        backing: &dyn PoolBacking,
        si: u32,
        r: u32,
        rounded: u64,
    ) -> Result<bool, PoolError> {
        let Some(vm) = backing.vmm().filter(|_| r != NIL) else {
            return Ok(false);
        };
        let terms = self.plan_terms();
        let e = &mut self.streams[si as usize].epochs;
        let Some(plan) = e.variant_at(rounded, terms) else {
            return Ok(false);
        };
        log::debug!(
            "gkrt pool: epoch plan switched to a variant's at its allocation {} ({rounded} bytes)",
            self.streams[si as usize].epochs.next
        );
        if self.pin_floor(si, r, &plan) && self.gather_runs(backing, vm, &plan.pages, r)? {
            return Ok(true);
        }
        // Left for want of its floor's anchors or pages, as a plan that cannot start: its kept
        // epoch stays as it is.
        self.streams[si as usize].epochs.keep_unmapped_plan();
        Ok(false)
    }

    /// Before following a plan: the floor's blocks that anchor its allocations, found where
    /// the plan has them (a live block of that size at that address; the rest of the floor is
    /// known by its hash). False when one is not there.
    fn pin_floor(&mut self, si: u32, r: u32, plan: &Plan) -> bool {
        let base = self.segs[r].base;
        for &f in &plan.pins {
            let f = f as usize;
            let addr = base + plan.offsets[f];
            let Some(i) = self.live.get(addr) else {
                return false;
            };
            let b = &self.blocks[i];
            if b.size != plan.sizes[f] || b.owner != si {
                return false;
            }
            self.streams[si as usize].epochs.placed[f] = i;
        }
        true
    }

    /// The plan's next allocation, carved at its planned place when it is `rounded` bytes and
    /// the place lies in one free block with its pages mapped.
    #[inline(always)]
    fn take_planned(&mut self, si: u32, r: u32, rounded: u64) -> Option<u32> {
        let e = &self.streams[si as usize].epochs;
        let plan = e.plan.as_ref()?;
        let k = e.next as usize;
        if k >= plan.young || plan.sizes[k] != rounded {
            return None;
        }
        let base = self.segs[r].base;
        let pos = base + plan.offsets[k];
        let anchor = plan.anchors[k];
        let cand = if anchor == NIL {
            self.segs[r].first
        } else {
            // The block the anchor took, if it still is that (freed, its record may be vacant
            // or reused: indexes stay valid, `slab.rs`).
            let below = &self.blocks[e.placed[anchor as usize]];
            if below.state != State::Allocated || below.addr != base + plan.offsets[anchor as usize]
            {
                return None;
            }
            below.next
        };
        if cand == NIL {
            return None;
        }
        self.carve_at(r, cand, pos, rounded)
    }

    /// `rounded` bytes at `pos` carved from block `cand` of range `r`, when it is free, holds
    /// them, and their pages are mapped.
    #[inline(always)]
    pub(super) fn carve_at(&mut self, r: u32, cand: u32, pos: u64, rounded: u64) -> Option<u32> {
        let b = &self.blocks[cand];
        if b.state != State::Free || b.addr > pos || b.addr + b.size < pos + rounded {
            return None;
        }
        let total = b.unmapped as u64;
        if b.cold {
            let (p0, p1) = self.touched(r, pos, rounded);
            if !self.pages_of(r).all_mapped(p0, p1) {
                return None;
            }
        }
        let held = self.unlink_held(cand);
        Some(self.carve_cold(r, cand, pos, rounded, total, held))
    }

    /// Before following a plan in the empty range `r`: its footprint mapped, by free pages
    /// moved there (recycling's victims: those the device is done with first, others only where
    /// the slack rule may wait; after the first step, of this stream's ranges and empty ones:
    /// `own_stream_victims`), then new pages as long as the pool maps no more than
    /// the slack rule allows or it ever has, within its limit. False when that is not enough,
    /// or the device has no more: the plan is not followed (what moved stays where it went).
    fn gather_pages(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        plan: &Plan,
        r: u32,
    ) -> Result<bool, PoolError> {
        debug_assert!(self.range_is_empty(r), "gathering in a range in use");
        let t = self.segs[r].first;
        let page = self.page;
        let pp = plan.footprint.div_ceil(page);
        let pages = self.pages_of(r);
        if pp > pages.pages() {
            return Ok(false);
        }
        let need = pages.count_unmapped(0, pp);
        if need == 0 {
            return Ok(true);
        }
        let placing = Some((t, 0, pp));
        self.unlink(t);
        // Free pages moved first: they leave the counts below, and what they saved is mapped
        // again under the footprint.
        let moving = self.gathering(r);
        if let Err(e) = self.recycle(backing, vm, need, 0, placing.into(), true, None, moving) {
            self.relink_counted(r, t);
            return Err(e);
        }
        if !self.room_to_gather(need) {
            // What moved stays unmapped: reserved fell, nothing is mapped in its place.
            self.relink_counted(r, t);
            vm.trim()?;
            return Ok(false);
        }
        let base = self.segs[r].base;
        let runs = self.pages_of(r).runs(0, pp, false);
        // Out of device memory, the plan is not followed: emptying the cache (and waiting for
        // the device) for a placement the request can do without would stall it for nothing.
        let mapped = self.map_runs(backing, vm, r, base, &runs, placing, pp * page, OnOom::Fail);
        self.relink_counted(r, t);
        vm.trim()?;
        match mapped {
            Ok(()) => Ok(true),
            // The device has less than the footprint (it may be shared, or smaller than the
            // epoch that made the plan): the plan is not followed, and the request is placed as
            // usual, which needs only its own bytes. What did map stays, counted.
            Err(PoolError::OutOfMemory { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether `need` new pages may be mapped to gather a plan's: up to the most ever mapped, or
    /// the higher of the slack rule's cap over the high-water mark of bytes in use (which the
    /// epoch's peak, and so about the plan's footprint, is under) — what the usual placement
    /// may map without moving pages — and the plan's room over that mark
    /// (`plan_room_permille`: a followed plan moves no page in the epochs after), and within
    /// the limit.
    fn room_to_gather(&self, need: u64) -> bool {
        self.mapped_pages + need <= self.mapped_peak.max(self.gather_cap())
            && self.stats.reserved_bytes + need * self.page <= self.config.memory_limit
    }

    /// The pages a plan's gathering may bring the pool to beyond the most it ever mapped.
    fn gather_cap(&self) -> u64 {
        let hw = self.high_water;
        let plan_cap = self.cap_over(hw, self.config.plan_room_permille);
        self.slack_cap(hw).max(plan_cap)
    }

    /// Before following a plan around the floor of range `r`: the pages the epoch's
    /// allocations touch mapped (`gather_runs`). False when that is not possible: the plan is
    /// not followed.
    fn gather_around_floor(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        plan: &Plan,
        r: u32,
    ) -> Result<bool, PoolError> {
        self.gather_runs(backing, vm, &plan.pages, r)
    }

    /// The pages of range `r` in `runs` (first page, count; in address order, apart) mapped, by
    /// free pages moved from outside their span (recycling's victims, as in `gather_pages`),
    /// then new ones within `room_to_gather`. False when that is not enough, or the device has
    /// no more. Unmapped pages lie only inside free blocks, so these are too.
    pub(super) fn gather_runs(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        runs: &[(u64, u64)],
        r: u32,
    ) -> Result<bool, PoolError> {
        let need_of = |p: &Pool| {
            let pages = p.pages_of(r);
            let mut need = 0;
            for &(p0, n) in runs {
                if p0 + n > pages.pages() {
                    return None;
                }
                need += pages.count_unmapped(p0, p0 + n);
            }
            Some(need)
        };
        let Some(need) = need_of(self) else {
            return Ok(false);
        };
        if need == 0 {
            return Ok(true);
        }
        // Free pages moved first (recycling's victims, outside the span of the runs): what they
        // save is mapped again in the runs.
        let keep = runs
            .first()
            .zip(runs.last())
            .map_or(Keep::Nothing, |(&(p0, _), &(q0, n))| {
                Keep::Span(r, p0, q0 + n)
            });
        let moving = self.gathering(r);
        self.recycle(backing, vm, need, 0, keep, true, None, moving)?;
        let Some(need) = need_of(self) else {
            return Ok(false);
        };
        let page = self.page;
        if !self.room_to_gather(need) {
            log::debug!(
                "gkrt pool: no room to gather a plan's pages: {need} to map, {} mapped, at most {} or the cap {}",
                self.mapped_pages,
                self.mapped_peak,
                self.gather_cap()
            );
            vm.trim()?;
            return Ok(false);
        }
        // Unmapped pages lie only inside free blocks: each one's share of the plan's runs.
        let base = self.segs[r].base;
        let mut i = self.segs[r].first;
        while i != NIL {
            let b = &self.blocks[i];
            let next = b.next;
            if b.state == State::Free && b.unmapped > 0 {
                let (q0, q1) = self.interior(r, b.addr, b.size);
                let mut unmapped = Vec::new();
                for &(p0, n) in runs {
                    let (lo, hi) = (p0.max(q0), (p0 + n).min(q1));
                    if lo < hi {
                        unmapped.extend(self.pages_of(r).runs(lo, hi, false));
                    }
                }
                if !unmapped.is_empty() {
                    self.unlink(i);
                    let placing = Some((i, q0, q1));
                    let mapped = self.map_runs(
                        backing,
                        vm,
                        r,
                        base,
                        &unmapped,
                        placing,
                        need * page,
                        OnOom::Fail,
                    );
                    self.relink_counted(r, i);
                    match mapped {
                        Ok(()) => {}
                        Err(PoolError::OutOfMemory { .. }) => {
                            vm.trim()?;
                            return Ok(false);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            i = next;
        }
        vm.trim()?;
        Ok(true)
    }

    /// What recycling for a plan's gathering in range `r` may do: wait for the device as the
    /// slack rule's moves at the peak may, and take pages as `own_stream_victims` says.
    fn gathering(&self, r: u32) -> Moving {
        Moving {
            bucket: false,
            victims_of: self.own_stream_victims(r),
            empty_only: false,
        }
    }

    /// Whether range `r` is one free block.
    pub(super) fn range_is_empty(&self, r: u32) -> bool {
        let t = self.segs[r].first;
        t == self.segs[r].tail && self.blocks[t].state == State::Free
    }
}

impl Pool {
    /// Epochs followed to the end of their plan, and plans left (or not started), over all
    /// streams so far.
    pub fn epoch_counts(&self) -> (u64, u64) {
        self.streams.iter().fold((0, 0), |(f, l), s| {
            (f + s.epochs.followed, l + s.epochs.left)
        })
    }
}
