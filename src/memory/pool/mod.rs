//! The caching device-memory pool.
//!
//! Owns: the bookkeeping of the device memory obtained through a [`PoolBacking`] (the runtime
//! implements it over `dyn Device`) — plain segments, and on devices with virtual memory one
//! reserved address range per stream with physical pages mapped on demand — the blocks carved
//! out of them, the memory budget (`memory_limit`, enforced on reserved bytes) and the always-on
//! O(1) statistics. It owns no device memory itself: everything comes from and goes back to
//! the backing.
//!
//! Where things are (each file's top comment says what it owns):
//! - `mod.rs` (here): [`PoolBacking`], [`Pool`] and its core API — allocation, stream-ordered
//!   free, lookup, statistics, releasing memory to the device;
//! - `config.rs` [`PoolConfig`]; `report.rs` [`PoolStats`], [`PoolError`], [`BlockInfo`];
//! - `stream.rs` per-stream state, one per lane (`Lane`: a stream's lasting blocks apart, so its
//!   working range can empty), and the lanes' allocation entry points (`alloc_in`);
//!   `markers.rs` the marker events that tell which frees the device has passed;
//! - `slab.rs` the record store; `block.rs` block records, cutting and coalescing;
//!   `free_index.rs` the free lists and best fit, over `tlsf.rs`'s size classes; `addr_map.rs`
//!   the live blocks by address;
//! - `segments.rs` plain segments and what all segments share; `ranges.rs` virtual ranges and
//!   placement in them, over `pages.rs`'s page bitmaps; `recycle.rs` page recycling;
//! - `epochs.rs` epoch plans: a range that returns to the same live blocks (its floor) and fills
//!   again the same way, found by recording, `epochs/kept.rs` an epoch kept with its plan, made
//!   once, `epochs/keeping.rs` which are kept (variants among them) and the switch to a variant's
//!   plan, `epochs/leaving.rs` a plan left; `epoch_plan.rs` the offline plan (`crate::arena`) of
//!   the last time, around the floor; `epoch_follow.rs` following it; `epochs/periodic.rs`
//!   periods, a loop's turns that carry a block into the next, planned the same way, and
//!   `period_steer.rs` the turn that steers the carry onto the period's plan;
//!   `epochs/step_lived.rs` which allocations of an epoch live through it, learnt from the last
//!   one over the same floor, and `step_lived.rs` placing them at the lowest free place;
//! - `move_budget.rs` the time budget of the slack rule's moves; `new_step.rs` whether the
//!   program is in a step that raised its peak (whose moves the budget is not asked for);
//!   `alias.rs` a moved chunk's old address kept mapped as its shadow (`page_aliases`);
//! - `pending.rs` blocks freed after an event; `pending_fit.rs` best fit over free and pending
//!   blocks together (a pending block that fits closer than any free one); `dry_run.rs` dry runs;
//!   `placement.rs` allocation at the range a dry run placed it in; `check.rs` validation;
//!   `snapshot.rs` the segments and blocks listed for memory snapshots; `notes.rs` the memory
//!   history's events and owner labels;
//!   `tests/` the tests, over one configurable fake backing.
//!
//! Data structures (no linear scans over blocks on alloc or free — but for a steering turn's
//! slots and the few allocations a step predicts step-lived, found by a walk from the range's
//! bottom — and no allocation per operation once warm):
//! - blocks live in a slab (records in a `Vec`, vacant ones reused) with `prev`/`next` links to
//!   their neighbours, so coalescing is O(1); segments and ranges live in another;
//! - free blocks sit in segregated size classes with two-level bitmaps (`tlsf.rs`), one index
//!   per stream and kind (small, large, virtual): the request's own class is searched for the
//!   best fit, then the first non-empty class above it (every block there fits), each list
//!   looked at for at most `FIT_SCAN` entries, smallest size then lowest address winning — best
//!   fit in practice, O(1) always;
//! - live blocks are found by address in an open-addressing table (`addr_map.rs`);
//! - free blocks of a virtual range that contain unmapped pages ("cold" blocks, few: the
//!   unreserved tail of the range and holes whose pages were recycled) sit in an ordered set per
//!   stream (a sorted vector, `cold_set.rs`), searched only when no mapped free block fits
//!   (`cold_search.rs`: the best position so far) and no entry holds the request at an end
//!   without new pages while the range's last block does at its start (that start is then
//!   carved directly: the search's own answer); the range's last block is not in it
//!   (placement and recycling look at it directly: it changes with nearly every allocation at the
//!   top of the used memory).
//!
//! The hot path (alloc and stream-ordered free of a block that fits a free list) was tuned by
//! counting instructions per operation on replayed traces (callgrind; BENCHMARKS.md §3): the
//! free-list steps and record helpers are forced inline (`#[inline(always)]`), rare paths kept
//! out of line (`#[inline(never)]`), and page arithmetic uses shifts. Moving code between these
//! files does not change that; an attribute removed or a call made indirect does.
//!
//! Policies:
//! - **Rounding / splitting.** Every request is rounded up to `alignment` (a power of two,
//!   default 256) and the chosen free block is split to exactly that size, so `block_size` is
//!   always the rounded request (planners predict `allocated_bytes` from it).
//! - **Virtual ranges (devices with virtual memory, `config.vmm`, or per stream with
//!   `set_new_stream_growth`).** The first allocation on a stream reserves one address range
//!   (`vmm_reserve_bytes`, default twice the memory limit, at most 1 TiB) for that stream (and
//!   lane: its lasting blocks get a range of their own); every block of the stream's lane is
//!   carved from it and physical pages (the device's granularity, 2 MiB) are mapped under a
//!   block when it is allocated, several consecutive pages per device allocation ("chunks": a
//!   64th of what will then be mapped or a 16th of the request, a power of two up to
//!   `vmm_page_bytes`, 8 MiB: `chunks.rs`), so a small heap rounds to a granule and a large
//!   one grows by few driver calls; a chunk is unmapped whole (`pages.rs` keeps where each
//!   starts). Free memory therefore never splits at a segment seam, small and large requests
//!   share one range, and reserved bytes are mapped pages, not address space. A request first
//!   tries the free blocks whose pages are all mapped (no device call); otherwise it is placed,
//!   at the low or the high end of a free block, where it needs the fewest new pages (then best
//!   fit, then lowest address) — and when every end needs new pages, also at the ends of the runs
//!   of mapped pages inside large free blocks, so mapped memory in the middle of a hole is used
//!   where it lies instead of being moved back and forth between steps.
//!   A request of at most one page that fits a mapped free block takes the block's high end
//!   (larger ones its low end): small and large blocks then gather at opposite ends of holes
//!   instead of small ones splitting the pages a large one could use (host replay, moe_train:
//!   1.068 of its peak live to 1.053).
//!   If the range cannot hold it (or the device cannot reserve one), the request falls back to
//!   plain segments.
//! - **Recycling pages.** A chunk lying wholly inside a free block can be unmapped and its
//!   memory mapped where it is needed. The pool does so (a) when the budget would be
//!   exceeded, and (b) when a request needs at least `recycle_min_bytes` (or, on a small heap,
//!   the slack itself) of new pages and the mapped total would exceed the high-water mark of
//!   allocated bytes by more than `recycle_slack_permille` (and at least one page) and the most
//!   ever mapped (since the start or `release_cached`: below it a move lowers no peak); a
//!   request that raises that mark gets no slack (`tight_peaks`: what it maps is the footprint
//!   the program keeps); within that cap, a request that would raise the most ever mapped
//!   takes the free pages other streams' empty ranges keep mapped, and no others
//!   (`empty_range_moves`: a warm-up's page) — but (b)
//!   only while such moves have taken at most `recycle_time_permille` of wall time as the pool
//!   measures it (`move_budget.rs`): under churn it maps new pages once instead of moving the
//!   same ones every step. Requests that bring the program to its peak, and those of a step
//!   that raised it (`new_step.rs`), are not asked: their moves set the footprint, up to the
//!   peak's bytes in all. Pages a slack-rule move placed are marked (`pages.rs`) and moved
//!   again only while all moves so far have taken at most that share of the time since the
//!   pool first mapped memory, with no bucket (any move may also draw on that lifetime share
//!   when the bucket is empty): a page moved once stays (amortised over the program), one
//!   moved back and forth between steps costs at most that share. Large transient tensors then reuse the physical memory of holes
//!   instead of growing the footprint (the effect on fragmentation: BENCHMARKS.md §3). A move
//!   that cannot keep mapping under the cap, with more than one physical allocation over it, is
//!   made only when it can move at least half of the pages over the cap
//!   (`recycle_majority_moves`): smaller ones leave holes later steps need again, and the peak
//!   rises there instead (ARCHITECTURE.md, "The pool's fragmentation"). Victims
//!   are the free blocks with the most mapped pages, their whole chunks unmapped from the high
//!   end.
//!   Stream-ordered frees may still have work queued on those pages, so a page is unmapped only
//!   once the device is known to be past the free: every `marker_every` frees (and at most once
//!   per `marker_min_interval_ns`) the pool records a marker event on the stream and polls it
//!   later; pages freed before a completed marker move at once, others only after waiting for the device (`VirtualMemory::quiesce`) —
//!   which the budget always may, and the slack rule only with `recycle_waits` (off by default:
//!   the pool never stalls the device for the slack and maps new pages instead; on, not for the
//!   time bucket's moves after the program's first step). Before picking,
//!   the slack rule records a marker after the latest frees and polls it briefly
//!   (`recycle_spin_ns`): an idle device passes it, a busy one does not.
//! - **Epoch plans** (`epoch_plans`, `epochs.rs`). From a stream's range holding some set of
//!   blocks (its floor: none when empty, a program's weights when they stay) to every block
//!   allocated since freed again, the pool logs each allocation's size and lifetime; the next
//!   epoch starting with the same size over the same floor plans the log offline around the
//!   floor's blocks and takes each allocation at the offset the plan gave it, after gathering
//!   the plan's pages, until a request differs (the rest placed as above). Repeated passes and
//!   steps then keep the first one's footprint instead of drifting on the holes its page moves
//!   left.
//! - **Plain segments (devices without virtual memory, the pinned pool, fallbacks).** As in
//!   PyTorch, requests of at most `small_request_max` (1 MiB) are served only from the small
//!   pool, whose segments are `small_segment_bytes` (2 MiB); larger requests only from the large
//!   pool: up to `medium_request_max` (10 MiB) they share `medium_segment_bytes` (20 MiB)
//!   segments, larger ones get their own segment rounded up to `large_segment_rounding` (2 MiB).
//! - **Streams.** A segment or range belongs to the stream whose allocation created it, and so
//!   do all blocks carved from it; `free` returns a block to that stream's free lists at once
//!   (work on one stream runs in order). Memory moves to another stream only through the device:
//!   a fully free segment is released and a new one obtained, or pages are recycled.
//!   `free_after_event` parks the block until the event completes; pending events are polled on
//!   `alloc`, `release_cached` and `release_all` (one `event_complete` query per distinct pending
//!   event), never waited on. Pending bytes do not count as allocated (the caller has freed
//!   them) but keep their memory.
//! - **Budget.** A new plain segment is first tried at the policy size; if that would exceed
//!   `memory_limit` or the backing reports out-of-memory, every cached fully free segment and
//!   every free mapped page (of every stream) is released and the policy size is tried once
//!   more (only if something was released), then a segment of exactly the rounded request (so a
//!   tight budget is used fully); only then does `alloc` fail with [`PoolError::OutOfMemory`].
//!   Pages are mapped only within the budget, recycling free pages first. Other device errors
//!   fail at once. Memory the backing grants is tracked before anything else can fail; a segment
//!   that cannot be used (misaligned) is handed straight back.
//! - **Tags.** A block carries a small tag chosen by its allocator (`alloc_tagged`, read back
//!   with `block_info`), so the runtime can tell the buffers a host allocated with
//!   `gkrt_malloc` from a graph's tensors.
//! - **Owners and history.** A block also keeps the label its allocator set with `set_owner`
//!   (who it belongs to, for snapshots), in a field free lists do not use while it is
//!   allocated. `record_history` switches on a fixed ring of events (`memory/history.rs`):
//!   allocations, frees requested and completed, segments, pages, out-of-memory failures and
//!   the caller's swaps; off, each recording point is one branch on `None`.
//! - **Statistics.** `failed_alloc_count` counts allocations that failed for lack of memory or a
//!   device error (not zero-size requests). `free_count` counts `free` and `free_after_event`.

mod addr_map;
mod alias;
mod block;
mod check;
mod chunks;
mod cold_search;
mod cold_set;
mod config;
mod dry_run;
mod epoch_follow;
mod epoch_plan;
mod epochs;
mod free_index;
mod lifetimes;
mod markers;
mod move_budget;
mod new_step;
mod notes;
mod pages;
mod pending;
mod pending_fit;
mod period_steer;
mod placement;
mod ranges;
mod recycle;
mod report;
mod segments;
mod slab;
mod snapshot;
mod step_lived;
mod stream;
mod tail_first;
mod tlsf;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::device::{DeviceError, EventId, StreamId, VirtualMemory};
use crate::memory::history::{Action, HistorySlot};
use addr_map::AddrMap;
use block::{Block, Kind, State};
use recycle::Keep;
use segments::Segment;
use slab::Slab;
pub use stream::Lane;
use stream::{FastHash, Streams};
use tlsf::NIL;

#[cfg(test)]
use config::MIB;
pub use config::{PoolConfig, TailFirst};
pub use dry_run::{DryRunStep, PendingTakes};
pub use placement::Placement;
pub use report::{BlockInfo, PoolError, PoolStats};
pub use snapshot::{BlockView, ViewState};
/// What the pool needs from below: segments, event completion and, optionally, virtual memory.
/// The runtime implements it over `dyn Device`; tests implement it with a fake.
pub trait PoolBacking {
    /// A fresh segment of `bytes` bytes; the address is aligned to at least 512 bytes.
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError>;
    /// Returns a segment obtained from `alloc_segment` (same address and size).
    fn free_segment(&self, addr: u64, bytes: u64) -> Result<(), DeviceError>;
    /// True once the event's last record has completed.
    fn event_complete(&self, event: EventId) -> bool;
    /// Virtual memory, when the device has it: the pool then grows one reserved range per
    /// stream page by page instead of taking segments.
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        None
    }
    /// Records a marker event on `stream` (re-recording `reuse` when given) and returns it; the
    /// pool polls it with `event_complete` to learn which stream-ordered frees the device has
    /// passed, so pages of those blocks can be unmapped without waiting for the device. `None`:
    /// no markers (the pool then waits for the device before unmapping used memory).
    fn record_marker(&self, _stream: StreamId, _reuse: Option<EventId>) -> Option<EventId> {
        None
    }
    /// Gives back a marker event from `record_marker` (pool teardown).
    fn release_marker(&self, _event: EventId) {}
    /// A monotonic clock in ns: the pool times its page moves with it (`move_budget.rs`).
    fn now_ns(&self) -> u64 {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

/// The caching device-memory pool. See the module comment for the policies.
#[derive(Clone, Debug)]
pub struct Pool {
    config: PoolConfig,
    /// log2(alignment).
    shift: u32,
    /// Every block of every segment and range.
    blocks: Slab<Block>,
    /// Plain segments and virtual ranges.
    segs: Slab<Segment>,
    live: AddrMap,
    streams: Streams,
    /// Each stream lane's `si`, by `stream::lane_key`.
    stream_index: HashMap<u64, u32, FastHash>,
    /// The lane key of the latest allocation and the index of its state (nearly every allocation
    /// repeats it).
    last_stream: (u64, u32),
    pending: BTreeMap<EventId, Vec<u32>>,
    pending_bytes: u64,
    pending_blocks: u64,
    /// Plain segments with no allocated or pending block (exactly one free block each).
    idle: BTreeSet<u32>,
    /// Page size of the virtual ranges (0 until one exists).
    page: u64,
    /// Pages mapped over all ranges.
    mapped_pages: u64,
    /// Most pages mapped at once since the pool started or last released its cache.
    mapped_peak: u64,
    /// Most bytes ever allocated or pending at once (not reset by `reset_peaks`).
    high_water: u64,
    /// The most bytes allocated at once before the last `reset_peaks`: with the statistics'
    /// peak, the program's own peak ever (`program_peak`; pending blocks are the pool's).
    peak_before_reset: u64,
    /// Epoch of the next stream-ordered free (advances with each marker recorded).
    epoch: u64,
    /// Blocks parked on events so far.
    park_seq: u64,
    /// What the slack rule's page moves may still cost.
    moves: move_budget::MoveBudget,
    /// Whether the program is in a step that raised its peak (`new_step_moves`).
    new_step: new_step::NewStep,
    /// Moved chunks' old addresses still mapped (`page_aliases`).
    aliases: alias::Aliases,
    /// Requests placed by the cold path (`alloc_virtual`, and `take_cold_end` at a cold hole's
    /// mapped end), for the host replay: the pool's own cost of unmapped pages left among mapped
    /// ones (off the hot path, which never counts; nor does the range tail's mapped start).
    pub(super) cold_placements: u64,
    /// How long blocks of each size lived, in allocations (`TailFirst::ShortLived`).
    lifetimes: lifetimes::Lifetimes,
    /// Set only during `alloc_no_wait`: recycling may not wait for the device.
    no_device_waits: bool,
    /// The lane of the allocation being made: `Lasting` only during `alloc_in`.
    lane: Lane,
    /// Pending blocks go back only when the caller says (`hold_events`), never by polling.
    hold_events: bool,
    /// No marker is recorded or polled (`hold_markers`): which free blocks are idle on the
    /// device stays what the pool knew when it began holding, as in a dry run.
    hold_markers: bool,
    stats: PoolStats,
    /// The label the next allocations carry (`set_owner`), kept in their blocks for snapshots.
    owner: u32,
    /// Recorded events, when switched on (`record_history`); a clone records none.
    history: HistorySlot,
}

impl Pool {
    pub fn new(config: PoolConfig) -> Pool {
        let config = config.normalized();
        Pool {
            shift: config.alignment.trailing_zeros(),
            config,
            blocks: Slab::default(),
            segs: Slab::default(),
            live: AddrMap::default(),
            streams: Streams::default(),
            stream_index: HashMap::default(),
            last_stream: (u64::MAX, NIL),
            pending: BTreeMap::new(),
            pending_bytes: 0,
            pending_blocks: 0,
            idle: BTreeSet::new(),
            page: 0,
            mapped_pages: 0,
            mapped_peak: 0,
            high_water: 0,
            peak_before_reset: 0,
            epoch: 1,
            park_seq: 0,
            moves: move_budget::MoveBudget::default(),
            new_step: new_step::NewStep::default(),
            aliases: alias::Aliases::default(),
            cold_placements: 0,
            lifetimes: lifetimes::Lifetimes::default(),
            no_device_waits: false,
            lane: Lane::Working,
            hold_events: false,
            hold_markers: false,
            stats: PoolStats::default(),
            owner: 0,
            history: HistorySlot::default(),
        }
    }

    /// The configuration as normalised by [`Pool::new`].
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Allocates `bytes` (rounded up to the alignment) for use on `stream`.
    pub fn alloc(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
    ) -> Result<u64, PoolError> {
        self.alloc_tagged(backing, bytes, stream, 0)
    }

    /// `alloc`, except that moving pages under the memory limit may not wait for the device
    /// (`VirtualMemory::quiesce`, a synchronisation of the whole context on CUDA): where only
    /// pages that queued work may still touch would make room, it fails with `OutOfMemory`
    /// and waits for nothing (pages known idle may have moved). For a caller with a cheaper
    /// way to make room: the executor first takes back blocks pending on its copies, which
    /// costs the compute stream a wait on those copies instead of stopping the host until the
    /// device drains (GPT-2 at a third of its working set on the H200: 5 such waits a step and
    /// the device idle while the pages moved).
    pub fn alloc_no_wait(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
    ) -> Result<u64, PoolError> {
        self.alloc_no_wait_in(backing, bytes, stream, Lane::Working)
    }

    /// `alloc`, marking the block with `tag` (the runtime's own blocks have tag 0). Every
    /// allocation comes through here, so `alloc_inner` has one call site and is inlined into it:
    /// the lane and the no-wait rule reach it as fields, set around the call, not as arguments.
    pub fn alloc_tagged(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
        tag: u8,
    ) -> Result<u64, PoolError> {
        if bytes == 0 {
            return Err(PoolError::ZeroSize);
        }
        if !self.pending.is_empty() {
            self.process_events(backing);
        }
        let idx = match self.alloc_inner(backing, bytes, stream) {
            Ok(i) => i,
            Err(e) => {
                self.stats.failed_alloc_count += 1;
                self.note(Action::Oom, 0, bytes, stream.0);
                return Err(e);
            }
        };
        Ok(self.hand_out(idx, bytes, tag))
    }

    fn alloc_inner(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
    ) -> Result<u32, PoolError> {
        let Some(rounded) = round_up(bytes, self.config.alignment) else {
            return Err(self.oom(bytes));
        };
        let si = self.stream_ix(stream, self.lane);
        if self.streams[si as usize].virtual_growth {
            // An epoch that follows its plan (`epochs.rs`).
            if self.streams[si as usize].epochs.mode.plans() {
                if let Some(i) = self.alloc_planned(backing, si, rounded)? {
                    return Ok(i);
                }
            }
            // One that lived through the last epoch over this floor (`step_lived.rs`).
            if self.streams[si as usize].epochs.wants_lowest() {
                if let Some(i) = self.take_lowest(backing, si, rounded)? {
                    return Ok(i);
                }
            }
            // The two common cases first, without asking the backing for its virtual memory:
            // a mapped free block, and the mapped start of the range's last block.
            if let Some(i) = self.take_fit(si, Kind::Virtual, rounded) {
                if let Some(j) = self.take_tail_before_warm_split(si, i, rounded) {
                    return Ok(j);
                }
                // Requests of at most a page share pages with their neighbours: they take the
                // high end of the hole, so its low end stays whole pages for large requests.
                if rounded <= self.page {
                    return Ok(self.split_high(i, rounded));
                }
                self.split(i, rounded);
                return Ok(i);
            }
            let r = self.streams[si as usize].range;
            // The tail prefix needs no cold block holding the request at a mapped end.
            let mut first = None;
            if r != NIL {
                if self.streams[si as usize].cold.is_empty() {
                    if let Some(i) = self.take_tail_prefix::<true>(si, r, rounded) {
                        return Ok(i);
                    }
                } else {
                    first = self.first_cold_fit(si, rounded);
                    let taken = match first {
                        // A hole's end on mapped pages.
                        Some(key @ ((0, _, _), _)) => self.take_cold_end(si, rounded, key),
                        _ => self.take_tail_prefix::<false>(si, r, rounded),
                    };
                    if let Some(i) = taken {
                        return Ok(i);
                    }
                }
            }
            if let Some(vm) = backing.vmm() {
                if let Some(i) = self.alloc_virtual(backing, vm, si, (bytes, rounded), first)? {
                    return Ok(i);
                }
            }
        }
        let kind = if rounded <= self.config.small_request_max {
            Kind::Small
        } else {
            Kind::Large
        };
        let idx = match self.take_fit(si, kind, rounded) {
            Some(i) => i,
            None => self.grow(backing, bytes, rounded, kind, si)?,
        };
        self.split(idx, rounded);
        self.mark_busy(self.blocks[idx].seg);
        Ok(idx)
    }

    /// Returns the block to the free lists of the stream it was allocated on (stream-ordered
    /// reuse: the next alloc on that stream may reuse it at once).
    pub fn free(&mut self, backing: &dyn PoolBacking, addr: u64) -> Result<(), PoolError> {
        let idx = self.take_live(addr)?;
        self.note_block(Action::FreeRequested, idx);
        self.note_block(Action::FreeCompleted, idx);
        self.free_block(idx);
        self.note_free(backing, idx);
        Ok(())
    }

    /// `free` of the block at `addr` only if it is live, allocated with `tag` on `stream` (and,
    /// when given, with `requested` bytes) — one lookup for the common case of a raw free. True:
    /// freed; false: nothing changed (no such live block, or something differs: `block_info`
    /// says what). A plain flag, not a `Result` holding a `BlockInfo` or a `PoolError`: the
    /// caller's common case then reads one register.
    #[inline]
    pub fn free_if_owned(
        &mut self,
        backing: &dyn PoolBacking,
        addr: u64,
        tag: u8,
        stream: StreamId,
        requested: Option<u64>,
    ) -> bool {
        // One probe of the live map for the common case.
        let Some(at) = self.live.find(addr) else {
            return false;
        };
        let idx = self.live.value_at(at);
        let b = &self.blocks[idx];
        let owner = self.streams[b.owner as usize].stream;
        if b.tag != tag || owner != stream || requested.is_some_and(|n| n != b.requested) {
            return false;
        }
        self.live.remove_at(at);
        self.count_free(idx);
        self.note_block(Action::FreeRequested, idx);
        self.note_block(Action::FreeCompleted, idx);
        self.free_block(idx);
        self.note_free(backing, idx);
        true
    }

    /// Size the block at `addr` was rounded to, if live.
    pub fn block_size(&self, addr: u64) -> Option<u64> {
        self.live.get(addr).map(|i| self.blocks[i].size)
    }

    /// What the pool knows of the live block at `addr`.
    pub fn block_info(&self, addr: u64) -> Option<BlockInfo> {
        self.live.get(addr).map(|i| {
            let b = &self.blocks[i];
            BlockInfo {
                stream: self.streams[b.owner as usize].stream,
                tag: b.tag,
                size: b.size,
                requested: b.requested,
            }
        })
    }

    /// Returns every completely free plain segment and every free mapped page to the device;
    /// returns bytes released. The slots a period's steering turn holds for its carry
    /// (`period_steer.rs`) are the pool's, not the program's: they go back too, and the carry
    /// then takes its slot only if it is still free. The high-water mark that the recycling rule
    /// measures against restarts from what is in use now, and so does the time accounting of
    /// its moves. On a device error the memory that failed stays tracked and the error is
    /// returned.
    pub fn release_cached(&mut self, backing: &dyn PoolBacking) -> Result<u64, PoolError> {
        self.process_events(backing);
        self.release_all_holds();
        self.high_water = self.stats.allocated_bytes + self.pending_bytes;
        let mut released = 0;
        if let Some(vm) = backing.vmm() {
            if self.mapped_pages > 0 {
                released += self.recycle_all(backing, vm, Keep::Nothing)? * self.page;
                // Every alias goes too (chunks still live keep their live address).
                self.drop_all_shadows(vm)?;
                vm.trim()?;
            }
        }
        released += self.release_idle_segments(backing)?;
        self.mapped_peak = self.mapped_pages;
        // The moves' time accounting restarts with it (`move_budget.rs`).
        self.moves.restart();
        Ok(released)
    }

    /// Releases every segment and range (runtime teardown). Blocks still live or pending on an
    /// event are forgotten and reported as [`PoolError::LiveBlocks`] (the memory is released
    /// anyway); memory the device refuses to free stays tracked and the first such error is
    /// returned instead.
    pub fn release_all(&mut self, backing: &dyn PoolBacking) -> Result<(), PoolError> {
        self.process_events(backing);
        self.release_all_holds();
        let live = self.live.len() as u64;
        let pending = self.pending_blocks;
        let bytes = self.stats.allocated_bytes + self.pending_bytes;
        let mut order: Vec<(u64, u32)> = (0..self.segs.len() as u32)
            .filter(|&s| self.segs[s].live)
            .map(|s| (self.segs[s].base, s))
            .collect();
        order.sort_unstable();
        let mut first_err = None;
        if let Some(vm) = backing.vmm() {
            // Shadows first: each chunk is then unmapped, and freed, once, at its live address.
            if let Err(e) = self.drop_all_shadows(vm) {
                first_err = Some(e);
            }
        }
        for (_, s) in order {
            match self.release_segment(backing, s) {
                Ok(()) => self.forget_segment(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for st in &mut self.streams {
            for e in st
                .markers
                .drain(..)
                .map(|(e, _)| e)
                .chain(st.spare_markers.drain(..))
            {
                backing.release_marker(e);
            }
        }
        if let Some(e) = first_err {
            return Err(PoolError::Device(e));
        }
        if live + pending > 0 {
            return Err(PoolError::LiveBlocks {
                live,
                pending,
                bytes,
            });
        }
        Ok(())
    }

    /// The largest free block the pool holds with all of its memory mapped: what one
    /// allocation could get without taking more from the device. A scan, for error messages.
    pub fn largest_free_block(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == block::State::Free && b.unmapped == 0)
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
    }

    /// The size of the pages the pool grows by on `vm` (a block of at most one shares pages with
    /// its neighbours): the one its ranges use once one is reserved, before that the device's
    /// granularity (at least the alignment, as `ensure_range` takes it); 0 where it grows by
    /// plain segments.
    pub fn page_size(&self, vm: Option<&dyn VirtualMemory>) -> u64 {
        if self.page != 0 {
            return self.page;
        }
        match vm {
            Some(vm) if self.config.vmm => vm.granularity().max(self.config.alignment),
            _ => 0,
        }
    }

    pub fn stats(&self) -> PoolStats {
        let (epochs_followed, epochs_left) = self.epoch_counts();
        PoolStats {
            epochs_followed,
            epochs_left,
            ..self.stats
        }
    }

    /// Slack-rule page moves declined because moving had used up its share of time.
    pub fn recycle_declined_count(&self) -> u64 {
        self.moves.declined
    }

    /// Peaks := current values.
    pub fn reset_peaks(&mut self) {
        self.peak_before_reset = self.program_peak();
        self.stats.peak_allocated_bytes = self.stats.allocated_bytes;
        self.stats.peak_reserved_bytes = self.stats.reserved_bytes;
    }

    /// The most bytes the program has had allocated at once, ever (`reset_peaks` does not
    /// lower it).
    pub(super) fn program_peak(&self) -> u64 {
        self.peak_before_reset.max(self.stats.peak_allocated_bytes)
    }

    /// Sets the cap on reserved bytes. Takes effect on the next growth; memory already reserved
    /// beyond a lowered limit is not released here (call `release_cached`).
    pub fn set_memory_limit(&mut self, limit: u64) {
        self.config.memory_limit = limit;
    }

    pub fn memory_limit(&self) -> u64 {
        self.config.memory_limit
    }

    /// Block `idx` (out of every index) becomes an allocation of `bytes` with `tag`: counted,
    /// findable by address. Returns its address. Forced inline: every allocation ends here.
    #[inline(always)]
    fn hand_out(&mut self, idx: u32, bytes: u64, tag: u8) -> u64 {
        let seq = self.stats.alloc_count + 1;
        let (addr, size) = {
            let b = &mut self.blocks[idx];
            b.state = State::Allocated;
            b.requested = bytes;
            b.tag = tag;
            b.fnext = self.owner;
            // Unused while allocated: it holds the allocation's order, so that a free can
            // tell how many allocations the block lived (`lifetimes.rs`).
            b.freed_epoch = seq;
            // Unused while allocated too: the allocation's index in its stream's epoch log
            // (`epochs.rs`), or NIL.
            b.fprev = NIL;
            if b.kind == Kind::Virtual {
                b.fprev = self.streams[b.owner as usize]
                    .epochs
                    .on_alloc(b.addr, b.size, seq);
            }
            (b.addr, b.size)
        };
        self.note_block(Action::Alloc, idx);
        self.live.insert(addr, idx);
        let now = self.stats.allocated_bytes + size;
        if self.new_step.on_alloc(now, self.program_peak()) {
            // A step is over, though no range emptied and no epoch was found (wgan_gp_train's
            // steps free a block made before them): the start-up's moves are made.
            self.moves.note_steady();
        }
        let s = &mut self.stats;
        s.allocated_bytes += size;
        s.requested_bytes += bytes;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.alloc_count = seq;
        let in_use = s.allocated_bytes + self.pending_bytes;
        self.high_water = self.high_water.max(in_use);
        addr
    }

    #[inline(always)]
    fn take_live(&mut self, addr: u64) -> Result<u32, PoolError> {
        let idx = self
            .live
            .remove(addr)
            .ok_or(PoolError::UnknownPointer(addr))?;
        self.count_free(idx);
        Ok(idx)
    }

    /// The statistics of freeing live block `idx` (already out of the live map).
    #[inline]
    fn count_free(&mut self, idx: u32) {
        let b = &self.blocks[idx];
        if self.config.tail_first == TailFirst::ShortLived {
            // `freed_epoch` holds the allocation's order while allocated (`hand_out`).
            let life = self.stats.alloc_count.saturating_sub(b.freed_epoch);
            self.lifetimes.note(b.size, life);
        }
        if b.kind == Kind::Virtual {
            let (addr, size, seq, k, si) = (b.addr, b.size, b.freed_epoch, b.fprev, b.owner);
            if self.streams[si as usize].epochs.on_free(addr, size, seq, k) {
                self.keep_found_epoch(si, idx);
            }
        }
        let b = &self.blocks[idx];
        let s = &mut self.stats;
        s.allocated_bytes -= b.size;
        s.requested_bytes -= b.requested;
        s.free_count += 1;
        let now = s.allocated_bytes;
        self.new_step.on_free(now, self.program_peak());
    }

    fn oom(&self, requested: u64) -> PoolError {
        PoolError::OutOfMemory {
            requested,
            reserved: self.stats.reserved_bytes,
            allocated: self.stats.allocated_bytes,
            limit: self.config.memory_limit,
        }
    }
}

fn round_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v & !(a - 1))
}

/// A page count as kept in a block (ranges hold far fewer than 2^32 pages).
#[inline]
fn pages32(n: u64) -> u32 {
    debug_assert!(n <= u32::MAX as u64, "{n} pages");
    n as u32
}

#[cfg(test)]
pub(crate) mod tests;
