//! The caching device-memory pool.
//!
//! Owns: the bookkeeping of device memory segments obtained through a [`PoolBacking`] (the
//! runtime implements it over `dyn Device`), the blocks carved out of them, the memory budget
//! (`memory_limit`, enforced on reserved bytes) and the always-on O(1) statistics. It owns no
//! device memory itself: segments come from and go back to the backing.
//!
//! Data structures (no linear scans on alloc or free):
//! - blocks live in a slab (`Vec` + free-index list) with `prev`/`next` links to their
//!   neighbours inside one segment, so coalescing is O(1);
//! - free blocks sit in two ordered maps (small pool, large pool) keyed `(stream, size, addr)`;
//!   best fit is one `BTreeMap` range query, ties go to the lowest address;
//! - live blocks are found by address in a `HashMap`; segments by base address in a `HashMap`;
//!   segments with no live or pending block are kept in an ordered set, so `release_cached`
//!   touches only those.
//!
//! Policies:
//! - **Rounding / splitting.** Every request is rounded up to `alignment` (a power of two,
//!   default 256) and the chosen free block is always split to exactly that size; since all
//!   sizes are multiples of the alignment, a remainder is either 0 or at least `alignment`, so
//!   no remainder smaller than the alignment is ever left. `block_size` is therefore always the
//!   rounded request, which keeps `allocated_bytes` predictable for planners.
//! - **Small vs large (no splitting of big blocks for tiny requests).** As in PyTorch, requests
//!   of at most `small_request_max` (1 MiB) are served only from the small pool, whose segments
//!   are `small_segment_bytes` (2 MiB); larger requests only from the large pool. A tiny request
//!   therefore never splits a large cached block, and large blocks are not peppered with small
//!   long-lived allocations. Large-pool segments: requests up to `medium_request_max` (10 MiB)
//!   share `medium_segment_bytes` (20 MiB) segments, larger ones get their own segment rounded
//!   up to `large_segment_rounding` (2 MiB); large cached blocks may be split for later large
//!   requests (best fit makes that the last resort).
//! - **Streams.** A segment belongs to the stream whose allocation created it, and so do all
//!   blocks carved from it; `free` returns a block to that stream's free lists at once (work on
//!   one stream runs in order). Memory moves to another stream only through the device: a fully
//!   free segment is released and a new one obtained. `free_after_event` parks the block until
//!   the event completes; pending events are polled on `alloc`, `release_cached` and
//!   `release_all` (one `event_complete` query per distinct pending event), never waited on.
//!   Pending bytes do not count as allocated (the caller has freed them) but keep their segment.
//! - **Budget.** A new segment is first tried at the policy size; if that would exceed
//!   `memory_limit` or the backing reports out-of-memory, every cached fully free segment (of
//!   every stream) is released and the policy size is tried once more (only if something was
//!   released), then a segment of exactly the rounded request (so a tight budget is used fully);
//!   only then does `alloc` fail with [`PoolError::OutOfMemory`]. Other device errors fail at
//!   once. A segment the backing grants is tracked before anything else can fail; one that
//!   cannot be used (misaligned) is handed straight back.
//! - **Statistics.** `failed_alloc_count` counts allocations that failed for lack of memory or a
//!   device error (not zero-size requests). `free_count` counts `free` and `free_after_event`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use crate::device::{DeviceError, EventId, StreamId};

const MIB: u64 = 1 << 20;

/// What the pool needs from below: segments and event completion. The runtime implements it
/// over `dyn Device`; tests implement it with a fake.
pub trait PoolBacking {
    /// A fresh segment of `bytes` bytes; the address is aligned to at least 512 bytes.
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError>;
    /// Returns a segment obtained from `alloc_segment` (same address and size).
    fn free_segment(&self, addr: u64, bytes: u64) -> Result<(), DeviceError>;
    /// True once the event's last record has completed.
    fn event_complete(&self, event: EventId) -> bool;
}

/// Pool configuration. [`Pool::new`] normalises it (see [`Pool::config`]): `alignment` becomes a
/// power of two (0 means the default), segment sizes become multiples of the alignment and at
/// least as large as the requests they serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Every block address and rounded size is a multiple of this (default 256).
    pub alignment: u64,
    /// Cap on reserved bytes (sum of live segments); `u64::MAX` = none.
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
}

/// Pool statistics; all O(1) and always on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Sum of rounded sizes of live blocks.
    pub allocated_bytes: u64,
    /// Sum of live segment sizes.
    pub reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Sum of sizes as requested (unrounded) of live blocks.
    pub requested_bytes: u64,
    /// Successful allocations, cumulative.
    pub alloc_count: u64,
    /// Successful frees (`free` and `free_after_event`), cumulative.
    pub free_count: u64,
    /// Live segments.
    pub segment_count: u64,
    /// Cumulative device segment allocations.
    pub segment_alloc_count: u64,
    /// Cumulative device segment frees.
    pub segment_free_count: u64,
    /// Allocations that failed (out of memory or a device error), cumulative.
    pub failed_alloc_count: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PoolError {
    ZeroSize,
    /// Would exceed `memory_limit`, or the device refused even after releasing cached segments.
    OutOfMemory {
        requested: u64,
        reserved: u64,
        allocated: u64,
        limit: u64,
    },
    /// Free of an address the pool did not hand out (or freed twice).
    UnknownPointer(u64),
    /// A device error (also `DeviceError::Invalid` for a segment the pool cannot use).
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Allocated,
    Pending(EventId),
    /// Slab slot not in use.
    Vacant,
}

#[derive(Clone, Debug)]
struct Block {
    addr: u64,
    size: u64,
    /// Size as requested, while allocated.
    requested: u64,
    /// Base address of the segment.
    segment: u64,
    stream: StreamId,
    small: bool,
    prev: Option<usize>,
    next: Option<usize>,
    state: State,
}

#[derive(Clone, Debug)]
struct Segment {
    size: u64,
    /// Slab index of the block at the segment's base (stable: merges keep the lower block).
    first: usize,
    /// Blocks allocated or pending on an event.
    busy: u64,
}

type FreeKey = (StreamId, u64, u64);

/// The caching device-memory pool. See the module comment for the policies.
#[derive(Clone, Debug)]
pub struct Pool {
    config: PoolConfig,
    slab: Vec<Block>,
    vacant: Vec<usize>,
    free_small: BTreeMap<FreeKey, usize>,
    free_large: BTreeMap<FreeKey, usize>,
    live: HashMap<u64, usize>,
    pending: BTreeMap<EventId, Vec<usize>>,
    pending_bytes: u64,
    pending_blocks: u64,
    segments: HashMap<u64, Segment>,
    /// Segments with no allocated or pending block (exactly one free block each).
    idle: BTreeSet<u64>,
    stats: PoolStats,
}

impl Pool {
    pub fn new(config: PoolConfig) -> Pool {
        Pool {
            config: config.normalized(),
            slab: Vec::new(),
            vacant: Vec::new(),
            free_small: BTreeMap::new(),
            free_large: BTreeMap::new(),
            live: HashMap::new(),
            pending: BTreeMap::new(),
            pending_bytes: 0,
            pending_blocks: 0,
            segments: HashMap::new(),
            idle: BTreeSet::new(),
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
        if bytes == 0 {
            return Err(PoolError::ZeroSize);
        }
        self.process_events(backing);
        let result = self.alloc_inner(backing, bytes, stream);
        if result.is_err() {
            self.stats.failed_alloc_count += 1;
        }
        result
    }

    fn alloc_inner(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
    ) -> Result<u64, PoolError> {
        let Some(rounded) = round_up(bytes, self.config.alignment) else {
            return Err(self.oom(bytes));
        };
        let small = rounded <= self.config.small_request_max;
        let idx = match self.best_fit(stream, small, rounded) {
            Some(i) => {
                self.remove_free(i);
                i
            }
            None => self.grow(backing, bytes, rounded, small, stream)?,
        };
        self.split(idx, rounded);
        let (addr, size, seg) = {
            let b = &mut self.slab[idx];
            b.state = State::Allocated;
            b.requested = bytes;
            (b.addr, b.size, b.segment)
        };
        self.mark_busy(seg);
        self.live.insert(addr, idx);
        let s = &mut self.stats;
        s.allocated_bytes += size;
        s.requested_bytes += bytes;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.alloc_count += 1;
        Ok(addr)
    }

    /// Returns the block to the free lists of the stream it was allocated on (stream-ordered
    /// reuse: the next alloc on that stream may reuse it at once).
    pub fn free(&mut self, _backing: &dyn PoolBacking, addr: u64) -> Result<(), PoolError> {
        let idx = self.take_live(addr)?;
        self.release_block(idx);
        Ok(())
    }

    /// Frees a block whose last use was on another stream: it becomes reusable only once
    /// `event` (recorded after that use) completes. Events are polled lazily, never waited on.
    pub fn free_after_event(
        &mut self,
        _backing: &dyn PoolBacking,
        addr: u64,
        event: EventId,
    ) -> Result<(), PoolError> {
        let idx = self.take_live(addr)?;
        self.slab[idx].state = State::Pending(event);
        self.pending_bytes += self.slab[idx].size;
        self.pending_blocks += 1;
        self.pending.entry(event).or_default().push(idx);
        Ok(())
    }

    /// Size the block at `addr` was rounded to, if live.
    pub fn block_size(&self, addr: u64) -> Option<u64> {
        self.live.get(&addr).map(|&i| self.slab[i].size)
    }

    /// Bytes freed with `free_after_event` whose event has not been seen complete yet.
    pub fn pending_free_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Number of blocks freed with `free_after_event` whose event has not been seen complete.
    pub fn pending_free_blocks(&self) -> u64 {
        self.pending_blocks
    }

    /// Returns every completely free segment to the device; returns bytes released. On a device
    /// error the segment that failed stays tracked and the error is returned.
    pub fn release_cached(&mut self, backing: &dyn PoolBacking) -> Result<u64, PoolError> {
        self.process_events(backing);
        let mut released = 0;
        while let Some(&base) = self.idle.first() {
            let size = self.segments[&base].size;
            backing.free_segment(base, size)?;
            self.idle.remove(&base);
            let seg = self
                .segments
                .remove(&base)
                .expect("idle segment is tracked");
            self.remove_free(seg.first);
            self.drop_block(seg.first);
            self.segment_gone(size);
            released += size;
        }
        Ok(released)
    }

    /// Releases every segment (runtime teardown). Blocks still live or pending on an event are
    /// forgotten and reported as [`PoolError::LiveBlocks`] (the segments are released
    /// anyway); a segment the device
    /// refuses to free stays tracked and the first such error is returned instead.
    pub fn release_all(&mut self, backing: &dyn PoolBacking) -> Result<(), PoolError> {
        self.process_events(backing);
        let live = self.live.len() as u64;
        let pending = self.pending_blocks;
        let bytes = self.stats.allocated_bytes + self.pending_bytes;
        let mut bases: Vec<u64> = self.segments.keys().copied().collect();
        bases.sort_unstable();
        let mut first_err = None;
        for base in bases {
            let size = self.segments[&base].size;
            match backing.free_segment(base, size) {
                Ok(()) => self.forget_segment(base),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
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

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Peaks := current values.
    pub fn reset_peaks(&mut self) {
        self.stats.peak_allocated_bytes = self.stats.allocated_bytes;
        self.stats.peak_reserved_bytes = self.stats.reserved_bytes;
    }

    /// Sets the cap on reserved bytes. Takes effect on the next segment allocation; segments
    /// already reserved beyond a lowered limit are not released here (call `release_cached`).
    pub fn set_memory_limit(&mut self, limit: u64) {
        self.config.memory_limit = limit;
    }

    pub fn memory_limit(&self) -> u64 {
        self.config.memory_limit
    }

    /// Dry run: would these steps succeed from the current state? Simulated on a clone with a
    /// fake backing that grants any segment within `memory_limit` (the device's own capacity is
    /// not modelled) and treats every pending event as incomplete (conservative). Returns the
    /// statistics after the last step, or the index of the first failing step and its error.
    pub fn dry_run(&self, steps: &[DryRunStep]) -> Result<PoolStats, (usize, PoolError)> {
        let mut sim = self.clone();
        let base = self
            .segments
            .iter()
            .map(|(b, s)| b.saturating_add(s.size))
            .max()
            .unwrap_or(0);
        let backing = SimBacking {
            align: self.config.alignment.max(512),
            next: std::cell::Cell::new(base),
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

    /// Checks every internal invariant (O(n); for tests and debugging).
    pub fn validate(&self) -> Result<(), String> {
        let a = self.config.alignment;
        let (mut allocated, mut requested, mut reserved) = (0u64, 0u64, 0u64);
        let (mut nblocks, mut nfree, mut nlive, mut npending, mut pending_bytes) =
            (0usize, 0usize, 0usize, 0u64, 0u64);
        for (&base, seg) in &self.segments {
            reserved += seg.size;
            let mut expect_addr = base;
            let mut prev: Option<usize> = None;
            let mut cur = Some(seg.first);
            let mut busy = 0;
            let mut prev_free = false;
            while let Some(i) = cur {
                let b = &self.slab[i];
                nblocks += 1;
                if b.addr != expect_addr || b.prev != prev || b.segment != base {
                    return Err(format!(
                        "block {i} at {:#x} breaks segment {base:#x}",
                        b.addr
                    ));
                }
                if !b.addr.is_multiple_of(a) || !b.size.is_multiple_of(a) || b.size == 0 {
                    return Err(format!("block {:#x}+{} misaligned", b.addr, b.size));
                }
                let key = (b.stream, b.size, b.addr);
                let free_map = if b.small {
                    &self.free_small
                } else {
                    &self.free_large
                };
                let in_free = free_map.get(&key) == Some(&i);
                match b.state {
                    State::Free => {
                        if prev_free {
                            return Err(format!("adjacent free blocks at {:#x}", b.addr));
                        }
                        if !in_free {
                            return Err(format!("free block {:#x} not in free map", b.addr));
                        }
                        nfree += 1;
                    }
                    State::Allocated => {
                        if self.live.get(&b.addr) != Some(&i) || in_free {
                            return Err(format!("live block {:#x} not in live map", b.addr));
                        }
                        allocated += b.size;
                        requested += b.requested;
                        busy += 1;
                        nlive += 1;
                    }
                    State::Pending(e) => {
                        if !self.pending.get(&e).is_some_and(|v| v.contains(&i)) || in_free {
                            return Err(format!("pending block {:#x} not in pending", b.addr));
                        }
                        busy += 1;
                        npending += 1;
                        pending_bytes += b.size;
                    }
                    State::Vacant => return Err(format!("vacant slot {i} linked")),
                }
                prev_free = b.state == State::Free;
                expect_addr = b.addr + b.size;
                prev = Some(i);
                cur = b.next;
            }
            if expect_addr != base + seg.size {
                return Err(format!("segment {base:#x} blocks do not cover it"));
            }
            if busy != seg.busy || (busy == 0) != self.idle.contains(&base) {
                return Err(format!("segment {base:#x} busy count/idle set wrong"));
            }
        }
        let s = &self.stats;
        if allocated != s.allocated_bytes
            || requested != s.requested_bytes
            || reserved != s.reserved_bytes
            || self.segments.len() as u64 != s.segment_count
            || s.peak_allocated_bytes < s.allocated_bytes
            || s.peak_reserved_bytes < s.reserved_bytes
        {
            return Err(format!("stats disagree with blocks: {s:?}"));
        }
        if nfree != self.free_small.len() + self.free_large.len()
            || nlive != self.live.len()
            || npending != self.pending_blocks
            || pending_bytes != self.pending_bytes
            || nblocks + self.vacant.len() != self.slab.len()
            || self.idle.len() > self.segments.len()
        {
            return Err("index sizes disagree with blocks".into());
        }
        Ok(())
    }

    // --- internals ---

    fn oom(&self, requested: u64) -> PoolError {
        PoolError::OutOfMemory {
            requested,
            reserved: self.stats.reserved_bytes,
            allocated: self.stats.allocated_bytes,
            limit: self.config.memory_limit,
        }
    }

    fn free_map(&mut self, small: bool) -> &mut BTreeMap<FreeKey, usize> {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    fn insert_free(&mut self, i: usize) {
        let b = &self.slab[i];
        let (key, small) = ((b.stream, b.size, b.addr), b.small);
        self.free_map(small).insert(key, i);
    }

    fn remove_free(&mut self, i: usize) {
        let b = &self.slab[i];
        let (key, small) = ((b.stream, b.size, b.addr), b.small);
        let removed = self.free_map(small).remove(&key);
        debug_assert_eq!(removed, Some(i));
    }

    fn new_block(&mut self, b: Block) -> usize {
        match self.vacant.pop() {
            Some(i) => {
                self.slab[i] = b;
                i
            }
            None => {
                self.slab.push(b);
                self.slab.len() - 1
            }
        }
    }

    fn drop_block(&mut self, i: usize) {
        self.slab[i].state = State::Vacant;
        self.slab[i].prev = None;
        self.slab[i].next = None;
        self.vacant.push(i);
    }

    fn best_fit(&self, stream: StreamId, small: bool, size: u64) -> Option<usize> {
        let map = if small {
            &self.free_small
        } else {
            &self.free_large
        };
        map.range((stream, size, 0)..=(stream, u64::MAX, u64::MAX))
            .next()
            .map(|(_, &i)| i)
    }

    fn segment_size(&self, rounded: u64, small: bool) -> u64 {
        let c = &self.config;
        if small {
            c.small_segment_bytes
        } else if rounded <= c.medium_request_max {
            c.medium_segment_bytes
        } else {
            round_up(rounded, c.large_segment_rounding).unwrap_or(rounded)
        }
    }

    /// Obtains a new segment for a request of `rounded` bytes; returns its single block (free,
    /// not in the free maps).
    fn grow(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        rounded: u64,
        small: bool,
        stream: StreamId,
    ) -> Result<usize, PoolError> {
        let policy = self.segment_size(rounded, small);
        if let Some(i) = self.try_segment(backing, policy, small, stream)? {
            return Ok(i);
        }
        if self.release_cached(backing)? > 0 {
            if let Some(i) = self.try_segment(backing, policy, small, stream)? {
                return Ok(i);
            }
        }
        if rounded < policy {
            if let Some(i) = self.try_segment(backing, rounded, small, stream)? {
                return Ok(i);
            }
        }
        Err(self.oom(bytes))
    }

    /// `Ok(None)`: over the limit or the device is out of memory.
    fn try_segment(
        &mut self,
        backing: &dyn PoolBacking,
        size: u64,
        small: bool,
        stream: StreamId,
    ) -> Result<Option<usize>, PoolError> {
        match self.stats.reserved_bytes.checked_add(size) {
            Some(total) if total <= self.config.memory_limit => {}
            _ => return Ok(None),
        }
        let base = match backing.alloc_segment(size) {
            Ok(base) => base,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(PoolError::Device(e)),
        };
        let unusable = if !base.is_multiple_of(self.config.alignment) {
            Some("is not aligned to the pool alignment")
        } else if base.checked_add(size).is_none() {
            Some("wraps around the address space")
        } else if self.segments.contains_key(&base) {
            Some("is already a live segment")
        } else {
            None
        };
        if let Some(why) = unusable {
            // Never free a segment we already track (that would free live memory).
            if !self.segments.contains_key(&base) {
                backing.free_segment(base, size)?;
            }
            return Err(PoolError::Device(DeviceError::Invalid(format!(
                "segment {base:#x} of {size} bytes granted by the device {why}"
            ))));
        }
        let i = self.new_block(Block {
            addr: base,
            size,
            requested: 0,
            segment: base,
            stream,
            small,
            prev: None,
            next: None,
            state: State::Free,
        });
        self.segments.insert(
            base,
            Segment {
                size,
                first: i,
                busy: 0,
            },
        );
        let s = &mut self.stats;
        s.reserved_bytes += size;
        s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
        s.segment_count += 1;
        s.segment_alloc_count += 1;
        Ok(Some(i))
    }

    /// Splits the (free, unindexed) block `i` so that it is `size` bytes; the remainder, if at
    /// least one alignment unit, becomes a free block.
    fn split(&mut self, i: usize, size: u64) {
        let b = &self.slab[i];
        let rem = b.size - size;
        if rem < self.config.alignment {
            return;
        }
        let tail = Block {
            addr: b.addr + size,
            size: rem,
            requested: 0,
            segment: b.segment,
            stream: b.stream,
            small: b.small,
            prev: Some(i),
            next: b.next,
            state: State::Free,
        };
        let next = b.next;
        let j = self.new_block(tail);
        if let Some(n) = next {
            self.slab[n].prev = Some(j);
        }
        self.slab[i].next = Some(j);
        self.slab[i].size = size;
        // The block was free, so its old next neighbour is not: the tail needs no coalescing.
        self.insert_free(j);
    }

    fn mark_busy(&mut self, base: u64) {
        let seg = self
            .segments
            .get_mut(&base)
            .expect("block's segment is tracked");
        if seg.busy == 0 {
            self.idle.remove(&base);
        }
        seg.busy += 1;
    }

    fn take_live(&mut self, addr: u64) -> Result<usize, PoolError> {
        let idx = self
            .live
            .remove(&addr)
            .ok_or(PoolError::UnknownPointer(addr))?;
        let b = &self.slab[idx];
        let s = &mut self.stats;
        s.allocated_bytes -= b.size;
        s.requested_bytes -= b.requested;
        s.free_count += 1;
        Ok(idx)
    }

    /// Block `i` (allocated or pending, already out of its index) becomes free: coalesce with
    /// free neighbours and index it.
    fn release_block(&mut self, i: usize) {
        self.slab[i].state = State::Free;
        self.slab[i].requested = 0;
        let base = self.slab[i].segment;
        let mut i = i;
        if let Some(p) = self.slab[i].prev {
            if self.slab[p].state == State::Free {
                self.remove_free(p);
                self.absorb_next(p);
                i = p;
            }
        }
        if let Some(n) = self.slab[i].next {
            if self.slab[n].state == State::Free {
                self.remove_free(n);
                self.absorb_next(i);
            }
        }
        self.insert_free(i);
        let seg = self
            .segments
            .get_mut(&base)
            .expect("block's segment is tracked");
        seg.busy -= 1;
        if seg.busy == 0 {
            self.idle.insert(base);
        }
    }

    /// Merges the next block of `i` into `i` (both unindexed).
    fn absorb_next(&mut self, i: usize) {
        let n = self.slab[i].next.expect("absorb_next needs a next block");
        let (size, next) = (self.slab[n].size, self.slab[n].next);
        self.slab[i].size += size;
        self.slab[i].next = next;
        if let Some(nn) = next {
            self.slab[nn].prev = Some(i);
        }
        self.drop_block(n);
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
            self.pending_bytes -= self.slab[i].size;
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

    fn segment_gone(&mut self, size: u64) {
        let s = &mut self.stats;
        s.reserved_bytes -= size;
        s.segment_count -= 1;
        s.segment_free_count += 1;
    }

    /// Drops a segment (already returned to the device) and every block in it.
    fn forget_segment(&mut self, base: u64) {
        let seg = self.segments.remove(&base).expect("segment is tracked");
        self.idle.remove(&base);
        let mut cur = Some(seg.first);
        while let Some(i) = cur {
            cur = self.slab[i].next;
            match self.slab[i].state {
                State::Free => self.remove_free(i),
                State::Allocated => {
                    let b = &self.slab[i];
                    self.live.remove(&b.addr);
                    self.stats.allocated_bytes -= b.size;
                    self.stats.requested_bytes -= b.requested;
                }
                State::Pending(e) => {
                    if let Some(v) = self.pending.get_mut(&e) {
                        v.retain(|&j| j != i);
                        if v.is_empty() {
                            self.pending.remove(&e);
                        }
                    }
                    self.pending_bytes -= self.slab[i].size;
                    self.pending_blocks -= 1;
                }
                State::Vacant => {}
            }
            self.drop_block(i);
        }
        self.segment_gone(seg.size);
    }
}

/// Backing for dry runs: hands out fresh addresses above every real segment, frees anything,
/// and reports every event incomplete.
struct SimBacking {
    align: u64,
    next: std::cell::Cell<u64>,
}

impl PoolBacking for SimBacking {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        let oom = || DeviceError::OutOfMemory {
            requested: bytes,
            message: "dry run address space exhausted".into(),
        };
        let base = round_up(self.next.get(), self.align).ok_or_else(oom)?;
        let end = base.checked_add(bytes).ok_or_else(oom)?;
        self.next.set(end);
        Ok(base)
    }
    fn free_segment(&self, _addr: u64, _bytes: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn event_complete(&self, _event: EventId) -> bool {
        false
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
