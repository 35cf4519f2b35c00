//! `PoolConfig::recycle_majority_moves` (`recycle.rs`, `majority_short`): a slack-rule move that
//! can give less than half of the pages over the cap is not made (the peak would still grow by
//! more than it saves); one that can give at least half is made, as without the rule.

use super::*;

/// A virtual range whose one free mapped page lies in a hole kept from the range's last block
/// by a live page above it, on a device that passes every marker: the slack rule's only victim
/// is that page. (pool, fake)
fn one_movable_page(rule: bool) -> (Pool, Fake) {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = vpool(u64::MAX);
    p.config.recycle_majority_moves = rule;
    let hole = p.alloc(&f, PAGE, st(0)).unwrap();
    let _sep = p.alloc(&f, PAGE, st(0)).unwrap();
    p.free(&f, hole).unwrap();
    check(&p);
    (p, f)
}

/// Pages the slack rule's soft part moves when `soft` pages are over the cap.
fn moved(rule: bool, soft: u64) -> (u64, u64, u64) {
    let (mut p, f) = one_movable_page(rule);
    let vm = f.vmm().expect("virtual memory");
    let declined = p.recycle_declined_count();
    let done = p.recycle(&f, vm, soft, 0, None, true).unwrap();
    check(&p);
    assert_eq!(p.stats().reserved_bytes, (2 - done) * PAGE);
    (done, f.unmaps(), p.recycle_declined_count() - declined)
}

#[test]
fn a_move_saving_less_than_the_peak_still_grows_is_not_made() {
    // Three pages over the cap, one movable: the peak would grow by two anyway.
    assert_eq!(moved(true, 3), (0, 0, 1));
    // Without the rule the page moves.
    assert_eq!(moved(false, 3).0, 1);
}

#[test]
fn a_move_saving_at_least_half_is_made_as_without_the_rule() {
    assert_eq!(moved(true, 2), (1, 1, 0));
    assert_eq!(moved(false, 2), (1, 1, 0));
    assert_eq!(moved(true, 1), (1, 1, 0));
}
