//! `TailFirst::ShortLived` (`lifetimes.rs`, `tail_first.rs`): the pool learns how many
//! allocations blocks of each size live, and a small request whose size lives shorter than the
//! mean (fewer allocations than there are live blocks) takes the short mapped start of the
//! range's last block rather than cut a warm hole; sizes that live long, or were never freed,
//! still take the best fit.

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
