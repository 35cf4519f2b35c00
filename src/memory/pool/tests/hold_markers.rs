//! `Pool::hold_markers`: while held, the pool records and polls no marker, so on a device that
//! has passed every free it moves the pages its dry run moves (none idle), not the idle ones.

use super::*;

const MIB: u64 = 1 << 20;

/// A free 64 MiB block below a live one, then 96 MiB (mapping it new exceeds the slack over the
/// high-water mark): the calls of `slack_case` in `virtual_ranges.rs`, as dry-run steps.
fn steps() -> Vec<DryRunStep> {
    let a = |bytes| DryRunStep::Alloc {
        bytes,
        stream: st(0),
    };
    vec![
        a(64 * MIB),
        a(64 * MIB),
        DryRunStep::Free { step: 0 },
        a(96 * MIB),
    ]
}

/// A pool with its virtual range (a dry run from a pool without one simulates plain segments),
/// over `f`.
fn primed(f: &Fake) -> Pool {
    let mut p = vpool(u64::MAX);
    let a = p.alloc(f, 256, st(0)).unwrap();
    p.free(f, a).unwrap();
    p
}

/// `steps` on the pool over `f`, holding markers or not; the pool's statistics.
fn real(f: &Fake, hold: bool) -> PoolStats {
    let mut p = primed(f);
    p.hold_markers(hold);
    larger_than_a_busy_hole(f, &mut p);
    check(&p);
    p.stats()
}

#[test]
fn held_markers_make_the_dry_runs_page_moves_on_an_idle_device() {
    let dry = primed(&Fake::virtual_memory()).dry_run(&steps()).unwrap();
    // The dry run's backing records no marker: x's pages are not known idle, the slack rule
    // may not wait, and 96 new MiB are mapped.
    assert_eq!((dry.recycle_count, dry.page_unmap_count), (0, 0));
    assert_eq!(dry.reserved_bytes, 224 * MIB);
    let figures = |s: &PoolStats| {
        (
            s.reserved_bytes,
            s.page_map_count,
            s.page_unmap_count,
            s.recycle_count,
            s.device_wait_count,
        )
    };
    // The device passes every marker at once: left to learn that, the pool moves x's pages.
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let free = real(&f, false);
    assert!(
        free.recycle_count == 1 && free.reserved_bytes < 224 * MIB,
        "{free:?}"
    );
    assert_ne!(figures(&free), figures(&dry));
    // Held, it records no marker and makes the dry run's moves.
    let g = Fake::virtual_memory();
    g.state_mut().idle_device = true;
    let held = real(&g, true);
    assert_eq!(g.event_calls().0, 0, "no marker recorded");
    assert_eq!(figures(&held), figures(&dry));
    assert_eq!(g.syncs(), 0);
}
