//! `TailFirst::ShortLived` (`lifetimes.rs`, `tail_first.rs`): the pool learns how many
//! allocations blocks of each size live, and a small request whose size lives shorter than the
//! mean (fewer allocations than there are live blocks) takes the short mapped start of the
//! range's last block rather than cut a warm hole; sizes that live long, or were never freed,
//! still take the best fit, and so does a request whose position lived long in the last epoch
//! over its floor.

use super::lifetimes::Lifetimes;
use super::*;

#[test]
fn the_table_keeps_a_running_mean_per_size_and_forgets_a_size_another_displaced() {
    let mut t = Lifetimes::default();
    assert_eq!(t.expected(4096), None);
    t.note(4096, 10);
    assert_eq!(t.expected(4096), Some(10));
    t.note(4096, 2);
    assert_eq!(t.expected(4096), Some(6));
    // Sizes that share a slot replace each other: find one and check the older is gone.
    let other = (1..100_000u64)
        .map(|k| 4096 + 256 * k)
        .find(|&s| {
            let mut u = Lifetimes::default();
            u.note(4096, 1);
            u.note(s, 1);
            u.expected(4096).is_none()
        })
        .expect("two sizes share a slot");
    t.note(other, 3);
    assert_eq!(t.expected(other), Some(3));
    assert_eq!(t.expected(4096), None);
}

/// `tail_first::hole_and_mapped_tail_by` with `TailFirst::ShortLived` (`rule`) or off.
fn hole_and_mapped_tail(rule: bool) -> (Pool, Fake, u64) {
    super::tail_first::hole_and_mapped_tail_by(if rule {
        TailFirst::ShortLived
    } else {
        TailFirst::Off
    })
}

/// Teaches the pool that blocks of `size` bytes live no allocation at all (freed at once).
fn teach_short(p: &mut Pool, f: &Fake, size: u64) {
    let a = p.alloc(f, size, st(0)).unwrap();
    p.free(f, a).unwrap();
}

#[test]
fn a_short_lived_size_takes_the_mapped_tail_and_the_hole_stays_whole() {
    let (mut p, f, hole) = hole_and_mapped_tail(true);
    // Never freed yet: nothing known, so the first one cuts the hole as the default does.
    let first = p.alloc(&f, PAGE / 2, st(0)).unwrap();
    assert!((hole..hole + 4 * PAGE).contains(&first));
    p.free(&f, first).unwrap();
    teach_short(&mut p, &f, PAGE / 2);
    super::tail_first::small_takes_the_tail(&mut p, &f, hole, "short-lived");
}

#[test]
fn a_long_lived_size_still_cuts_the_hole() {
    let (mut p, f, hole) = hole_and_mapped_tail(true);
    // A block of PAGE / 4 outlives eight allocations, with at most four blocks live.
    let long = p.alloc(&f, PAGE / 4, st(0)).unwrap();
    for _ in 0..8 {
        teach_short(&mut p, &f, PAGE / 8);
    }
    p.free(&f, long).unwrap();
    assert!(p.lifetimes.expected(PAGE / 4).unwrap() >= 8);
    let again = p.alloc(&f, PAGE / 4, st(0)).unwrap();
    assert!((hole..hole + 4 * PAGE).contains(&again));
    // While a short-lived size still goes to the tail.
    let short = p.alloc(&f, PAGE / 8, st(0)).unwrap();
    assert!(short >= hole + 5 * PAGE);
    check(&p);
}

#[test]
fn off_the_pool_learns_nothing_and_cuts_the_hole() {
    let (mut p, f, hole) = hole_and_mapped_tail(false);
    teach_short(&mut p, &f, PAGE / 2);
    assert_eq!(p.lifetimes.expected(PAGE / 2), None);
    let small = p.alloc(&f, PAGE / 2, st(0)).unwrap();
    assert!((hole..hole + 4 * PAGE).contains(&small));
    check(&p);
}

#[test]
fn a_short_lived_request_over_a_page_still_takes_the_best_fit() {
    let (mut p, f, hole) = hole_and_mapped_tail(true);
    teach_short(&mut p, &f, PAGE + PAGE / 2);
    assert_eq!(p.alloc(&f, PAGE + PAGE / 2, st(0)).unwrap(), hole);
    check(&p);
}

/// A range holding a warm 2-page hole below a live page (the floor) and the range's last block
/// with its first page mapped; then steps over that floor. Each step makes a small block it
/// keeps to its end (of a size that changes from step to step, so no step follows a plan), a
/// block of `PAGE / 4` (`long`) that lives through three more allocations, blocks of its size
/// freed as soon as made, and a larger temporary. Blocks of the size live fewer allocations
/// than there are live blocks; the one at `long`'s position does not. Returns the hole's
/// address and, per step, where `long` went and where the first block of its size after it did.
fn steps_with_a_long_block_among_short_ones() -> (u64, Vec<(u64, u64)>) {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    assert_eq!(p.config.tail_first, TailFirst::ShortLived);
    let hole = p.alloc(&f, 2 * PAGE, st(0)).unwrap();
    let _floor = p.alloc(&f, PAGE, st(0)).unwrap();
    let last = p.alloc(&f, PAGE / 2, st(0)).unwrap();
    p.free(&f, last).unwrap();
    p.free(&f, hole).unwrap();
    let size = PAGE / 4;
    let mut placed = Vec::new();
    for big in [5, 6, 7, 4] {
        let anchor = p.alloc(&f, big * PAGE / 32, st(0)).unwrap();
        let long = p.alloc(&f, size, st(0)).unwrap();
        let mut short = Vec::new();
        for _ in 0..3 {
            short.push(p.alloc(&f, size, st(0)).unwrap());
            p.free(&f, *short.last().unwrap()).unwrap();
        }
        p.free(&f, long).unwrap();
        let t = p.alloc(&f, big * PAGE / 4, st(0)).unwrap();
        p.free(&f, t).unwrap();
        for _ in 0..3 {
            let t = p.alloc(&f, size, st(0)).unwrap();
            p.free(&f, t).unwrap();
        }
        p.free(&f, anchor).unwrap();
        placed.push((long, short[0]));
        check(&p);
    }
    (hole, placed)
}

/// `TailFirst::ShortLived` by position: once a step over the floor has been learnt, the block
/// at `long`'s position cuts the hole (best fit), while the blocks of its size made after it,
/// which lived short at their positions too, still take the range's last block. By size alone
/// both would take the last block.
#[test]
fn a_position_that_lived_long_in_the_last_step_cuts_the_hole_though_its_size_lives_short() {
    let (hole, placed) = steps_with_a_long_block_among_short_ones();
    let in_hole = |a: u64| (hole..hole + 2 * PAGE).contains(&a);
    for (step, &(long, short)) in placed.iter().enumerate().skip(1) {
        assert!(
            in_hole(long),
            "step {step}: the long-lived position took the hole"
        );
        assert!(
            !in_hole(short),
            "step {step}: a short-lived one took the range's last block"
        );
    }
}
