//! `PoolConfig::recycle_majority_moves` (`recycle.rs`, `majority_short`): a slack-rule move that
//! can give less than half of the pages over the cap is not made (the peak would still grow by
//! more than it saves); one that can give at least half is made, as without the rule; so is one
//! where no more than a physical allocation's worth of pages is over the cap.

use super::*;
use crate::memory::pool::recycle::Moving;

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

/// A slack-rule recycling of `soft` pages over the cap (none that must go): the pages it moved
/// and the moves it declined.
fn soft_move(p: &mut Pool, f: &Fake, soft: u64) -> (u64, u64) {
    let vm = f.vmm().expect("virtual memory");
    let declined = p.recycle_declined_count();
    let done = p
        .recycle(f, vm, soft, 0, Keep::Nothing, true, None, Moving::default())
        .unwrap();
    check(p);
    (done, p.recycle_declined_count() - declined)
}

/// Pages the slack rule's soft part moves when `soft` pages are over the cap.
fn moved(rule: bool, soft: u64) -> (u64, u64, u64) {
    let (mut p, f) = one_movable_page(rule);
    let (done, declined) = soft_move(&mut p, &f, soft);
    assert_eq!(p.stats().reserved_bytes, (2 - done) * PAGE);
    (done, f.unmaps(), declined)
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

/// Pages moved when `soft` pages are over the cap, with one movable page (a one-page chunk) and
/// 260 pages mapped in a live block below it, where the pool maps in chunks of four pages
/// (8 MiB, a 64th of what is mapped, at most `vmm_page_bytes`).
fn moved_in_chunks_of_four(soft: u64) -> (u64, u64) {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = vpool(u64::MAX);
    p.config.vmm_page_bytes = 4 * PAGE;
    let _big = p.alloc(&f, 260 * PAGE, st(0)).unwrap();
    let hole = p.alloc(&f, PAGE, st(0)).unwrap();
    let _sep = p.alloc(&f, PAGE, st(0)).unwrap();
    p.free(&f, hole).unwrap();
    check(&p);
    assert_eq!(p.chunk_pages(soft), 4);
    soft_move(&mut p, &f, soft)
}

#[test]
fn growth_of_at_most_one_chunk_over_the_cap_moves_what_it_can() {
    // Three pages over the cap, one movable: less than half, but within one chunk (a cache
    // grown a row at a time, kv_growth): the page moves.
    assert_eq!(moved_in_chunks_of_four(3), (1, 0));
    assert_eq!(moved_in_chunks_of_four(4), (1, 0));
    // Five pages over: more than a chunk, and one page is less than half: declined.
    assert_eq!(moved_in_chunks_of_four(5), (0, 1));
}

#[test]
fn the_rule_is_the_default() {
    assert!(PoolConfig::default().recycle_majority_moves);
}
