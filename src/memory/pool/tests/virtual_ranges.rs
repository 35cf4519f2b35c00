//! The pool over virtual memory: ranges per stream, placement, page recycling under the
//! budget and the slack rule, markers, fallbacks to plain segments, failures and teardown.

use super::*;

#[test]
fn virtual_range_packs_small_and_large_blocks_without_seams() {
    let f = Fake::virtual_memory();
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
    assert_eq!(f.allocs(), 0, "no plain segment");
    // Freed neighbours coalesce across what would be a segment seam elsewhere.
    p.free(&f, a).unwrap();
    p.free(&f, b).unwrap();
    let d = p.alloc(&f, 3 * MIB + 1024, st(0)).unwrap();
    assert_eq!(d, a);
    assert_eq!(f.maps(), 2, "reuse maps nothing");
    check(&p);
}

#[test]
fn small_requests_take_the_high_end_of_a_hole_and_large_ones_the_low_end() {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    let keep = p.alloc(&f, MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    // A mapped hole of 64 MiB below `keep`: at most a page goes to its top...
    let small = p.alloc(&f, 4096, st(0)).unwrap();
    assert_eq!(small, a + 64 * MIB - 4096);
    let page = p.alloc(&f, PAGE, st(0)).unwrap();
    assert_eq!(page, small - PAGE);
    // ...more than a page to its bottom, and what is left between them is one block.
    let large = p.alloc(&f, PAGE + 256, st(0)).unwrap();
    assert_eq!(large, a);
    let rest = p
        .alloc(&f, 64 * MIB - 2 * PAGE - 4096 - 256, st(0))
        .unwrap();
    assert_eq!(rest, a + PAGE + 256);
    assert_eq!(f.maps(), 33, "all of it from the pages mapped at first");
    for x in [small, page, large, rest, keep] {
        p.free(&f, x).unwrap();
    }
    check(&p);
}

#[test]
fn a_stream_can_grow_by_a_range_while_the_others_use_segments() {
    let f = Fake::virtual_memory();
    let mut p = Pool::new(PoolConfig {
        vmm: false,
        vmm_reserve_bytes: 4 << 30,
        vmm_page_bytes: PAGE,
        ..PoolConfig::default()
    });
    assert!(p.set_new_stream_growth(st(1), true));
    let seg = p.alloc(&f, 3 * MIB, st(0)).unwrap();
    assert_eq!((f.allocs(), f.maps()), (1, 0), "stream 0 takes a segment");
    let a = p.alloc(&f, 1000, st(1)).unwrap();
    let b = p.alloc(&f, 3 * MIB, st(1)).unwrap();
    assert_eq!(
        b,
        a + 1024,
        "stream 1 packs small and large blocks in its range"
    );
    assert_eq!((f.allocs(), f.maps()), (1, 2), "and maps pages, no segment");
    // A stream the pool already serves keeps its way of growing.
    assert!(!p.set_new_stream_growth(st(0), true));
    assert!(!p.set_new_stream_growth(st(1), false));
    p.alloc(&f, 30 * MIB, st(0)).unwrap();
    assert_eq!((f.allocs(), f.maps()), (2, 2));
    p.alloc(&f, 30 * MIB, st(1)).unwrap();
    assert_eq!(f.allocs(), 2);
    assert!(f.maps() > 2);
    p.free(&f, seg).unwrap();
    check(&p);
}

#[test]
fn take_pending_works_inside_a_virtual_range() {
    let f = Fake::virtual_memory();
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
    let f = Fake::virtual_memory();
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
    let f = Fake::virtual_memory();
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
        s.recycle_count >= 1 && f.syncs() >= 1,
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

/// `alloc_no_wait` under the budget: where only pages the device may still use would make
/// room, it fails (out of memory) without waiting and leaves the pool as it was; `alloc` then
/// waits once and succeeds. Pages known idle move without a wait either way.
#[test]
fn alloc_no_wait_fails_rather_than_wait_for_the_device() {
    let f = Fake::virtual_memory();
    let mut p = vpool(16 * MIB);
    let a = p.alloc(&f, 12 * MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    let before = p.stats();
    let err = p.alloc_no_wait(&f, 10 * MIB, st(1)).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory { .. }), "{err:?}");
    let s = p.stats();
    assert_eq!(
        (f.syncs(), s.device_wait_count, s.page_unmap_count),
        (0, 0, 0)
    );
    assert_eq!(s.reserved_bytes, before.reserved_bytes);
    check(&p);
    let b = p.alloc(&f, 10 * MIB, st(1)).unwrap();
    assert!(f.covers(b, 10 * MIB));
    assert_eq!((f.syncs(), p.stats().device_wait_count), (1, 1));
    p.free(&f, b).unwrap();
    check(&p);

    // The device is known done with the freed pages (idle): they move with no wait.
    let g = Fake::virtual_memory();
    g.state_mut().idle_device = true;
    let mut q = vpool(16 * MIB);
    let a = q.alloc(&g, 12 * MIB, st(0)).unwrap();
    q.free(&g, a).unwrap();
    let b = q.alloc_no_wait(&g, 10 * MIB, st(1)).unwrap();
    assert!(g.covers(b, 10 * MIB));
    assert!(q.stats().page_unmap_count > 0);
    assert_eq!((g.syncs(), q.stats().device_wait_count), (0, 0));
    check(&q);
}

#[test]
fn large_requests_reuse_hole_pages_beyond_the_slack_waiting_if_needed() {
    let f = Fake::virtual_memory();
    let mut p = Pool::new(PoolConfig {
        recycle_waits: true,
        ..vpool(u64::MAX).config().clone()
    });
    // x's pages move, after waiting once for the device (it may still use them).
    larger_than_a_busy_hole(&f, &mut p);
    let s = p.stats();
    let cap = (160 * MIB / 1000 * 1030).div_ceil(PAGE) * PAGE;
    assert!(s.reserved_bytes <= cap, "{} > {cap}", s.reserved_bytes);
    assert_eq!(s.reserved_bytes, f.mapped_bytes());
    assert_eq!((f.syncs(), s.recycle_count, s.device_wait_count), (1, 1, 1));
    check(&p);
}

#[test]
fn after_its_first_step_the_time_buckets_moves_no_longer_wait_for_the_device() {
    // Without `peak_moves` the slack move below is one the time bucket pays for; with it, a
    // move at the program's peak (its request raises it), which may still wait.
    for (first_step, peak_moves) in [(false, false), (true, false), (true, true)] {
        let f = Fake::virtual_memory();
        let mut p = Pool::new(PoolConfig {
            recycle_waits: true,
            peak_moves,
            ..vpool(u64::MAX).config().clone()
        });
        if first_step {
            // A program keeps 1 MiB of weights (no range empties) and runs a first step up to
            // 66 MiB and back, freeing a block made before the weights while its 64 MiB are
            // live (so no epoch is found: `epochs.rs`). The next step rising past the first
            // one's half-way mark (33 MiB) ends it.
            let before = p.alloc(&f, MIB, st(0)).unwrap();
            let _w = p.alloc(&f, MIB, st(0)).unwrap();
            let a = p.alloc(&f, 64 * MIB, st(0)).unwrap();
            p.free(&f, before).unwrap();
            p.free(&f, a).unwrap();
            let b = p.alloc(&f, 20 * MIB, st(0)).unwrap();
            assert!(
                !p.moves.is_steady(),
                "below the mark: the first step goes on"
            );
            p.free(&f, b).unwrap();
        }
        // (With the first step, the helper's first block is the next step's rise past its
        // mark.)
        larger_than_a_busy_hole(&f, &mut p);
        assert_eq!(p.moves.is_steady(), first_step);
        // In the first step the slack rule waits once and moves x's pages; after it, a move
        // the bucket pays for maps new pages instead.
        let s = p.stats();
        let waits = u64::from(!first_step || peak_moves);
        assert_eq!((f.syncs(), s.device_wait_count), (waits, waits));
        assert_eq!(s.page_unmap_count > 0, waits > 0);
        check(&p);
    }
}

/// A non-waiting pool (spin as given) with a freed 64 MiB block `x` below a live one, then a
/// 96 MiB request: it does not fit x's hole, and mapping 96 new MiB exceeds the slack over the
/// high-water mark. Returns the pool and the 96 MiB block.
fn slack_case(f: &Fake, spin_ns: u64) -> (Pool, u64) {
    let mut p = Pool::new(PoolConfig {
        recycle_waits: false,
        recycle_spin_ns: spin_ns,
        ..vpool(u64::MAX).config().clone()
    });
    let z = larger_than_a_busy_hole(f, &mut p);
    (p, z)
}

#[test]
fn frees_record_markers_at_most_once_per_interval() {
    for (min_ns, records) in [(0, 5), (3_600 * 1_000_000_000, 1)] {
        let f = Fake::virtual_memory();
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
        assert_eq!(f.state().markers.len(), records, "interval {min_ns} ns");
        p.validate().unwrap();
    }
}

#[test]
fn large_requests_reuse_idle_hole_pages_beyond_the_slack() {
    let f = Fake::virtual_memory();
    // The device may still use x's memory (its marker is not passed): no waiting for it, new
    // pages instead.
    let (mut p, z) = slack_case(&f, PoolConfig::default().recycle_spin_ns);
    assert_eq!(p.stats().reserved_bytes, 224 * MIB);
    assert_eq!((f.syncs(), p.stats().page_unmap_count), (0, 0));
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
        f.syncs(),
        0,
        "idle pages move without waiting for the device"
    );
    // Small growth never recycles: it maps new pages.
    let unmaps = f.unmaps();
    let _w = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    assert_eq!(f.unmaps(), unmaps);
    check(&p);
}

#[test]
fn an_idle_device_lets_the_slack_rule_move_pages_without_waiting() {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    // As in the test above, but the device passes the fresh marker within the spin: x's pages
    // move, the footprint stays within the slack, and nothing waited for the device.
    let (p, _) = slack_case(&f, PoolConfig::default().recycle_spin_ns);
    let s = p.stats();
    let cap = (160 * MIB / 1000 * 1030).div_ceil(PAGE) * PAGE;
    assert!(s.reserved_bytes <= cap, "{} > {cap}", s.reserved_bytes);
    assert_eq!((f.syncs(), s.recycle_count, s.device_wait_count), (0, 1, 0));
    check(&p);

    // With the spin off, the same requests map new pages instead.
    let g = Fake::virtual_memory();
    g.state_mut().idle_device = true;
    let (q, _) = slack_case(&g, 0);
    assert_eq!(q.stats().reserved_bytes, 224 * MIB);
    check(&q);
}

/// A spin whose polls the scheduler delays past its time bound still polls a few times: the
/// idle device's marker, passed at the third poll, lets x's pages move as above.
#[test]
fn a_spin_delayed_past_its_bound_still_sees_an_idle_device() {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let spin = PoolConfig::default().recycle_spin_ns;
    f.state_mut().poll_delay = std::time::Duration::from_nanos(2 * spin);
    let (p, _) = slack_case(&f, spin);
    let s = p.stats();
    assert_eq!((f.syncs(), s.recycle_count, s.device_wait_count), (0, 1, 0));
    check(&p);
}

#[test]
fn placement_prefers_mapped_pages_at_either_end_of_a_hole() {
    let f = Fake::virtual_memory();
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
    let f = Fake::virtual_memory();
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

/// With a cold hole left by unmapped pages, a request that no end of the hole holds on mapped
/// pages takes the mapped start of the range's last block at once (`take_tail_prefix`), and one
/// that an end does hold goes into the hole at that end (`take_cold_end`: the hole is smaller
/// than the tail): the choices `place_cold` makes, which debug builds also assert at each
/// shortcut. Each block handed out lies on mapped pages, and `check` finds every index right.
#[test]
fn a_cold_hole_that_cannot_hold_the_request_leaves_it_to_the_tail_start() {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    let _a = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 8 * MIB, st(0)).unwrap();
    let _c = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    p.free(&f, b).unwrap();
    assert_eq!(p.release_cached(&f).unwrap(), 8 * MIB);
    // One page of the hole mapped again, at its low end; the rest stays unmapped.
    let y = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    assert_eq!(y, b);
    p.free(&f, y).unwrap();
    // Too large for the hole: the range tail maps 16 MiB, which stay mapped at its start.
    let x = p.alloc(&f, 16 * MIB, st(0)).unwrap();
    p.free(&f, x).unwrap();
    check(&p);
    let maps = p.stats().page_map_count;
    for _ in 0..2 {
        // The hole's mapped low page holds 1 MiB: the hole, not the tail.
        let v = p.alloc(&f, MIB, st(0)).unwrap();
        assert_eq!(v, b, "the hole's mapped end");
        assert!(f.covers(v, MIB));
        check(&p);
        // 4 MiB would need a new page at either end of the hole: the tail's mapped start.
        let w = p.alloc(&f, 4 * MIB, st(0)).unwrap();
        assert_eq!(w, x, "the tail's mapped start");
        assert!(f.covers(w, 4 * MIB));
        check(&p);
        // And with 1 MiB of the hole's page taken, 1.5 MiB fits only the tail's start.
        let u = p.alloc(&f, 3 * MIB / 2, st(0)).unwrap();
        assert_eq!(u, x + 4 * MIB);
        check(&p);
        for z in [v, w, u] {
            p.free(&f, z).unwrap();
        }
        check(&p);
    }
    assert_eq!(p.stats().page_map_count, maps, "no page mapped");
}

#[test]
fn placement_uses_mapped_pages_in_the_middle_of_a_hole() {
    let f = Fake::virtual_memory();
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
    let f = Fake::virtual_memory();
    let mut p = Pool::new(PoolConfig {
        vmm_reserve_bytes: 8 * MIB,
        vmm_page_bytes: PAGE,
        ..PoolConfig::default()
    });
    let a = p.alloc(&f, 6 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 6 * MIB, st(0)).unwrap();
    assert!(f.covers(a, 6 * MIB));
    assert_eq!(f.allocs(), 1, "the second block comes from a plain segment");
    assert_eq!(p.block_size(b), Some(6 * MIB));
    assert_eq!(p.stats().reserved_bytes, 6 * MIB + 20 * MIB);
    p.free(&f, a).unwrap();
    p.free(&f, b).unwrap();
    assert_eq!(p.release_cached(&f).unwrap(), 6 * MIB + 20 * MIB);
    assert_eq!((p.stats().reserved_bytes, f.mapped_bytes()), (0, 0));
    check(&p);
    p.release_all(&f).unwrap();
    assert!(f.state().ranges.is_empty());
}

#[test]
fn failed_map_leaves_the_pool_consistent() {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    let a = p.alloc(&f, MIB, st(0)).unwrap();
    f.state_mut().fail_next_map = Some(DeviceError::Driver {
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
    let g = FakeConfig::virtual_memory().capacity(8 * MIB).build();
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
    let f = Fake::virtual_memory();
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
    let before = (p.stats(), f.maps());
    let dry = p.dry_run(&steps).unwrap();
    assert_eq!((p.stats(), f.maps()), before, "dry run changed the pool");
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
    assert!(f.state().ranges.is_empty() && f.state().mapped.is_empty());
    assert_eq!(real.stats().reserved_bytes, 0);
    check(&real);
}
