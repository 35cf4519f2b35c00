//! `PoolConfig::tight_peaks` (`ranges.rs`, `map_pages`): a request that raises the high-water
//! mark of bytes in use moves free pages rather than map beyond that mark, where the slack
//! (`recycle_slack_permille`) would have let it map; a request below the mark still has the
//! slack.

use super::*;

/// A virtual range of 200 live pages, a free hole of four mapped pages above them and a live
/// page above the hole, on a device that passes every marker. With `top` pages, a block of
/// that size was allocated above them all and freed first: the high-water mark is then above
/// what is in use, and those pages stay mapped at the range's tail. (pool, fake)
fn hole_between_live_blocks(tight: bool, top: u64) -> (Pool, Fake) {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = vpool(u64::MAX);
    p.config.tight_peaks = tight;
    let _big = p.alloc(&f, 200 * PAGE, st(0)).unwrap();
    let hole = p.alloc(&f, 4 * PAGE, st(0)).unwrap();
    let _sep = p.alloc(&f, PAGE, st(0)).unwrap();
    if top > 0 {
        let t = p.alloc(&f, top * PAGE, st(0)).unwrap();
        p.free(&f, t).unwrap();
    }
    p.free(&f, hole).unwrap();
    check(&p);
    assert_eq!(p.stats().reserved_bytes, (205 + top) * PAGE);
    (p, f)
}

#[test]
fn a_request_raising_the_high_water_mark_moves_pages_instead_of_using_the_slack() {
    for tight in [true, false] {
        let (mut p, f) = hole_between_live_blocks(tight, 0);
        let unmaps = f.unmaps();
        // 201 pages live, eight more raise the mark (205) to 209; the hole cannot hold them, so
        // eight pages are mapped above the live page: 213, within 3% of 209.
        let _grow = p.alloc(&f, 8 * PAGE, st(0)).unwrap();
        check(&p);
        let reserved = p.stats().reserved_bytes / PAGE;
        if tight {
            // Mapping is held to the mark and a page (210): three of the hole's pages move.
            assert_eq!(reserved, 210, "tight");
            assert_eq!(f.unmaps() - unmaps, 3);
        } else {
            assert_eq!(reserved, 213, "with the slack");
            assert_eq!(f.unmaps(), unmaps);
        }
    }
}

#[test]
fn a_request_below_the_high_water_mark_keeps_the_slack() {
    for tight in [true, false] {
        // The mark is 215 pages, all mapped; 201 are in use.
        let (mut p, f) = hole_between_live_blocks(tight, 10);
        let unmaps = f.unmaps();
        // Twelve pages (213 in use, under the mark) take the tail's ten and two new ones: 217
        // mapped, over the mark but within its slack, so nothing moves, tight or not (with no
        // slack at all, a page of the hole would move).
        let _below = p.alloc(&f, 12 * PAGE, st(0)).unwrap();
        check(&p);
        assert_eq!(p.stats().reserved_bytes, 217 * PAGE, "tight {tight}");
        assert_eq!(f.unmaps(), unmaps, "tight {tight}");
    }
}
