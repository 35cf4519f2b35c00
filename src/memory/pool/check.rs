//! Validation: every internal invariant of the pool checked from scratch (O(n); for tests and
//! debugging).

use super::block::{Kind, State};
use super::tlsf::{class_of, CLASSES, NIL};
use super::Pool;
use crate::device::EventId;
#[cfg(test)]
use crate::device::StreamId;

impl Pool {
    /// Checks every internal invariant (O(n); for tests and debugging).
    pub fn validate(&self) -> Result<(), String> {
        let a = self.config.alignment;
        let (mut allocated, mut requested, mut reserved) = (0u64, 0u64, 0u64);
        let (mut nblocks, mut nfree, mut nlive, mut npending, mut pending_bytes) =
            (0usize, 0usize, 0usize, 0u64, 0u64);
        let mut mapped_total = 0u64;
        let mut nsegs = 0u64;
        let mut cold_tails = 0usize;
        for (s, seg) in self.segs.iter().enumerate() {
            if !seg.live {
                continue;
            }
            nsegs += 1;
            let s = s as u32;
            let base = seg.base;
            let virt = seg.kind == Kind::Virtual;
            if virt {
                let pages = seg.pages.as_ref().ok_or("range without a page map")?;
                mapped_total += pages.mapped();
                reserved += pages.mapped() * self.page;
            } else {
                reserved += seg.size;
            }
            let mut expect_addr = base;
            let mut prev = NIL;
            let mut cur = seg.first;
            let mut busy = 0;
            let mut prev_free = false;
            let mut last = NIL;
            while cur != NIL {
                let b = &self.blocks[cur];
                nblocks += 1;
                if b.addr != expect_addr || b.prev != prev || b.seg != s {
                    return Err(format!(
                        "block {cur} at {:#x} breaks segment {base:#x}",
                        b.addr
                    ));
                }
                if !b.addr.is_multiple_of(a) || !b.size.is_multiple_of(a) || b.size == 0 {
                    return Err(format!("block {:#x}+{} misaligned", b.addr, b.size));
                }
                if b.kind != seg.kind || self.blocks[seg.first].owner != b.owner {
                    return Err(format!(
                        "block {:#x} kind/stream differs from its segment",
                        b.addr
                    ));
                }
                match b.state {
                    State::Free => {
                        if prev_free {
                            return Err(format!("adjacent free blocks at {:#x}", b.addr));
                        }
                        let st = &self.streams[b.owner as usize];
                        if virt {
                            let (q0, q1) = self.interior(s, b.addr, b.size);
                            let n = if q0 < q1 {
                                self.pages_of(s).count_unmapped(q0, q1)
                            } else {
                                0
                            };
                            if n != b.unmapped as u64 {
                                return Err(format!(
                                    "free block {:#x}: {} unmapped pages recorded, {n} found",
                                    b.addr, b.unmapped
                                ));
                            }
                        } else if b.unmapped != 0 {
                            return Err(format!("plain block {:#x} has unmapped pages", b.addr));
                        }
                        let want_cold = virt && b.unmapped > 0;
                        if b.cold != want_cold {
                            return Err(format!("free block {:#x} in the wrong index", b.addr));
                        }
                        let in_set = st.cold.contains(&(b.size, b.addr, cur));
                        if b.cold && in_set == (seg.tail == cur) {
                            return Err(format!(
                                "cold block {:#x}: in the cold set {in_set}, range tail {}",
                                b.addr,
                                seg.tail == cur
                            ));
                        }
                        if b.cold && seg.tail == cur {
                            cold_tails += 1;
                        }
                        nfree += 1;
                    }
                    State::Allocated | State::Pending => {
                        if virt {
                            let (p0, p1) = self.touched(s, b.addr, b.size);
                            if self.pages_of(s).count_unmapped(p0, p1) != 0 {
                                return Err(format!(
                                    "block {:#x} in use over unmapped pages",
                                    b.addr
                                ));
                            }
                        }
                        busy += 1;
                        if b.state == State::Pending {
                            let e = EventId(b.fprev);
                            if !self.pending.get(&e).is_some_and(|v| v.contains(&cur)) {
                                return Err(format!("pending block {:#x} not in pending", b.addr));
                            }
                            npending += 1;
                            pending_bytes += b.size;
                        } else if self.streams[b.owner as usize].epochs.holds(cur) {
                            // A slot held for a steering turn's carry (`period_steer.rs`):
                            // allocated, not handed out.
                        } else {
                            if self.live.get(b.addr) != Some(cur) {
                                return Err(format!("live block {:#x} not in live map", b.addr));
                            }
                            allocated += b.size;
                            requested += b.requested;
                            nlive += 1;
                        }
                    }
                    State::Vacant => return Err(format!("vacant record {cur} linked")),
                }
                prev_free = b.state == State::Free;
                expect_addr = b.addr + b.size;
                prev = cur;
                last = cur;
                cur = b.next;
            }
            if expect_addr != base + seg.size || seg.tail != last {
                return Err(format!("segment {base:#x} blocks do not cover it"));
            }
            if !virt && (busy != seg.busy || (busy == 0) != self.idle.contains(&s)) {
                return Err(format!("segment {base:#x} busy count/idle set wrong"));
            }
        }
        // Every list and set entry is a free block of its own stream and kind.
        let mut listed = 0usize;
        for (k, st) in self.streams.iter().enumerate() {
            for (kind, classes) in st.warm.iter().enumerate() {
                for c in 0..CLASSES {
                    let mut cur = classes.head(c);
                    let mut prev = NIL;
                    while cur != NIL {
                        let b = &self.blocks[cur];
                        if b.state != State::Free
                            || b.cold
                            || b.owner as usize != k
                            || b.kind as usize != kind
                            || b.fprev != prev
                            || class_of(b.size >> self.shift) != c
                        {
                            return Err(format!("list entry {cur} of class {c} is wrong"));
                        }
                        listed += 1;
                        prev = cur;
                        cur = b.fnext;
                    }
                }
            }
            for &(size, addr, i) in &st.cold {
                let b = &self.blocks[i];
                if b.state != State::Free || !b.cold || b.size != size || b.addr != addr {
                    return Err(format!("cold entry {addr:#x} is wrong"));
                }
                listed += 1;
            }
        }
        let s = &self.stats;
        if allocated != s.allocated_bytes
            || requested != s.requested_bytes
            || reserved != s.reserved_bytes
            || mapped_total != self.mapped_pages
            || nsegs != s.segment_count
            || s.peak_allocated_bytes < s.allocated_bytes
            || s.peak_reserved_bytes < s.reserved_bytes
        {
            return Err(format!("stats disagree with blocks: {s:?}"));
        }
        if nfree != listed + cold_tails
            || nlive != self.live.len()
            || npending != self.pending_blocks
            || pending_bytes != self.pending_bytes
            || nblocks + self.blocks.vacant_len() != self.blocks.len()
            || self.idle.len() > nsegs as usize
        {
            return Err("index sizes disagree with blocks".into());
        }
        self.check_aliases()
    }

    /// Free blocks of the small (`true`) or large pool, as `(stream, size, addr)` in order.
    #[cfg(test)]
    pub(super) fn free_plain(&self, small: bool) -> Vec<(StreamId, u64, u64)> {
        let kind = if small { Kind::Small } else { Kind::Large };
        let mut out: Vec<(StreamId, u64, u64)> = self
            .blocks
            .iter()
            .filter(|b| b.state == State::Free && b.kind == kind)
            .map(|b| (self.streams[b.owner as usize].stream, b.size, b.addr))
            .collect();
        out.sort_unstable();
        out
    }
}
