//! `PoolConfig::empty_range_moves` (`recycle.rs`, `pages_in_empty_ranges`): a request within
//! the slack rule's cap that would raise the most pages ever mapped takes the free pages another
//! stream left mapped in its empty range, and no other range's; a range that still holds a live
//! block keeps its own.

use super::*;
use crate::memory::pool::recycle::{Keep, Moving};

/// A pool whose stream 1 has allocated and freed 256 bytes, as trace_replay's warm-up does: its
/// range is empty and keeps one page mapped. The device passes every marker. (pool, fake, the
/// warm-up's address)
fn warmed_up(rule: bool) -> (Pool, Fake, u64) {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = vpool(u64::MAX);
    p.config.empty_range_moves = rule;
    let w = p.alloc(&f, 256, st(1)).unwrap();
    p.free(&f, w).unwrap();
    assert_eq!(p.stats().reserved_bytes, PAGE);
    (p, f, w)
}

#[test]
fn a_stream_at_rest_gives_its_page_before_the_footprint_grows() {
    for rule in [true, false] {
        let (mut p, f, warm) = warmed_up(rule);
        // A page on stream 0 stays within the slack rule's page of rounding over the
        // high-water mark: without the rule it is mapped anew beside the idle one.
        let a = p.alloc(&f, PAGE, st(0)).unwrap();
        check(&p);
        assert!(f.covers(a, PAGE));
        if rule {
            assert_eq!(
                p.stats().reserved_bytes,
                PAGE,
                "the idle page was not taken"
            );
            assert!(!f.covers(warm, 256), "the warm-up's page stayed mapped");
        } else {
            assert_eq!(p.stats().reserved_bytes, 2 * PAGE);
            assert!(f.covers(warm, 256));
        }
        // The warm-up's stream comes back: it maps a page of its own again.
        let again = p.alloc(&f, 256, st(1)).unwrap();
        check(&p);
        assert!(f.covers(again, 256));
    }
}

#[test]
fn a_stream_holding_a_live_block_keeps_its_free_pages() {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = vpool(u64::MAX);
    // Stream 1 keeps 256 bytes live at its range's start and frees the page-sized block after
    // them: its second page lies free, mapped, in a range that is not empty.
    let _kept = p.alloc(&f, 256, st(1)).unwrap();
    let side = p.alloc(&f, PAGE, st(1)).unwrap();
    p.free(&f, side).unwrap();
    assert_eq!(p.stats().reserved_bytes, 2 * PAGE);
    assert_eq!(p.pages_in_empty_ranges(NIL), 0);
    let a = p.alloc(&f, PAGE, st(0)).unwrap();
    check(&p);
    assert!(f.covers(a, PAGE));
    // Within the slack rule's rounding, and no empty range: a new page.
    assert_eq!(p.stats().reserved_bytes, 3 * PAGE);
    assert!(
        f.covers(side + PAGE - 256, 256),
        "stream 1's free page moved"
    );
}

/// A move made for an empty range's pages alone (within the slack rule's cap) takes no other:
/// stream 0's hole keeps its free mapped page, stream 1's empty range gives its own.
#[test]
fn a_move_within_the_cap_takes_the_empty_ranges_pages_alone() {
    for empty_only in [true, false] {
        let f = Fake::virtual_memory();
        f.state_mut().idle_device = true;
        let mut p = vpool(u64::MAX);
        // Stream 0: a free mapped page in a hole below a live one, and more free pages than
        // stream 1's in that hole, so that by mapped pages it would be taken first.
        let hole = p.alloc(&f, 2 * PAGE, st(0)).unwrap();
        let _sep = p.alloc(&f, PAGE, st(0)).unwrap();
        p.free(&f, hole).unwrap();
        let warm = p.alloc(&f, 256, st(1)).unwrap();
        p.free(&f, warm).unwrap();
        assert_eq!(p.pages_in_empty_ranges(NIL), 1);
        let vm = f.vmm().expect("virtual memory");
        let moving = Moving {
            empty_only,
            ..Moving::default()
        };
        let done = p
            .recycle(&f, vm, 1, 0, Keep::Nothing, true, None, moving)
            .unwrap();
        check(&p);
        assert_eq!(done, 1);
        assert_eq!(
            f.covers(hole, 2 * PAGE),
            empty_only,
            "stream 0's hole (empty only {empty_only})"
        );
        assert_eq!(f.covers(warm, 256), !empty_only, "stream 1's page");
    }
}
