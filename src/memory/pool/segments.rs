//! Segments: the plain segments obtained from the backing (the small, medium and large policy
//! sizes, growth within the budget) and the bookkeeping every segment or virtual range shares:
//! its record, the idle set, returning its memory to the device and forgetting its blocks.

use super::block::{Block, Kind, State};
use super::pages::PageMap;
use super::tlsf::NIL;
use super::{round_up, Pool, PoolBacking, PoolError};
use crate::device::{DeviceError, EventId};
use crate::memory::history::Action;

#[derive(Clone, Debug)]
pub(super) struct Segment {
    pub(super) base: u64,
    pub(super) size: u64,
    /// Block at the base (merges keep the lower block; carving off the low end of a range's
    /// last block makes a new first block when that was the only one).
    pub(super) first: u32,
    /// Block at the end.
    pub(super) tail: u32,
    /// Plain segments: blocks allocated or pending on an event.
    pub(super) busy: u64,
    pub(super) kind: Kind,
    /// Virtual ranges: which pages are mapped.
    pub(super) pages: Option<PageMap>,
    pub(super) live: bool,
}

impl Pool {
    pub(super) fn release_idle_segments(
        &mut self,
        backing: &dyn PoolBacking,
    ) -> Result<u64, PoolError> {
        let mut released = 0;
        while let Some(&s) = self.idle.first() {
            let (base, size, first) = {
                let seg = &self.segs[s];
                (seg.base, seg.size, seg.first)
            };
            backing.free_segment(base, size)?;
            let si = self.blocks[first].owner;
            self.idle.remove(&s);
            self.unlink(first);
            self.drop_block(first);
            self.drop_segment(s);
            self.segment_gone(base, size, si);
            released += size;
        }
        Ok(released)
    }

    /// Returns segment `s`'s memory to the device (a range: its mapped pages, then the range).
    pub(super) fn release_segment(
        &mut self,
        backing: &dyn PoolBacking,
        s: u32,
    ) -> Result<(), DeviceError> {
        let seg = &mut self.segs[s];
        let Some(pages) = seg.pages.as_mut() else {
            return backing.free_segment(seg.base, seg.size);
        };
        let vm = backing.vmm().ok_or_else(|| {
            DeviceError::Invalid(
                "releasing a virtual range through a backing without virtual memory".into(),
            )
        })?;
        let page = self.page;
        let mut chunks = Vec::new();
        pages.each_chunk_down(0, pages.pages(), |c| {
            chunks.push(c);
            true
        });
        if !chunks.is_empty() {
            vm.quiesce()?;
        }
        // Each physical allocation is unmapped as it was mapped: whole.
        for (p, n) in chunks {
            vm.unmap(seg.base + p * page, n * page, 1)?;
            pages.unmap_chunks(p, p + n);
            self.mapped_pages -= n;
            self.stats.reserved_bytes -= n * page;
            self.stats.page_unmap_count += n;
        }
        vm.trim()?;
        vm.unreserve(seg.base, seg.size)
    }

    pub(super) fn mark_busy(&mut self, s: u32) {
        let seg = &mut self.segs[s];
        if seg.busy == 0 {
            self.idle.remove(&s);
        }
        seg.busy += 1;
    }

    pub(super) fn segment_size(&self, rounded: u64, kind: Kind) -> u64 {
        let c = &self.config;
        if kind == Kind::Small {
            c.small_segment_bytes
        } else if rounded <= c.medium_request_max {
            c.medium_segment_bytes
        } else {
            round_up(rounded, c.large_segment_rounding).unwrap_or(rounded)
        }
    }

    /// Obtains a new segment for a request of `rounded` bytes; returns its single block (free,
    /// unlinked).
    pub(super) fn grow(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        rounded: u64,
        kind: Kind,
        si: u32,
    ) -> Result<u32, PoolError> {
        let policy = self.segment_size(rounded, kind);
        if let Some(i) = self.try_segment(backing, policy, kind, si)? {
            return Ok(i);
        }
        if self.release_cached(backing)? > 0 {
            if let Some(i) = self.try_segment(backing, policy, kind, si)? {
                return Ok(i);
            }
        }
        if rounded < policy {
            if let Some(i) = self.try_segment(backing, rounded, kind, si)? {
                return Ok(i);
            }
        }
        Err(self.oom(bytes))
    }

    pub(super) fn drop_segment(&mut self, s: u32) {
        let seg = &mut self.segs[s];
        seg.live = false;
        seg.pages = None;
        self.segs.remove(s);
    }

    pub(super) fn overlaps_tracked(&self, base: u64, size: u64) -> bool {
        self.segs
            .iter()
            .any(|s| s.live && base < s.base + s.size && s.base < base + size)
    }

    /// A tracked segment (or range) with one free block covering it, unlinked. Returns the
    /// block. Statistics count the segment; reserved bytes are the caller's.
    pub(super) fn add_segment(&mut self, base: u64, size: u64, kind: Kind, si: u32) -> u32 {
        let s = self.segs.insert(Segment {
            base,
            size,
            first: NIL,
            tail: NIL,
            busy: 0,
            kind,
            pages: None,
            live: true,
        });
        let i = self.blocks.insert(Block {
            addr: base,
            size,
            requested: 0,
            seg: s,
            owner: si,
            prev: NIL,
            next: NIL,
            fprev: NIL,
            fnext: NIL,
            unmapped: 0,
            freed_epoch: 0,
            kind,
            state: State::Free,
            tag: 0,
            cold: false,
        });
        let seg = &mut self.segs[s];
        seg.first = i;
        seg.tail = i;
        if kind != Kind::Virtual {
            let stream = self.streams[si as usize].stream.0;
            self.note(Action::SegmentAlloc, base, size, stream);
        }
        self.stats.segment_count += 1;
        self.stats.segment_alloc_count += 1;
        i
    }

    /// `Ok(None)`: over the limit or the device is out of memory.
    pub(super) fn try_segment(
        &mut self,
        backing: &dyn PoolBacking,
        size: u64,
        kind: Kind,
        si: u32,
    ) -> Result<Option<u32>, PoolError> {
        match self.stats.reserved_bytes.checked_add(size) {
            Some(total) if total <= self.config.memory_limit => {}
            _ => return Ok(None),
        }
        let base = match backing.alloc_segment(size) {
            Ok(base) => base,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(PoolError::Device(e)),
        };
        let tracked = self.overlaps_tracked(base, size.max(1));
        let unusable = if !base.is_multiple_of(self.config.alignment) {
            Some("is not aligned to the pool alignment")
        } else if base.checked_add(size).is_none() {
            Some("wraps around the address space")
        } else if tracked {
            Some("overlaps memory the pool already tracks")
        } else {
            None
        };
        if let Some(why) = unusable {
            // Never free memory we already track (that would free live memory).
            if !tracked {
                backing.free_segment(base, size)?;
            }
            return Err(PoolError::Device(DeviceError::Invalid(format!(
                "segment {base:#x} of {size} bytes granted by the device {why}"
            ))));
        }
        let i = self.add_segment(base, size, kind, si);
        let seg = self.blocks[i].seg;
        self.idle.insert(seg);
        let s = &mut self.stats;
        s.reserved_bytes += size;
        s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
        Ok(Some(i))
    }

    /// Counts out plain segment `[base, base + size)` of stream index `si`, freed.
    pub(super) fn segment_gone(&mut self, base: u64, size: u64, si: u32) {
        let stream = self.streams[si as usize].stream.0;
        self.note(Action::SegmentFree, base, size, stream);
        let s = &mut self.stats;
        s.reserved_bytes -= size;
        s.segment_count -= 1;
        s.segment_free_count += 1;
    }

    /// Drops a segment or range (its memory already returned to the device) and every block
    /// in it.
    pub(super) fn forget_segment(&mut self, s: u32) {
        let (first, base, size, kind, si) = {
            let seg = &self.segs[s];
            let si = self.blocks[seg.first].owner;
            (seg.first, seg.base, seg.size, seg.kind, si)
        };
        self.idle.remove(&s);
        let mut cur = first;
        while cur != NIL {
            let next = self.blocks[cur].next;
            match self.blocks[cur].state {
                State::Free => self.unlink(cur),
                State::Allocated => {
                    let b = &self.blocks[cur];
                    self.live.remove(b.addr);
                    self.stats.allocated_bytes -= b.size;
                    self.stats.requested_bytes -= b.requested;
                }
                State::Pending => {
                    let e = EventId(self.blocks[cur].fprev);
                    if let Some(v) = self.pending.get_mut(&e) {
                        v.retain(|&j| j != cur);
                        if v.is_empty() {
                            self.pending.remove(&e);
                        }
                    }
                    self.pending_bytes -= self.blocks[cur].size;
                    self.pending_blocks -= 1;
                }
                State::Vacant => {}
            }
            self.drop_block(cur);
            cur = next;
        }
        // Blocks forgotten while allocated leave the allocated bytes as frees do.
        let (now, peak) = (self.stats.allocated_bytes, self.program_peak());
        self.new_step.on_free(now, peak);
        if kind == Kind::Virtual {
            let st = &mut self.streams[si as usize];
            if st.range == s {
                st.range = NIL;
            }
            // Any pages left mapped were counted out by `release_segment`.
            let s2 = &mut self.stats;
            s2.segment_count -= 1;
            s2.segment_free_count += 1;
        } else {
            self.segment_gone(base, size, si);
        }
        self.drop_segment(s);
    }
}
