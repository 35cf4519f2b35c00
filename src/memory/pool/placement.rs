//! Allocation at a given place: a dry run records where each of its allocations landed
//! ([`Placement`], `Pool::placement_of`), and a later real allocation asks for exactly that range
//! (`Pool::take_at`), taking it out of free blocks and of blocks still pending on an event alike.
//!
//! Why: the swap plan is fitted on a dry run in which a copy-out's block is free at once; the
//! real pool, ahead of the device, still finds it pending on the copy and places the next blocks
//! elsewhere, drifting from the dry run until it runs out of mapped memory under the limit and
//! moves pages (GPT-2 at a third of its working set on the H200: ~460 page maps and 4 waits for
//! the device a step, where the dry run has none). Taking the dry run's range, pending parts
//! included, keeps the real layout the dry run's; the caller's stream waits for the pending
//! parts' events (a stream wait, not a host wait: free once the copy is done).
//!
//! Finding the block at an address without an index by address: a placement names the nearest
//! allocated block below it in its segment (its `anchor`, found through the live map), or the
//! segment's base, and the range is found by walking at most `WALK` blocks up from there.

use super::block::{Kind, State};
use super::stream::{lane_key, Lane};
use super::tlsf::NIL;
use super::{pages32, round_up, Pool, PoolBacking};
use crate::device::{EventId, StreamId};
use crate::memory::history::Action;

/// Blocks walked from the anchor to the end of the range, at most: a placement further away
/// (the layout has drifted) is a miss, not a scan.
const WALK: usize = 16;

/// Where an allocation of a dry run landed, and how to find that place again: from below, or
/// from the allocated block just above it (a small request takes the high end of a hole, whose
/// low part may hold many blocks pending on copies in the real pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub addr: u64,
    pub anchor: Anchor,
    /// The nearest allocated block above, if any.
    pub above: Option<u64>,
}

/// Where the walk to a placement starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// After the allocated block at this address (the nearest one below the placement).
    Block(u64),
    /// At the first block of the segment or range based here (nothing allocated below).
    SegmentBase(u64),
}

impl Pool {
    /// Where the live block at `addr` lies, as `take_at` finds it again; `None` when no block
    /// below it in its segment can anchor it (a block pending on an event lies between).
    pub fn placement_of(&self, addr: u64) -> Option<Placement> {
        let i = self.live.get(addr)?;
        let mut p = self.blocks[i].prev;
        // Free blocks coalesce: at most one lies between two blocks that are not free.
        if p != NIL && self.blocks[p].state == State::Free {
            p = self.blocks[p].prev;
        }
        let anchor = if p == NIL {
            Anchor::SegmentBase(self.segs[self.blocks[i].seg].base)
        } else if self.blocks[p].state == State::Allocated {
            Anchor::Block(self.blocks[p].addr)
        } else {
            return None;
        };
        let mut n = self.blocks[i].next;
        if n != NIL && self.blocks[n].state == State::Free {
            n = self.blocks[n].next;
        }
        let above =
            (n != NIL && self.blocks[n].state == State::Allocated).then(|| self.blocks[n].addr);
        Some(Placement {
            addr,
            anchor,
            above,
        })
    }

    /// Allocates `bytes` on `stream` at exactly `at.addr` when every byte of the range lies in
    /// blocks of that stream that are free (its pages there mapped) or pending on an event; the
    /// events of the pending parts are appended to `events` (each once), and the caller makes
    /// the stream that will use the block wait for them before any use. The parts of those
    /// blocks outside the range stay free or pending as they were. `None` (nothing changed):
    /// the range is taken, unmapped, another stream's, or not within `WALK` blocks of its
    /// anchor — allocate normally. Events that completed are processed first, so only copies
    /// the device may still run are waited for.
    pub fn take_at(
        &mut self,
        backing: &dyn PoolBacking,
        at: Placement,
        bytes: u64,
        stream: StreamId,
        events: &mut Vec<EventId>,
    ) -> Option<u64> {
        if bytes == 0 {
            return None;
        }
        if !self.pending.is_empty() {
            self.process_events(backing);
        }
        let rounded = round_up(bytes, self.config.alignment)?;
        let end = at.addr.checked_add(rounded)?;
        let si = *self.stream_index.get(&lane_key(stream, Lane::Working))?;
        let (first, last) = self.range_blocks(at, end, si)?;
        let (seg, kind) = (self.blocks[first].seg, self.blocks[first].kind);
        // Plain segments count their allocated and pending blocks (`Segment::busy`): the range
        // becomes one allocated block, the pending parts outside it stay pending.
        let mut busy: i64 = 1;
        let mut low = (State::Free, EventId(0));
        let mut cur = first;
        let high = loop {
            let next = self.blocks[cur].next;
            let was = self.detach(cur, events);
            busy -= (was.0 == State::Pending) as i64;
            if cur == first {
                low = was;
            }
            if cur == last {
                break was;
            }
            cur = next;
        };
        // The low part of the first block and the high part of the last keep their states.
        let mut start = first;
        let addr = self.blocks[first].addr;
        if addr < at.addr {
            start = self.cut(first, at.addr - addr);
            busy += self.reattach(first, low.0, low.1);
        }
        let tail = if last == first { start } else { last };
        let (addr, size) = (self.blocks[tail].addr, self.blocks[tail].size);
        if addr + size > end {
            let upper = self.cut(tail, end - addr);
            busy += self.reattach(upper, high.0, high.1);
        }
        while self.blocks[start].size < rounded {
            self.absorb_next(start);
        }
        let b = &mut self.blocks[start];
        b.state = State::Free;
        b.unmapped = 0;
        b.cold = false;
        if kind != Kind::Virtual {
            if busy > 0 {
                for _ in 0..busy {
                    self.mark_busy(seg);
                }
            } else {
                self.segs[seg].busy -= (-busy) as u64;
            }
        }
        Some(self.hand_out(start, bytes, 0))
    }

    /// The first and last blocks covering `[at.addr, end)`, each of stream `si`, free (its pages
    /// there mapped) or pending; `None` when the range is not so, or not within `WALK` blocks of
    /// the nearer of its anchors.
    fn range_blocks(&self, at: Placement, end: u64, si: u32) -> Option<(u32, u32)> {
        // Pending blocks are mapped; a free block is usable where the range's pages in it are
        // (the range's last block holds mapped memory and the unreserved tail alike).
        let usable = |i: u32| {
            let b = &self.blocks[i];
            let mapped = || {
                if b.unmapped == 0 && !b.cold {
                    return true;
                }
                let (lo, hi) = (b.addr.max(at.addr), (b.addr + b.size).min(end));
                let (p0, p1) = self.touched(b.seg, lo, hi - lo);
                b.kind == Kind::Virtual && self.pages_of(b.seg).all_mapped(p0, p1)
            };
            b.owner == si && (b.state == State::Pending || b.state == State::Free && mapped())
        };
        let below = match at.anchor {
            Anchor::Block(a) => self.live.get(a).map(|i| {
                let b = &self.blocks[i];
                (b.next, at.addr.saturating_sub(b.addr + b.size))
            }),
            Anchor::SegmentBase(base) => self
                .segs
                .iter()
                .find(|s| s.live && s.base == base && s.first != NIL)
                .map(|s| (s.first, at.addr.saturating_sub(base))),
        };
        let above = at.above.and_then(|a| self.live.get(a)).map(|i| {
            let b = &self.blocks[i];
            (b.prev, b.addr.saturating_sub(end))
        });
        let from_above = match (below, above) {
            (Some((_, gap_below)), Some((_, gap_above))) => gap_above < gap_below,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        let (start, _) = if from_above { above? } else { below? };
        let step = |i: u32| {
            if from_above {
                self.blocks[i].prev
            } else {
                self.blocks[i].next
            }
        };
        // Walk to the block holding the range's first byte (from above: its last byte).
        let outside = |i: u32| {
            let b = &self.blocks[i];
            if from_above {
                b.addr >= end
            } else {
                b.addr + b.size <= at.addr
            }
        };
        let mut cur = start;
        let mut walked = 0;
        while cur != NIL && outside(cur) {
            walked += 1;
            if walked > WALK {
                return None;
            }
            cur = step(cur);
        }
        if cur == NIL {
            return None;
        }
        let holds_end = |i: u32| {
            let b = &self.blocks[i];
            if from_above {
                b.addr <= at.addr
            } else {
                b.addr + b.size >= end
            }
        };
        let b = &self.blocks[cur];
        if (from_above && b.addr + b.size < end) || (!from_above && b.addr > at.addr) {
            return None;
        }
        let entry = cur;
        loop {
            if !usable(cur) {
                return None;
            }
            if holds_end(cur) {
                return Some(if from_above {
                    (cur, entry)
                } else {
                    (entry, cur)
                });
            }
            walked += 1;
            let next = step(cur);
            if walked > WALK || next == NIL {
                return None;
            }
            cur = next;
        }
    }

    /// Takes block `i` out of its free list or its event's pending list (noting the event in
    /// `events`); returns its state and event as they were. The block is left unlinked, its
    /// state unchanged (the caller counts pending blocks by it).
    fn detach(&mut self, i: u32, events: &mut Vec<EventId>) -> (State, EventId) {
        let (state, event) = (self.blocks[i].state, EventId(self.blocks[i].fprev));
        match state {
            State::Free => self.unlink(i),
            State::Pending => {
                // (Its free completes here for the history, as `assume_complete` would.)
                self.note_block(Action::FreeCompleted, i);
                if let Some(list) = self.pending.get_mut(&event) {
                    if let Some(pos) = list.iter().position(|&j| j == i) {
                        list.swap_remove(pos);
                    }
                    if list.is_empty() {
                        self.pending.remove(&event);
                    }
                }
                self.pending_bytes -= self.blocks[i].size;
                self.pending_blocks -= 1;
                if !events.contains(&event) {
                    events.push(event);
                }
            }
            State::Allocated | State::Vacant => unreachable!("range_blocks checked the states"),
        }
        (state, event)
    }

    /// Block `i` (detached, or cut from a detached block) becomes `state` again: free and
    /// linked (with its unmapped pages counted), or pending on `event`. Returns 1 for a pending
    /// block (a busy block of a plain segment), else 0.
    fn reattach(&mut self, i: u32, state: State, event: EventId) -> i64 {
        let unmapped = match self.blocks[i].kind {
            Kind::Virtual if state == State::Free => {
                let (r, addr, size) =
                    (self.blocks[i].seg, self.blocks[i].addr, self.blocks[i].size);
                let (q0, q1) = self.interior(r, addr, size);
                if q0 < q1 {
                    self.pages_of(r).count_unmapped(q0, q1)
                } else {
                    0
                }
            }
            _ => 0,
        };
        let b = &mut self.blocks[i];
        b.unmapped = pages32(unmapped);
        b.cold = false;
        if state == State::Pending {
            b.state = State::Pending;
            b.fprev = event.0;
            self.pending_bytes += b.size;
            self.pending_blocks += 1;
            self.pending.entry(event).or_default().push(i);
            1
        } else {
            b.state = State::Free;
            self.link(i);
            0
        }
    }
}
