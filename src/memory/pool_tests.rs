//! Tests of the caching pool against a fake backing that hands out addresses from a counter
//! (never reusing one) and records live segments.

use super::*;
use proptest::prelude::*;
use std::cell::RefCell;
use std::collections::HashSet;

const KIB: u64 = 1 << 10;

struct FakeState {
    next: u64,
    align: u64,
    /// Added to every (aligned) address: lets a test hand out misaligned segments.
    skew: u64,
    capacity: u64,
    live: BTreeMap<u64, u64>,
    reserved: u64,
    peak: u64,
    allocs: u64,
    frees: u64,
    completed: HashSet<EventId>,
    freed_log: Vec<(u64, u64)>,
    fail_next: Option<DeviceError>,
}

struct Fake(RefCell<FakeState>);

impl Fake {
    fn new() -> Fake {
        Fake::with_capacity(u64::MAX)
    }
    fn with_capacity(capacity: u64) -> Fake {
        Fake(RefCell::new(FakeState {
            next: 1 << 32,
            align: 512,
            skew: 0,
            capacity,
            live: BTreeMap::new(),
            reserved: 0,
            peak: 0,
            allocs: 0,
            frees: 0,
            completed: HashSet::new(),
            freed_log: Vec::new(),
            fail_next: None,
        }))
    }
    fn complete(&self, e: EventId) {
        self.0.borrow_mut().completed.insert(e);
    }
    fn live_segments(&self) -> usize {
        self.0.borrow().live.len()
    }
    fn reserved(&self) -> u64 {
        self.0.borrow().reserved
    }
    fn allocs(&self) -> u64 {
        self.0.borrow().allocs
    }
}

impl PoolBacking for Fake {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        let mut s = self.0.borrow_mut();
        if let Some(e) = s.fail_next.take() {
            return Err(e);
        }
        assert!(bytes > 0, "pool asked for an empty segment");
        if s.reserved.saturating_add(bytes) > s.capacity {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: "fake full".into(),
            });
        }
        let addr = round_up(s.next, s.align).unwrap() + s.skew;
        // A gap after every segment so that an overrun never lands in the next one.
        s.next = addr + bytes + 4096;
        s.live.insert(addr, bytes);
        s.reserved += bytes;
        s.peak = s.peak.max(s.reserved);
        s.allocs += 1;
        Ok(addr)
    }
    fn free_segment(&self, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        let mut s = self.0.borrow_mut();
        match s.live.remove(&addr) {
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
        self.0.borrow().completed.contains(&event)
    }
}

fn st(n: u32) -> StreamId {
    StreamId(n)
}

fn pool() -> Pool {
    Pool::new(PoolConfig::default())
}

fn limited(limit: u64) -> Pool {
    Pool::new(PoolConfig {
        memory_limit: limit,
        ..PoolConfig::default()
    })
}

fn check(p: &Pool) {
    if let Err(e) = p.validate() {
        panic!("pool invariant broken: {e}");
    }
}

#[test]
fn split_carves_adjacent_blocks_from_one_segment() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, 1000, st(0)).unwrap();
    let b = p.alloc(&f, 3000, st(0)).unwrap();
    let c = p.alloc(&f, 256, st(0)).unwrap();
    assert_eq!(b, a + 1024);
    assert_eq!(c, b + 3072);
    assert_eq!(p.block_size(a), Some(1024));
    assert_eq!(p.block_size(b), Some(3072));
    assert_eq!(p.block_size(c), Some(256));
    let s = p.stats();
    assert_eq!(s.allocated_bytes, 4352);
    assert_eq!(s.requested_bytes, 4256);
    assert_eq!(s.reserved_bytes, 2 * MIB);
    assert_eq!(
        (s.segment_count, s.segment_alloc_count, s.alloc_count),
        (1, 1, 3)
    );
    // The rest of the segment is one free block right after `c`.
    let rest: Vec<_> = p.free_small.keys().copied().collect();
    assert_eq!(rest, vec![(st(0), 2 * MIB - 4352, c + 256)]);
    check(&p);
}

#[test]
fn best_fit_picks_the_smallest_block_that_fits() {
    let f = Fake::new();
    let mut p = pool();
    // Holes of 8 KiB, 2 KiB and 4 KiB separated by live blocks.
    let big = p.alloc(&f, 8 * KIB, st(0)).unwrap();
    let _x = p.alloc(&f, 256, st(0)).unwrap();
    let small = p.alloc(&f, 2 * KIB, st(0)).unwrap();
    let _y = p.alloc(&f, 256, st(0)).unwrap();
    let mid = p.alloc(&f, 4 * KIB, st(0)).unwrap();
    let _z = p.alloc(&f, 256, st(0)).unwrap();
    for a in [big, small, mid] {
        p.free(&f, a).unwrap();
    }
    assert_eq!(p.alloc(&f, 3 * KIB, st(0)).unwrap(), mid);
    assert_eq!(p.alloc(&f, 2 * KIB, st(0)).unwrap(), small);
    assert_eq!(p.alloc(&f, KIB, st(0)).unwrap(), mid + 3 * KIB);
    assert_eq!(p.alloc(&f, 5 * KIB, st(0)).unwrap(), big);
    check(&p);
}

fn permutations3() -> Vec<[usize; 3]> {
    vec![
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ]
}

/// Allocates `sizes` (which exactly fill one segment), frees them in `order`, checking the
/// number of free blocks after each free, then allocates `whole` and expects the segment back.
fn coalesce_case(sizes: [u64; 3], seg: u64, order: [usize; 3], small: bool) {
    let f = Fake::new();
    let mut p = pool();
    let addrs: Vec<u64> = sizes
        .iter()
        .map(|&n| p.alloc(&f, n, st(0)).unwrap())
        .collect();
    assert_eq!(addrs[1], addrs[0] + sizes[0]);
    assert_eq!(addrs[2], addrs[1] + sizes[1]);
    assert_eq!(p.stats().segment_count, 1);
    let map = |p: &Pool| {
        if small {
            p.free_small.clone()
        } else {
            p.free_large.clone()
        }
    };
    assert!(map(&p).is_empty(), "the three blocks fill the segment");
    let mut freed = [false; 3];
    for &k in &order {
        p.free(&f, addrs[k]).unwrap();
        freed[k] = true;
        check(&p);
        let runs = (0..3)
            .filter(|&j| freed[j] && (j == 0 || !freed[j - 1]))
            .count();
        assert_eq!(map(&p).len(), runs, "order {order:?} after freeing {k}");
    }
    let keys: Vec<_> = map(&p).keys().copied().collect();
    assert_eq!(keys, vec![(st(0), seg, addrs[0])], "order {order:?}");
    assert_eq!(p.idle.len(), 1);
    // The whole segment is reusable without a new segment.
    if small {
        let x = p.alloc(&f, seg / 2, st(0)).unwrap();
        let y = p.alloc(&f, seg / 2, st(0)).unwrap();
        assert_eq!((x, y), (addrs[0], addrs[0] + seg / 2));
    } else {
        assert_eq!(p.alloc(&f, seg, st(0)).unwrap(), addrs[0]);
    }
    assert_eq!(p.stats().segment_alloc_count, 1);
    assert_eq!(f.allocs(), 1);
    check(&p);
}

#[test]
fn coalesce_three_neighbours_in_every_order() {
    for order in permutations3() {
        // Medium requests share one 20 MiB large-pool segment.
        coalesce_case([4 * MIB, 6 * MIB, 10 * MIB], 20 * MIB, order, false);
        // Small requests share one 2 MiB small-pool segment.
        coalesce_case([512 * KIB, 512 * KIB, MIB], 2 * MIB, order, true);
    }
}

#[test]
fn pending_block_blocks_coalescing_until_its_event_completes() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, MIB / 2, st(0)).unwrap();
    let b = p.alloc(&f, MIB / 2, st(0)).unwrap();
    let c = p.alloc(&f, MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    p.free_after_event(&f, b, EventId(7)).unwrap();
    p.free(&f, c).unwrap();
    assert_eq!(p.free_small.len(), 2);
    assert_eq!(p.pending_free_bytes(), MIB / 2);
    assert_eq!(
        p.release_cached(&f).unwrap(),
        0,
        "segment holds a pending block"
    );
    f.complete(EventId(7));
    assert_eq!(p.release_cached(&f).unwrap(), 2 * MIB);
    assert_eq!(p.pending_free_bytes(), 0);
    assert_eq!(f.live_segments(), 0);
    check(&p);
}

#[test]
fn sizes_and_addresses_are_aligned() {
    let f = Fake::new();
    let mut p = pool();
    for n in [
        1,
        255,
        256,
        257,
        1000,
        4097,
        MIB - 1,
        MIB + 1,
        10 * MIB + 3,
        33 * MIB + 1,
    ] {
        let a = p.alloc(&f, n, st(0)).unwrap();
        assert_eq!(a % 256, 0, "{n} bytes at {a:#x}");
        assert_eq!(p.block_size(a), Some(n.div_ceil(256) * 256));
    }
    check(&p);

    // A non-power-of-two alignment is rounded up to one.
    let mut p = Pool::new(PoolConfig {
        alignment: 300,
        ..PoolConfig::default()
    });
    assert_eq!(p.config().alignment, 512);
    for n in [1, 513, 7000] {
        let a = p.alloc(&f, n, st(1)).unwrap();
        assert_eq!(a % 512, 0);
        assert_eq!(p.block_size(a), Some(n.div_ceil(512) * 512));
    }
    check(&p);
}

#[test]
fn misaligned_segment_is_returned_not_leaked() {
    let f = Fake::new();
    {
        let mut s = f.0.borrow_mut();
        s.align = 4096;
        s.skew = 512;
    }
    let mut p = Pool::new(PoolConfig {
        alignment: 4096,
        ..PoolConfig::default()
    });
    let err = p.alloc(&f, 100, st(0)).unwrap_err();
    assert!(
        matches!(err, PoolError::Device(DeviceError::Invalid(_))),
        "{err:?}"
    );
    assert_eq!(f.live_segments(), 0);
    assert_eq!(p.stats().reserved_bytes, 0);
    assert_eq!(p.stats().failed_alloc_count, 1);
    f.0.borrow_mut().skew = 0;
    let a = p.alloc(&f, 100, st(0)).unwrap();
    assert_eq!((a % 4096, p.block_size(a)), (0, Some(4096)));
    check(&p);
}

#[test]
fn limit_gives_out_of_memory_with_numbers() {
    let f = Fake::new();
    let mut p = limited(4 * MIB);
    // The 20 MiB policy segment does not fit the budget: an exact 3 MiB segment does.
    p.alloc(&f, 3 * MIB, st(0)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 3 * MIB);
    let err = p.alloc(&f, 2 * MIB, st(0)).unwrap_err();
    assert_eq!(
        err,
        PoolError::OutOfMemory {
            requested: 2 * MIB,
            reserved: 3 * MIB,
            allocated: 3 * MIB,
            limit: 4 * MIB
        }
    );
    let msg = err.to_string();
    for n in ["2097152", "3145728", "4194304"] {
        assert!(msg.contains(n), "{msg}");
    }
    assert_eq!(p.stats().failed_alloc_count, 1);
    assert_eq!(p.stats().alloc_count, 1);
    // A small request still fits in the remaining MiB (exact segment: 2 MiB would not fit).
    p.alloc(&f, 1000, st(0)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 3 * MIB + 1024);
    p.set_memory_limit(64 * MIB);
    assert_eq!(p.memory_limit(), 64 * MIB);
    p.alloc(&f, 2 * MIB, st(0)).unwrap();
    assert!(p.stats().reserved_bytes <= 64 * MIB);
    check(&p);
}

#[test]
fn limit_releases_cached_segments_of_every_stream() {
    let f = Fake::new();
    let mut p = limited(24 * MIB);
    let a = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    assert_eq!(p.stats().reserved_bytes, 20 * MIB);
    // Stream 1 cannot use stream 0's cache, and 20 + 20 > 24: stream 0's segment is released.
    let b = p.alloc(&f, 8 * MIB, st(1)).unwrap();
    let s = p.stats();
    assert_eq!((s.reserved_bytes, s.segment_count), (20 * MIB, 1));
    assert_eq!((s.segment_alloc_count, s.segment_free_count), (2, 1));
    assert_eq!(f.live_segments(), 1);
    assert_eq!(p.block_size(b), Some(8 * MIB));
    check(&p);
}

#[test]
fn device_out_of_memory_releases_cached_and_retries_once() {
    let f = Fake::with_capacity(24 * MIB);
    let mut p = pool();
    let a = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    let _b = p.alloc(&f, 8 * MIB, st(1)).unwrap();
    assert_eq!(p.stats().segment_free_count, 1);
    // Nothing cached now: 20 MiB refused, exact 8 MiB refused (20 + 8 > 24).
    let err = p.alloc(&f, 8 * MIB, st(2)).unwrap_err();
    assert_eq!(
        err,
        PoolError::OutOfMemory {
            requested: 8 * MIB,
            reserved: 20 * MIB,
            allocated: 8 * MIB,
            limit: u64::MAX
        }
    );
    assert!(err.to_string().contains("no memory limit"), "{err}");
    // But an exact 4 MiB segment fits on the device.
    let c = p.alloc(&f, 4 * MIB, st(2)).unwrap();
    assert_eq!(p.block_size(c), Some(4 * MIB));
    assert_eq!(f.live_segments(), 2);
    assert_eq!(p.stats().failed_alloc_count, 1);
    check(&p);
}

#[test]
fn other_device_errors_fail_at_once_without_leaks() {
    let f = Fake::new();
    let mut p = pool();
    f.0.borrow_mut().fail_next = Some(DeviceError::Driver {
        call: "cuMemAlloc",
        name: "CUDA_ERROR_UNKNOWN".into(),
        message: "test".into(),
    });
    let err = p.alloc(&f, 100, st(0)).unwrap_err();
    assert!(
        matches!(err, PoolError::Device(DeviceError::Driver { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("CUDA_ERROR_UNKNOWN"));
    assert_eq!(f.live_segments(), 0);
    assert_eq!(
        p.stats(),
        PoolStats {
            failed_alloc_count: 1,
            ..PoolStats::default()
        }
    );
    check(&p);
}

#[test]
fn release_cached_returns_only_fully_free_segments() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, 100, st(0)).unwrap();
    let b = p.alloc(&f, 100, st(0)).unwrap();
    let c = p.alloc(&f, 5 * MIB, st(1)).unwrap();
    let d = p.alloc(&f, 30 * MIB, st(0)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 2 * MIB + 20 * MIB + 30 * MIB);
    p.free(&f, a).unwrap();
    p.free(&f, c).unwrap();
    p.free(&f, d).unwrap();
    assert_eq!(p.release_cached(&f).unwrap(), 50 * MIB);
    let s = p.stats();
    assert_eq!(
        (s.reserved_bytes, s.segment_count, s.segment_free_count),
        (2 * MIB, 1, 2)
    );
    assert_eq!(f.live_segments(), 1);
    assert_eq!(p.block_size(b), Some(256));
    assert_eq!(p.release_cached(&f).unwrap(), 0);
    p.free(&f, b).unwrap();
    assert_eq!(p.release_cached(&f).unwrap(), 2 * MIB);
    assert_eq!((p.stats().reserved_bytes, f.live_segments()), (0, 0));
    assert_eq!(p.stats().peak_reserved_bytes, 52 * MIB);
    check(&p);
}

#[test]
fn unknown_pointer_and_double_free() {
    let f = Fake::new();
    let mut p = pool();
    assert_eq!(p.free(&f, 0x1234), Err(PoolError::UnknownPointer(0x1234)));
    let a = p.alloc(&f, 1000, st(0)).unwrap();
    assert_eq!(p.free(&f, a + 256), Err(PoolError::UnknownPointer(a + 256)));
    p.free(&f, a).unwrap();
    assert_eq!(p.free(&f, a), Err(PoolError::UnknownPointer(a)));
    assert_eq!(
        p.free_after_event(&f, a, EventId(1)),
        Err(PoolError::UnknownPointer(a))
    );
    let b = p.alloc(&f, 1000, st(0)).unwrap();
    p.free_after_event(&f, b, EventId(1)).unwrap();
    assert_eq!(p.free(&f, b), Err(PoolError::UnknownPointer(b)));
    assert_eq!(
        p.free_after_event(&f, b, EventId(2)),
        Err(PoolError::UnknownPointer(b))
    );
    assert_eq!(p.block_size(b), None);
    let msg = PoolError::UnknownPointer(0xabc00).to_string();
    assert!(msg.contains("0xabc00"), "{msg}");
    assert_eq!(p.stats().free_count, 2);
    assert_eq!(p.alloc(&f, 0, st(0)), Err(PoolError::ZeroSize));
    assert_eq!(p.stats().failed_alloc_count, 0);
    check(&p);
}

#[test]
fn streams_do_not_share_free_blocks() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, 4096, st(0)).unwrap();
    p.free(&f, a).unwrap();
    let b = p.alloc(&f, 4096, st(1)).unwrap();
    assert!(
        b.abs_diff(a) >= 2 * MIB,
        "stream 1 got memory from stream 0's segment"
    );
    assert_eq!(p.stats().segment_alloc_count, 2);
    assert_eq!(
        p.alloc(&f, 4096, st(0)).unwrap(),
        a,
        "stream-ordered reuse on stream 0"
    );
    p.free(&f, b).unwrap();
    assert_eq!(p.alloc(&f, 4096, st(1)).unwrap(), b);
    assert_eq!(p.stats().segment_alloc_count, 2);
    check(&p);
}

#[test]
fn free_after_event_waits_for_the_event() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, MIB, st(0)).unwrap();
    p.free_after_event(&f, a, EventId(1)).unwrap();
    assert_eq!(p.stats().allocated_bytes, 0);
    assert_eq!((p.pending_free_bytes(), p.pending_free_blocks()), (MIB, 1));
    assert_eq!(p.block_size(a), None);
    let overlaps_a = |x: u64| x < a + MIB && a < x + MIB;
    let b = p.alloc(&f, MIB, st(0)).unwrap();
    assert!(!overlaps_a(b));
    let c = p.alloc(&f, MIB, st(0)).unwrap();
    assert!(!overlaps_a(c));
    assert_eq!(
        p.stats().segment_alloc_count,
        2,
        "a's memory is not reusable yet"
    );
    // Polling again without completion changes nothing.
    let d = p.alloc(&f, MIB, st(0)).unwrap();
    assert!(!overlaps_a(d));
    p.free(&f, b).unwrap();
    assert_eq!(p.release_cached(&f).unwrap(), 0);
    f.complete(EventId(1));
    // The next alloc polls the event: a's segment is whole again and serves a 1 MiB request.
    let e = p.alloc(&f, MIB, st(0)).unwrap();
    assert_eq!(e, a);
    assert_eq!(p.stats().segment_alloc_count, 2);
    assert_eq!(p.pending_free_bytes(), 0);
    check(&p);
}

#[test]
fn free_after_event_shares_one_event_between_blocks() {
    let f = Fake::new();
    let mut p = pool();
    let xs: Vec<u64> = (0..4)
        .map(|_| p.alloc(&f, 64 * KIB, st(0)).unwrap())
        .collect();
    for &x in &xs {
        p.free_after_event(&f, x, EventId(3)).unwrap();
    }
    assert_eq!(p.pending_free_blocks(), 4);
    f.complete(EventId(3));
    assert_eq!(p.release_cached(&f).unwrap(), 2 * MIB);
    assert_eq!(p.pending_free_blocks(), 0);
    check(&p);
}

#[test]
fn release_all_reports_live_blocks_and_frees_every_segment() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, 1000, st(0)).unwrap();
    let b = p.alloc(&f, 12 * MIB, st(1)).unwrap();
    let c = p.alloc(&f, 100, st(2)).unwrap();
    p.free_after_event(&f, b, EventId(9)).unwrap();
    p.free(&f, c).unwrap();
    let err = p.release_all(&f).unwrap_err();
    let msg = err.to_string();
    assert_eq!(
        err,
        PoolError::LiveBlocks {
            live: 1,
            pending: 1,
            bytes: 1024 + 12 * MIB
        }
    );
    let bytes = (1024 + 12 * MIB).to_string();
    for part in ["1 live block", "1 block(s) pending", bytes.as_str()] {
        assert!(msg.contains(part), "{msg}");
    }
    assert_eq!(f.live_segments(), 0);
    let s = p.stats();
    assert_eq!(
        (s.reserved_bytes, s.allocated_bytes, s.segment_count),
        (0, 0, 0)
    );
    assert_eq!(p.free(&f, a), Err(PoolError::UnknownPointer(a)));
    check(&p);
    // A clean pool releases without error.
    let x = p.alloc(&f, 1000, st(0)).unwrap();
    p.free(&f, x).unwrap();
    p.release_all(&f).unwrap();
    assert_eq!(f.live_segments(), 0);
    check(&p);
}

#[test]
fn peaks_and_reset() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, 3 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    p.free(&f, b).unwrap();
    let s = p.stats();
    assert_eq!(
        (s.peak_allocated_bytes, s.peak_reserved_bytes),
        (4 * MIB, 22 * MIB)
    );
    assert_eq!((s.alloc_count, s.free_count, s.allocated_bytes), (2, 2, 0));
    p.release_cached(&f).unwrap();
    p.reset_peaks();
    let s = p.stats();
    assert_eq!((s.peak_allocated_bytes, s.peak_reserved_bytes), (0, 0));
    p.alloc(&f, 100, st(0)).unwrap();
    let s = p.stats();
    assert_eq!(
        (s.peak_allocated_bytes, s.peak_reserved_bytes),
        (256, 2 * MIB)
    );
}

#[test]
fn config_is_normalised() {
    let p = Pool::new(PoolConfig {
        alignment: 0,
        small_request_max: 3000,
        small_segment_bytes: 1000,
        medium_request_max: 10,
        medium_segment_bytes: 0,
        large_segment_rounding: 0,
        ..PoolConfig::default()
    });
    let c = p.config();
    assert_eq!(c.alignment, 256);
    assert_eq!((c.small_request_max, c.small_segment_bytes), (3072, 3072));
    assert_eq!((c.medium_request_max, c.medium_segment_bytes), (3072, 3072));
    assert_eq!(c.large_segment_rounding, 256);
}

#[test]
fn dry_run_matches_a_real_run_and_changes_nothing() {
    let f = Fake::new();
    let mut p = limited(4 * MIB);
    let live = p.alloc(&f, 1000, st(0)).unwrap();
    let before = p.stats();
    let ok = [
        DryRunStep::Alloc {
            bytes: MIB,
            stream: st(0),
        },
        DryRunStep::Alloc {
            bytes: MIB,
            stream: st(0),
        },
        DryRunStep::Free { step: 0 },
        DryRunStep::FreeLive { addr: live },
        DryRunStep::Alloc {
            bytes: MIB,
            stream: st(0),
        },
    ];
    let dry = p.dry_run(&ok).unwrap();
    assert_eq!(p.stats(), before);
    assert_eq!(f.allocs(), 1);
    // The same steps for real on a clone give the same statistics.
    let mut real = p.clone();
    let x = real.alloc(&f, MIB, st(0)).unwrap();
    real.alloc(&f, MIB, st(0)).unwrap();
    real.free(&f, x).unwrap();
    real.free(&f, live).unwrap();
    real.alloc(&f, MIB, st(0)).unwrap();
    assert_eq!(real.stats(), dry);
    assert_eq!(dry.reserved_bytes, 4 * MIB);
    // Two more 1 MiB blocks fit (the second segment holds two); the fourth would need 5 MiB.
    let too_much = [DryRunStep::Alloc {
        bytes: MIB,
        stream: st(0),
    }; 4];
    let (i, e) = p.dry_run(&too_much).unwrap_err();
    assert_eq!(i, 3);
    assert!(matches!(e, PoolError::OutOfMemory { requested, .. } if requested == MIB));
    let (i, e) = p.dry_run(&[DryRunStep::Free { step: 0 }]).unwrap_err();
    assert_eq!((i, e), (0, PoolError::UnknownPointer(0)));
}

// --- property test against a model ---

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64, u32),
    Free(usize),
    /// Free after an event; `true`: reuse the newest still-incomplete event.
    FreeAfterEvent(usize, bool),
    Complete(usize),
    BadFree(usize),
    ReleaseCached,
    ResetPeaks,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1u64..=4096,
        3 => 4097u64..=MIB,
        2 => MIB + 1..=12 * MIB,
        1 => 12 * MIB + 1..=40 * MIB,
    ];
    prop_oneof![
        8 => (size, 0u32..3).prop_map(|(n, s)| Op::Alloc(n, s)),
        5 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, r)| Op::FreeAfterEvent(i, r)),
        2 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::BadFree),
        1 => Just(Op::ReleaseCached),
        1 => Just(Op::ResetPeaks),
    ]
}

struct LiveBlock {
    addr: u64,
    size: u64,
    requested: u64,
    stream: u32,
}

/// Memory a freed block occupied, with the stream it belonged to and the event its reuse
/// waits for.
struct Retired {
    addr: u64,
    size: u64,
    stream: u32,
    event: Option<EventId>,
}

#[derive(Default)]
struct Model {
    live: Vec<LiveBlock>,
    retired: Vec<Retired>,
    incomplete: Vec<EventId>,
    freed_addrs: Vec<u64>,
    next_event: u32,
    unpolled_completion: bool,
    allocated: u64,
    requested: u64,
    peak_allocated: u64,
    allocs: u64,
    frees: u64,
    failed: u64,
}

fn overlaps(a: u64, an: u64, b: u64, bn: u64) -> bool {
    a < b + bn && b < a + an
}

impl Model {
    fn blocked(&self, f: &Fake, r: &Retired) -> bool {
        r.event.is_some_and(|e| !f.event_complete(e))
    }
}

fn check_state(p: &Pool, f: &Fake, m: &mut Model) -> Result<(), TestCaseError> {
    if let Err(e) = p.validate() {
        return Err(TestCaseError::fail(format!("invariant: {e}")));
    }
    let expected = {
        let s = f.0.borrow();
        PoolStats {
            allocated_bytes: m.allocated,
            reserved_bytes: s.reserved,
            peak_allocated_bytes: m.peak_allocated,
            peak_reserved_bytes: s.peak,
            requested_bytes: m.requested,
            alloc_count: m.allocs,
            free_count: m.frees,
            segment_count: s.live.len() as u64,
            segment_alloc_count: s.allocs,
            segment_free_count: s.frees,
            failed_alloc_count: m.failed,
        }
    };
    prop_assert_eq!(p.stats(), expected);
    let align = p.config().alignment;
    let mut sorted: Vec<&LiveBlock> = m.live.iter().collect();
    sorted.sort_by_key(|b| b.addr);
    for w in sorted.windows(2) {
        prop_assert!(w[0].addr + w[0].size <= w[1].addr, "live blocks overlap");
    }
    let s = f.0.borrow();
    for b in &m.live {
        prop_assert_eq!(b.addr % align, 0);
        prop_assert_eq!(p.block_size(b.addr), Some(b.size));
        let seg = s.live.range(..=b.addr).next_back();
        prop_assert!(
            seg.is_some_and(|(&base, &n)| b.addr + b.size <= base + n),
            "block {:#x}+{} outside every live segment",
            b.addr,
            b.size
        );
    }
    // Segments freed since the last check held nothing in use.
    let freed: Vec<(u64, u64)> = s.freed_log.clone();
    drop(s);
    f.0.borrow_mut().freed_log.clear();
    for (base, n) in freed {
        for b in &m.live {
            prop_assert!(
                !overlaps(b.addr, b.size, base, n),
                "segment freed under a live block"
            );
        }
        for r in &m.retired {
            prop_assert!(
                !(overlaps(r.addr, r.size, base, n) && m.blocked(f, r)),
                "segment freed under a block pending on an incomplete event"
            );
        }
        m.retired.retain(|r| !overlaps(r.addr, r.size, base, n));
    }
    Ok(())
}

fn run_ops(cfg: PoolConfig, nstreams: u32, capacity: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let limit = cfg.memory_limit;
    let f = Fake::with_capacity(capacity);
    let mut p = Pool::new(cfg);
    let align = p.config().alignment;
    let mut m = Model::default();
    for op in ops {
        match *op {
            Op::Alloc(n, s) => {
                let s = s % nstreams;
                let r = n.div_ceil(align) * align;
                // Nothing in use once completed events are polled: the request must succeed
                // whenever it fits the budget and the device on its own.
                let quiet = m.live.is_empty() && !m.retired.iter().any(|x| m.blocked(&f, x));
                let dry = (capacity == u64::MAX && !m.unpolled_completion).then(|| {
                    p.dry_run(&[DryRunStep::Alloc {
                        bytes: n,
                        stream: st(s),
                    }])
                });
                let res = p.alloc(&f, n, st(s));
                m.unpolled_completion = false;
                match res {
                    Ok(addr) => {
                        for x in &m.retired {
                            if overlaps(x.addr, x.size, addr, r) {
                                prop_assert_eq!(x.stream, s, "block of another stream reused");
                                prop_assert!(!m.blocked(&f, x), "reused before its event");
                            }
                        }
                        prop_assert!(f.reserved() <= limit);
                        m.live.push(LiveBlock {
                            addr,
                            size: r,
                            requested: n,
                            stream: s,
                        });
                        m.allocated += r;
                        m.requested += n;
                        m.peak_allocated = m.peak_allocated.max(m.allocated);
                        m.allocs += 1;
                        if let Some(d) = dry {
                            prop_assert_eq!(d, Ok(p.stats()), "dry run disagrees");
                        }
                    }
                    Err(PoolError::OutOfMemory {
                        requested,
                        reserved,
                        allocated,
                        limit: l,
                    }) => {
                        m.failed += 1;
                        prop_assert_eq!(
                            (requested, reserved, allocated, l),
                            (n, f.reserved(), m.allocated, limit)
                        );
                        prop_assert!(p.idle.is_empty(), "failed without releasing the cache");
                        prop_assert!(
                            reserved.saturating_add(r) > limit
                                || reserved.saturating_add(r) > capacity,
                            "failed although an exact segment fit"
                        );
                        prop_assert!(!(quiet && r <= limit && r <= capacity), "quiet pool failed");
                        if let Some(d) = dry {
                            prop_assert!(
                                matches!(d, Err((0, PoolError::OutOfMemory { .. }))),
                                "dry run: {:?}",
                                d
                            );
                        }
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("alloc error {e}"))),
                }
            }
            Op::Free(i) | Op::FreeAfterEvent(i, _) if !m.live.is_empty() => {
                let b = m.live.swap_remove(i % m.live.len());
                let event = match *op {
                    Op::FreeAfterEvent(_, reuse) => {
                        let e = match m.incomplete.last() {
                            Some(&e) if reuse => e,
                            _ => {
                                m.next_event += 1;
                                m.incomplete.push(EventId(m.next_event));
                                EventId(m.next_event)
                            }
                        };
                        p.free_after_event(&f, b.addr, e)
                            .map_err(|e| TestCaseError::fail(format!("free_after_event: {e}")))?;
                        Some(e)
                    }
                    _ => {
                        p.free(&f, b.addr)
                            .map_err(|e| TestCaseError::fail(format!("free: {e}")))?;
                        None
                    }
                };
                m.allocated -= b.size;
                m.requested -= b.requested;
                m.frees += 1;
                m.freed_addrs.push(b.addr);
                m.retired.push(Retired {
                    addr: b.addr,
                    size: b.size,
                    stream: b.stream,
                    event,
                });
            }
            Op::Free(_) | Op::FreeAfterEvent(..) => {}
            Op::Complete(i) => {
                if !m.incomplete.is_empty() {
                    let e = m.incomplete.remove(i % m.incomplete.len());
                    f.complete(e);
                    m.unpolled_completion = true;
                }
            }
            Op::BadFree(i) => {
                if !m.freed_addrs.is_empty() {
                    let a = m.freed_addrs[i % m.freed_addrs.len()];
                    if !m.live.iter().any(|b| b.addr == a) {
                        prop_assert_eq!(p.free(&f, a), Err(PoolError::UnknownPointer(a)));
                    }
                }
                if let Some(b) = m.live.first() {
                    let a = b.addr + 1;
                    prop_assert_eq!(
                        p.free_after_event(&f, a, EventId(0)),
                        Err(PoolError::UnknownPointer(a))
                    );
                }
            }
            Op::ReleaseCached => {
                let before = f.reserved();
                let released = p.release_cached(&f);
                m.unpolled_completion = false;
                prop_assert_eq!(released, Ok(before - f.reserved()));
                // Every segment left holds something in use.
                let s = f.0.borrow();
                for (&base, &n) in &s.live {
                    let used = m.live.iter().any(|b| overlaps(b.addr, b.size, base, n))
                        || m.retired
                            .iter()
                            .any(|x| overlaps(x.addr, x.size, base, n) && m.blocked(&f, x));
                    prop_assert!(used, "release_cached kept an unused segment {:#x}", base);
                }
            }
            Op::ResetPeaks => {
                p.reset_peaks();
                m.peak_allocated = m.allocated;
                let mut s = f.0.borrow_mut();
                s.peak = s.reserved;
            }
        }
        check_state(&p, &f, &mut m)?;
    }
    // Free everything, complete every event: the cache drains to nothing.
    for b in std::mem::take(&mut m.live) {
        prop_assert_eq!(p.free(&f, b.addr), Ok(()));
        m.allocated -= b.size;
        m.requested -= b.requested;
        m.frees += 1;
    }
    for e in std::mem::take(&mut m.incomplete) {
        f.complete(e);
    }
    p.release_cached(&f)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    check_state(&p, &f, &mut m)?;
    prop_assert_eq!(p.stats().reserved_bytes, 0);
    prop_assert_eq!(p.stats().allocated_bytes, 0);
    prop_assert_eq!(f.live_segments(), 0);
    prop_assert_eq!(p.release_all(&f), Ok(()));
    Ok(())
}

fn tiny_config() -> PoolConfig {
    PoolConfig {
        small_request_max: 4 * KIB,
        small_segment_bytes: 16 * KIB,
        medium_request_max: 64 * KIB,
        medium_segment_bytes: 256 * KIB,
        large_segment_rounding: 64 * KIB,
        ..PoolConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_alloc_free_sequences_match_the_model(
        tiny in any::<bool>(),
        nstreams in 1u32..=3,
        limit in prop_oneof![Just(u64::MAX), MIB..=64 * MIB],
        capacity in prop_oneof![3 => Just(u64::MAX), 1 => MIB..=96 * MIB],
        ops in proptest::collection::vec(op_strategy(), 1..200),
    ) {
        let base = if tiny { tiny_config() } else { PoolConfig::default() };
        run_ops(PoolConfig { memory_limit: limit, ..base }, nstreams, capacity, &ops)?;
    }
}
