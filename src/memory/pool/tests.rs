//! Tests of the caching pool against a fake backing that hands out addresses from a counter
//! (never reusing one) and records live segments.

use super::*;
use proptest::prelude::*;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashSet};

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
    assert_eq!(p.free_plain(true), vec![(st(0), 2 * MIB - 4352, c + 256)]);
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
    let map = |p: &Pool| p.free_plain(small);
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
    assert_eq!(map(&p), vec![(st(0), seg, addrs[0])], "order {order:?}");
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
    assert_eq!(p.free_plain(true).len(), 2);
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
fn free_if_owned_frees_only_a_matching_block() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc_tagged(&f, 1000, st(0), 1).unwrap();
    let b = p.alloc(&f, 1000, st(0)).unwrap();
    let info = |s, tag| {
        Some(BlockInfo {
            stream: st(s),
            tag,
            size: 1024,
            requested: 1000,
        })
    };
    assert_eq!(p.free_if_owned(&f, a, 1, st(1), None), Ok(info(0, 1)));
    assert_eq!(p.free_if_owned(&f, a, 0, st(0), None), Ok(info(0, 1)));
    assert_eq!(p.free_if_owned(&f, a, 1, st(0), Some(999)), Ok(info(0, 1)));
    assert_eq!(p.free_if_owned(&f, b, 1, st(0), None), Ok(info(0, 0)));
    assert_eq!(p.block_size(a), Some(1024), "nothing freed so far");
    assert_eq!(p.free_if_owned(&f, a, 1, st(0), Some(1000)), Ok(None));
    assert_eq!(p.block_size(a), None);
    assert_eq!(
        p.free_if_owned(&f, a, 1, st(0), None),
        Err(PoolError::UnknownPointer(a))
    );
    assert_eq!(p.stats().free_count, 1);
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
fn take_pending_hands_out_the_smallest_oldest_pending_block() {
    let f = Fake::new();
    let mut p = pool();
    let a = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, MIB, st(0)).unwrap();
    let c = p.alloc(&f, MIB, st(0)).unwrap();
    assert_eq!(p.take_pending(MIB, st(0)), None, "nothing pending yet");
    p.free_after_event(&f, a, EventId(1)).unwrap();
    p.free_after_event(&f, c, EventId(3)).unwrap();
    p.free_after_event(&f, b, EventId(2)).unwrap();
    // Best fit among pending blocks; of the two 1 MiB ones, c was parked first.
    assert_eq!(p.take_pending(MIB, st(0)), Some((c, EventId(3))));
    assert_eq!(p.take_pending(MIB, st(0)), Some((b, EventId(2))));
    // Another stream's allocation never takes stream 0's blocks, and nothing is too large.
    assert_eq!(p.take_pending(MIB, st(1)), None);
    assert_eq!(p.take_pending(5 * MIB, st(0)), None);
    // A much larger block is not split for a small request; a close fit is, and the rest
    // stays pending on the same event.
    assert_eq!(p.take_pending(MIB, st(0)), None);
    assert_eq!(
        p.take_pending(4 * MIB - 256 * KIB, st(0)),
        Some((a, EventId(1)))
    );
    assert_eq!(
        (p.pending_free_bytes(), p.pending_free_blocks()),
        (256 * KIB, 1)
    );
    assert_eq!(p.stats().allocated_bytes, 6 * MIB - 256 * KIB);
    check(&p);
    for x in [a, b, c] {
        p.free(&f, x).unwrap();
    }
    f.complete(EventId(1));
    let whole = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    assert_eq!(whole, a, "the rest coalesces once its event completes");
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
            ..PoolStats::default()
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

// --- virtual memory ---

const PAGE: u64 = 2 * MIB;

/// A device with virtual memory: reservations from a counter, a set of mapped pages, an
/// optional cap on mapped bytes (the device's memory), and the same segments and events as
/// `Fake` for the plain fallback.
struct VFake {
    plain: Fake,
    next: std::cell::Cell<u64>,
    ranges: RefCell<BTreeMap<u64, u64>>,
    mapped: RefCell<BTreeSet<u64>>,
    capacity: u64,
    maps: std::cell::Cell<u64>,
    unmaps: std::cell::Cell<u64>,
    syncs: std::cell::Cell<u64>,
    fail_map: RefCell<Option<DeviceError>>,
    /// Marker records in order: (event, stream, completed).
    markers: RefCell<Vec<(EventId, u32, bool)>>,
    next_marker: std::cell::Cell<u32>,
    /// Memory freed stream-ordered: (addr, size, stream, markers recorded on the stream before).
    /// It stays in use on the device until a later marker of its stream completes or the device
    /// is quiesced; unmapping it before is an error.
    freed: RefCell<Vec<(u64, u64, u32, usize)>>,
    /// An idle device: a polled marker completes (with all before it) at its third poll.
    idle_device: std::cell::Cell<bool>,
    polls: std::cell::Cell<u32>,
}

impl VFake {
    fn new() -> VFake {
        VFake::with_capacity(u64::MAX)
    }
    fn with_capacity(capacity: u64) -> VFake {
        VFake {
            plain: Fake::new(),
            next: std::cell::Cell::new(1 << 44),
            ranges: RefCell::new(BTreeMap::new()),
            mapped: RefCell::new(BTreeSet::new()),
            capacity,
            maps: Default::default(),
            unmaps: Default::default(),
            syncs: Default::default(),
            fail_map: RefCell::new(None),
            markers: RefCell::new(Vec::new()),
            next_marker: std::cell::Cell::new(1 << 30),
            freed: RefCell::new(Vec::new()),
            idle_device: Default::default(),
            polls: Default::default(),
        }
    }
    /// The test freed `[addr, addr + size)` stream-ordered on `stream`.
    fn note_freed(&self, addr: u64, size: u64, stream: u32) {
        let before = self
            .markers
            .borrow()
            .iter()
            .filter(|m| m.1 == stream)
            .count();
        self.freed.borrow_mut().push((addr, size, stream, before));
    }
    /// The device passes the oldest pending marker.
    fn complete_marker(&self) {
        if let Some(m) = self.markers.borrow_mut().iter_mut().find(|m| !m.2) {
            m.2 = true;
        }
    }
    /// Memory some queued work may still use.
    fn in_use_on_device(&self, page: u64) -> bool {
        let markers = self.markers.borrow();
        self.freed.borrow().iter().any(|&(a, n, s, before)| {
            let passed = markers
                .iter()
                .filter(|m| m.1 == s)
                .skip(before)
                .any(|m| m.2);
            !passed && page < a + n && a < page + PAGE
        })
    }
    fn mapped_bytes(&self) -> u64 {
        self.mapped.borrow().len() as u64 * PAGE
    }
    /// Every page that `[addr, addr + size)` touches is mapped.
    fn covers(&self, addr: u64, size: u64) -> bool {
        let m = self.mapped.borrow();
        let (p0, p1) = (addr / PAGE, (addr + size).div_ceil(PAGE));
        (p0..p1).all(|p| m.contains(&(p * PAGE)))
    }
    fn in_range(&self, addr: u64) -> bool {
        let r = self.ranges.borrow();
        r.range(..=addr)
            .next_back()
            .is_some_and(|(&b, &n)| addr < b + n)
    }
}

impl PoolBacking for VFake {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        let cap = self.capacity.saturating_sub(self.mapped_bytes());
        if self.plain.reserved().saturating_add(bytes) > cap {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: "vfake full".into(),
            });
        }
        self.plain.alloc_segment(bytes)
    }
    fn free_segment(&self, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        self.plain.free_segment(addr, bytes)
    }
    fn event_complete(&self, event: EventId) -> bool {
        if event.0 >= 1 << 30 {
            let mut m = self.markers.borrow_mut();
            let Some(i) = m.iter().rposition(|m| m.0 == event) else {
                return false;
            };
            if !m[i].2 && self.idle_device.get() {
                self.polls.set(self.polls.get() + 1);
                if self.polls.get() >= 3 {
                    self.polls.set(0);
                    m[..=i].iter_mut().for_each(|m| m.2 = true);
                }
            }
            return m[i].2;
        }
        self.plain.event_complete(event)
    }
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }
    fn record_marker(&self, stream: StreamId, reuse: Option<EventId>) -> Option<EventId> {
        let e = reuse.unwrap_or_else(|| {
            let n = self.next_marker.get();
            self.next_marker.set(n + 1);
            EventId(n)
        });
        self.markers.borrow_mut().push((e, stream.0, false));
        Some(e)
    }
}

impl VirtualMemory for VFake {
    fn granularity(&self) -> u64 {
        PAGE
    }
    fn reserve(&self, bytes: u64) -> Result<u64, DeviceError> {
        assert!(
            bytes > 0 && bytes.is_multiple_of(PAGE),
            "reserve of {bytes}"
        );
        let base = self.next.get();
        self.next.set(base + bytes + PAGE);
        self.ranges.borrow_mut().insert(base, bytes);
        Ok(base)
    }
    fn unreserve(&self, base: u64, bytes: u64) -> Result<(), DeviceError> {
        assert_eq!(
            self.ranges.borrow_mut().remove(&base),
            Some(bytes),
            "unreserve {base:#x}"
        );
        let m = self.mapped.borrow();
        assert!(
            m.range(base..base + bytes).next().is_none(),
            "range {base:#x} released with pages mapped"
        );
        Ok(())
    }
    fn map(&self, addr: u64, page: u64, count: u64) -> Result<(), DeviceError> {
        if let Some(e) = self.fail_map.borrow_mut().take() {
            return Err(e);
        }
        let bytes = page * count;
        assert!(addr.is_multiple_of(PAGE) && count > 0 && page.is_multiple_of(PAGE));
        if self.mapped_bytes() + self.plain.reserved() + bytes > self.capacity {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: "vfake full".into(),
            });
        }
        let mut m = self.mapped.borrow_mut();
        for p in (addr..addr + bytes).step_by(PAGE as usize) {
            assert!(self.in_range(p), "map outside a reservation at {p:#x}");
            assert!(m.insert(p), "page {p:#x} mapped twice");
        }
        self.maps.set(self.maps.get() + bytes / PAGE);
        Ok(())
    }
    fn unmap(&self, addr: u64, page: u64, count: u64) -> Result<(), DeviceError> {
        for p in (addr..addr + page * count).step_by(PAGE as usize) {
            assert!(
                !self.in_use_on_device(p),
                "page {p:#x} unmapped while queued work may still use it"
            );
        }
        let mut m = self.mapped.borrow_mut();
        for p in (addr..addr + page * count).step_by(PAGE as usize) {
            assert!(m.remove(&p), "page {p:#x} unmapped but not mapped");
        }
        self.unmaps.set(self.unmaps.get() + page * count / PAGE);
        Ok(())
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        self.syncs.set(self.syncs.get() + 1);
        for m in self.markers.borrow_mut().iter_mut() {
            m.2 = true;
        }
        self.freed.borrow_mut().clear();
        Ok(())
    }
    fn trim(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

fn vpool(limit: u64) -> Pool {
    Pool::new(PoolConfig {
        memory_limit: limit,
        vmm_reserve_bytes: 4 << 30,
        vmm_page_bytes: PAGE,
        ..PoolConfig::default()
    })
}

#[test]
fn virtual_range_packs_small_and_large_blocks_without_seams() {
    let f = VFake::new();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, 1000, st(0)).unwrap();
    let b = p.alloc(&f, 3 * MIB, st(0)).unwrap();
    let c = p.alloc(&f, 100, st(0)).unwrap();
    // One range, blocks back to back, pages mapped only under them.
    assert_eq!((b, c), (a + 1024, a + 1024 + 3 * MIB));
    let s = p.stats();
    assert_eq!((s.segment_count, s.reserved_bytes), (1, 2 * PAGE));
    assert_eq!(f.mapped_bytes(), 2 * PAGE);
    assert!(f.covers(a, 1024) && f.covers(b, 3 * MIB) && f.covers(c, 256));
    assert_eq!(f.plain.allocs(), 0, "no plain segment");
    // Freed neighbours coalesce across what would be a segment seam elsewhere.
    p.free(&f, a).unwrap();
    p.free(&f, b).unwrap();
    let d = p.alloc(&f, 3 * MIB + 1024, st(0)).unwrap();
    assert_eq!(d, a);
    assert_eq!(f.maps.get(), 2, "reuse maps nothing");
    check(&p);
}

#[test]
fn a_stream_can_grow_by_a_range_while_the_others_use_segments() {
    let f = VFake::new();
    let mut p = Pool::new(PoolConfig {
        vmm: false,
        vmm_reserve_bytes: 4 << 30,
        vmm_page_bytes: PAGE,
        ..PoolConfig::default()
    });
    assert!(p.set_new_stream_growth(st(1), true));
    let seg = p.alloc(&f, 3 * MIB, st(0)).unwrap();
    assert_eq!(
        (f.plain.allocs(), f.maps.get()),
        (1, 0),
        "stream 0 takes a segment"
    );
    let a = p.alloc(&f, 1000, st(1)).unwrap();
    let b = p.alloc(&f, 3 * MIB, st(1)).unwrap();
    assert_eq!(
        b,
        a + 1024,
        "stream 1 packs small and large blocks in its range"
    );
    assert_eq!(
        (f.plain.allocs(), f.maps.get()),
        (1, 2),
        "and maps pages, no segment"
    );
    // A stream the pool already serves keeps its way of growing.
    assert!(!p.set_new_stream_growth(st(0), true));
    assert!(!p.set_new_stream_growth(st(1), false));
    p.alloc(&f, 30 * MIB, st(0)).unwrap();
    assert_eq!((f.plain.allocs(), f.maps.get()), (2, 2));
    p.alloc(&f, 30 * MIB, st(1)).unwrap();
    assert_eq!(f.plain.allocs(), 2);
    assert!(f.maps.get() > 2);
    p.free(&f, seg).unwrap();
    check(&p);
}

#[test]
fn take_pending_works_inside_a_virtual_range() {
    let f = VFake::new();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, MIB, st(0)).unwrap();
    p.free_after_event(&f, a, EventId(5)).unwrap();
    let (x, e) = p.take_pending(7 * MIB + 512 * KIB, st(0)).unwrap();
    assert_eq!((x, e), (a, EventId(5)));
    assert!(f.covers(x, 7 * MIB + 512 * KIB));
    assert_eq!(p.pending_free_bytes(), 512 * KIB);
    check(&p);
    p.free(&f, x).unwrap();
    p.free(&f, b).unwrap();
    check(&p);
}

#[test]
fn virtual_streams_get_their_own_ranges() {
    let f = VFake::new();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, 4096, st(0)).unwrap();
    p.free(&f, a).unwrap();
    let b = p.alloc(&f, 4096, st(1)).unwrap();
    assert!(
        b.abs_diff(a) >= 4 << 30,
        "stream 1 got memory from stream 0's range"
    );
    assert_eq!(p.stats().segment_count, 2);
    assert_eq!(p.alloc(&f, 4096, st(0)).unwrap(), a);
    assert_eq!(
        p.block_info(b)
            .map(|i| (i.stream, i.tag, i.size, i.requested)),
        Some((st(1), 0, 4096, 4096))
    );
    check(&p);
}

#[test]
fn budget_recycles_free_pages_of_other_streams() {
    let f = VFake::new();
    let mut p = vpool(16 * MIB);
    let a = p.alloc(&f, 12 * MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    assert_eq!(p.stats().reserved_bytes, 12 * MIB);
    // Stream 1 needs 10 MiB: 12 + 10 > 16, so stream 0's free pages are unmapped first.
    let b = p.alloc(&f, 10 * MIB, st(1)).unwrap();
    let s = p.stats();
    assert!(s.reserved_bytes <= 16 * MIB, "{s:?}");
    assert_eq!(s.reserved_bytes, f.mapped_bytes());
    assert!(f.covers(b, 10 * MIB));
    assert!(
        s.recycle_count >= 1 && f.syncs.get() >= 1,
        "unmapping waits for the device"
    );
    // Over the budget even with everything recycled: out of memory, with numbers.
    let err = p.alloc(&f, 8 * MIB, st(0)).unwrap_err();
    assert!(
        matches!(err, PoolError::OutOfMemory { requested, limit, .. } if requested == 8 * MIB && limit == 16 * MIB),
        "{err:?}"
    );
    assert_eq!(p.stats().failed_alloc_count, 1);
    check(&p);
}

#[test]
fn large_requests_reuse_hole_pages_beyond_the_slack_waiting_if_needed() {
    let f = VFake::new();
    let mut p = Pool::new(PoolConfig {
        recycle_waits: true,
        ..vpool(u64::MAX).config().clone()
    });
    let x = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    let _y = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    p.free(&f, x).unwrap();
    f.note_freed(x, 64 * MIB, 0);
    // 96 MiB does not fit x's hole; mapping 96 new MiB would put 224 MiB behind a high-water
    // mark of 160 MiB: x's pages move, after waiting once for the device (it may still use them).
    let z = p.alloc(&f, 96 * MIB, st(0)).unwrap();
    assert!(f.covers(z, 96 * MIB));
    let s = p.stats();
    let cap = (160 * MIB / 1000 * 1030).div_ceil(PAGE) * PAGE;
    assert!(s.reserved_bytes <= cap, "{} > {cap}", s.reserved_bytes);
    assert_eq!(s.reserved_bytes, f.mapped_bytes());
    assert_eq!(
        (f.syncs.get(), s.recycle_count, s.device_wait_count),
        (1, 1, 1)
    );
    check(&p);
}

/// A non-waiting pool (spin as given) with a freed 64 MiB block `x` below a live one, then a
/// 96 MiB request: it does not fit x's hole, and mapping 96 new MiB exceeds the slack over the
/// high-water mark. Returns the pool and the 96 MiB block.
fn slack_case(f: &VFake, spin_ns: u64) -> (Pool, u64) {
    let mut p = Pool::new(PoolConfig {
        recycle_waits: false,
        recycle_spin_ns: spin_ns,
        ..vpool(u64::MAX).config().clone()
    });
    let x = p.alloc(f, 64 * MIB, st(0)).unwrap();
    let _y = p.alloc(f, 64 * MIB, st(0)).unwrap();
    p.free(f, x).unwrap();
    f.note_freed(x, 64 * MIB, 0);
    let z = p.alloc(f, 96 * MIB, st(0)).unwrap();
    assert!(f.covers(z, 96 * MIB));
    (p, z)
}

#[test]
fn frees_record_markers_at_most_once_per_interval() {
    for (min_ns, records) in [(0, 5), (3_600 * 1_000_000_000, 1)] {
        let f = VFake::new();
        let mut p = Pool::new(PoolConfig {
            marker_every: 1,
            marker_min_interval_ns: min_ns,
            ..vpool(u64::MAX).config().clone()
        });
        let blocks: Vec<u64> = (0..5).map(|_| p.alloc(&f, 4096, st(0)).unwrap()).collect();
        for b in blocks {
            p.free(&f, b).unwrap();
        }
        // A marker after every free, or only the first within the hour.
        assert_eq!(f.markers.borrow().len(), records, "interval {min_ns} ns");
        p.validate().unwrap();
    }
}

#[test]
fn large_requests_reuse_idle_hole_pages_beyond_the_slack() {
    let f = VFake::new();
    // The device may still use x's memory (its marker is not passed): no waiting for it, new
    // pages instead.
    let (mut p, z) = slack_case(&f, PoolConfig::default().recycle_spin_ns);
    assert_eq!(p.stats().reserved_bytes, 224 * MIB);
    assert_eq!((f.syncs.get(), p.stats().page_unmap_count), (0, 0));
    // The device passes the marker recorded then (after x's free, before z's).
    f.complete_marker();
    p.free(&f, z).unwrap();
    f.note_freed(z, 96 * MIB, 0);
    // 160 MiB goes where z was (its pages are mapped) plus 64 new MiB: x's idle hole gives them.
    let u = p.alloc(&f, 160 * MIB, st(0)).unwrap();
    assert_eq!(u, z);
    assert!(f.covers(u, 160 * MIB));
    let s = p.stats();
    let cap = (224 * MIB / 1000 * 1030).div_ceil(PAGE) * PAGE;
    assert!(s.reserved_bytes <= cap, "{} > {cap}", s.reserved_bytes);
    assert_eq!(s.reserved_bytes, f.mapped_bytes());
    assert!(s.page_unmap_count > 0 && s.recycle_count == 1);
    assert_eq!(
        f.syncs.get(),
        0,
        "idle pages move without waiting for the device"
    );
    // Small growth never recycles: it maps new pages.
    let unmaps = f.unmaps.get();
    let _w = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    assert_eq!(f.unmaps.get(), unmaps);
    check(&p);
}

#[test]
fn an_idle_device_lets_the_slack_rule_move_pages_without_waiting() {
    let f = VFake::new();
    f.idle_device.set(true);
    // As in the test above, but the device passes the fresh marker within the spin: x's pages
    // move, the footprint stays within the slack, and nothing waited for the device.
    let (p, _) = slack_case(&f, PoolConfig::default().recycle_spin_ns);
    let s = p.stats();
    let cap = (160 * MIB / 1000 * 1030).div_ceil(PAGE) * PAGE;
    assert!(s.reserved_bytes <= cap, "{} > {cap}", s.reserved_bytes);
    assert_eq!(
        (f.syncs.get(), s.recycle_count, s.device_wait_count),
        (0, 1, 0)
    );
    check(&p);

    // With the spin off, the same requests map new pages instead.
    let g = VFake::new();
    g.idle_device.set(true);
    let (q, _) = slack_case(&g, 0);
    assert_eq!(q.stats().reserved_bytes, 224 * MIB);
    check(&q);
}

#[test]
fn placement_prefers_mapped_pages_at_either_end_of_a_hole() {
    let f = VFake::new();
    let mut p = vpool(64 * MIB);
    let a = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let c = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    p.free(&f, b).unwrap();
    // Unmap the free pages (as the budget would), then map the upper half of the hole again.
    assert_eq!(p.release_cached(&f).unwrap(), 8 * MIB);
    let u = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    let _ = (u, c);
    check(&p);
    // A 4 MiB request: the hole [b, b+8M) has unmapped pages; a's hole is fully mapped.
    let v = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    assert!(f.covers(v, 4 * MIB));
    assert_eq!(p.stats().reserved_bytes, f.mapped_bytes());
    check(&p);
}

#[test]
fn the_mapped_start_of_the_range_tail_is_reused_in_place() {
    let f = VFake::new();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    // a's memory merged into the range's last block, whose first page is mapped.
    check(&p);
    let maps = p.stats().page_map_count;
    for size in [MIB, 3 * MIB / 2, 256] {
        let b = p.alloc(&f, size, st(0)).unwrap();
        assert_eq!(b, a, "{size} bytes at the start of the tail");
        assert_eq!(p.stats().page_map_count, maps);
        check(&p);
        p.free(&f, b).unwrap();
    }
    // Larger than the mapped start: new pages, still at the same place.
    let c = p.alloc(&f, 3 * MIB, st(0)).unwrap();
    assert_eq!(c, a);
    assert!(p.stats().page_map_count > maps && f.covers(c, 3 * MIB));
    check(&p);
}

#[test]
fn placement_uses_mapped_pages_in_the_middle_of_a_hole() {
    let f = VFake::new();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let c = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let _d = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    p.free(&f, c).unwrap();
    assert_eq!(p.release_cached(&f).unwrap(), 16 * MIB);
    // One hole [a, c + 8M): unmapped, mapped (b's pages), unmapped.
    p.free(&f, b).unwrap();
    check(&p);
    let (maps, reserved) = (p.stats().page_map_count, p.stats().reserved_bytes);
    // Either end of the hole needs four new pages; b's place needs none.
    let u = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    assert_eq!(u, b);
    assert_eq!(
        (p.stats().page_map_count, p.stats().reserved_bytes),
        (maps, reserved)
    );
    assert!(f.covers(u, 8 * MIB));
    check(&p);
}

#[test]
fn virtual_range_too_small_falls_back_to_plain_segments() {
    let f = VFake::new();
    let mut p = Pool::new(PoolConfig {
        vmm_reserve_bytes: 8 * MIB,
        vmm_page_bytes: PAGE,
        ..PoolConfig::default()
    });
    let a = p.alloc(&f, 6 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 6 * MIB, st(0)).unwrap();
    assert!(f.covers(a, 6 * MIB));
    assert_eq!(
        f.plain.allocs(),
        1,
        "the second block comes from a plain segment"
    );
    assert_eq!(p.block_size(b), Some(6 * MIB));
    assert_eq!(p.stats().reserved_bytes, 6 * MIB + 20 * MIB);
    p.free(&f, a).unwrap();
    p.free(&f, b).unwrap();
    assert_eq!(p.release_cached(&f).unwrap(), 6 * MIB + 20 * MIB);
    assert_eq!((p.stats().reserved_bytes, f.mapped_bytes()), (0, 0));
    check(&p);
    p.release_all(&f).unwrap();
    assert!(f.ranges.borrow().is_empty());
}

#[test]
fn failed_map_leaves_the_pool_consistent() {
    let f = VFake::new();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, MIB, st(0)).unwrap();
    *f.fail_map.borrow_mut() = Some(DeviceError::Driver {
        call: "cuMemMap",
        name: "CUDA_ERROR_UNKNOWN".into(),
        message: "test".into(),
    });
    let err = p.alloc(&f, 40 * MIB, st(0)).unwrap_err();
    assert!(err.to_string().contains("CUDA_ERROR_UNKNOWN"), "{err}");
    check(&p);
    let b = p.alloc(&f, 40 * MIB, st(0)).unwrap();
    assert!(f.covers(b, 40 * MIB) && f.covers(a, MIB));
    // The device itself running out: recycle everything, then out of memory.
    let g = VFake::with_capacity(8 * MIB);
    let mut q = vpool(u64::MAX);
    let x = q.alloc(&g, 6 * MIB, st(0)).unwrap();
    q.free(&g, x).unwrap();
    let y = q.alloc(&g, 7 * MIB, st(1)).unwrap();
    assert!(g.covers(y, 7 * MIB));
    assert!(matches!(
        q.alloc(&g, 4 * MIB, st(1)),
        Err(PoolError::OutOfMemory { .. })
    ));
    check(&q);
}

#[test]
fn virtual_release_all_and_dry_run() {
    let f = VFake::new();
    let mut p = vpool(64 * MIB);
    let live = p.alloc(&f, 5 * MIB, st(0)).unwrap();
    let steps = [
        DryRunStep::Alloc {
            bytes: 20 * MIB,
            stream: st(0),
        },
        DryRunStep::Free { step: 0 },
        DryRunStep::Alloc {
            bytes: 30 * MIB,
            stream: st(1),
        },
        DryRunStep::FreeLive { addr: live },
    ];
    let before = (p.stats(), f.maps.get());
    let dry = p.dry_run(&steps).unwrap();
    assert_eq!(
        (p.stats(), f.maps.get()),
        before,
        "dry run changed the pool"
    );
    let mut real = p.clone();
    let x = real.alloc(&f, 20 * MIB, st(0)).unwrap();
    real.free(&f, x).unwrap();
    real.alloc(&f, 30 * MIB, st(1)).unwrap();
    real.free(&f, live).unwrap();
    assert_eq!(real.stats(), dry);
    let (i, e) = p
        .dry_run(&[DryRunStep::Alloc {
            bytes: 70 * MIB,
            stream: st(0),
        }])
        .unwrap_err();
    assert!(i == 0 && matches!(e, PoolError::OutOfMemory { .. }));
    let err = real.release_all(&f).unwrap_err();
    assert!(
        matches!(err, PoolError::LiveBlocks { live: 1, .. }),
        "{err:?}"
    );
    assert!(f.ranges.borrow().is_empty() && f.mapped.borrow().is_empty());
    assert_eq!(real.stats().reserved_bytes, 0);
    check(&real);
}

/// Random operations on a pool with virtual memory: blocks never overlap, every page under a
/// block in use is mapped, pages are unmapped only under free memory, other streams' blocks are
/// reused only after their event, reserved bytes match the device and stay within the budget.
fn run_virtual_ops(
    limit: u64,
    capacity: u64,
    nstreams: u32,
    waits: bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let f = VFake::with_capacity(capacity);
    let mut p = Pool::new(PoolConfig {
        memory_limit: limit,
        vmm_reserve_bytes: 256 * MIB,
        vmm_page_bytes: PAGE,
        recycle_min_bytes: 4 * MIB,
        recycle_waits: waits,
        ..PoolConfig::default()
    });
    let mut live: Vec<LiveBlock> = Vec::new();
    let mut retired: Vec<Retired> = Vec::new();
    let mut incomplete: Vec<EventId> = Vec::new();
    let mut next_event = 0;
    for op in ops {
        match *op {
            Op::Alloc(n, s) => {
                let s = s % nstreams;
                match p.alloc(&f, n, st(s)) {
                    Ok(addr) => {
                        let r = n.div_ceil(256) * 256;
                        for b in &live {
                            prop_assert!(!overlaps(b.addr, b.size, addr, r), "live blocks overlap");
                        }
                        for x in &retired {
                            if overlaps(x.addr, x.size, addr, r) {
                                prop_assert_eq!(x.stream, s, "block of another stream reused");
                                prop_assert!(
                                    x.event.is_none_or(|e| f.event_complete(e)),
                                    "reused before its event"
                                );
                            }
                        }
                        live.push(LiveBlock {
                            addr,
                            size: r,
                            requested: n,
                            stream: s,
                        });
                    }
                    Err(PoolError::OutOfMemory { .. }) => {
                        // Memory in use (live, or pending on an incomplete event), each block
                        // rounded out to whole pages at both ends, plus the request: more than
                        // the budget or the device.
                        let blocked = |x: &Retired| x.event.is_some_and(|e| !f.event_complete(e));
                        let held = live.iter().map(|b| b.size + 2 * PAGE).sum::<u64>()
                            + retired
                                .iter()
                                .filter(|x| blocked(x))
                                .map(|x| x.size + 2 * PAGE)
                                .sum::<u64>();
                        prop_assert!(
                            held + n + 2 * PAGE > limit.min(capacity),
                            "out of memory with {held} bytes held"
                        );
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("alloc: {e}"))),
                }
            }
            Op::Free(i) | Op::FreeAfterEvent(i, _) if !live.is_empty() => {
                let b = live.swap_remove(i % live.len());
                let event = if let Op::FreeAfterEvent(_, reuse) = *op {
                    let e = match incomplete.last() {
                        Some(&e) if reuse => e,
                        _ => {
                            next_event += 1;
                            incomplete.push(EventId(next_event));
                            EventId(next_event)
                        }
                    };
                    prop_assert_eq!(p.free_after_event(&f, b.addr, e), Ok(()));
                    Some(e)
                } else {
                    prop_assert_eq!(p.free(&f, b.addr), Ok(()));
                    f.note_freed(b.addr, b.size, b.stream);
                    None
                };
                retired.push(Retired {
                    addr: b.addr,
                    size: b.size,
                    stream: b.stream,
                    event,
                });
            }
            Op::Free(_) | Op::FreeAfterEvent(..) => {}
            Op::Complete(i) => {
                if !incomplete.is_empty() {
                    f.plain.complete(incomplete.remove(i % incomplete.len()));
                }
                f.complete_marker();
            }
            Op::BadFree(i) => {
                let a = 0x1000 + (i as u64 % 1000) * 256;
                prop_assert_eq!(p.free(&f, a), Err(PoolError::UnknownPointer(a)));
            }
            Op::ReleaseCached => {
                let before = p.stats().reserved_bytes;
                let released = p.release_cached(&f);
                prop_assert_eq!(released, Ok(before - p.stats().reserved_bytes));
            }
            Op::ResetPeaks => p.reset_peaks(),
        }
        if let Err(e) = p.validate() {
            return Err(TestCaseError::fail(format!("invariant: {e}")));
        }
        let s = p.stats();
        prop_assert_eq!(s.reserved_bytes, f.mapped_bytes() + f.plain.reserved());
        prop_assert!(s.reserved_bytes <= limit, "over the budget");
        for b in &live {
            prop_assert!(
                f.covers(b.addr, b.size) || f.plain.reserved() > 0,
                "live block unmapped"
            );
        }
        let blocked = |x: &Retired| x.event.is_some_and(|e| !f.event_complete(e));
        for x in retired.iter().filter(|x| blocked(x)) {
            prop_assert!(
                f.covers(x.addr, x.size) || f.plain.reserved() > 0,
                "pages unmapped under a block pending on an event"
            );
        }
    }
    for b in std::mem::take(&mut live) {
        prop_assert_eq!(p.free(&f, b.addr), Ok(()));
    }
    for e in incomplete {
        f.plain.complete(e);
    }
    p.release_cached(&f)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(p.stats().reserved_bytes, 0);
    prop_assert_eq!(f.mapped_bytes(), 0);
    prop_assert_eq!(p.release_all(&f), Ok(()));
    prop_assert!(f.ranges.borrow().is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sequences_on_virtual_memory_keep_every_invariant(
        nstreams in 1u32..=3,
        limit in prop_oneof![Just(u64::MAX), 16 * MIB..=128 * MIB],
        capacity in prop_oneof![3 => Just(u64::MAX), 1 => 16 * MIB..=160 * MIB],
        waits in any::<bool>(),
        ops in proptest::collection::vec(op_strategy(), 1..200),
    ) {
        run_virtual_ops(limit, capacity, nstreams, waits, &ops)?;
    }
}

// --- trace replay (host only; `cargo test --release -- --ignored replay --nocapture`) ---

/// A device with virtual memory that records nothing but counts: the pool's own cost.
struct CountingVm {
    next: std::cell::Cell<u64>,
    maps: std::cell::Cell<u64>,
    unmaps: std::cell::Cell<u64>,
    plain: std::cell::Cell<u64>,
    vmm: bool,
}

impl PoolBacking for CountingVm {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        let base = self.next.get();
        self.next.set(base + bytes.next_multiple_of(PAGE) + PAGE);
        self.plain.set(self.plain.get() + 1);
        Ok(base)
    }
    fn free_segment(&self, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn event_complete(&self, _: EventId) -> bool {
        true
    }
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        self.vmm.then_some(self as &dyn VirtualMemory)
    }
    fn record_marker(&self, _: StreamId, reuse: Option<EventId>) -> Option<EventId> {
        // Nothing runs on this device: every marker is passed at once.
        Some(reuse.unwrap_or(EventId(0)))
    }
}

impl VirtualMemory for CountingVm {
    fn granularity(&self) -> u64 {
        PAGE
    }
    fn reserve(&self, bytes: u64) -> Result<u64, DeviceError> {
        self.alloc_segment(bytes)
    }
    fn unreserve(&self, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn map(&self, _: u64, _: u64, count: u64) -> Result<(), DeviceError> {
        self.maps.set(self.maps.get() + count);
        Ok(())
    }
    fn unmap(&self, _: u64, _: u64, count: u64) -> Result<(), DeviceError> {
        self.unmaps.set(self.unmaps.get() + count);
        Ok(())
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn trim(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Ev {
    A(u32, u64),
    F(u32),
}

/// Events of a trace file (`a ID BYTES STREAM` / `f ID`, gzipped or not), ids made dense.
fn load_trace(path: &str) -> Vec<Ev> {
    let raw = std::process::Command::new("gzip")
        .args(["-dcf", path])
        .output()
        .expect("gzip runs");
    assert!(raw.status.success(), "reading {path}");
    let text = String::from_utf8(raw.stdout).expect("utf-8 trace");
    let mut ids = HashMap::new();
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut w = line.split_whitespace();
        let (op, id) = (w.next().unwrap(), w.next().unwrap().to_string());
        if op == "a" {
            let n = ids.len() as u32;
            let bytes = w.next().unwrap().parse().unwrap();
            ids.insert(id, n);
            out.push(Ev::A(n, bytes));
        } else {
            out.push(Ev::F(ids[&id]));
        }
    }
    out
}

fn trace_paths() -> Vec<String> {
    match std::env::var("GKRT_TRACES") {
        Ok(v) => v.split(':').map(str::to_string).collect(),
        Err(_) => ["gpt2_train", "resnet50_train"]
            .iter()
            .map(|t| {
                format!(
                    "{}/../shared/traces/{t}.trace.gz",
                    env!("CARGO_MANIFEST_DIR")
                )
            })
            .collect(),
    }
}

fn replay(evs: &[Ev], cfg: PoolConfig, vmm: bool, passes: usize) -> (f64, Vec<f64>, u64, u64, u64) {
    let b = CountingVm {
        next: std::cell::Cell::new(1 << 40),
        maps: Default::default(),
        unmaps: Default::default(),
        plain: Default::default(),
        vmm,
    };
    let mut p = Pool::new(cfg);
    let n = evs.iter().filter(|e| matches!(e, Ev::A(..))).count();
    let mut addr = vec![0u64; n];
    let (mut live, mut peak) = (0u64, 0u64);
    let mut sizes = vec![0u64; n];
    let mut per_pass = Vec::new();
    let mut unmaps_after_first = 0;
    let thrash_mb: usize = std::env::var("GKRT_REPLAY_THRASH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut junk = vec![0u8; thrash_mb << 20];
    for pass in 0..passes {
        let u0 = b.unmaps.get();
        for k in (0..junk.len()).step_by(64) {
            junk[k] = junk[k].wrapping_add(pass as u8);
        }
        std::hint::black_box(&junk);
        let t = std::time::Instant::now();
        for e in evs {
            match *e {
                Ev::A(i, bytes) => {
                    addr[i as usize] = p.alloc(&b, bytes, st(0)).unwrap();
                    if pass == 0 {
                        sizes[i as usize] = bytes;
                        live += bytes;
                        peak = peak.max(live);
                    }
                }
                Ev::F(i) => {
                    p.free(&b, addr[i as usize]).unwrap();
                    if pass == 0 {
                        live -= sizes[i as usize];
                    }
                }
            }
        }
        per_pass.push(t.elapsed().as_secs_f64() * 1e9 / evs.len() as f64);
        if std::env::var("GKRT_REPLAY_VERBOSE").is_ok() {
            println!(
                "pass {pass}: unmapped {} mapped {} reserved {}",
                b.unmaps.get() - u0,
                b.maps.get(),
                p.stats().reserved_bytes
            );
        }
        if pass > 0 {
            unmaps_after_first += b.unmaps.get() - u0;
        }
    }
    check(&p);
    let frag = p.stats().peak_reserved_bytes as f64 / peak as f64;
    (
        frag,
        per_pass,
        unmaps_after_first,
        b.maps.get(),
        b.plain.get(),
    )
}

#[test]
#[ignore = "benchmark: replays ../shared/traces (or GKRT_TRACES) and prints figures"]
fn replay_traces_through_the_pool() {
    let passes: usize = std::env::var("GKRT_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    println!("| trace | pool | peak reserved / peak live | ns/op (median pass) | first pass | pages mapped | pages unmapped after pass 1 |");
    println!("|---|---|---|---|---|---|---|");
    for path in trace_paths() {
        let evs = load_trace(&path);
        let name = path
            .rsplit('/')
            .next()
            .unwrap()
            .trim_end_matches(".gz")
            .trim_end_matches(".trace");
        // The defaults, or GKRT_POOL_* knobs (read by Pool::new) for exploring.
        for (label, vmm, cfg) in [
            ("virtual ranges", true, PoolConfig::default()),
            ("plain segments", false, PoolConfig::default()),
        ] {
            // GKRT_REPLAY_VMM_ONLY: the virtual-range rows alone (for profiling the default).
            if !vmm && std::env::var("GKRT_REPLAY_VMM_ONLY").is_ok() {
                continue;
            }
            let (frag, mut t, unmaps, maps, _) = replay(&evs, cfg, vmm, passes);
            let first = t[0];
            t.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "| {name} | {label} | {frag:.4} | {:.1} | {first:.1} | {maps} | {unmaps} |",
                t[t.len() / 2]
            );
        }
    }
}

#[test]
fn a_block_record_is_one_cache_line() {
    assert_eq!(std::mem::size_of::<Block>(), 64);
    assert_eq!(std::mem::align_of::<Block>(), 64);
}
