//! `PoolConfig::own_stream_moves` (`recycle.rs`, `own_stream_victims`): once the program's
//! first step has ended, the slack rule takes no pages from another stream's range that holds
//! live blocks (that stream's next step would take them back); empty ranges still give theirs,
//! and the budget takes pages wherever they are.

use super::*;

/// Stream 1 holds a live page and eight free mapped pages below it (`side`, freed); stream 0
/// holds 200 live pages. With `steady`, stream 2 first allocated and freed 256 bytes: its
/// range emptied, which ends the program's first step (`MoveBudget::note_steady`), and its one
/// page, free in an empty range, moved to stream 0 when its 200 pages raised the most ever
/// mapped (`empty_range_moves`). The device passes every marker, so nothing waits.
/// (pool, fake, side's address)
fn side_stream_with_free_pages(own: bool, steady: bool, limit: u64) -> (Pool, Fake, u64) {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = vpool(limit);
    p.config.own_stream_moves = own;
    if steady {
        let w = p.alloc(&f, 256, st(2)).unwrap();
        p.free(&f, w).unwrap();
    }
    // Side's pages lie below the held one, so freeing them leaves a set of live blocks the
    // range never had before: no epoch ends there (one would end the first step).
    let side = p.alloc(&f, 8 * PAGE, st(1)).unwrap();
    let _held = p.alloc(&f, PAGE, st(1)).unwrap();
    let _main = p.alloc(&f, 200 * PAGE, st(0)).unwrap();
    p.free(&f, side).unwrap();
    check(&p);
    (p, f, side)
}

#[test]
fn after_the_first_step_the_slack_rule_leaves_another_streams_pages_in_place() {
    for own in [true, false] {
        let (mut p, f, side) = side_stream_with_free_pages(own, true, u64::MAX);
        let mapped = p.stats().reserved_bytes / PAGE;
        assert_eq!(mapped, 209);
        // Sixteen pages on stream 0 raise the high-water mark (209 pages) to 217: held to the
        // mark and a page (`tight_peaks`), eight pages must move or be mapped anew.
        let grow = p.alloc(&f, 16 * PAGE, st(0)).unwrap();
        check(&p);
        assert!(f.covers(grow, 16 * PAGE));
        if own {
            // Stream 1's pages stay under its free block: the sixteen are new.
            assert!(f.covers(side, 8 * PAGE), "stream 1's pages moved");
            assert_eq!(p.stats().reserved_bytes / PAGE, mapped + 16);
        } else {
            // Without the rule they are the victims: the footprint stays at the mark and a page.
            assert!(!f.covers(side, 8 * PAGE), "stream 1's pages stayed");
            assert_eq!(p.stats().reserved_bytes / PAGE, 218);
        }
    }
}

#[test]
fn in_the_first_step_pages_move_between_streams() {
    // No range has emptied: the start-up's moves set the footprint, from every stream.
    let (mut p, f, side) = side_stream_with_free_pages(true, false, u64::MAX);
    assert_eq!(p.stats().reserved_bytes / PAGE, 209);
    assert!(!p.moves.is_steady());
    let _grow = p.alloc(&f, 16 * PAGE, st(0)).unwrap();
    check(&p);
    assert!(!f.covers(side, 8 * PAGE), "stream 1's pages stayed");
    assert_eq!(p.stats().reserved_bytes / PAGE, 218);
}

#[test]
fn the_budget_takes_another_streams_pages_after_the_first_step_too() {
    // A limit of 220 pages: sixteen more cannot all be new, so the budget moves stream 1's.
    let (mut p, f, side) = side_stream_with_free_pages(true, true, 220 * PAGE);
    let grow = p.alloc(&f, 16 * PAGE, st(0)).unwrap();
    check(&p);
    assert!(f.covers(grow, 16 * PAGE));
    assert!(
        !f.covers(side, 8 * PAGE),
        "the budget left stream 1's pages"
    );
    assert!(p.stats().reserved_bytes <= 220 * PAGE);
}
