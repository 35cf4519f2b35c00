//! The pool over plain segments: splitting, best fit, coalescing, alignment, the budget,
//! device errors, streams, events, release, peaks, configuration and dry runs.

use super::*;

#[test]
fn split_carves_adjacent_blocks_from_one_segment() {
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = FakeConfig::plain().misaligned(4096, 512).build();
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
    f.state_mut().skew = 0;
    let a = p.alloc(&f, 100, st(0)).unwrap();
    assert_eq!((a % 4096, p.block_size(a)), (0, Some(4096)));
    check(&p);
}

#[test]
fn limit_gives_out_of_memory_with_numbers() {
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = FakeConfig::plain().capacity(24 * MIB).build();
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
    let f = Fake::plain();
    let mut p = pool();
    f.state_mut().fail_next_segment = Some(DeviceError::Driver {
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    // Each mismatch leaves the block as it was.
    assert!(!p.free_if_owned(&f, a, 1, st(1), None));
    assert!(!p.free_if_owned(&f, a, 0, st(0), None));
    assert!(!p.free_if_owned(&f, a, 1, st(0), Some(999)));
    assert!(!p.free_if_owned(&f, b, 1, st(0), None));
    assert_eq!(p.block_info(a), info(0, 1), "nothing freed so far");
    assert_eq!(p.block_info(b), info(0, 0));
    assert_eq!(p.stats().free_count, 0);
    assert!(p.free_if_owned(&f, a, 1, st(0), Some(1000)));
    assert_eq!(p.block_size(a), None);
    assert!(!p.free_if_owned(&f, a, 1, st(0), None), "freed already");
    assert_eq!(p.stats().free_count, 1);
    check(&p);
}

#[test]
fn streams_do_not_share_free_blocks() {
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
    let f = Fake::plain();
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
