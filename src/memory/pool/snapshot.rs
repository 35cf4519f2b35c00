//! The pool as a list of segments and their blocks, for memory snapshots (the runtime turns it
//! into PyTorch's snapshot format). A scan over every segment: for snapshots, never on the
//! allocation path.
//!
//! A virtual range is reported up to the end of what it uses (its last mapped page or last
//! block in use, whichever is higher), not the whole reserved address space: its blocks then
//! add up to its reported size, as PyTorch's expandable segments do; free blocks inside it may
//! still contain unmapped pages (recycled holes).

use super::block::{Kind, State};
use super::tlsf::NIL;
use super::Pool;

/// A block's state, as PyTorch's snapshots name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewState {
    /// Live: allocated and not freed.
    Allocated,
    /// Freed, waiting for an event (a copy still reads it) before it can be reused.
    AwaitingFree,
    Free,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockView {
    pub addr: u64,
    pub size: u64,
    /// Bytes as requested (0 for free blocks).
    pub requested: u64,
    pub state: ViewState,
    /// The label its allocator set (`Pool::set_owner`); 0 for free blocks.
    pub label: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    pub addr: u64,
    /// Bytes reported (the whole segment; a range up to the end of what it uses).
    pub size: u64,
    /// The stream's id as the device numbers it.
    pub stream: u32,
    /// Plain segment of the small pool (requests of at most 1 MiB).
    pub small: bool,
    /// A virtual range grown by pages.
    pub expandable: bool,
    pub blocks: Vec<BlockView>,
}

impl Pool {
    /// Every live segment and range with its blocks in address order, segments by address.
    pub fn segments_view(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for seg in self.segs.iter().filter(|s| s.live) {
            let first = &self.blocks[seg.first];
            let stream = self.streams[first.owner as usize].stream.0;
            let end = match &seg.pages {
                None => seg.base + seg.size,
                Some(pages) => {
                    let mapped_end = pages
                        .runs(0, pages.pages(), true)
                        .last()
                        .map_or(seg.base, |&(p, n)| seg.base + (p + n) * self.page);
                    let mut used_end = seg.base;
                    let mut cur = seg.first;
                    while cur != NIL {
                        let b = &self.blocks[cur];
                        if b.state != State::Free {
                            used_end = b.addr + b.size;
                        }
                        cur = b.next;
                    }
                    mapped_end.max(used_end)
                }
            };
            let mut blocks = Vec::new();
            let mut cur = seg.first;
            while cur != NIL {
                let b = &self.blocks[cur];
                cur = b.next;
                if b.addr >= end {
                    break;
                }
                let (state, label, requested) = match b.state {
                    State::Allocated => (ViewState::Allocated, b.fnext, b.requested),
                    State::Pending => (ViewState::AwaitingFree, b.fnext, b.requested),
                    State::Free | State::Vacant => (ViewState::Free, 0, 0),
                };
                blocks.push(BlockView {
                    addr: b.addr,
                    size: b.size.min(end - b.addr),
                    requested,
                    state,
                    label,
                });
            }
            if end > seg.base {
                out.push(SegmentView {
                    addr: seg.base,
                    size: end - seg.base,
                    stream,
                    small: seg.kind == Kind::Small,
                    expandable: seg.kind == Kind::Virtual,
                    blocks,
                });
            }
        }
        out.sort_unstable_by_key(|s| s.addr);
        out
    }
}
