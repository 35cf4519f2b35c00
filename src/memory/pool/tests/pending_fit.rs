//! Best fit over free and pending blocks (`pending_fit.rs`): a pending block that fits more
//! closely than every warm free block is taken, a large hole is left whole, and the read-only
//! search agrees with the one that takes.

use super::*;

/// A virtual range holding a 64 MiB hole, one 1 MiB block pending on event 7 and one live
/// block between them (so nothing coalesces): (pool, fake, hole, pending block).
fn hole_and_pending() -> (Pool, Fake, u64, u64) {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    p.config.pending_best_fit = true;
    // A small request cut from its best fit, as these tests compare it with the pending block.
    p.config.tail_first = TailFirst::Off;
    let hole = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    let _sep = p.alloc(&f, MIB, st(0)).unwrap();
    let parked = p.alloc(&f, MIB, st(0)).unwrap();
    let _top = p.alloc(&f, MIB, st(0)).unwrap();
    p.free(&f, hole).unwrap();
    p.free_after_event(&f, parked, EventId(7)).unwrap();
    (p, f, hole, parked)
}

#[test]
fn a_pending_block_closer_than_every_free_one_is_taken_and_the_hole_stays_whole() {
    let (mut p, f, hole, parked) = hole_and_pending();
    // A plain allocation would cut the hole; the pending block fits exactly.
    assert_eq!(p.warm_fit_size(0, MIB), Some(64 * MIB));
    let (addr, event) = p
        .take_pending_if_closer(&f, MIB, st(0))
        .expect("the pending block fits closer than the hole");
    assert_eq!((addr, event), (parked, EventId(7)));
    assert_eq!(p.pending_free_bytes(), 0);
    // The hole is still one block: the largest request it held before fits at its start.
    assert_eq!(p.alloc(&f, 64 * MIB, st(0)).unwrap(), hole);
    check(&p);
}

#[test]
fn without_the_knob_nothing_pending_is_taken() {
    let (mut p, f, _hole, _parked) = hole_and_pending();
    p.config.pending_best_fit = false;
    assert_eq!(p.take_pending_if_closer(&f, MIB, st(0)), None);
    assert_eq!(p.pending_free_bytes(), MIB);
    check(&p);
}

#[test]
fn a_free_block_as_close_as_the_pending_one_is_left_to_the_plain_allocation() {
    let (mut p, f, _hole, _parked) = hole_and_pending();
    // A free block of exactly the size: no reason to wait for the copy.
    let exact = p.alloc(&f, MIB, st(0)).unwrap();
    let _guard = p.alloc(&f, MIB, st(0)).unwrap();
    p.free(&f, exact).unwrap();
    assert_eq!(p.warm_fit_size(0, MIB), Some(MIB));
    assert_eq!(p.take_pending_if_closer(&f, MIB, st(0)), None);
    assert_eq!(p.pending_free_bytes(), MIB, "nothing taken");
    // Larger than the pending block: nothing to take either.
    assert_eq!(p.take_pending_if_closer(&f, 2 * MIB, st(0)), None);
    // A completed copy frees its block: it is no longer pending, the plain path reuses it.
    f.complete(EventId(7));
    assert_eq!(p.take_pending_if_closer(&f, MIB, st(0)), None);
    assert_eq!(p.pending_free_bytes(), 0);
    check(&p);
}

#[test]
fn the_read_only_best_fit_names_the_block_the_taking_one_takes() {
    let f = Fake::plain();
    let mut p = pool();
    let sizes = [3 * MIB, MIB, 5 * MIB, MIB, 2 * MIB, 4 * KIB, 3 * MIB];
    let blocks: Vec<u64> = sizes
        .iter()
        .map(|&s| p.alloc(&f, s, st(0)).unwrap())
        .collect();
    let _guard = p.alloc(&f, MIB, st(0)).unwrap();
    // Free every other block, so the free ones stay apart.
    for &b in blocks.iter().step_by(2) {
        p.free(&f, b).unwrap();
    }
    for want in [KIB, MIB, 2 * MIB, 3 * MIB, 4 * MIB, 6 * MIB] {
        let kind = if want <= p.config.small_request_max {
            Kind::Small
        } else {
            Kind::Large
        };
        let peeked = p.peek_fit(0, kind, want);
        let mut q = p.clone();
        assert_eq!(peeked, q.take_fit(0, kind, want), "{want} bytes");
    }
    check(&p);
}
