//! The free indexes of a stream: warm free blocks (every page mapped) in segregated size-class
//! lists (`tlsf.rs`), one index per kind (small, large, virtual), and cold blocks (a virtual
//! range's free blocks with unmapped pages) in an ordered set (`cold_set.rs`). Linking, unlinking, best fit.

use super::block::Kind;
use super::cold_set::ColdKey;
use super::tlsf::{class_of, NIL};
use super::Pool;

/// A cold set entry left in place by `unlink_held`: the stream whose set holds it, and the key.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    stream: u32,
    key: ColdKey,
}

/// Entries of one size-class list looked at for the best fit.
pub(super) const FIT_SCAN: usize = 32;

impl Pool {
    /// Whether cold block `i` is its range's last block, which stays out of the cold set:
    /// placement looks at it anyway, and it changes with nearly every allocation or free at the
    /// top of the used memory (an ordered-set update each time, which was most of the cost of
    /// such workloads).
    #[inline]
    pub(super) fn is_range_tail(&self, i: u32) -> bool {
        self.segs[self.blocks[i].seg].tail == i
    }

    /// Puts a free block into its stream's warm list or cold set.
    #[inline(always)]
    pub(super) fn link(&mut self, i: u32) {
        let b = &self.blocks[i];
        let (si, kind) = (b.owner as usize, b.kind as usize);
        if b.kind == Kind::Virtual && b.unmapped > 0 {
            let key = (b.size, b.addr, i);
            if !self.is_range_tail(i) {
                self.streams[si].cold.insert(key);
            }
            self.blocks[i].cold = true;
            return;
        }
        let c = class_of(b.size >> self.shift);
        let head = self.streams[si].warm[kind].head(c);
        {
            let b = &mut self.blocks[i];
            b.cold = false;
            b.fprev = NIL;
            b.fnext = head;
        }
        if head != NIL {
            self.blocks[head].fprev = i;
        }
        self.streams[si].warm[kind].set_head(c, i);
    }

    /// `unlink(i)`, except that a block in its stream's cold set leaves its entry there, held
    /// for `link_held` to reuse (one shift of the set's entries where removing and inserting
    /// make two). Returns the held entry. Until `link_held`, nothing may read the cold set.
    #[inline(always)]
    pub(super) fn unlink_held(&mut self, i: u32) -> Option<Held> {
        let b = &self.blocks[i];
        if b.cold && !self.is_range_tail(i) {
            let held = Held {
                stream: b.owner,
                key: (b.size, b.addr, i),
            };
            self.blocks[i].cold = false;
            return Some(held);
        }
        self.unlink(i);
        None
    }

    /// `link(i)` in place of the entry `unlink_held` left in the cold set, if any: the entry
    /// becomes `i`'s when `i` goes into the same set, and is removed otherwise.
    #[inline(always)]
    pub(super) fn link_held(&mut self, i: u32, held: Option<Held>) {
        let Some(Held { stream, key }) = held else {
            return self.link(i);
        };
        let b = &self.blocks[i];
        if b.kind == Kind::Virtual && b.unmapped > 0 && b.owner == stream && !self.is_range_tail(i)
        {
            let replaced = self.streams[stream as usize]
                .cold
                .replace(&key, (b.size, b.addr, i));
            debug_assert!(replaced);
            self.blocks[i].cold = true;
            return;
        }
        self.drop_held(held);
        self.link(i);
    }

    /// Removes the entry `unlink_held` left, if any.
    #[inline(always)]
    pub(super) fn drop_held(&mut self, held: Option<Held>) {
        if let Some(Held { stream, key }) = held {
            let removed = self.streams[stream as usize].cold.remove(&key);
            debug_assert!(removed);
        }
    }

    /// Takes a free block out of its list or set.
    #[inline(always)]
    pub(super) fn unlink(&mut self, i: u32) {
        let b = &self.blocks[i];
        let (si, kind) = (b.owner as usize, b.kind as usize);
        if b.cold {
            let key = (b.size, b.addr, i);
            if !self.is_range_tail(i) {
                let removed = self.streams[si].cold.remove(&key);
                debug_assert!(removed);
            }
            self.blocks[i].cold = false;
            return;
        }
        let (p, n, c) = (b.fprev, b.fnext, class_of(b.size >> self.shift));
        if p == NIL {
            self.streams[si].warm[kind].set_head(c, n);
        } else {
            self.blocks[p].fnext = n;
        }
        if n != NIL {
            self.blocks[n].fprev = p;
        }
    }

    /// Best fit among the warm free blocks of `si` and `kind`; the block is unlinked.
    /// Forced inline, like `link`, `unlink`, `Slab::insert` and `absorb_next`: each runs on
    /// nearly every operation, and as calls their frames cost about as much as their work
    /// (BENCHMARKS.md §3, session 6).
    #[inline(always)]
    pub(super) fn take_fit(&mut self, si: u32, kind: Kind, size: u64) -> Option<u32> {
        let best = self.peek_fit(si, kind, size)?;
        self.unlink(best);
        Some(best)
    }

    /// The block `take_fit(si, kind, size)` takes, left where it is (`pending_fit.rs` compares
    /// it with blocks pending on copies).
    #[inline(always)]
    pub(super) fn peek_fit(&self, si: u32, kind: Kind, size: u64) -> Option<u32> {
        let classes = &self.streams[si as usize].warm[kind as usize];
        let mut c = classes.first_at_or_above(class_of(size >> self.shift))?;
        loop {
            let mut best: Option<(u64, u64, u32)> = None;
            let mut cur = classes.head(c);
            let mut seen = 0;
            while cur != NIL && seen < FIT_SCAN {
                let b = &self.blocks[cur];
                if b.size >= size && best.is_none_or(|(s, a, _)| (b.size, b.addr) < (s, a)) {
                    best = Some((b.size, b.addr, cur));
                }
                cur = b.fnext;
                seen += 1;
            }
            if let Some((_, _, i)) = best {
                return Some(i);
            }
            // Only the request's own class can hold blocks that are too small.
            c = classes.first_at_or_above(c + 1)?;
        }
    }
}
