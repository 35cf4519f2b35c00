//! Placing an allocation predicted to live through its step (`epochs/step_lived.rs` predicts
//! which) at the lowest free place of its stream's range: beside the floor, below the memory the
//! step's large blocks take, instead of in the hole of the same size that best fit finds in the
//! middle of it. What a step keeps to its end then splits nothing that its later, larger blocks
//! need (session 33: roberta_infer_varlen 1.1560 → 1.0678 of its peak live on the host replay,
//! with its layers' periods).
//!
//! Cost: a walk of the range's blocks up to the first free one that holds the request, for the
//! few allocations a step predicted so (roberta: 7 of its 300); the pages under it gathered as a
//! plan's are.

use super::block::State;
use super::tlsf::NIL;
use super::{Pool, PoolBacking, PoolError};

impl Pool {
    /// Stream `si`'s allocation of `rounded` bytes, predicted step-lived: carved at the start of
    /// the range's lowest free block that holds it, its pages gathered first (`gather_runs`,
    /// within the room a plan's gathering has). `None` when no free block holds it or its pages
    /// cannot be gathered: it is placed as usual.
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
        let mut i = self.segs[r].first;
        while i != NIL {
            let b = &self.blocks[i];
            let pos = b.addr.next_multiple_of(align);
            if b.state == State::Free && pos + rounded <= b.addr + b.size {
                let (p0, p1) = self.touched(r, pos, rounded);
                if !self.pages_of(r).all_mapped(p0, p1) {
                    // Moving pages here is a choice, not a need: only for a request larger than
                    // any they were moved for at its position (`Epochs::gathers`), while moves
                    // have paid for themselves (`move_budget.rs`), and charged to them.
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
                return Ok(self.carve_slot(r, pos, rounded));
            }
            i = b.next;
        }
        Ok(None)
    }
}
