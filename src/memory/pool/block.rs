//! Blocks: the 64-byte record of one piece of a segment or range, and the operations that cut
//! a free block in two and merge a freed block with its free neighbours.

use super::tlsf::NIL;
use super::{pages32, Pool};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Free,
    Allocated,
    /// Waiting for an event (kept in `fprev`: a pending block is in no free list).
    Pending,
    /// Record not in use (vacant in the slab).
    Vacant,
}

/// Which free index a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Small = 0,
    Large = 1,
    Virtual = 2,
}

/// One block of a segment or range: 64 bytes, one cache line (the pool's operations are mostly
/// reads of a few blocks at scattered slab records).
#[derive(Clone, Debug)]
#[repr(align(64))]
pub(super) struct Block {
    pub(super) addr: u64,
    pub(super) size: u64,
    /// Size as requested, while allocated.
    pub(super) requested: u64,
    /// Index of the segment or range in `segs`.
    pub(super) seg: u32,
    /// Index of the owning stream in `streams`.
    pub(super) owner: u32,
    /// Neighbours by address inside the segment.
    pub(super) prev: u32,
    pub(super) next: u32,
    /// Links of the free list the block is in (warm blocks only); a pending block keeps the
    /// id of its event in `fprev`. An allocated or pending block is in no list, and keeps its
    /// owner's label (`Pool::set_owner`) in `fnext` (the record has no byte to spare).
    pub(super) fprev: u32,
    pub(super) fnext: u32,
    /// Free blocks of a virtual range: unmapped pages lying wholly inside the block.
    pub(super) unmapped: u32,
    /// Free blocks: the marker epoch of the last stream-ordered free of memory in the block
    /// (0: never in use, or in use only until an event that completed). Pending blocks: when
    /// they were parked (`Pool::park_seq`).
    pub(super) freed_epoch: u64,
    pub(super) kind: Kind,
    pub(super) state: State,
    pub(super) tag: u8,
    /// Free and in its stream's cold set (virtual, with unmapped pages) rather than a list.
    pub(super) cold: bool,
}

impl Block {
    /// A free, unlinked block for `[addr, addr + size)` cut from this one (same segment,
    /// stream, kind and free epoch), between neighbours `prev` and `next`; its `unmapped` count
    /// is the caller's to set.
    #[inline(always)]
    pub(super) fn free_piece(&self, addr: u64, size: u64, prev: u32, next: u32) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            seg: self.seg,
            owner: self.owner,
            prev,
            next,
            fprev: NIL,
            fnext: NIL,
            unmapped: 0,
            freed_epoch: self.freed_epoch,
            kind: self.kind,
            state: State::Free,
            tag: 0,
            cold: false,
        }
    }
}

impl Pool {
    /// Gives the live block at `addr` the tag `tag` (the caller's kind of block: a free asks for
    /// it, `free_if_owned`); with no block live there, nothing.
    pub fn retag(&mut self, addr: u64, tag: u8) {
        if let Some(i) = self.live.get(addr) {
            self.blocks[i].tag = tag;
        }
    }

    pub(super) fn drop_block(&mut self, i: u32) {
        let b = &mut self.blocks[i];
        b.state = State::Vacant;
        b.prev = NIL;
        b.next = NIL;
        self.blocks.remove(i);
    }

    /// Cuts block `i` (free, unlinked) at `at` bytes from its start; returns the upper part, a
    /// free unlinked block. Neither part's `unmapped` count is set.
    pub(super) fn cut(&mut self, i: u32, at: u64) -> u32 {
        let b = &self.blocks[i];
        let upper = b.free_piece(b.addr + at, b.size - at, i, b.next);
        let (next, seg) = (b.next, b.seg);
        let j = self.blocks.insert(upper);
        if next != NIL {
            self.blocks[next].prev = j;
        } else {
            self.segs[seg].tail = j;
        }
        let b = &mut self.blocks[i];
        b.next = j;
        b.size = at;
        j
    }

    /// Splits the (free, unlinked, fully mapped) block `i` so that it is `size` bytes; the
    /// remainder, if any, becomes a free linked block.
    #[inline]
    pub(super) fn split(&mut self, i: u32, size: u64) {
        if self.blocks[i].size == size {
            return;
        }
        let j = self.cut(i, size);
        // The block was free, so its old next neighbour is not: the tail needs no coalescing.
        self.link(j);
    }

    /// Splits the (free, unlinked, fully mapped) block `i` so that its high end, `size` bytes,
    /// is a block of its own, returned; the low remainder, if any, stays free and linked.
    #[inline]
    pub(super) fn split_high(&mut self, i: u32, size: u64) -> u32 {
        let at = self.blocks[i].size - size;
        if at == 0 {
            return i;
        }
        let j = self.cut(i, at);
        // Its old previous neighbour is not free (free blocks coalesce): nothing to merge.
        self.link(i);
        j
    }

    /// Block `i` (allocated or pending, already out of its index; every page it touches is
    /// mapped) becomes free: coalesce with free neighbours and index it.
    pub(super) fn free_block(&mut self, i: u32) {
        let mut i = i;
        let mut unmapped = 0;
        {
            let b = &mut self.blocks[i];
            b.state = State::Free;
            b.requested = 0;
            b.tag = 0;
        }
        let (prev, seg, kind) = {
            let b = &self.blocks[i];
            (b.prev, b.seg, b.kind)
        };
        // Conservative for blocks released by an event too: the next marker orders after it.
        let mut epoch = self.epoch;
        if prev != NIL && self.blocks[prev].state == State::Free {
            self.unlink(prev);
            unmapped += self.blocks[prev].unmapped as u64;
            epoch = epoch.max(self.blocks[prev].freed_epoch);
            self.absorb_next(prev);
            i = prev;
        }
        let next = self.blocks[i].next;
        if next != NIL && self.blocks[next].state == State::Free {
            self.unlink(next);
            unmapped += self.blocks[next].unmapped as u64;
            epoch = epoch.max(self.blocks[next].freed_epoch);
            self.absorb_next(i);
        }
        self.blocks[i].unmapped = pages32(unmapped);
        self.blocks[i].freed_epoch = epoch;
        self.link(i);
        if kind != Kind::Virtual {
            let s = &mut self.segs[seg];
            s.busy -= 1;
            if s.busy == 0 {
                self.idle.insert(seg);
            }
        } else if self.blocks[i].prev == NIL && self.blocks[i].next == NIL {
            // The whole range is free: its epoch ends (`epochs.rs`).
            self.range_emptied(self.blocks[i].owner);
        }
    }

    /// Merges the next block of `i` into `i` (both unlinked).
    #[inline(always)]
    pub(super) fn absorb_next(&mut self, i: u32) {
        let n = self.blocks[i].next;
        let (size, next, seg) = {
            let b = &self.blocks[n];
            (b.size, b.next, b.seg)
        };
        self.blocks[i].size += size;
        self.blocks[i].next = next;
        if next != NIL {
            self.blocks[next].prev = i;
        } else {
            self.segs[seg].tail = i;
        }
        self.drop_block(n);
    }
}
