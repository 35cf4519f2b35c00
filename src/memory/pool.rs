//! The caching device-memory pool.
//!
//! Owns: the bookkeeping of the device memory obtained through a [`PoolBacking`] (the runtime
//! implements it over `dyn Device`) — plain segments, and on devices with virtual memory one
//! reserved address range per stream with physical pages mapped on demand — the blocks carved
//! out of them, the memory budget (`memory_limit`, enforced on reserved bytes) and the always-on
//! O(1) statistics. It owns no device memory itself: everything comes from and goes back to
//! the backing.
//!
//! Data structures (no linear scans over blocks on alloc or free, no allocation per operation
//! once warm):
//! - blocks live in a slab (`Vec` + free-index list) with `prev`/`next` links to their
//!   neighbours, so coalescing is O(1);
//! - free blocks sit in segregated size classes with two-level bitmaps (`tlsf.rs`), one index
//!   per stream and kind (small, large, virtual): the request's own class is searched for the
//!   best fit, then the first non-empty class above it (every block there fits), each list
//!   looked at for at most `FIT_SCAN` entries, smallest size then lowest address winning — best
//!   fit in practice, O(1) always;
//! - live blocks are found by address in a `HashMap` with a multiplicative hash;
//! - free blocks of a virtual range that contain unmapped pages ("cold" blocks, few: the
//!   unreserved tail of the range and holes whose pages were recycled) sit in an ordered set per
//!   stream, searched only when no mapped free block fits; the range's last block is not in it
//!   (placement and recycling look at it directly: it changes with nearly every allocation at the
//!   top of the used memory).
//!
//! Policies:
//! - **Rounding / splitting.** Every request is rounded up to `alignment` (a power of two,
//!   default 256) and the chosen free block is split to exactly that size, so `block_size` is
//!   always the rounded request (planners predict `allocated_bytes` from it).
//! - **Virtual ranges (devices with virtual memory, `config.vmm`, or per stream with
//!   `set_new_stream_growth`).** The first allocation on a stream reserves one address range
//!   (`vmm_reserve_bytes`, default twice the memory limit, at most 1 TiB) for that stream;
//!   every block of the stream is carved from it and physical pages (`vmm_page_bytes`, 64 MiB:
//!   one device allocation each) are mapped under a block when it is allocated. Free memory
//!   therefore never splits at a segment seam, small and large requests share one range, and
//!   reserved bytes are mapped pages, not address space. A request first
//!   tries the free blocks whose pages are all mapped (no device call); otherwise it is placed,
//!   at the low or the high end of a free block, where it needs the fewest new pages (then best
//!   fit, then lowest address) — and when every end needs new pages, also at the ends of the runs
//!   of mapped pages inside large free blocks, so mapped memory in the middle of a hole is used
//!   where it lies instead of being moved (the GPT-2 trace moved ten pages every step before).
//!   If the range cannot hold it (or the device cannot reserve one), the request falls back to
//!   plain segments.
//! - **Recycling pages.** A mapped page lying wholly inside a free block can be unmapped and
//!   its memory mapped where it is needed. The pool does so (a) when the budget would be
//!   exceeded, and (b) when a request needs at least `recycle_min_bytes` of new pages and the
//!   mapped total would exceed the high-water mark of allocated bytes by more than
//!   `recycle_slack_permille`: large transient tensors then reuse the physical memory of holes
//!   instead of growing the footprint (this is what keeps peak reserved within 4% of peak live
//!   on the GPT-2 trace, against 9% without). Victims are the free blocks with the most mapped
//!   pages, unmapped from their high end. Stream-ordered frees may still have work queued on those pages, so a page is
//!   unmapped only once the device is known to be past the free: every 256 frees (and at most
//!   once a millisecond) the pool records a marker event on the stream and polls it later;
//!   pages freed before a completed
//!   marker move at once, others only after waiting for the device (`VirtualMemory::quiesce`) —
//!   which the budget always may, and the slack rule only with `recycle_waits` (off by default:
//!   the pool never stalls the device for the slack and maps new pages instead). Before picking,
//!   the slack rule records a marker after the latest frees and polls it briefly
//!   (`recycle_spin_ns`): an idle device passes it, a busy one does not.
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
//! - **Statistics.** `failed_alloc_count` counts allocations that failed for lack of memory or a
//!   device error (not zero-size requests). `free_count` counts `free` and `free_after_event`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use super::addr_map::AddrMap;
use super::pages::PageMap;
use super::tlsf::{class_of, Classes, CLASSES, NIL};
use crate::device::{DeviceError, EventId, StreamId, VirtualMemory};

const MIB: u64 = 1 << 20;
/// Entries of one size-class list looked at for the best fit.
const FIT_SCAN: usize = 32;
/// Cold blocks looked at when no mapped free block fits.
const COLD_SCAN: usize = 32;
/// Runs of mapped pages inside a cold block whose ends are tried as placements.
const MAPPED_RUNS_TRIED: usize = 4;

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
}

/// Markers in flight per stream, at most (the slack rule's own may take it to twice that).
const MARKERS_IN_FLIGHT: usize = 8;

/// Pool configuration. [`Pool::new`] normalises it (see [`Pool::config`]): `alignment` becomes a
/// power of two (0 means the default), segment sizes become multiples of the alignment and at
/// least as large as the requests they serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Every block address and rounded size is a multiple of this (default 256).
    pub alignment: u64,
    /// Cap on reserved bytes (plain segments plus mapped pages); `u64::MAX` = none.
    pub memory_limit: u64,
    /// Requests up to this many bytes use the small pool (default 1 MiB).
    pub small_request_max: u64,
    /// Size of a small-pool segment (default 2 MiB).
    pub small_segment_bytes: u64,
    /// Large-pool requests up to this many bytes share medium segments (default 10 MiB).
    pub medium_request_max: u64,
    /// Size of a shared large-pool segment (default 20 MiB).
    pub medium_segment_bytes: u64,
    /// Larger requests get their own segment, rounded up to a multiple of this (default 2 MiB).
    pub large_segment_rounding: u64,
    /// Use the backing's virtual memory when it has some (default true).
    pub vmm: bool,
    /// Address space reserved per stream in virtual mode; 0 (default) = twice the memory limit,
    /// at least 1 GiB and at most 1 TiB.
    pub vmm_reserve_bytes: u64,
    /// Unit of physical memory in virtual mode: each page is one device allocation, mapped and
    /// unmapped whole (default 64 MiB; rounded up to a power of two and to the device's
    /// granularity). Larger pages mean fewer driver calls when memory moves, smaller ones less
    /// rounding at the edges of used memory (measured on the traces: 2 MiB pages moved memory
    /// 32 times as often as 64 MiB ones for the same fragmentation).
    pub vmm_page_bytes: u64,
    /// Mapped memory may exceed the high-water mark of allocated bytes by this many thousandths
    /// before large requests recycle free pages instead of mapping new ones (default 30).
    pub recycle_slack_permille: u64,
    /// Only a request needing at least this many bytes of new pages recycles under the slack
    /// rule (default 32 MiB); the budget always recycles.
    pub recycle_min_bytes: u64,
    /// Whether the slack rule may wait for the device (`quiesce`) to reuse pages that queued
    /// work may still touch. Default false: it moves only pages the device is known to be done
    /// with (markers) and otherwise maps new ones, so it never stalls the device (measured on the
    /// H200: waiting made a GPT-2 training step 10% slower for 1.2% less memory). The budget
    /// may always wait.
    pub recycle_waits: bool,
    /// Before the slack rule picks pages to move, it records a marker after the latest frees
    /// and polls it for up to this long (default 200 µs): an idle or nearly idle device passes
    /// it, and the pages freed before it can move without a stall; a busy one does not, and new
    /// pages are mapped (after a miss, spins back off exponentially).
    pub recycle_spin_ns: u64,
    /// Stream-ordered frees between two marker events on a stream with a virtual range
    /// (default 256): more frequent markers tell recycling sooner which free pages the device
    /// is done with, at one event query and one record each.
    pub marker_every: u32,
    /// Least time between two of those markers (default 1 ms). A marker costs two driver calls
    /// (a record, a query: 5–9% of the time per operation of a replay on the H200 machine, where
    /// 256 frees take about 20 µs), while the device's progress matters to recycling on the
    /// scale of kernels and steps: a GPT-2 training step frees 256 blocks in about 3.5 ms, so
    /// real programs keep their markers.
    pub marker_min_interval_ns: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            alignment: 256,
            memory_limit: u64::MAX,
            small_request_max: MIB,
            small_segment_bytes: 2 * MIB,
            medium_request_max: 10 * MIB,
            medium_segment_bytes: 20 * MIB,
            large_segment_rounding: 2 * MIB,
            vmm: true,
            vmm_reserve_bytes: 0,
            vmm_page_bytes: 64 * MIB,
            recycle_slack_permille: 30,
            recycle_min_bytes: 32 * MIB,
            recycle_waits: false,
            recycle_spin_ns: 200_000,
            marker_every: 256,
            marker_min_interval_ns: 1_000_000,
        }
    }
}

impl PoolConfig {
    fn normalized(mut self) -> PoolConfig {
        let a = match self.alignment {
            0 => 256,
            a => a.checked_next_power_of_two().unwrap_or(1 << 63),
        };
        self.alignment = a;
        let up = |x: u64| round_up(x.max(1), a).unwrap_or(u64::MAX - (u64::MAX % a));
        self.small_request_max = up(self.small_request_max);
        self.medium_request_max = up(self.medium_request_max.max(self.small_request_max));
        self.small_segment_bytes = up(self.small_segment_bytes.max(self.small_request_max));
        self.medium_segment_bytes = up(self.medium_segment_bytes.max(self.medium_request_max));
        self.large_segment_rounding = up(self.large_segment_rounding);
        self
    }

    /// Benchmark knobs, read when a pool is made: `GKRT_POOL_PAGE_MIB` (`vmm_page_bytes` in
    /// MiB), `GKRT_POOL_SLACK_PERMILLE` (`recycle_slack_permille`), `GKRT_POOL_RECYCLE_MIN_MIB`
    /// (`recycle_min_bytes` in MiB), `GKRT_POOL_RECYCLE_WAIT` (`recycle_waits`, 0 or 1),
    /// `GKRT_POOL_RECYCLE_SPIN_US` (`recycle_spin_ns` in µs), `GKRT_POOL_MARKER_EVERY`
    /// (`marker_every`), `GKRT_POOL_MARKER_MIN_US` (`marker_min_interval_ns` in µs). Values
    /// that do not parse are
    /// ignored with a warning.
    fn with_env_overrides(mut self) -> PoolConfig {
        let read = |name: &str| -> Option<u64> {
            let v = std::env::var(name).ok()?;
            let n = v.trim().parse().ok();
            if n.is_none() {
                log::warn!("gkrt pool: ignoring {name}='{v}' (not a number)");
            }
            n
        };
        if let Some(m) = read("GKRT_POOL_PAGE_MIB") {
            self.vmm_page_bytes = m.saturating_mul(MIB);
        }
        if let Some(p) = read("GKRT_POOL_SLACK_PERMILLE") {
            self.recycle_slack_permille = p;
        }
        if let Some(m) = read("GKRT_POOL_RECYCLE_MIN_MIB") {
            self.recycle_min_bytes = m.saturating_mul(MIB);
        }
        if let Some(w) = read("GKRT_POOL_RECYCLE_WAIT") {
            self.recycle_waits = w != 0;
        }
        if let Some(us) = read("GKRT_POOL_RECYCLE_SPIN_US") {
            self.recycle_spin_ns = us.saturating_mul(1000);
        }
        if let Some(n) = read("GKRT_POOL_MARKER_EVERY") {
            self.marker_every = n.clamp(1, u32::MAX as u64) as u32;
        }
        if let Some(us) = read("GKRT_POOL_MARKER_MIN_US") {
            self.marker_min_interval_ns = us.saturating_mul(1000);
        }
        self
    }

    /// Address space to reserve per stream for pages of `page` bytes.
    fn reserve_bytes(&self, page: u64) -> u64 {
        const GIB: u64 = 1 << 30;
        let want = match self.vmm_reserve_bytes {
            0 => self.memory_limit.saturating_mul(2).clamp(GIB, 1 << 40),
            n => n,
        };
        round_up(want.max(page), page).unwrap_or(want - want % page)
    }
}

/// Pool statistics; all O(1) and always on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Sum of rounded sizes of live blocks.
    pub allocated_bytes: u64,
    /// Memory held from the device: plain segments plus mapped pages.
    pub reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Sum of sizes as requested (unrounded) of live blocks.
    pub requested_bytes: u64,
    /// Successful allocations, cumulative.
    pub alloc_count: u64,
    /// Successful frees (`free` and `free_after_event`), cumulative.
    pub free_count: u64,
    /// Live segments (plain segments and reserved virtual ranges).
    pub segment_count: u64,
    /// Cumulative device segment allocations and range reservations.
    pub segment_alloc_count: u64,
    /// Cumulative device segment frees and range releases.
    pub segment_free_count: u64,
    /// Allocations that failed (out of memory or a device error), cumulative.
    pub failed_alloc_count: u64,
    /// Pages mapped into virtual ranges, cumulative.
    pub page_map_count: u64,
    /// Pages unmapped from virtual ranges, cumulative.
    pub page_unmap_count: u64,
    /// Times free pages were recycled, cumulative.
    pub recycle_count: u64,
    /// Times recycling waited for the device (`VirtualMemory::quiesce`), cumulative.
    pub device_wait_count: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PoolError {
    ZeroSize,
    /// Would exceed `memory_limit`, or the device refused even after releasing cached memory.
    OutOfMemory {
        requested: u64,
        reserved: u64,
        allocated: u64,
        limit: u64,
    },
    /// Free of an address the pool did not hand out (or freed twice).
    UnknownPointer(u64),
    /// A device error (also `DeviceError::Invalid` for memory the pool cannot use).
    Device(DeviceError),
    /// `release_all` found blocks still in use (`live` allocated, `pending` waiting on an
    /// event, `bytes` their total size); every segment was released anyway.
    LiveBlocks {
        live: u64,
        pending: u64,
        bytes: u64,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::ZeroSize => write!(f, "allocation of 0 bytes"),
            PoolError::OutOfMemory {
                requested,
                reserved,
                allocated,
                limit,
            } => {
                write!(
                    f,
                    "out of device memory: requested {requested} bytes with {reserved} bytes \
                     reserved and {allocated} bytes allocated, "
                )?;
                if *limit == u64::MAX {
                    write!(f, "no memory limit (the device refused)")
                } else {
                    write!(f, "memory limit {limit} bytes")
                }
            }
            PoolError::UnknownPointer(addr) => write!(
                f,
                "free of unknown pointer {addr:#x} (not allocated by this pool, or already freed)"
            ),
            PoolError::Device(e) => write!(f, "device error in the memory pool: {e}"),
            PoolError::LiveBlocks {
                live,
                pending,
                bytes,
            } => write!(
                f,
                "memory pool released with {live} live block(s) and {pending} block(s) pending \
                 on an event, {bytes} bytes in all"
            ),
        }
    }
}

impl std::error::Error for PoolError {}

impl From<DeviceError> for PoolError {
    fn from(e: DeviceError) -> Self {
        PoolError::Device(e)
    }
}

/// A live block, as [`Pool::block_info`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// The stream it was allocated on (and is reused on).
    pub stream: StreamId,
    /// The tag given to `alloc_tagged` (0 for `alloc`).
    pub tag: u8,
    /// Rounded size.
    pub size: u64,
    /// Size as requested.
    pub requested: u64,
}

/// One step of [`Pool::dry_run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DryRunStep {
    Alloc {
        bytes: u64,
        stream: StreamId,
    },
    /// Free (stream-ordered) the block allocated by the `Alloc` at index `step` of the same list.
    Free {
        step: usize,
    },
    /// Free (stream-ordered) a block that is live in the real pool.
    FreeLive {
        addr: u64,
    },
}

fn round_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v & !(a - 1))
}

/// Multiplicative hashing for addresses and stream ids: one 128-bit multiply, both halves
/// folded, so keys that differ only in high bits (2 MiB-aligned blocks) still spread.
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let m = (self.0 as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (m as u64) ^ ((m >> 64) as u64)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = self.0.rotate_left(32) ^ x;
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }
}

type FastHash = BuildHasherDefault<AddrHasher>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Allocated,
    /// Waiting for an event (kept in `fprev`: a pending block is in no free list).
    Pending,
    /// Slab slot not in use.
    Vacant,
}

/// Which free index a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Small = 0,
    Large = 1,
    Virtual = 2,
}

/// One block of a segment or range: 64 bytes, one cache line (the pool's operations are mostly
/// reads of a few blocks at scattered slab slots).
#[derive(Clone, Debug)]
#[repr(align(64))]
struct Block {
    addr: u64,
    size: u64,
    /// Size as requested, while allocated.
    requested: u64,
    /// Index of the segment or range in `segs`.
    seg: u32,
    /// Index of the owning stream in `slots`.
    slot: u32,
    /// Neighbours by address inside the segment.
    prev: u32,
    next: u32,
    /// Links of the free list the block is in (warm blocks only); a pending block keeps the
    /// id of its event in `fprev`.
    fprev: u32,
    fnext: u32,
    /// Free blocks of a virtual range: unmapped pages lying wholly inside the block.
    unmapped: u32,
    /// Free blocks: the marker epoch of the last stream-ordered free of memory in the block
    /// (0: never in use, or in use only until an event that completed). Pending blocks: when
    /// they were parked (`Pool::park_seq`).
    freed_epoch: u64,
    kind: Kind,
    state: State,
    tag: u8,
    /// Free and in its stream's cold set (virtual, with unmapped pages) rather than a list.
    cold: bool,
}

impl Block {
    /// A free, unlinked block for `[addr, addr + size)` cut from this one (same segment,
    /// stream, kind and free epoch), between neighbours `prev` and `next`; its `unmapped` count
    /// is the caller's to set.
    #[inline(always)]
    fn free_piece(&self, addr: u64, size: u64, prev: u32, next: u32) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            seg: self.seg,
            slot: self.slot,
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

#[derive(Clone, Debug)]
struct Segment {
    base: u64,
    size: u64,
    /// Block at the base (merges keep the lower block; carving off the low end of a range's
    /// last block makes a new first block when that was the only one).
    first: u32,
    /// Block at the end.
    tail: u32,
    /// Plain segments: blocks allocated or pending on an event.
    busy: u64,
    kind: Kind,
    /// Virtual ranges: which pages are mapped.
    pages: Option<PageMap>,
    live: bool,
}

/// Free indexes of one stream.
#[derive(Clone, Debug)]
struct Slot {
    stream: StreamId,
    warm: [Classes; 3],
    /// Free blocks of the range with unmapped pages: (size, addr, block).
    cold: BTreeSet<(u64, u64, u32)>,
    /// Segment index of the stream's virtual range, or NIL.
    range: u32,
    /// Reserving a range failed: use plain segments from now on.
    range_failed: bool,
    /// Grow by virtual ranges (`config.vmm`, or `set_new_stream_growth`) rather than segments.
    virtual_growth: bool,
    /// Marker events in flight on the stream, oldest first, with their epochs; and completed
    /// ones kept for re-recording.
    markers: std::collections::VecDeque<(EventId, u64)>,
    spare_markers: Vec<EventId>,
    /// Frees on this stream with a smaller epoch are known done on the device.
    safe_epoch: u64,
    /// Frees since the last marker.
    frees: u32,
    /// When `note_free` last recorded a marker.
    last_marker: Option<std::time::Instant>,
    /// Spin opportunities to skip after consecutive misses (backoff), and the current streak.
    spin_skip: u32,
    spin_misses: u32,
}

/// The caching device-memory pool. See the module comment for the policies.
#[derive(Clone, Debug)]
pub struct Pool {
    config: PoolConfig,
    /// log2(alignment).
    shift: u32,
    slab: Vec<Block>,
    vacant: Vec<u32>,
    segs: Vec<Segment>,
    vacant_segs: Vec<u32>,
    live: AddrMap,
    slots: Vec<Slot>,
    slot_of: HashMap<StreamId, u32, FastHash>,
    /// The stream of the latest allocation and its slot (nearly every allocation repeats it).
    last_slot: (StreamId, u32),
    pending: BTreeMap<EventId, Vec<u32>>,
    pending_bytes: u64,
    pending_blocks: u64,
    /// Plain segments with no allocated or pending block (exactly one free block each).
    idle: BTreeSet<u32>,
    /// Page size of the virtual ranges (0 until one exists).
    page: u64,
    /// Pages mapped over all ranges.
    mapped_pages: u64,
    /// Most bytes ever allocated or pending at once (not reset by `reset_peaks`).
    high_water: u64,
    /// Epoch of the next stream-ordered free (advances with each marker recorded).
    epoch: u64,
    /// Blocks parked on events so far.
    park_seq: u64,
    stats: PoolStats,
}

impl Pool {
    pub fn new(config: PoolConfig) -> Pool {
        let config = config.with_env_overrides().normalized();
        Pool {
            shift: config.alignment.trailing_zeros(),
            config,
            slab: Vec::new(),
            vacant: Vec::new(),
            segs: Vec::new(),
            vacant_segs: Vec::new(),
            live: AddrMap::default(),
            slots: Vec::new(),
            slot_of: HashMap::default(),
            last_slot: (StreamId(u32::MAX), NIL),
            pending: BTreeMap::new(),
            pending_bytes: 0,
            pending_blocks: 0,
            idle: BTreeSet::new(),
            page: 0,
            mapped_pages: 0,
            high_water: 0,
            epoch: 1,
            park_seq: 0,
            stats: PoolStats::default(),
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

    /// `alloc`, marking the block with `tag` (the runtime's own blocks have tag 0).
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
        let slot = self.slot(stream);
        if self.slots[slot as usize].virtual_growth {
            // The two common cases first, without asking the backing for its virtual memory:
            // a mapped free block, and the mapped start of the range's last block.
            if let Some(i) = self.take_fit(slot, Kind::Virtual, rounded) {
                self.split(i, rounded);
                return Ok(i);
            }
            let r = self.slots[slot as usize].range;
            if r != NIL {
                if let Some(i) = self.take_tail_prefix(slot, r, rounded) {
                    return Ok(i);
                }
            }
            if let Some(vm) = backing.vmm() {
                if let Some(i) = self.alloc_virtual(backing, vm, slot, bytes, rounded)? {
                    return Ok(i);
                }
            }
        }
        let kind = if rounded <= self.config.small_request_max {
            Kind::Small
        } else {
            Kind::Large
        };
        let idx = match self.take_fit(slot, kind, rounded) {
            Some(i) => i,
            None => self.grow(backing, bytes, rounded, kind, slot)?,
        };
        self.split(idx, rounded);
        self.mark_busy(self.slab[idx as usize].seg);
        Ok(idx)
    }

    /// Returns the block to the free lists of the stream it was allocated on (stream-ordered
    /// reuse: the next alloc on that stream may reuse it at once).
    pub fn free(&mut self, backing: &dyn PoolBacking, addr: u64) -> Result<(), PoolError> {
        let idx = self.take_live(addr)?;
        self.release_block(idx);
        self.note_free(backing, idx);
        Ok(())
    }

    /// `free` of the block at `addr` only if it was allocated with `tag` on `stream` (and, when
    /// given, with `requested` bytes) — one lookup for the common case of a raw free. `Ok(None)`:
    /// freed; `Ok(Some(info))`: left allocated because something differs; `UnknownPointer`: no
    /// such live block.
    pub fn free_if_owned(
        &mut self,
        backing: &dyn PoolBacking,
        addr: u64,
        tag: u8,
        stream: StreamId,
        requested: Option<u64>,
    ) -> Result<Option<BlockInfo>, PoolError> {
        // One probe of the live map for the common case.
        let Some(slot) = self.live.find(addr) else {
            return Err(PoolError::UnknownPointer(addr));
        };
        let idx = self.live.value_at(slot);
        let b = &self.slab[idx as usize];
        let owner = self.slots[b.slot as usize].stream;
        if b.tag != tag || owner != stream || requested.is_some_and(|n| n != b.requested) {
            return Ok(Some(BlockInfo {
                stream: owner,
                tag: b.tag,
                size: b.size,
                requested: b.requested,
            }));
        }
        self.live.remove_at(slot);
        self.count_free(idx);
        self.release_block(idx);
        self.note_free(backing, idx);
        Ok(None)
    }

    /// Frees a block whose last use was on another stream: it becomes reusable only once
    /// `event` (recorded after that use) completes. Events are polled lazily, never waited on.
    pub fn free_after_event(
        &mut self,
        _backing: &dyn PoolBacking,
        addr: u64,
        event: EventId,
    ) -> Result<(), PoolError> {
        self.park(addr, event)
    }

    fn park(&mut self, addr: u64, event: EventId) -> Result<(), PoolError> {
        let idx = self.take_live(addr)?;
        let size = self.slab[idx as usize].size;
        self.slab[idx as usize].state = State::Pending;
        self.slab[idx as usize].fprev = event.0;
        // Parking order, for `take_pending` (the field is reset when the block is freed).
        self.park_seq += 1;
        self.slab[idx as usize].freed_epoch = self.park_seq;
        self.pending_bytes += size;
        self.pending_blocks += 1;
        self.pending.entry(event).or_default().push(idx);
        Ok(())
    }

    /// Size the block at `addr` was rounded to, if live.
    pub fn block_size(&self, addr: u64) -> Option<u64> {
        self.live.get(addr).map(|i| self.slab[i as usize].size)
    }

    /// What the pool knows of the live block at `addr`.
    pub fn block_info(&self, addr: u64) -> Option<BlockInfo> {
        self.live.get(addr).map(|i| {
            let b = &self.slab[i as usize];
            BlockInfo {
                stream: self.slots[b.slot as usize].stream,
                tag: b.tag,
                size: b.size,
                requested: b.requested,
            }
        })
    }

    /// Bytes freed with `free_after_event` whose event has not been seen complete yet.
    pub fn pending_free_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Number of blocks freed with `free_after_event` whose event has not been seen complete.
    pub fn pending_free_blocks(&self) -> u64 {
        self.pending_blocks
    }

    /// Returns every completely free plain segment and every free mapped page to the device;
    /// returns bytes released. The high-water mark that the recycling rule measures against
    /// restarts from what is in use now. On a device error the memory that failed stays tracked
    /// and the error is returned.
    pub fn release_cached(&mut self, backing: &dyn PoolBacking) -> Result<u64, PoolError> {
        self.process_events(backing);
        self.high_water = self.stats.allocated_bytes + self.pending_bytes;
        let mut released = 0;
        if let Some(vm) = backing.vmm() {
            if self.mapped_pages > 0 {
                released += self.recycle(backing, vm, u64::MAX, u64::MAX, None)? * self.page;
                vm.trim()?;
            }
        }
        released += self.release_idle_segments(backing)?;
        Ok(released)
    }

    fn release_idle_segments(&mut self, backing: &dyn PoolBacking) -> Result<u64, PoolError> {
        let mut released = 0;
        while let Some(&s) = self.idle.first() {
            let (base, size, first) = {
                let seg = &self.segs[s as usize];
                (seg.base, seg.size, seg.first)
            };
            backing.free_segment(base, size)?;
            self.idle.remove(&s);
            self.unlink(first);
            self.drop_block(first);
            self.drop_segment(s);
            self.segment_gone(size);
            released += size;
        }
        Ok(released)
    }

    /// Releases every segment and range (runtime teardown). Blocks still live or pending on an
    /// event are forgotten and reported as [`PoolError::LiveBlocks`] (the memory is released
    /// anyway); memory the device refuses to free stays tracked and the first such error is
    /// returned instead.
    pub fn release_all(&mut self, backing: &dyn PoolBacking) -> Result<(), PoolError> {
        self.process_events(backing);
        let live = self.live.len() as u64;
        let pending = self.pending_blocks;
        let bytes = self.stats.allocated_bytes + self.pending_bytes;
        let mut order: Vec<(u64, u32)> = (0..self.segs.len() as u32)
            .filter(|&s| self.segs[s as usize].live)
            .map(|s| (self.segs[s as usize].base, s))
            .collect();
        order.sort_unstable();
        let mut first_err = None;
        for (_, s) in order {
            match self.give_back(backing, s) {
                Ok(()) => self.forget_segment(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for sl in &mut self.slots {
            for e in sl
                .markers
                .drain(..)
                .map(|(e, _)| e)
                .chain(sl.spare_markers.drain(..))
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

    /// Returns segment `s`'s memory to the device (a range: its mapped pages, then the range).
    fn give_back(&mut self, backing: &dyn PoolBacking, s: u32) -> Result<(), DeviceError> {
        let seg = &mut self.segs[s as usize];
        let Some(pages) = seg.pages.as_mut() else {
            return backing.free_segment(seg.base, seg.size);
        };
        let vm = backing.vmm().ok_or_else(|| {
            DeviceError::Invalid(
                "releasing a virtual range through a backing without virtual memory".into(),
            )
        })?;
        let page = self.page;
        let runs = pages.runs(0, pages.pages(), true);
        if !runs.is_empty() {
            vm.quiesce()?;
        }
        for (p, n) in runs {
            vm.unmap(seg.base + p * page, page, n)?;
            pages.set(p, p + n, false);
            self.mapped_pages -= n;
            self.stats.reserved_bytes -= n * page;
            self.stats.page_unmap_count += n;
        }
        vm.trim()?;
        vm.unreserve(seg.base, seg.size)
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Peaks := current values.
    pub fn reset_peaks(&mut self) {
        self.stats.peak_allocated_bytes = self.stats.allocated_bytes;
        self.stats.peak_reserved_bytes = self.stats.reserved_bytes;
    }

    /// Sets the cap on reserved bytes. Takes effect on the next growth; memory already reserved
    /// beyond a lowered limit is not released here (call `release_cached`).
    pub fn set_memory_limit(&mut self, limit: u64) {
        self.config.memory_limit = limit;
    }

    pub fn memory_limit(&self) -> u64 {
        self.config.memory_limit
    }

    /// Dry run: would these steps succeed from the current state? Simulated on a clone with a
    /// fake backing that grants any memory within `memory_limit` (the device's own capacity is
    /// not modelled) and treats every pending event as incomplete (conservative). Returns the
    /// statistics after the last step, or the index of the first failing step and its error.
    pub fn dry_run(&self, steps: &[DryRunStep]) -> Result<PoolStats, (usize, PoolError)> {
        let mut sim = self.clone();
        let base = self
            .segs
            .iter()
            .filter(|s| s.live)
            .map(|s| s.base.saturating_add(s.size))
            .max()
            .unwrap_or(0);
        let backing = SimBacking {
            align: self.config.alignment.max(512),
            next: std::cell::Cell::new(base),
            page: self.page,
        };
        let mut addrs: Vec<Option<u64>> = vec![None; steps.len()];
        for (i, step) in steps.iter().enumerate() {
            match *step {
                DryRunStep::Alloc { bytes, stream } => {
                    addrs[i] = Some(sim.alloc(&backing, bytes, stream).map_err(|e| (i, e))?);
                }
                DryRunStep::Free { step } => {
                    let addr = addrs
                        .get_mut(step)
                        .and_then(Option::take)
                        .ok_or((i, PoolError::UnknownPointer(0)))?;
                    sim.free(&backing, addr).map_err(|e| (i, e))?;
                }
                DryRunStep::FreeLive { addr } => sim.free(&backing, addr).map_err(|e| (i, e))?,
            }
        }
        Ok(sim.stats)
    }

    /// Allocates `bytes` on `stream` from a block pending on an event, without waiting: the
    /// smallest pending block of that stream large enough and at most 1/8 larger (the oldest
    /// of equal ones, whose copy ends first), split if larger (the rest stays pending on the
    /// same event). Returns the
    /// address and the event: the caller makes the stream that will use the block wait for it
    /// (`cuStreamWaitEvent`) before any use. `None` when no single pending block is large
    /// enough.
    pub fn take_pending(&mut self, bytes: u64, stream: StreamId) -> Option<(u64, EventId)> {
        let rounded = round_up(bytes, self.config.alignment)?;
        let slot = *self.slot_of.get(&stream)?;
        let mut best: Option<(u64, u64, EventId, usize)> = None;
        for (&event, blocks) in &self.pending {
            for (pos, &i) in blocks.iter().enumerate() {
                let b = &self.slab[i as usize];
                // A close fit only: splitting a much larger block leaves pieces that keep
                // pending memory from coalescing (measured: fallback evictions on a chain of
                // mixed sizes, where waiting for all pending copies needed none).
                if b.slot != slot || b.size < rounded || b.size - rounded > rounded / 8 {
                    continue;
                }
                let key = (b.size, b.freed_epoch);
                if best.is_none_or(|(size, seq, _, _)| key < (size, seq)) {
                    best = Some((b.size, b.freed_epoch, event, pos));
                }
            }
        }
        let (size, _, event, pos) = best?;
        let blocks = self.pending.get_mut(&event).expect("found above");
        let idx = blocks.swap_remove(pos);
        if blocks.is_empty() {
            self.pending.remove(&event);
        }
        self.pending_bytes -= size;
        self.pending_blocks -= 1;
        if size > rounded {
            // The rest stays pending on the same event (it counts as a busy block of its segment).
            let j = self.cut(idx, rounded);
            let rest = &mut self.slab[j as usize];
            rest.state = State::Pending;
            rest.fprev = event.0;
            let rest_size = rest.size;
            self.pending_bytes += rest_size;
            self.pending_blocks += 1;
            self.pending.entry(event).or_default().push(j);
            if self.slab[j as usize].kind != Kind::Virtual {
                self.mark_busy(self.slab[j as usize].seg);
            }
        }
        Some((self.hand_out(idx, bytes, 0), event))
    }

    /// Block `idx` (out of every index) becomes an allocation of `bytes` with `tag`: counted,
    /// findable by address. Returns its address.
    fn hand_out(&mut self, idx: u32, bytes: u64, tag: u8) -> u64 {
        let (addr, size) = {
            let b = &mut self.slab[idx as usize];
            b.state = State::Allocated;
            b.requested = bytes;
            b.tag = tag;
            (b.addr, b.size)
        };
        self.live.insert(addr, idx);
        let s = &mut self.stats;
        s.allocated_bytes += size;
        s.requested_bytes += bytes;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.alloc_count += 1;
        let in_use = s.allocated_bytes + self.pending_bytes;
        self.high_water = self.high_water.max(in_use);
        addr
    }

    /// Events that blocks are pending on (each once).
    pub fn pending_events(&self) -> Vec<EventId> {
        self.pending.keys().copied().collect()
    }

    /// Frees the blocks pending on `event` now. The caller guarantees that the stream owning
    /// them waits for the event before any later work (e.g. by `cuStreamWaitEvent`), so reuse
    /// on that stream is ordered after whatever the event guards — no host wait needed.
    pub fn assume_complete(&mut self, event: EventId) {
        for i in self.pending.remove(&event).unwrap_or_default() {
            self.pending_bytes -= self.slab[i as usize].size;
            self.pending_blocks -= 1;
            self.release_block(i);
        }
    }

    fn process_events(&mut self, backing: &dyn PoolBacking) {
        if self.pending.is_empty() {
            return;
        }
        let done: Vec<EventId> = self
            .pending
            .keys()
            .copied()
            .filter(|&e| backing.event_complete(e))
            .collect();
        for e in done {
            self.assume_complete(e);
        }
    }

    // --- streams ---

    /// How a stream the pool has not seen yet will grow: by a virtual range (where the backing
    /// has virtual memory) or by plain segments, whatever `config.vmm` says for other streams.
    /// A stream the pool already serves keeps its way (false is returned).
    #[inline]
    pub fn set_new_stream_growth(&mut self, stream: StreamId, virtual_ranges: bool) -> bool {
        if self.slot_of.contains_key(&stream) {
            return false;
        }
        let slot = self.slot(stream);
        self.slots[slot as usize].virtual_growth = virtual_ranges;
        true
    }

    #[inline(always)]
    fn slot(&mut self, stream: StreamId) -> u32 {
        if self.last_slot.0 == stream && self.last_slot.1 != NIL {
            return self.last_slot.1;
        }
        self.slot_other(stream)
    }

    /// `slot` for a stream other than the last allocation's.
    #[inline(never)]
    fn slot_other(&mut self, stream: StreamId) -> u32 {
        if let Some(&s) = self.slot_of.get(&stream) {
            self.last_slot = (stream, s);
            return s;
        }
        let s = self.slots.len() as u32;
        self.slots.push(Slot {
            stream,
            warm: Default::default(),
            cold: BTreeSet::new(),
            range: NIL,
            range_failed: false,
            virtual_growth: self.config.vmm,
            markers: Default::default(),
            spare_markers: Vec::new(),
            safe_epoch: 1,
            frees: 0,
            last_marker: None,
            spin_skip: 0,
            spin_misses: 0,
        });
        self.slot_of.insert(stream, s);
        s
    }

    // --- markers: which stream-ordered frees the device has passed ---

    /// Counts a stream-ordered free of block `i`; every `marker_every` frees on a stream with a
    /// virtual range, records a marker there, unless one was recorded less than
    /// `marker_min_interval_ns` ago.
    #[inline]
    fn note_free(&mut self, backing: &dyn PoolBacking, i: u32) {
        let slot = self.slab[i as usize].slot;
        let sl = &mut self.slots[slot as usize];
        if sl.range == NIL {
            return;
        }
        sl.frees += 1;
        if sl.frees >= self.config.marker_every {
            sl.frees = 0;
            self.mark_if_due(backing, slot);
        }
    }

    #[inline(never)]
    fn mark_if_due(&mut self, backing: &dyn PoolBacking, slot: u32) {
        let now = std::time::Instant::now();
        let min = std::time::Duration::from_nanos(self.config.marker_min_interval_ns);
        let sl = &mut self.slots[slot as usize];
        if sl.last_marker.is_some_and(|t| now.duration_since(t) < min) {
            return;
        }
        sl.last_marker = Some(now);
        self.mark(backing, slot);
    }

    /// Records a marker on `slot`'s stream (unless too many are in flight).
    fn mark(&mut self, backing: &dyn PoolBacking, slot: u32) {
        self.mark_capped(backing, slot, MARKERS_IN_FLIGHT);
    }

    fn mark_capped(&mut self, backing: &dyn PoolBacking, slot: u32, cap: usize) {
        self.poll_markers(backing, slot);
        let sl = &mut self.slots[slot as usize];
        if sl.markers.len() >= cap {
            return;
        }
        let reuse = sl.spare_markers.pop();
        // On failure the backing has given a re-recorded event back itself.
        if let Some(e) = backing.record_marker(sl.stream, reuse) {
            self.epoch += 1;
            sl.markers.push_back((e, self.epoch));
        }
    }

    /// Polls `slot`'s newest marker for up to `recycle_spin_ns` (see there); never waits on the
    /// device. After a miss (a busy device) the next 1, 2, 4 … 64 opportunities are skipped, so
    /// a device that stays busy costs few spins; a hit resets the backoff.
    fn spin_on_newest_marker(&mut self, backing: &dyn PoolBacking, slot: u32) {
        let spin = self.config.recycle_spin_ns;
        let sl = &mut self.slots[slot as usize];
        let Some(&(e, _)) = sl.markers.back() else {
            return;
        };
        if spin == 0 {
            return;
        }
        if sl.spin_skip > 0 {
            sl.spin_skip -= 1;
            return;
        }
        let start = std::time::Instant::now();
        while !backing.event_complete(e) {
            if start.elapsed().as_nanos() as u64 >= spin {
                let sl = &mut self.slots[slot as usize];
                sl.spin_skip = 1 << sl.spin_misses.min(6);
                sl.spin_misses += 1;
                return;
            }
            std::hint::spin_loop();
        }
        self.slots[slot as usize].spin_misses = 0;
    }

    /// Advances `slot`'s safe epoch past every completed marker.
    fn poll_markers(&mut self, backing: &dyn PoolBacking, slot: u32) {
        let sl = &mut self.slots[slot as usize];
        while let Some(&(e, epoch)) = sl.markers.front() {
            if !backing.event_complete(e) {
                break;
            }
            sl.safe_epoch = epoch;
            sl.markers.pop_front();
            sl.spare_markers.push(e);
        }
    }

    /// True when the device is known to be done with the memory of free block `i`.
    fn idle_on_device(&self, i: u32) -> bool {
        let b = &self.slab[i as usize];
        b.freed_epoch == 0 || b.freed_epoch < self.slots[b.slot as usize].safe_epoch
    }

    // --- free indexes ---

    /// Whether cold block `i` is its range's last block, which stays out of the cold set:
    /// placement looks at it anyway, and it changes with nearly every allocation or free at the
    /// top of the used memory (an ordered-set update each time, measured as most of the cost of
    /// such workloads).
    #[inline]
    fn is_range_tail(&self, i: u32) -> bool {
        self.segs[self.slab[i as usize].seg as usize].tail == i
    }

    /// Puts a free block into its stream's warm list or cold set.
    #[inline(always)]
    fn link(&mut self, i: u32) {
        let b = &self.slab[i as usize];
        let (slot, kind) = (b.slot as usize, b.kind as usize);
        if b.kind == Kind::Virtual && b.unmapped > 0 {
            let key = (b.size, b.addr, i);
            if !self.is_range_tail(i) {
                self.slots[slot].cold.insert(key);
            }
            self.slab[i as usize].cold = true;
            return;
        }
        let c = class_of(b.size >> self.shift);
        let head = self.slots[slot].warm[kind].head(c);
        {
            let b = &mut self.slab[i as usize];
            b.cold = false;
            b.fprev = NIL;
            b.fnext = head;
        }
        if head != NIL {
            self.slab[head as usize].fprev = i;
        }
        self.slots[slot].warm[kind].set_head(c, i);
    }

    /// Takes a free block out of its list or set.
    #[inline(always)]
    fn unlink(&mut self, i: u32) {
        let b = &self.slab[i as usize];
        let (slot, kind) = (b.slot as usize, b.kind as usize);
        if b.cold {
            let key = (b.size, b.addr, i);
            if !self.is_range_tail(i) {
                let removed = self.slots[slot].cold.remove(&key);
                debug_assert!(removed);
            }
            self.slab[i as usize].cold = false;
            return;
        }
        let (p, n, c) = (b.fprev, b.fnext, class_of(b.size >> self.shift));
        if p == NIL {
            self.slots[slot].warm[kind].set_head(c, n);
        } else {
            self.slab[p as usize].fnext = n;
        }
        if n != NIL {
            self.slab[n as usize].fprev = p;
        }
    }

    /// Best fit among the warm free blocks of `slot` and `kind`; the block is unlinked.
    /// Forced inline, like `link`, `unlink`, `new_block` and `absorb_next`: each runs on nearly
    /// every operation, and as calls their frames cost about as much as their work (callgrind on
    /// the traces: 390 → 348 instructions per operation, host replay 16–27% faster).
    #[inline(always)]
    fn take_fit(&mut self, slot: u32, kind: Kind, size: u64) -> Option<u32> {
        let classes = &self.slots[slot as usize].warm[kind as usize];
        let own = class_of(size >> self.shift);
        let mut c = classes.first_at_or_above(own)?;
        let best = loop {
            let mut best: Option<(u64, u64, u32)> = None;
            let mut cur = classes.head(c);
            let mut seen = 0;
            while cur != NIL && seen < FIT_SCAN {
                let b = &self.slab[cur as usize];
                if b.size >= size && best.is_none_or(|(s, a, _)| (b.size, b.addr) < (s, a)) {
                    best = Some((b.size, b.addr, cur));
                }
                cur = b.fnext;
                seen += 1;
            }
            if let Some((_, _, i)) = best {
                break i;
            }
            // Only the request's own class can hold blocks that are too small.
            c = classes.first_at_or_above(c + 1)?;
        };
        self.unlink(best);
        Some(best)
    }

    // --- blocks ---

    #[inline(always)]
    fn new_block(&mut self, b: Block) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.slab[i as usize] = b;
                i
            }
            None => {
                self.slab.push(b);
                (self.slab.len() - 1) as u32
            }
        }
    }

    fn drop_block(&mut self, i: u32) {
        let b = &mut self.slab[i as usize];
        b.state = State::Vacant;
        b.prev = NIL;
        b.next = NIL;
        self.vacant.push(i);
    }

    /// Cuts block `i` (free, unlinked) at `at` bytes from its start; returns the upper part, a
    /// free unlinked block. Neither part's `unmapped` count is set.
    fn cut(&mut self, i: u32, at: u64) -> u32 {
        let b = &self.slab[i as usize];
        let upper = b.free_piece(b.addr + at, b.size - at, i, b.next);
        let (next, seg) = (b.next, b.seg);
        let j = self.new_block(upper);
        if next != NIL {
            self.slab[next as usize].prev = j;
        } else {
            self.segs[seg as usize].tail = j;
        }
        let b = &mut self.slab[i as usize];
        b.next = j;
        b.size = at;
        j
    }

    /// Splits the (free, unlinked, fully mapped) block `i` so that it is `size` bytes; the
    /// remainder, if any, becomes a free linked block.
    #[inline]
    fn split(&mut self, i: u32, size: u64) {
        if self.slab[i as usize].size == size {
            return;
        }
        let j = self.cut(i, size);
        // The block was free, so its old next neighbour is not: the tail needs no coalescing.
        self.link(j);
    }

    fn mark_busy(&mut self, s: u32) {
        let seg = &mut self.segs[s as usize];
        if seg.busy == 0 {
            self.idle.remove(&s);
        }
        seg.busy += 1;
    }

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
        let b = &self.slab[idx as usize];
        let s = &mut self.stats;
        s.allocated_bytes -= b.size;
        s.requested_bytes -= b.requested;
        s.free_count += 1;
    }

    /// Block `i` (allocated or pending, already out of its index; every page it touches is
    /// mapped) becomes free: coalesce with free neighbours and index it.
    fn release_block(&mut self, i: u32) {
        let mut i = i;
        let mut unmapped = 0;
        {
            let b = &mut self.slab[i as usize];
            b.state = State::Free;
            b.requested = 0;
            b.tag = 0;
        }
        let (prev, seg, kind) = {
            let b = &self.slab[i as usize];
            (b.prev, b.seg, b.kind)
        };
        // Conservative for blocks released by an event too: the next marker orders after it.
        let mut epoch = self.epoch;
        if prev != NIL && self.slab[prev as usize].state == State::Free {
            self.unlink(prev);
            unmapped += self.slab[prev as usize].unmapped as u64;
            epoch = epoch.max(self.slab[prev as usize].freed_epoch);
            self.absorb_next(prev);
            i = prev;
        }
        let next = self.slab[i as usize].next;
        if next != NIL && self.slab[next as usize].state == State::Free {
            self.unlink(next);
            unmapped += self.slab[next as usize].unmapped as u64;
            epoch = epoch.max(self.slab[next as usize].freed_epoch);
            self.absorb_next(i);
        }
        self.slab[i as usize].unmapped = pages32(unmapped);
        self.slab[i as usize].freed_epoch = epoch;
        self.link(i);
        if kind != Kind::Virtual {
            let s = &mut self.segs[seg as usize];
            s.busy -= 1;
            if s.busy == 0 {
                self.idle.insert(seg);
            }
        }
    }

    /// Merges the next block of `i` into `i` (both unlinked).
    #[inline(always)]
    fn absorb_next(&mut self, i: u32) {
        let n = self.slab[i as usize].next;
        let (size, next, seg) = {
            let b = &self.slab[n as usize];
            (b.size, b.next, b.seg)
        };
        self.slab[i as usize].size += size;
        self.slab[i as usize].next = next;
        if next != NIL {
            self.slab[next as usize].prev = i;
        } else {
            self.segs[seg as usize].tail = i;
        }
        self.drop_block(n);
    }

    // --- plain segments ---

    fn oom(&self, requested: u64) -> PoolError {
        PoolError::OutOfMemory {
            requested,
            reserved: self.stats.reserved_bytes,
            allocated: self.stats.allocated_bytes,
            limit: self.config.memory_limit,
        }
    }

    fn segment_size(&self, rounded: u64, kind: Kind) -> u64 {
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
    fn grow(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        rounded: u64,
        kind: Kind,
        slot: u32,
    ) -> Result<u32, PoolError> {
        let policy = self.segment_size(rounded, kind);
        if let Some(i) = self.try_segment(backing, policy, kind, slot)? {
            return Ok(i);
        }
        if self.release_cached(backing)? > 0 {
            if let Some(i) = self.try_segment(backing, policy, kind, slot)? {
                return Ok(i);
            }
        }
        if rounded < policy {
            if let Some(i) = self.try_segment(backing, rounded, kind, slot)? {
                return Ok(i);
            }
        }
        Err(self.oom(bytes))
    }

    fn new_segment(&mut self, seg: Segment) -> u32 {
        match self.vacant_segs.pop() {
            Some(s) => {
                self.segs[s as usize] = seg;
                s
            }
            None => {
                self.segs.push(seg);
                (self.segs.len() - 1) as u32
            }
        }
    }

    fn drop_segment(&mut self, s: u32) {
        let seg = &mut self.segs[s as usize];
        seg.live = false;
        seg.pages = None;
        self.vacant_segs.push(s);
    }

    fn overlaps_tracked(&self, base: u64, size: u64) -> bool {
        self.segs
            .iter()
            .any(|s| s.live && base < s.base + s.size && s.base < base + size)
    }

    /// A tracked segment (or range) with one free block covering it, unlinked. Returns the
    /// block. Statistics count the segment; reserved bytes are the caller's.
    fn add_segment(&mut self, base: u64, size: u64, kind: Kind, slot: u32) -> u32 {
        let s = self.new_segment(Segment {
            base,
            size,
            first: NIL,
            tail: NIL,
            busy: 0,
            kind,
            pages: None,
            live: true,
        });
        let i = self.new_block(Block {
            addr: base,
            size,
            requested: 0,
            seg: s,
            slot,
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
        let seg = &mut self.segs[s as usize];
        seg.first = i;
        seg.tail = i;
        self.stats.segment_count += 1;
        self.stats.segment_alloc_count += 1;
        i
    }

    /// `Ok(None)`: over the limit or the device is out of memory.
    fn try_segment(
        &mut self,
        backing: &dyn PoolBacking,
        size: u64,
        kind: Kind,
        slot: u32,
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
        let i = self.add_segment(base, size, kind, slot);
        let seg = self.slab[i as usize].seg;
        self.idle.insert(seg);
        let s = &mut self.stats;
        s.reserved_bytes += size;
        s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
        Ok(Some(i))
    }

    fn segment_gone(&mut self, size: u64) {
        let s = &mut self.stats;
        s.reserved_bytes -= size;
        s.segment_count -= 1;
        s.segment_free_count += 1;
    }

    /// Drops a segment or range (its memory already returned to the device) and every block
    /// in it.
    fn forget_segment(&mut self, s: u32) {
        let (first, size, kind, slot) = {
            let seg = &self.segs[s as usize];
            let slot = self.slab[seg.first as usize].slot;
            (seg.first, seg.size, seg.kind, slot)
        };
        self.idle.remove(&s);
        let mut cur = first;
        while cur != NIL {
            let next = self.slab[cur as usize].next;
            match self.slab[cur as usize].state {
                State::Free => self.unlink(cur),
                State::Allocated => {
                    let b = &self.slab[cur as usize];
                    self.live.remove(b.addr);
                    self.stats.allocated_bytes -= b.size;
                    self.stats.requested_bytes -= b.requested;
                }
                State::Pending => {
                    let e = EventId(self.slab[cur as usize].fprev);
                    if let Some(v) = self.pending.get_mut(&e) {
                        v.retain(|&j| j != cur);
                        if v.is_empty() {
                            self.pending.remove(&e);
                        }
                    }
                    self.pending_bytes -= self.slab[cur as usize].size;
                    self.pending_blocks -= 1;
                }
                State::Vacant => {}
            }
            self.drop_block(cur);
            cur = next;
        }
        if kind == Kind::Virtual {
            let sl = &mut self.slots[slot as usize];
            if sl.range == s {
                sl.range = NIL;
            }
            // Any pages left mapped were counted out by `give_back`.
            let s2 = &mut self.stats;
            s2.segment_count -= 1;
            s2.segment_free_count += 1;
        } else {
            self.segment_gone(size);
        }
        self.drop_segment(s);
    }

    // --- virtual ranges ---

    /// Pages `[p0, p1)` of range `r` that a block at `[addr, addr + size)` touches.
    #[inline]
    fn touched(&self, r: u32, addr: u64, size: u64) -> (u64, u64) {
        // Pages are a power of two: shifts, not divisions (this is on the allocation path).
        let base = self.segs[r as usize].base;
        let shift = self.page.trailing_zeros();
        (
            (addr - base) >> shift,
            (addr + size - base + (self.page - 1)) >> shift,
        )
    }

    /// Pages `[p0, p1)` of range `r` lying wholly inside `[addr, addr + size)` (p0 ≥ p1: none).
    #[inline]
    fn interior(&self, r: u32, addr: u64, size: u64) -> (u64, u64) {
        let base = self.segs[r as usize].base;
        let shift = self.page.trailing_zeros();
        (
            (addr - base + (self.page - 1)) >> shift,
            (addr + size - base) >> shift,
        )
    }

    fn pages_of(&self, r: u32) -> &PageMap {
        self.segs[r as usize]
            .pages
            .as_ref()
            .expect("a virtual range has a page map")
    }

    /// The stream's range, reserving it on first use; `None` if the device cannot reserve one.
    fn ensure_range(&mut self, vm: &dyn VirtualMemory, slot: u32) -> Option<u32> {
        let sl = &self.slots[slot as usize];
        if sl.range != NIL {
            return Some(sl.range);
        }
        if sl.range_failed {
            return None;
        }
        let g = vm.granularity();
        let page = self
            .config
            .vmm_page_bytes
            .max(g)
            .checked_next_power_of_two()
            .unwrap_or(0);
        let usable = g.is_power_of_two() && page >= self.config.alignment;
        if !usable || (self.page != 0 && page != self.page) {
            log::warn!("gkrt pool: the device's granularity {g} is unusable; using plain segments");
            self.slots[slot as usize].range_failed = true;
            return None;
        }
        let size = self.config.reserve_bytes(page);
        let base = match vm.reserve(size) {
            // Pages are counted from the base: granularity alignment is all mapping needs.
            Ok(base)
                if base.is_multiple_of(g.max(self.config.alignment))
                    && !self.overlaps_tracked(base, size) =>
            {
                base
            }
            Ok(base) => {
                log::warn!("gkrt pool: reserved range {base:#x} is unusable; using plain segments");
                let _ = vm.unreserve(base, size);
                self.slots[slot as usize].range_failed = true;
                return None;
            }
            Err(e) => {
                log::warn!(
                    "gkrt pool: reserving {size} bytes of address space failed ({e}); using plain segments"
                );
                self.slots[slot as usize].range_failed = true;
                return None;
            }
        };
        self.page = page;
        let i = self.add_segment(base, size, Kind::Virtual, slot);
        let r = self.slab[i as usize].seg;
        self.segs[r as usize].pages = Some(PageMap::new(size / page));
        self.slab[i as usize].unmapped = pages32(size / page);
        self.link(i);
        self.slots[slot as usize].range = r;
        Some(r)
    }

    /// Allocation in the stream's virtual range when no mapped free block fits (`alloc_inner`
    /// tried those, and the start of the range's last block); `Ok(None)`: the range cannot hold
    /// it (use plain segments).
    fn alloc_virtual(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        slot: u32,
        bytes: u64,
        rounded: u64,
    ) -> Result<Option<u32>, PoolError> {
        let Some(r) = self.ensure_range(vm, slot) else {
            return Ok(None);
        };
        if let Some(i) = self.take_tail_prefix(slot, r, rounded) {
            return Ok(Some(i));
        }
        let Some((cand, pos)) = self.place_cold(slot, r, rounded) else {
            return Ok(None);
        };
        self.unlink(cand);
        let (p0, p1) = self.touched(r, pos, rounded);
        let need = self.pages_of(r).count_unmapped(p0, p1);
        if need > 0 {
            if let Err(e) = self.map_pages(backing, vm, r, cand, (p0, p1), need, (bytes, rounded)) {
                // Pages mapped before the failure stay mapped inside the (still free) block.
                let (q0, q1) = {
                    let b = &self.slab[cand as usize];
                    self.interior(r, b.addr, b.size)
                };
                self.slab[cand as usize].unmapped =
                    pages32(self.pages_of(r).count_unmapped(q0, q1));
                self.link(cand);
                return Err(e);
            }
        }
        // Carve [pos, pos + rounded) out of the candidate; the pieces' unmapped pages.
        let total = self.slab[cand as usize].unmapped as u64 - need;
        let (addr, size) = (self.slab[cand as usize].addr, self.slab[cand as usize].size);
        let mut block = cand;
        let mut low = None;
        if pos > addr {
            low = Some(cand);
            block = self.cut(cand, pos - addr);
        }
        let mut high = None;
        if pos + rounded < addr + size {
            high = Some(self.cut(block, rounded));
        }
        let count = |p: &Pool, i: u32| {
            let b = &p.slab[i as usize];
            let (q0, q1) = p.interior(r, b.addr, b.size);
            if q0 < q1 {
                p.pages_of(r).count_unmapped(q0, q1)
            } else {
                0
            }
        };
        match (low, high) {
            (Some(l), Some(h)) => {
                // Count the smaller piece page by page, deduce the other.
                let (small, big) = if self.slab[l as usize].size <= self.slab[h as usize].size {
                    (l, h)
                } else {
                    (h, l)
                };
                let n = count(self, small);
                self.slab[small as usize].unmapped = pages32(n);
                self.slab[big as usize].unmapped = pages32(total - n);
                self.link(l);
                self.link(h);
            }
            (Some(p), None) | (None, Some(p)) => {
                self.slab[p as usize].unmapped = pages32(total);
                self.link(p);
            }
            (None, None) => debug_assert_eq!(total, 0),
        }
        self.slab[block as usize].unmapped = 0;
        Ok(Some(block))
    }

    /// The common cold placement in one step: no other cold block, and the range's last block
    /// (free) has `size` mapped bytes at its start — `place_cold` would choose exactly that, the
    /// only position needing no new page. The block is carved there; the rest stays the last
    /// block with the same unmapped pages (none of them is under the carved part).
    fn take_tail_prefix(&mut self, slot: u32, r: u32, size: u64) -> Option<u32> {
        let t = self.segs[r as usize].tail;
        let b = &self.slab[t as usize];
        if !self.slots[slot as usize].cold.is_empty()
            || b.state != State::Free
            || !b.cold
            || b.size <= size
        {
            return None;
        }
        let (p0, p1) = self.touched(r, b.addr, size);
        if !self.pages_of(r).all_mapped(p0, p1) {
            return None;
        }
        // Carve a new block off the low end; the tail keeps its record, its unmapped pages
        // (none of them is under the carved part) and its index (being the range's last block,
        // it is in no ordered set), so nothing is unlinked or linked.
        let low = b.free_piece(b.addr, size, b.prev, t);
        let prev = b.prev;
        let j = self.new_block(low);
        if prev != NIL {
            self.slab[prev as usize].next = j;
        } else {
            self.segs[r as usize].first = j;
        }
        let b = &mut self.slab[t as usize];
        b.prev = j;
        b.addr += size;
        b.size -= size;
        Some(j)
    }

    /// Where to put `size` bytes among the cold blocks of `slot` (and the range's tail): the
    /// low or high end of a block, fewest unmapped pages first, then best fit, then lowest
    /// address.
    fn place_cold(&self, slot: u32, r: u32, size: u64) -> Option<(u32, u64)> {
        let sl = &self.slots[slot as usize];
        let pages = self.pages_of(r);
        type Best = Option<((u64, u64, u64), u32)>;
        let mut best: Best = None;
        let try_at = |best: &mut Best, i: u32, pos: u64, bsize: u64| {
            let (p0, p1) = self.touched(r, pos, size);
            let key = (pages.count_unmapped(p0, p1), bsize, pos);
            if best.is_none_or(|(k, _)| key < k) {
                *best = Some((key, i));
            }
        };
        let tail = self.segs[r as usize].tail;
        let tail = self.slab[tail as usize].cold.then_some(tail);
        let candidates = || {
            sl.cold
                .range((size, 0, 0)..)
                .take(COLD_SCAN)
                .map(|&(_, _, i)| i)
                .chain(tail)
                .filter(|&i| {
                    let b = &self.slab[i as usize];
                    b.state == State::Free && b.size >= size
                })
        };
        for i in candidates() {
            let b = &self.slab[i as usize];
            try_at(&mut best, i, b.addr, b.size);
            try_at(&mut best, i, b.addr + b.size - size, b.size);
        }
        if best.is_some_and(|((unmapped, _, _), _)| unmapped > 0) {
            // No end of a block avoids new pages: try the ends of the runs of mapped pages
            // inside large blocks, so mapped memory in the middle of a block is used where it
            // is rather than moved to an end (which moved pages back and forth every step on
            // the GPT-2 trace).
            let base = self.segs[r as usize].base;
            for i in candidates() {
                let b = &self.slab[i as usize];
                let (q0, q1) = self.interior(r, b.addr, b.size);
                if b.size <= size + self.page || q1.saturating_sub(q0) <= b.unmapped as u64 {
                    continue;
                }
                let (lo_end, hi_end) = (b.addr, b.addr + b.size);
                let mut runs = 0;
                pages.each_run(q0, q1, true, |(p, n)| {
                    let (lo, hi) = (base + p * self.page, base + (p + n) * self.page);
                    if lo + size <= hi_end {
                        try_at(&mut best, i, lo, b.size);
                    }
                    if hi >= lo_end + size {
                        try_at(&mut best, i, hi - size, b.size);
                    }
                    runs += 1;
                    runs < MAPPED_RUNS_TRIED
                });
            }
        }
        best.map(|((_, _, pos), i)| (i, pos))
    }

    /// Maps the unmapped pages among `[p0, p1)` of range `r` (`need` of them) for a block to be
    /// placed in the free block `cand`, recycling free pages first when the budget or the slack
    /// rule says so.
    #[allow(clippy::too_many_arguments)]
    fn map_pages(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        r: u32,
        cand: u32,
        (p0, p1): (u64, u64),
        need: u64,
        (bytes, rounded): (u64, u64),
    ) -> Result<(), PoolError> {
        let placing = Some((cand, p0, p1));
        let page = self.page;
        let add = need * page;
        let limit = self.config.memory_limit;
        let over_limit = |p: &Pool| {
            p.stats
                .reserved_bytes
                .checked_add(add)
                .is_none_or(|t| t > limit)
        };
        let mut must = 0;
        if over_limit(self) {
            let excess = (self.stats.reserved_bytes + add).saturating_sub(limit);
            must = excess.div_ceil(page);
        }
        let mut want = must;
        if add >= self.config.recycle_min_bytes {
            let hw = self
                .high_water
                .max(self.stats.allocated_bytes + self.pending_bytes + rounded);
            let allowed = hw / 1000 * (1000 + self.config.recycle_slack_permille);
            let cap = allowed.div_ceil(page);
            want = want.max((self.mapped_pages + need).saturating_sub(cap));
        }
        if want > 0 {
            self.recycle(backing, vm, want, must, placing)?;
        }
        if over_limit(self) {
            self.release_idle_segments(backing)?;
            if over_limit(self) {
                return Err(self.oom(bytes));
            }
        }
        let base = self.segs[r as usize].base;
        let runs = self.pages_of(r).runs(p0, p1, false);
        let mapped = self.map_runs(backing, vm, r, base, &runs, placing, bytes);
        // Spares left by recycling that the new pages did not reuse go back to the device.
        let trimmed = vm.trim();
        mapped?;
        Ok(trimmed?)
    }

    #[allow(clippy::too_many_arguments)]
    fn map_runs(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        r: u32,
        base: u64,
        runs: &[(u64, u64)],
        placing: Option<(u32, u64, u64)>,
        bytes: u64,
    ) -> Result<(), PoolError> {
        let page = self.page;
        for &(p, n) in runs {
            let mut result = vm.map(base + p * page, page, n);
            if let Err(DeviceError::OutOfMemory { .. }) = result {
                // Give the device every free page and idle segment we hold, then retry.
                self.recycle(backing, vm, u64::MAX, u64::MAX, placing)?;
                vm.trim()?;
                self.release_idle_segments(backing)?;
                result = vm.map(base + p * page, page, n);
            }
            match result {
                Ok(()) => {}
                Err(DeviceError::OutOfMemory { .. }) => return Err(self.oom(bytes)),
                Err(e) => return Err(PoolError::Device(e)),
            }
            let pages = self.segs[r as usize].pages.as_mut().expect("range");
            pages.set(p, p + n, true);
            self.mapped_pages += n;
            let s = &mut self.stats;
            s.reserved_bytes += n * page;
            s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
            s.page_map_count += n;
        }
        Ok(())
    }

    /// Mapped pages lying wholly inside the free block `i` of a range.
    fn mapped_interior(&self, i: u32) -> u64 {
        let b = &self.slab[i as usize];
        let r = self.slots[b.slot as usize].range;
        let (q0, q1) = self.interior(r, b.addr, b.size);
        q1.saturating_sub(q0) - b.unmapped as u64
    }

    /// Unmaps up to `want` mapped pages lying wholly inside free blocks of every range, each
    /// block from its high end; returns the pages unmapped. Blocks the device is known to be done
    /// with (their last free is older than a completed marker) go first, largest first, and need
    /// no wait; the others are unmapped only to reach `must` (the budget), after waiting for the
    /// device once (`quiesce`). `placing` is a block being placed (unlinked, so no list holds it)
    /// with the pages `[p0, p1)` it is about to use: its other pages are victims too.
    fn recycle(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        want: u64,
        must: u64,
        placing: Option<(u32, u64, u64)>,
    ) -> Result<u64, PoolError> {
        let waits = self.config.recycle_waits;
        for slot in 0..self.slots.len() as u32 {
            if self.slots[slot as usize].range != NIL {
                if !waits && must < want {
                    // A fresh marker passed at once means the device is idle: nothing to wait for.
                    // It must come after the latest frees even when the usual markers have not
                    // been seen complete yet (a slow round trip), so the cap is doubled here.
                    self.mark_capped(backing, slot, 2 * MARKERS_IN_FLIGHT);
                    self.spin_on_newest_marker(backing, slot);
                }
                self.poll_markers(backing, slot);
            }
        }
        let done = self.recycle_victims(vm, want, must, placing)?;
        // Let the blocks skipped this time become known-idle for the next time.
        for slot in 0..self.slots.len() as u32 {
            let sl = &self.slots[slot as usize];
            if sl.range != NIL && sl.markers.is_empty() {
                self.mark(backing, slot);
            }
        }
        Ok(done)
    }

    fn recycle_victims(
        &mut self,
        vm: &dyn VirtualMemory,
        want: u64,
        must: u64,
        placing: Option<(u32, u64, u64)>,
    ) -> Result<u64, PoolError> {
        let mut victims: Vec<(u64, u32)> = Vec::new();
        let mut avail = 0u64;
        if let Some((i, _, _)) = placing {
            victims.push((self.mapped_interior(i), i));
        }
        for sl in &self.slots {
            if sl.range == NIL {
                continue;
            }
            let tail = self.segs[sl.range as usize].tail;
            let tail = self.slab[tail as usize].cold.then_some(tail);
            for i in sl.cold.iter().map(|&(_, _, i)| i).chain(tail) {
                let mapped = self.mapped_interior(i);
                if mapped > 0 {
                    victims.push((mapped, i));
                    avail += mapped;
                }
            }
            let classes = &sl.warm[Kind::Virtual as usize];
            let mut c = classes.last_at_or_below(CLASSES - 1);
            while let Some(k) = c {
                let mut cur = classes.head(k);
                while cur != NIL {
                    let mapped = self.mapped_interior(cur);
                    if mapped > 0 {
                        victims.push((mapped, cur));
                        avail += mapped;
                    }
                    cur = self.slab[cur as usize].fnext;
                }
                if avail >= want.saturating_mul(2) && avail >= want {
                    break;
                }
                c = if k == 0 {
                    None
                } else {
                    classes.last_at_or_below(k - 1)
                };
            }
        }
        if victims.is_empty() {
            return Ok(0);
        }
        // Idle ones first, then most mapped pages first: the unreserved tail of a range counts
        // only what is mapped in it, so the pages just above the used part (reused soonest) go
        // last.
        let mut victims: Vec<(bool, u64, u32)> = victims
            .into_iter()
            .map(|(mapped, i)| (self.idle_on_device(i), mapped, i))
            .collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        if log::log_enabled!(log::Level::Trace) {
            let idle = victims.iter().filter(|v| v.0).count();
            let slots: Vec<(usize, u64)> = self
                .slots
                .iter()
                .map(|s| (s.markers.len(), s.safe_epoch))
                .collect();
            let epochs: Vec<u64> = victims
                .iter()
                .map(|v| self.slab[v.2 as usize].freed_epoch)
                .collect();
            log::trace!(
                "pool recycle: want {want} must {must}, {} victims ({idle} idle, freed epochs {epochs:?}), epoch {}, slots (markers, safe epoch) {slots:?}",
                victims.len(),
                self.epoch
            );
        }
        let page = self.page;
        let mut done = 0u64;
        let mut quiet = false;
        for (idle, _, i) in victims {
            if done >= want {
                break;
            }
            if !idle && !quiet && done >= must && !self.config.recycle_waits {
                // Only the soft goal is left, and it may not wait for the device.
                break;
            }
            let (r, addr, size) = {
                let b = &self.slab[i as usize];
                (self.slots[b.slot as usize].range, b.addr, b.size)
            };
            let (q0, q1) = self.interior(r, addr, size);
            let mut runs = self.pages_of(r).runs(q0, q1, true);
            if let Some((_, k0, k1)) = placing.filter(|&(j, _, _)| j == i) {
                // Keep the pages the placed block will use.
                runs = runs
                    .into_iter()
                    .flat_map(|(p, n)| {
                        let lo = (p, n.min(k0.saturating_sub(p)));
                        let hi_start = (p + n).min(p.max(k1));
                        [lo, (hi_start, p + n - hi_start)]
                    })
                    .filter(|&(_, n)| n > 0)
                    .collect();
            }
            let base = self.segs[r as usize].base;
            let mut took = 0;
            let mut failed = None;
            'runs: for &(p, n) in runs.iter().rev() {
                if done >= want {
                    break;
                }
                if !idle && !quiet {
                    if let Err(e) = vm.quiesce() {
                        failed = Some(e);
                        break;
                    }
                    quiet = true;
                    self.stats.device_wait_count += 1;
                }
                let k = n.min(want - done);
                let start = p + n - k;
                if let Err(e) = vm.unmap(base + start * page, page, k) {
                    failed = Some(e);
                    break 'runs;
                }
                self.segs[r as usize]
                    .pages
                    .as_mut()
                    .expect("range")
                    .set(start, start + k, false);
                self.mapped_pages -= k;
                let s = &mut self.stats;
                s.reserved_bytes -= k * page;
                s.page_unmap_count += k;
                done += k;
                took += k;
            }
            if took > 0 && placing.is_some_and(|(j, _, _)| j == i) {
                self.slab[i as usize].unmapped += pages32(took);
            } else if took > 0 {
                self.unlink(i);
                self.slab[i as usize].unmapped += pages32(took);
                self.link(i);
            }
            if let Some(e) = failed {
                return Err(PoolError::Device(e));
            }
        }
        if done > 0 {
            self.stats.recycle_count += 1;
        }
        Ok(done)
    }

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
                let b = &self.slab[cur as usize];
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
                if b.kind != seg.kind || self.slab[seg.first as usize].slot != b.slot {
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
                        let sl = &self.slots[b.slot as usize];
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
                        let in_set = sl.cold.contains(&(b.size, b.addr, cur));
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
                        } else {
                            if self.live.get(b.addr) != Some(cur) {
                                return Err(format!("live block {:#x} not in live map", b.addr));
                            }
                            allocated += b.size;
                            requested += b.requested;
                            nlive += 1;
                        }
                    }
                    State::Vacant => return Err(format!("vacant slot {cur} linked")),
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
        for (k, sl) in self.slots.iter().enumerate() {
            for (kind, classes) in sl.warm.iter().enumerate() {
                for c in 0..CLASSES {
                    let mut cur = classes.head(c);
                    let mut prev = NIL;
                    while cur != NIL {
                        let b = &self.slab[cur as usize];
                        if b.state != State::Free
                            || b.cold
                            || b.slot as usize != k
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
            for &(size, addr, i) in &sl.cold {
                let b = &self.slab[i as usize];
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
            || nblocks + self.vacant.len() != self.slab.len()
            || self.idle.len() > nsegs as usize
        {
            return Err("index sizes disagree with blocks".into());
        }
        Ok(())
    }

    /// Free blocks of the small (`true`) or large pool, as `(stream, size, addr)` in order.
    #[cfg(test)]
    fn free_plain(&self, small: bool) -> Vec<(StreamId, u64, u64)> {
        let kind = if small { Kind::Small } else { Kind::Large };
        let mut out: Vec<(StreamId, u64, u64)> = self
            .slab
            .iter()
            .filter(|b| b.state == State::Free && b.kind == kind)
            .map(|b| (self.slots[b.slot as usize].stream, b.size, b.addr))
            .collect();
        out.sort_unstable();
        out
    }
}

/// Backing for dry runs: hands out fresh addresses above every real segment, frees anything,
/// maps anything, and reports every event incomplete.
struct SimBacking {
    align: u64,
    next: std::cell::Cell<u64>,
    /// Page size of the real pool's ranges; 0: no virtual memory.
    page: u64,
}

impl SimBacking {
    fn fresh(&self, bytes: u64, align: u64) -> Result<u64, DeviceError> {
        let oom = || DeviceError::OutOfMemory {
            requested: bytes,
            message: "dry run address space exhausted".into(),
        };
        let base = round_up(self.next.get(), align).ok_or_else(oom)?;
        let end = base.checked_add(bytes).ok_or_else(oom)?;
        self.next.set(end);
        Ok(base)
    }
}

impl PoolBacking for SimBacking {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        self.fresh(bytes, self.align)
    }
    fn free_segment(&self, _addr: u64, _bytes: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn event_complete(&self, _event: EventId) -> bool {
        false
    }
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        (self.page != 0).then_some(self as &dyn VirtualMemory)
    }
}

impl VirtualMemory for SimBacking {
    fn granularity(&self) -> u64 {
        self.page
    }
    fn reserve(&self, bytes: u64) -> Result<u64, DeviceError> {
        self.fresh(bytes, self.page)
    }
    fn unreserve(&self, _base: u64, _bytes: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn map(&self, _addr: u64, _page: u64, _count: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn unmap(&self, _addr: u64, _page: u64, _count: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn trim(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;

/// A page count as kept in a block (ranges hold far fewer than 2^32 pages).
#[inline]
fn pages32(n: u64) -> u32 {
    debug_assert!(n <= u32::MAX as u64, "{n} pages");
    n as u32
}
