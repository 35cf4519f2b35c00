//! Placing an allocation predicted to live through its step (`epochs/step_lived.rs` predicts
//! which) at the lowest free place of its stream's range: beside the floor, below the memory the
//! step's large blocks take, instead of in the hole of the same size that best fit finds in the
//! middle of it. What a step keeps to its end then splits nothing that its later, larger blocks
//! need (session 33: roberta_infer_varlen 1.1560 → 1.0678 of its peak live on the host replay,
//! with its layers' periods).
//!
//! The lowest free place is the first free block above the floor (and what went low before)
//! that holds it. When that is not the first free block there but a hole further up, amid the
//! step's own blocks, and best fit takes the same hole anyway, going to its low end keeps the
//! block out of no one's way and parts the hole from the neighbour below, which the step frees
//! and whose free would have grown it: it is placed as usual. A decoder's last token's keys
//! and values, step-lived in a generation over the same weights, took the low ends of holes
//! between the previous token's, and kv_growth_small_8x128_b16 reserved 1.4898 of its peak
//! live on the host replay, 1.0925 placed as usual there (session 50).
//!
//! Cost: a walk of the range's blocks up to the first free one that holds the request, and a
//! best-fit lookup, for the few allocations a step predicted so (roberta: 7 of its 300), the
//! walks after an epoch's first starting above the floor it found, and all of an epoch's walks
//! bounded by the blocks the range has had in it (`Epochs::lowest_walk`): a step per
//! allocation. Without that bound the first passes of bert_ckpt_train and bert_train walked
//! 43–45 blocks per operation (host replay). The pages under the place are gathered as a
//! plan's are.

use super::block::{Kind, State};
use super::tlsf::NIL;
use super::{Pool, PoolBacking, PoolError};

impl Pool {
    /// Stream `si`'s allocation of `rounded` bytes, predicted step-lived: carved at the start of
    /// the range's lowest free block that holds it, its pages gathered first (`gather_runs`,
    /// within the room a plan's gathering has). `None` when no free block within the walk's
    /// bound holds it, or its pages cannot be gathered: it is placed as usual.
    pub(super) fn take_lowest(
        &mut self,
        backing: &dyn PoolBacking,
        si: u32,
        rounded: u64,
    ) -> Result<Option<u32>, PoolError> {
        let r = self.streams[si as usize].range;
        let Some(vm) = backing.vmm() else {
            return Ok(None);
        };
        if r == NIL {
            return Ok(None);
        }
        let align = self.config.alignment;
        let (budget, from) = self.streams[si as usize].epochs.lowest_walk();
        // After the floor's top block found by the epoch's first walk, while it is still there.
        let mut i = match self.live.get(from) {
            Some(j) if from != 0 => self.blocks[j].next,
            _ => self.segs[r].first,
        };
        let (mut visited, mut next_from) = (0, from);
        let mut seen_free = false;
        let placed = loop {
            if i == NIL || visited == budget {
                break None;
            }
            visited += 1;
            let b = &self.blocks[i];
            if b.state != State::Free {
                i = b.next;
                continue;
            }
            // The first free block the walk meets: beside the floor and what went low before.
            let lowest = !seen_free;
            if lowest {
                seen_free = true;
                let p = b.prev;
                if p != NIL && self.live.get(self.blocks[p].addr) == Some(p) {
                    next_from = self.blocks[p].addr;
                }
            }
            let pos = b.addr.next_multiple_of(align);
            if pos + rounded <= b.addr + b.size {
                break Some((i, pos, lowest));
            }
            i = b.next;
        };
        self.streams[si as usize]
            .epochs
            .walked_lowest(visited, next_from);
        let Some((i, pos, lowest)) = placed else {
            return Ok(None);
        };
        // A hole further up that best fit takes anyway lies amid the step's own blocks: its low
        // end is beside one the step frees, and the usual placement picks the end (a small
        // request the high one, so that the rest of the hole joins that neighbour's when it goes).
        if !lowest && self.peek_fit(si, Kind::Virtual, rounded) == Some(i) {
            return Ok(None);
        }
        let (p0, p1) = self.touched(r, pos, rounded);
        if !self.pages_of(r).all_mapped(p0, p1) {
            // Moving pages here is a choice, not a need: only for a request larger than any they
            // were moved for at its position (`Epochs::gathers`), while moves have paid for
            // themselves (`move_budget.rs`), and charged to them.
            let (now, permille) = (backing.now_ns(), self.config.recycle_time_permille);
            if !self.moves.allows(now, permille)
                || !self.streams[si as usize].epochs.gathers(rounded)
            {
                return Ok(None);
            }
            let gathered = self.gather_runs(backing, vm, &[(p0, p1 - p0)], r)?;
            self.moves.charge(backing.now_ns().saturating_sub(now));
            if !gathered {
                return Ok(None);
            }
        }
        // Gathering relinks the block found, keeping it; should it no longer hold the place, the
        // block that does is found from the range's bottom.
        match self.carve_at(r, i, pos, rounded) {
            Some(j) => Ok(Some(j)),
            None => Ok(self.carve_slot(r, pos, rounded)),
        }
    }
}
