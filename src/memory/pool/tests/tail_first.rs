//! `TailFirst::Always` (`tail_first.rs`): a small request takes the short mapped
//! start of the range's last block rather than cut a warm hole, so the large block that left
//! the hole gets it back without new pages; off, the hole is cut (the default is unchanged).

use super::*;

/// A virtual range holding a warm 4-page hole (freed, kept from coalescing by a live page
/// above it) and, above that, the range's last block whose first page is mapped (a freed page
/// gone back to it): (pool, fake, the hole's address).
fn hole_and_mapped_tail(rule: bool) -> (Pool, Fake, u64) {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    p.config.tail_first = if rule {
        TailFirst::Always
    } else {
        TailFirst::Off
    };
    let hole = p.alloc(&f, 4 * PAGE, st(0)).unwrap();
    let _sep = p.alloc(&f, PAGE, st(0)).unwrap();
    let last = p.alloc(&f, PAGE, st(0)).unwrap();
    p.free(&f, last).unwrap();
    p.free(&f, hole).unwrap();
    check(&p);
    (p, f, hole)
}

#[test]
fn a_small_request_takes_the_mapped_tail_and_the_hole_stays_whole() {
    let (mut p, f, hole) = hole_and_mapped_tail(true);
    let maps = f.maps();
    let small = p.alloc(&f, PAGE / 2, st(0)).unwrap();
    assert!(
        small >= hole + 5 * PAGE,
        "the small request went to the range's last block, not into the hole"
    );
    // The hole is still one block: the large request that left it fits at its start.
    assert_eq!(p.alloc(&f, 4 * PAGE, st(0)).unwrap(), hole);
    assert_eq!(f.maps(), maps, "no page was mapped for either request");
    check(&p);
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
