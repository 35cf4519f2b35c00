//! Steering a period's turn onto its plan (`epochs/periodic.rs`): the carry of a loop lies
//! where the usual placement put it, and a plan around it there would be split by it. So the
//! turn after a period is found is placed as usual, but for its carried allocations: their
//! slots (beside the floor) are held from the turn's first allocation — when only the floor and
//! the carry are live, so the slots are free — and handed to them as they come. The next turn
//! then starts over the floor the period's plan keeps, and follows it. A slot's pages may have
//! been moved away by recycling since the floor was laid (the slots lie right above it): they
//! are gathered first, as a plan's are (session 33: roberta's slot, above its weights, had none
//! mapped, so no turn of its layers ever followed a plan).

use super::block::State;
use super::tlsf::NIL;
use super::{Pool, PoolBacking, PoolError};

impl Pool {
    /// At the first allocation of a turn that steers its carry (stream `si`, range `r`): the
    /// slots' pages gathered (`gather_runs`, within the room a plan's gathering has), then each
    /// slot carved from the free block holding it and held — allocated, not handed out, in no
    /// statistics. A slot that is not free, or not mapped, stays unheld (its allocation tries
    /// the slot when it comes). False when the turn does not steer.
    pub(super) fn hold_slots(
        &mut self,
        backing: &dyn PoolBacking,
        si: u32,
        r: u32,
    ) -> Result<bool, PoolError> {
        let slots = self.streams[si as usize].epochs.start_steering();
        if slots.is_empty() {
            return Ok(false);
        }
        if let (Some(vm), true) = (backing.vmm(), r != NIL) {
            let base = self.segs[r].base;
            let mut runs: Vec<(u64, u64)> = slots
                .iter()
                .map(|&(off, size)| self.touched(r, base + off, size))
                .collect();
            runs.sort_unstable();
            // Apart, as `gather_runs` takes them: slots may share a seam page.
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
            for (p0, p1) in runs {
                match merged.last_mut() {
                    Some((q0, n)) if p0 <= *q0 + *n => *n = (*n).max(p1 - *q0),
                    _ => merged.push((p0, p1 - p0)),
                }
            }
            // Not gathered, the slots not mapped stay unheld.
            self.gather_runs(backing, vm, &merged, r)?;
        }
        let mut holds = Vec::with_capacity(slots.len());
        for (off, size) in slots {
            let h = if r == NIL {
                None
            } else {
                self.carve_slot(r, self.segs[r].base + off, size)
            };
            if let Some(h) = h {
                // Allocated to no one yet: no label, no log index (`Pool::hand_out` sets them).
                let b = &mut self.blocks[h];
                b.state = State::Allocated;
                b.requested = 0;
                b.fnext = 0;
                b.fprev = NIL;
            }
            holds.push(h.unwrap_or(NIL));
        }
        self.streams[si as usize].epochs.set_holds(holds);
        Ok(true)
    }

    /// Allocation `rounded` of a steering turn: a carried one at its slot — the block holding it,
    /// or the slot carved when it is free — or `None`, placed as usual. Once the turn's carried
    /// allocations are all made the slots left go back.
    pub(super) fn steer(&mut self, si: u32, r: u32, rounded: u64) -> Option<u32> {
        let next = self.streams[si as usize].epochs.steer_next(rounded);
        if !self.streams[si as usize].epochs.steering() {
            self.release_holds(si);
        }
        let (slot, held) = next?;
        if held != NIL {
            return Some(held);
        }
        if r == NIL {
            return None;
        }
        self.carve_slot(r, self.segs[r].base + slot, rounded)
    }

    /// Every stream's held slots become free again (`release_all`, `release_cached`: they are no
    /// one's blocks).
    pub(super) fn release_all_holds(&mut self) {
        for si in 0..self.streams.len() as u32 {
            self.release_holds(si);
        }
    }

    /// The blocks of stream `si` still holding slots become free again.
    pub(super) fn release_holds(&mut self, si: u32) {
        for h in self.streams[si as usize].epochs.take_holds() {
            self.free_block(h);
        }
    }

    /// `size` bytes at `pos` in range `r`, carved from the free block holding them when their
    /// pages are mapped. The block is found by walking the range's blocks in address order: a
    /// few carried allocations a turn do so.
    pub(super) fn carve_slot(&mut self, r: u32, pos: u64, size: u64) -> Option<u32> {
        let mut i = self.segs[r].first;
        while i != NIL && self.blocks[i].addr + self.blocks[i].size <= pos {
            i = self.blocks[i].next;
        }
        if i == NIL {
            return None;
        }
        self.carve_at(r, i, pos, size)
    }

    /// The allocated blocks of stream `si`'s range `r`: offset from its base, size, and index in
    /// the stream's epoch log (`NIL`: older than the log, or not logged) — the floor a period is
    /// kept over (`Epochs::keep_period`).
    pub(super) fn logged_floor(&self, si: u32, r: u32) -> Vec<(u64, u64, u32)> {
        let base = self.segs[r].base;
        let from = self.streams[si as usize].epochs.log_from();
        let mut out = Vec::new();
        let mut i = self.segs[r].first;
        while i != NIL {
            let b = &self.blocks[i];
            if b.state == State::Allocated {
                // While allocated, `freed_epoch` holds the allocation's order and `fprev` its
                // log index (`Pool::hand_out`).
                let k = if b.freed_epoch > from { b.fprev } else { NIL };
                out.push((b.addr - base, b.size, k));
            }
            i = b.next;
        }
        out
    }
}
