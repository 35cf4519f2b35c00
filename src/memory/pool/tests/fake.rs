//! The one fake backing every pool test uses, configured per test: plain segments only or with
//! virtual memory, a device capacity, segment alignment and skew, an idle or busy device, and
//! a count-only mode for the trace replay. By default it records every segment, range, page,
//! marker and stream-ordered free, and asserts that the pool never frees what it was not given,
//! maps a page twice, or unmaps a page that queued work may still use. Its virtual memory keeps
//! physical allocations apart from the addresses they are mapped at (`map_alias` maps one at a
//! second address), frees each with its last address (a second free is an assertion), and
//! holds the words tests write through an address in the allocation behind it (`write`,
//! `read`), so data is seen through every address of the same memory.

use std::cell::{Ref, RefCell, RefMut};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::super::round_up;
use super::super::PoolBacking;
use crate::device::{DeviceError, EventId, StreamId, VirtualMemory};

/// Page size (and the virtual memory's granularity) of the virtual-memory tests.
pub(super) const PAGE: u64 = 2 * (1 << 20);

/// Marker events are numbered from here; test events stay below.
const FIRST_MARKER: u32 = 1 << 30;

/// How a [`Fake`] behaves; fixed when it is built.
#[derive(Clone, Debug)]
pub(super) struct FakeConfig {
    /// Device memory: plain segments plus mapped pages (default: unlimited).
    pub(super) capacity: u64,
    /// Plain segments: the first address, the alignment of each and the gap after each (so an
    /// overrun never lands in the next segment).
    pub(super) segment_base: u64,
    pub(super) segment_align: u64,
    pub(super) segment_gap: u64,
    /// Added to every segment address at first (tests change it through the state): lets a
    /// test hand out misaligned segments.
    pub(super) skew: u64,
    /// Virtual memory with pages (granularity) of this many bytes; 0: none, and no markers.
    pub(super) page: u64,
    /// The first reserved range (ranges follow one another, a page apart).
    pub(super) range_base: u64,
    /// Keep every segment, range, page, marker and free and check each call against them.
    /// Off: count calls only, and every event is complete at once (nothing runs on this
    /// device) — the trace replay, which measures the pool's own cost.
    pub(super) record: bool,
    /// The clock (`now_ns`): it stands still but for `Fake::advance` and `move_cost_ns` per
    /// `map` or `unmap` call (default 0): what a driver call costs. With `real_clock`, readings
    /// are real elapsed time plus the driver calls' costs (the trace replay).
    pub(super) move_cost_ns: u64,
    /// Added per physical allocation a `map` or `unmap` call creates or releases (default 0):
    /// the driver's `cuMemCreate` + `cuMemMap` (or `cuMemUnmap` + `cuMemRelease`) per
    /// allocation, beside the call's one `cuMemSetAccess` in `move_cost_ns`.
    pub(super) alloc_cost_ns: u64,
    pub(super) real_clock: bool,
    /// Counting mode: how far the device runs behind the host, in ns of the clock (0: nothing
    /// runs on it, every marker passed at once). A marker completes that long after it is
    /// recorded, and `quiesce` waits that long — a live program's device, whose queue holds
    /// that much work when the pool looks.
    pub(super) device_lag_ns: u64,
}

impl FakeConfig {
    /// Plain segments only (no virtual memory, no markers), recording.
    pub(super) fn plain() -> FakeConfig {
        FakeConfig {
            capacity: u64::MAX,
            segment_base: 1 << 32,
            segment_align: 512,
            segment_gap: 4096,
            skew: 0,
            page: 0,
            range_base: 1 << 44,
            record: true,
            move_cost_ns: 0,
            alloc_cost_ns: 0,
            real_clock: false,
            device_lag_ns: 0,
        }
    }

    /// Virtual memory with `PAGE` pages, marker events, and plain segments for the fallback.
    pub(super) fn virtual_memory() -> FakeConfig {
        FakeConfig {
            page: PAGE,
            ..FakeConfig::plain()
        }
    }

    /// The trace replay's device: counts only, segments and ranges from one address counter
    /// spaced by pages, with virtual memory or without.
    pub(super) fn counting(vmm: bool) -> FakeConfig {
        FakeConfig {
            segment_base: 1 << 40,
            segment_align: PAGE,
            segment_gap: PAGE,
            page: if vmm { PAGE } else { 0 },
            range_base: 1 << 40,
            record: false,
            ..FakeConfig::plain()
        }
    }

    pub(super) fn capacity(self, capacity: u64) -> FakeConfig {
        FakeConfig { capacity, ..self }
    }

    pub(super) fn misaligned(self, segment_align: u64, skew: u64) -> FakeConfig {
        FakeConfig {
            segment_align,
            skew,
            ..self
        }
    }

    /// Each driver call of `map` or `unmap` takes `move_cost_ns` on the clock.
    pub(super) fn move_cost(self, move_cost_ns: u64) -> FakeConfig {
        FakeConfig {
            move_cost_ns,
            ..self
        }
    }

    pub(super) fn build(self) -> Fake {
        Fake {
            started: std::time::Instant::now(),
            event_calls: Default::default(),
            state: RefCell::new(FakeState {
                clock: 0,
                map_calls: 0,
                unmap_calls: 0,
                next_segment: self.segment_base,
                skew: self.skew,
                segments: BTreeMap::new(),
                reserved: 0,
                peak: 0,
                allocs: 0,
                frees: 0,
                freed_log: Vec::new(),
                completed: HashSet::new(),
                fail_next_segment: None,
                next_range: self.range_base,
                ranges: BTreeMap::new(),
                mapped: BTreeSet::new(),
                allocations: BTreeMap::new(),
                handles: BTreeMap::new(),
                next_handle: 1,
                words: HashMap::new(),
                alias_maps: 0,
                maps: 0,
                unmaps: 0,
                syncs: 0,
                fail_next_map: None,
                markers: Vec::new(),
                next_marker: FIRST_MARKER,
                freed: Vec::new(),
                idle_device: false,
                polls: 0,
                poll_delay: std::time::Duration::ZERO,
                lagged: HashMap::new(),
                next_lagged: 0,
            }),
            config: self,
        }
    }
}

/// What the fake has handed out and seen; tests read and steer it through [`Fake::state`].
pub(super) struct FakeState {
    /// The fake clock, ns (see `FakeConfig::move_cost_ns`).
    clock: u64,
    /// `map` calls (each maps `count` physical allocations), and `unmap` calls.
    map_calls: u64,
    unmap_calls: u64,
    next_segment: u64,
    /// Added to every (aligned) segment address.
    pub(super) skew: u64,
    /// Live plain segments: base → size.
    pub(super) segments: BTreeMap<u64, u64>,
    /// Bytes of live plain segments, and their peak.
    pub(super) reserved: u64,
    pub(super) peak: u64,
    /// Plain segments handed out and taken back, cumulative.
    pub(super) allocs: u64,
    pub(super) frees: u64,
    /// Plain segments taken back since a test last cleared it: (base, size).
    pub(super) freed_log: Vec<(u64, u64)>,
    /// Test events completed with [`Fake::complete`].
    completed: HashSet<EventId>,
    /// The next segment request fails with this.
    pub(super) fail_next_segment: Option<DeviceError>,
    next_range: u64,
    /// Reserved ranges: base → size.
    pub(super) ranges: BTreeMap<u64, u64>,
    /// Where physical allocations are mapped, by address: (size, allocation) (`unmap` must
    /// match, as on CUDA, where one mapping is unmapped whole). An allocation mapped at two
    /// addresses (`map_alias`) appears twice.
    allocations: BTreeMap<u64, (u64, u64)>,
    /// The physical allocations: id → (size, addresses it is mapped at). Freed with their last
    /// address.
    handles: BTreeMap<u64, (u64, u32)>,
    next_handle: u64,
    /// Words written through `Fake::write`: (allocation, offset) → value.
    words: HashMap<(u64, u64), u64>,
    /// `map_alias` calls.
    pub(super) alias_maps: u64,
    /// Mapped pages (addresses, aliases included).
    pub(super) mapped: BTreeSet<u64>,
    /// Pages mapped and unmapped, cumulative; device waits (`quiesce`).
    pub(super) maps: u64,
    pub(super) unmaps: u64,
    pub(super) syncs: u64,
    /// The next map fails with this.
    pub(super) fail_next_map: Option<DeviceError>,
    /// Marker records in order: (event, stream, completed).
    pub(super) markers: Vec<(EventId, u32, bool)>,
    next_marker: u32,
    /// Memory freed stream-ordered: (addr, size, stream, markers recorded on the stream before).
    /// It stays in use on the device until a later marker of its stream completes or the device
    /// is quiesced; unmapping it before is an error.
    freed: Vec<(u64, u64, u32, usize)>,
    /// An idle device: a polled marker completes (with all before it) at its third poll.
    pub(super) idle_device: bool,
    polls: u32,
    /// Wall-clock time each poll of a marker not yet complete takes (the polling thread
    /// descheduled, as on a loaded machine).
    pub(super) poll_delay: std::time::Duration,
    /// Counting mode with a device lag: each marker's time of completion, and the next id.
    lagged: HashMap<u32, u64>,
    next_lagged: u32,
}

pub(super) struct Fake {
    config: FakeConfig,
    state: RefCell<FakeState>,
    started: std::time::Instant,
    /// Marker events recorded and event queries (`event_complete`), in every mode: on the
    /// H200 each is a driver call (the host replay reports them per operation).
    event_calls: std::cell::Cell<(u64, u64)>,
}

impl Fake {
    pub(super) fn plain() -> Fake {
        FakeConfig::plain().build()
    }

    pub(super) fn virtual_memory() -> Fake {
        FakeConfig::virtual_memory().build()
    }

    pub(super) fn state(&self) -> Ref<'_, FakeState> {
        self.state.borrow()
    }

    pub(super) fn state_mut(&self) -> RefMut<'_, FakeState> {
        self.state.borrow_mut()
    }

    /// Test event `e` has completed.
    pub(super) fn complete(&self, e: EventId) {
        self.state_mut().completed.insert(e);
    }

    pub(super) fn live_segments(&self) -> usize {
        self.state().segments.len()
    }

    /// Bytes of live plain segments.
    pub(super) fn reserved(&self) -> u64 {
        self.state().reserved
    }

    /// Plain segments handed out, cumulative.
    pub(super) fn allocs(&self) -> u64 {
        self.state().allocs
    }

    /// Physical allocations held now, and their sizes (largest first; one mapped at two
    /// addresses counts once).
    pub(super) fn allocation_sizes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.state().handles.values().map(|h| h.0).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    }

    pub(super) fn map_calls(&self) -> u64 {
        self.state().map_calls
    }

    pub(super) fn unmap_calls(&self) -> u64 {
        self.state().unmap_calls
    }

    /// Moves the clock on by `ns` (time spent outside the pool).
    pub(super) fn advance(&self, ns: u64) {
        self.state_mut().clock += ns;
    }

    /// Marker events recorded and event queries so far (see `event_calls`).
    pub(super) fn event_calls(&self) -> (u64, u64) {
        self.event_calls.get()
    }

    pub(super) fn maps(&self) -> u64 {
        self.state().maps
    }

    pub(super) fn unmaps(&self) -> u64 {
        self.state().unmaps
    }

    pub(super) fn syncs(&self) -> u64 {
        self.state().syncs
    }

    /// The test freed `[addr, addr + size)` stream-ordered on `stream`.
    pub(super) fn note_freed(&self, addr: u64, size: u64, stream: u32) {
        let mut s = self.state_mut();
        let before = s.markers.iter().filter(|m| m.1 == stream).count();
        s.freed.push((addr, size, stream, before));
    }

    /// The device passes the oldest pending marker.
    pub(super) fn complete_marker(&self) {
        if let Some(m) = self.state_mut().markers.iter_mut().find(|m| !m.2) {
            m.2 = true;
        }
    }

    /// Memory some queued work may still use.
    fn in_use_on_device(s: &FakeState, page: u64, page_bytes: u64) -> bool {
        s.freed.iter().any(|&(a, n, stream, before)| {
            let passed = s
                .markers
                .iter()
                .filter(|m| m.1 == stream)
                .skip(before)
                .any(|m| m.2);
            !passed && page < a + n && a < page + page_bytes
        })
    }

    /// Bytes of physical memory held for virtual memory (an allocation mapped at several
    /// addresses counts once).
    pub(super) fn mapped_bytes(&self) -> u64 {
        Fake::physical(&self.state())
    }

    fn physical(s: &FakeState) -> u64 {
        s.handles.values().map(|h| h.0).sum()
    }

    /// Pages mapped at some address (aliases included).
    pub(super) fn mapped_addresses(&self) -> u64 {
        self.state().mapped.len() as u64
    }

    /// The allocation mapped over `addr` and the offset of `addr` in it.
    fn resolve(s: &FakeState, addr: u64) -> Option<(u64, u64)> {
        let (&at, &(size, h)) = s.allocations.range(..=addr).next_back()?;
        (addr < at + size).then_some((h, addr - at))
    }

    /// Writes the word `v` at `addr` into the memory mapped there; false if none is.
    pub(super) fn write(&self, addr: u64, v: u64) -> bool {
        let mut s = self.state_mut();
        let Some(key) = Fake::resolve(&s, addr) else {
            return false;
        };
        s.words.insert(key, v);
        true
    }

    /// The word last written into the memory now mapped at `addr` (through any address);
    /// `None` if nothing was, or nothing is mapped there.
    pub(super) fn read(&self, addr: u64) -> Option<u64> {
        let s = self.state();
        Fake::resolve(&s, addr).and_then(|k| s.words.get(&k).copied())
    }

    /// Every page that `[addr, addr + size)` touches is mapped.
    pub(super) fn covers(&self, addr: u64, size: u64) -> bool {
        let page = self.config.page;
        let s = self.state();
        let (p0, p1) = (addr / page, (addr + size).div_ceil(page));
        (p0..p1).all(|p| s.mapped.contains(&(p * page)))
    }

    fn in_range(s: &FakeState, addr: u64) -> bool {
        s.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&b, &n)| addr < b + n)
    }

    /// An address from the segment counter (the count-only mode's ranges use it too).
    fn next_address(s: &mut FakeState, bytes: u64, align: u64, gap: u64) -> u64 {
        let addr = round_up(s.next_segment, align).unwrap() + s.skew;
        s.next_segment = addr + bytes + gap;
        addr
    }
}

impl PoolBacking for Fake {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        let c = &self.config;
        let mut s = self.state_mut();
        if !c.record {
            s.allocs += 1;
            return Ok(Fake::next_address(
                &mut s,
                bytes,
                c.segment_align,
                c.segment_gap,
            ));
        }
        if let Some(e) = s.fail_next_segment.take() {
            return Err(e);
        }
        assert!(bytes > 0, "pool asked for an empty segment");
        let mapped = Fake::physical(&s);
        if s.reserved.saturating_add(mapped).saturating_add(bytes) > c.capacity {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: "fake full".into(),
            });
        }
        let addr = Fake::next_address(&mut s, bytes, c.segment_align, c.segment_gap);
        s.segments.insert(addr, bytes);
        s.reserved += bytes;
        s.peak = s.peak.max(s.reserved);
        s.allocs += 1;
        Ok(addr)
    }

    fn free_segment(&self, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        if !self.config.record {
            return Ok(());
        }
        let mut s = self.state_mut();
        match s.segments.remove(&addr) {
            Some(size) => assert_eq!(size, bytes, "segment {addr:#x} freed with the wrong size"),
            None => {
                panic!("free of a segment {addr:#x} the fake never handed out (or freed twice)")
            }
        }
        s.reserved -= bytes;
        s.frees += 1;
        s.freed_log.push((addr, bytes));
        Ok(())
    }

    fn event_complete(&self, event: EventId) -> bool {
        let (r, q) = self.event_calls.get();
        self.event_calls.set((r, q + 1));
        if !self.config.record {
            if self.config.device_lag_ns > 0 {
                let now = self.now_ns();
                return self
                    .state()
                    .lagged
                    .get(&event.0)
                    .is_none_or(|&at| at <= now);
            }
            return true;
        }
        if self.config.page == 0 || event.0 < FIRST_MARKER {
            // A shared borrow: tests ask this while they read the state.
            return self.state().completed.contains(&event);
        }
        let mut guard = self.state_mut();
        let s = &mut *guard;
        let Some(i) = s.markers.iter().rposition(|m| m.0 == event) else {
            return false;
        };
        if !s.markers[i].2 && s.idle_device {
            s.polls += 1;
            if s.polls >= 3 {
                s.polls = 0;
                s.markers[..=i].iter_mut().for_each(|m| m.2 = true);
            }
        }
        if !s.markers[i].2 {
            std::thread::sleep(s.poll_delay);
        }
        s.markers[i].2
    }

    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        (self.config.page != 0).then_some(self as &dyn VirtualMemory)
    }

    fn now_ns(&self) -> u64 {
        let s = self.state();
        if self.config.real_clock {
            return self.started.elapsed().as_nanos() as u64 + s.clock;
        }
        s.clock
    }

    fn record_marker(&self, stream: StreamId, reuse: Option<EventId>) -> Option<EventId> {
        if self.config.page == 0 {
            return None;
        }
        let (r, q) = self.event_calls.get();
        self.event_calls.set((r + 1, q));
        if !self.config.record {
            let lag = self.config.device_lag_ns;
            if lag > 0 {
                let at = self.now_ns() + lag;
                let mut s = self.state_mut();
                let e = reuse.unwrap_or_else(|| {
                    s.next_lagged += 1;
                    EventId(s.next_lagged)
                });
                s.lagged.insert(e.0, at);
                return Some(e);
            }
            // Nothing runs on this device: every marker is passed at once.
            return Some(reuse.unwrap_or(EventId(0)));
        }
        let mut s = self.state_mut();
        let e = reuse.unwrap_or_else(|| {
            let n = s.next_marker;
            s.next_marker = n + 1;
            EventId(n)
        });
        s.markers.push((e, stream.0, false));
        Some(e)
    }
}

impl VirtualMemory for Fake {
    fn granularity(&self) -> u64 {
        self.config.page
    }

    fn reserve(&self, bytes: u64) -> Result<u64, DeviceError> {
        let page = self.config.page;
        let mut s = self.state_mut();
        if !self.config.record {
            return Ok(Fake::next_address(&mut s, bytes, page, page));
        }
        assert!(
            bytes > 0 && bytes.is_multiple_of(page),
            "reserve of {bytes}"
        );
        let base = s.next_range;
        s.next_range = base + bytes + page;
        s.ranges.insert(base, bytes);
        Ok(base)
    }

    fn unreserve(&self, base: u64, bytes: u64) -> Result<(), DeviceError> {
        if !self.config.record {
            return Ok(());
        }
        let mut s = self.state_mut();
        assert_eq!(s.ranges.remove(&base), Some(bytes), "unreserve {base:#x}");
        assert!(
            s.mapped.range(base..base + bytes).next().is_none(),
            "range {base:#x} released with pages mapped"
        );
        Ok(())
    }

    fn map(&self, addr: u64, page: u64, count: u64) -> Result<(), DeviceError> {
        let mut guard = self.state_mut();
        let s = &mut *guard;
        s.clock += self.config.move_cost_ns + count * self.config.alloc_cost_ns;
        s.map_calls += 1;
        if !self.config.record {
            s.maps += count;
            return Ok(());
        }
        if let Some(e) = s.fail_next_map.take() {
            return Err(e);
        }
        let unit = self.config.page;
        let bytes = page * count;
        assert!(addr.is_multiple_of(unit) && count > 0 && page.is_multiple_of(unit));
        if Fake::physical(s) + s.reserved + bytes > self.config.capacity {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: "fake full".into(),
            });
        }
        for p in (addr..addr + bytes).step_by(unit as usize) {
            assert!(Fake::in_range(s, p), "map outside a reservation at {p:#x}");
            assert!(s.mapped.insert(p), "page {p:#x} mapped twice");
        }
        for k in 0..count {
            let h = s.next_handle;
            s.next_handle += 1;
            s.handles.insert(h, (page, 1));
            s.allocations.insert(addr + k * page, (page, h));
        }
        s.maps += bytes / unit;
        Ok(())
    }

    fn supports_aliases(&self) -> bool {
        true
    }

    fn map_alias(&self, addr: u64, from: u64, page: u64) -> Result<(), DeviceError> {
        let mut guard = self.state_mut();
        let s = &mut *guard;
        // One call mapping one allocation, as `map` charges (no new memory, but the driver's
        // map and access calls).
        s.clock += self.config.move_cost_ns + self.config.alloc_cost_ns;
        s.map_calls += 1;
        s.alias_maps += 1;
        if !self.config.record {
            s.maps += 1;
            return Ok(());
        }
        let unit = self.config.page;
        assert!(addr.is_multiple_of(unit) && page.is_multiple_of(unit) && page > 0);
        let Some(&(size, h)) = s.allocations.get(&from) else {
            panic!("alias of {from:#x}: no allocation mapped there");
        };
        assert_eq!(
            size, page,
            "alias of {page} bytes of a {size}-byte allocation"
        );
        for p in (addr..addr + page).step_by(unit as usize) {
            assert!(
                Fake::in_range(s, p),
                "alias outside a reservation at {p:#x}"
            );
            assert!(s.mapped.insert(p), "page {p:#x} mapped twice (alias)");
        }
        s.allocations.insert(addr, (page, h));
        s.handles.get_mut(&h).expect("mapped allocation").1 += 1;
        s.maps += page / unit;
        Ok(())
    }

    fn unmap(&self, addr: u64, page: u64, count: u64) -> Result<(), DeviceError> {
        let mut guard = self.state_mut();
        let s = &mut *guard;
        s.clock += self.config.move_cost_ns + count * self.config.alloc_cost_ns;
        s.unmap_calls += 1;
        if !self.config.record {
            s.unmaps += count;
            return Ok(());
        }
        let unit = self.config.page;
        for p in (addr..addr + page * count).step_by(unit as usize) {
            assert!(
                !Fake::in_use_on_device(s, p, unit),
                "page {p:#x} unmapped while queued work may still use it"
            );
        }
        for k in 0..count {
            let at = addr + k * page;
            let m = s.allocations.remove(&at);
            assert_eq!(
                m.map(|m| m.0),
                Some(page),
                "unmap of {page} bytes at {at:#x} is not one whole allocation"
            );
            let h = m.expect("checked").1;
            let left = {
                let e = s.handles.get_mut(&h).expect("a mapped allocation is held");
                e.1 -= 1;
                e.1
            };
            if left == 0 {
                // Its last address: the memory goes back (exactly once).
                s.handles.remove(&h);
                s.words.retain(|&(x, _), _| x != h);
            }
        }
        for p in (addr..addr + page * count).step_by(unit as usize) {
            assert!(s.mapped.remove(&p), "page {p:#x} unmapped but not mapped");
        }
        s.unmaps += page * count / unit;
        Ok(())
    }

    fn quiesce(&self) -> Result<(), DeviceError> {
        if !self.config.record {
            // The device's queue drains: the host waits for its lag, every marker passes.
            let lag = self.config.device_lag_ns;
            if lag > 0 {
                let mut s = self.state_mut();
                s.clock += lag;
                s.syncs += 1;
                s.lagged.clear();
            }
            return Ok(());
        }
        let mut s = self.state_mut();
        s.syncs += 1;
        for m in s.markers.iter_mut() {
            m.2 = true;
        }
        s.freed.clear();
        Ok(())
    }

    fn trim(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}
