//! `TailFirst::Always` (`tail_first.rs`): a small request takes the short mapped
//! start of the range's last block rather than cut a warm hole, so the large block that left
//! the hole gets it back without new pages; off, the hole is cut (the default is unchanged).

use super::*;

/// A virtual range holding a warm 4-page hole (freed, kept from coalescing by a live page
/// above it) and, above that, the range's last block whose first page is mapped (a freed page
/// gone back to it), the pool placing small requests by `mode`: (pool, fake, the hole's
/// address).
pub(super) fn hole_and_mapped_tail_by(mode: TailFirst) -> (Pool, Fake, u64) {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    p.config.tail_first = mode;
    let hole = p.alloc(&f, 4 * PAGE, st(0)).unwrap();
    let _sep = p.alloc(&f, PAGE, st(0)).unwrap();
    let last = p.alloc(&f, PAGE, st(0)).unwrap();
    p.free(&f, last).unwrap();
    p.free(&f, hole).unwrap();
    check(&p);
    (p, f, hole)
}

/// `hole_and_mapped_tail_by` with `TailFirst::Always` (`rule`) or off.
fn hole_and_mapped_tail(rule: bool) -> (Pool, Fake, u64) {
    hole_and_mapped_tail_by(if rule {
        TailFirst::Always
    } else {
        TailFirst::Off
    })
}

/// A request of half a page (`what` it is) goes to the range's last block, and the hole stays
/// whole: the large request that left it fits at its start, with no page mapped for either.
pub(super) fn small_takes_the_tail(p: &mut Pool, f: &Fake, hole: u64, what: &str) {
    let maps = f.maps();
    let small = p.alloc(f, PAGE / 2, st(0)).unwrap();
    assert!(
        small >= hole + 5 * PAGE,
        "the {what} request went to the range's last block, not into the hole"
    );
    assert_eq!(p.alloc(f, 4 * PAGE, st(0)).unwrap(), hole);
    assert_eq!(f.maps(), maps, "no page was mapped for either request");
    check(p);
}

#[test]
fn a_small_request_takes_the_mapped_tail_and_the_hole_stays_whole() {
    let (mut p, f, hole) = hole_and_mapped_tail(true);
    small_takes_the_tail(&mut p, &f, hole, "small");
}

#[test]
fn without_the_rule_the_small_request_cuts_the_hole() {
    let (mut p, f, hole) = hole_and_mapped_tail(false);
    let small = p.alloc(&f, PAGE / 2, st(0)).unwrap();
    assert!((hole..hole + 4 * PAGE).contains(&small));
    assert_ne!(p.alloc(&f, 4 * PAGE, st(0)).unwrap(), hole);
    check(&p);
}

#[test]
fn a_request_over_a_page_still_takes_the_best_fit() {
    let (mut p, f, hole) = hole_and_mapped_tail(true);
    assert_eq!(p.alloc(&f, PAGE + PAGE / 2, st(0)).unwrap(), hole);
    check(&p);
}
