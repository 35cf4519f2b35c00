//! Whether the real pool's runs follow the pool's dry run (issue 23: GPT-2 small at a third on
//! the H200 mapped 135–193 pages and waited for the device before the logits' gradient in
//! steady runs whose dry run mapped none). The emulated executor runs the plan the runtime
//! chooses, with its release schedule, from the emptied pool the tuning fits it to, on two
//! devices: one that records no markers (as the dry run's backing) and one that records the
//! pool's markers and passes each at once (a device that keeps up with the host).
//! `cargo test --release --lib pool_fidelity -- --nocapture` prints the figures.

use super::gpt2_choice_tests::{
    choose_as_runtime, choose_started, limit_at, on_h200_costs, runtime_knobs, MEDIUM_R9,
    MEDIUM_S14, SMALL_R9, SMALL_S14,
};
use super::gpt2_shape_tests::{pool_for, Step as Shape, MEDIUM, SMALL};
use super::swap_placements_tests::{Emulator, RunFigures};
use super::swap_release::{released_moves, steady_run, Releases, SteadyRun, RELEASE_MARGIN_MS};
use super::test_vmm::Device;
use crate::device::StreamId;
use crate::graph::Liveness;
use crate::plan::program::Program;
use crate::plan::swap::SwapPlan;
use crate::plan::swap_model::{dirty_at_end, estimate, Link};

const ALIGN: u64 = 256;
const S: StreamId = StreamId(0);

/// The steady runs of `plan`'s pending-aware dry run from an emptied pool at `limit`, and the
/// emulated executor's runs 1–5 on `dev` from the same pool, the kept tensors brought in in
/// the plan's order (`Executor::bring_kept`).
fn runs_on(
    s: &Shape,
    plan: &SwapPlan,
    link: Link,
    limit: u64,
    (dev, hold): (Device, bool),
    (from_host, clean_dry_run): (bool, bool),
) -> (SteadyRun, (u64, u64), Vec<RunFigures>) {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(plan), None);
    let e = estimate(&s.tensors, &s.nodes, &program, &s.cost_ms, link, ALIGN);
    let mut releases = Releases::from_estimate(&program, &e, RELEASE_MARGIN_MS);
    if clean_dry_run {
        releases = releases.clean_start(&program, &s.nodes);
    }
    let pool = pool_for(limit, true);
    let steady =
        steady_run(&s.tensors, &s.nodes, &program, &releases, &pool, S, &[]).expect("fits");
    // The same dry run node by node (the timeline's `pred_pool_first` and `pred_pool` rows):
    // its steady runs sum to `steady_run`'s figures.
    let by_run = released_moves(&s.tensors, &s.nodes, &program, &releases, &pool, S, &[]);
    let by_run = by_run.expect("fits");
    let sum = |runs: &[Vec<crate::plan::swap_fit::PoolMoves>]| {
        let all = runs.iter().flatten();
        all.fold((0, 0), |(m, w), p| (m + p.maps, w + p.waits))
    };
    assert_eq!(sum(&by_run[1..]), (steady.page_maps, steady.device_waits));
    let first = sum(&by_run[..1]);
    let end = dirty_at_end(s.tensors.len(), &s.nodes, &program);
    let mut emu = Emulator::new(s, &program, dev, pool, Some(&releases));
    if !from_host {
        emu.newer = end;
    }
    emu.lenient = from_host;
    emu.place_kept();
    // As `RuntimeGraph::execute` holds them around each run (`GKRT_SWAP_RELEASE_HOLD_MARKERS`).
    let runs = (0..5)
        .map(|_| {
            emu.pool.hold_markers(hold);
            let r = emu.run(None);
            emu.pool.hold_markers(false);
            r
        })
        .collect();
    (steady, first, runs)
}

/// The dry run's steady runs map no page and never wait; the emulated runs on a device that
/// records no marker (as the dry run's backing) follow it exactly; on one that passes its
/// markers at once the pool moves idle pages where the dry run maps new ones, its first run
/// leaves another layout, and its steady runs map pages — unless it holds its markers while a
/// release schedule's runs go (`Pool::hold_markers`), when it makes the dry run's choices, on
/// the host's clock and on a slow one alike.
#[test]
fn steady_runs_follow_the_dry_run_on_a_device_that_passes_its_markers() {
    let sizes = [
        ("small, run 9", SMALL, SMALL_R9),
        ("small, session 14", SMALL, SMALL_S14),
        ("medium, session 14", MEDIUM, MEDIUM_S14),
    ];
    for (name, config, csv) in sizes {
        let (s, link) = on_h200_costs(config, csv);
        let limit = limit_at(&s, 0.333);
        // (The choice the runtime made before `Releases::clean_start`: steady-start fits.)
        let choice = choose_started(&s, limit, link, (true, runtime_knobs()), None, false);
        let on = |dev, hold| runs_on(&s, &choice.plan, link, limit, (dev, hold), (false, false));
        let (steady, first, quiet) = on(Device::default(), false);
        let (_, _, free) = on(Device::with_markers(), false);
        let (_, _, held) = on(Device::with_markers(), true);
        // The move budget's clock is the other input the dry run does not share: 5 ms a reading
        // charges every page move far more than the host's clock does.
        let (_, _, slow) = on(Device::with_markers().with_slow_clock(5_000_000), true);
        println!("{name}: the dry run's steady runs {steady:?}");
        println!("  a device without markers: {quiet:?}");
        println!("  markers passed at once: {free:?}");
        println!("  markers passed, held during the runs: {held:?}");
        println!("  held, a slow clock: {slow:?}");
        assert_eq!((steady.page_maps, steady.device_waits), (0, 0), "{name}");
        // The dry run's first run is the emulated executor's on a device without markers.
        assert_eq!(first, (quiet[0].maps, quiet[0].device_waits), "{name}");
        let steady_moves = |runs: &[RunFigures]| {
            runs[1..]
                .iter()
                .map(|r| r.maps + r.device_waits + r.take_backs + r.pending_takes)
                .sum::<u64>()
        };
        assert_eq!(steady_moves(&quiet), 0, "{name}: {quiet:?}");
        assert!(
            steady_moves(&free) > 0,
            "{name}: the device's progress made no difference"
        );
        assert_eq!(held, quiet, "{name}");
        assert_eq!(slow, quiet, "{name}");
    }
}

/// After the tuning emptied the pool, `Executor::bring_kept` brings the plan's kept tensors from
/// the host: clean, so the plan's first run sends the embedding's AdamW state (kept, written by
/// the last nodes) out without a copy, its blocks free at once, where the model — every run a
/// steady one — has them copied and pending. A dry run that assumed so left another first-run
/// layout than the executor's, and the steady runs after it map pages (the H200, session 15 run
/// 1: 16 and 6 maps and two device waits before nodes 247 and 326, the markers held). With
/// `Releases::clean_start` the dry run's first run is the executor's, and the steady runs follow.
#[test]
fn the_first_run_after_the_kept_tensors_came_clean_from_the_host_is_the_dry_runs() {
    let mut departed = 0;
    let sizes = [
        ("small, run 9", SMALL, SMALL_R9),
        ("small, session 14", SMALL, SMALL_S14),
        ("medium, run 9", MEDIUM, MEDIUM_R9),
    ];
    for (name, config, csv) in sizes {
        let (s, link) = on_h200_costs(config, csv);
        let limit = limit_at(&s, 0.333);
        let plan = &choose_as_runtime(&s, limit, link).plan;
        let held = || (Device::with_markers(), true);
        let (steady, first, clean) = runs_on(&s, plan, link, limit, held(), (true, true));
        // The plan chosen with steady-start fits, before `Releases::clean_start`.
        let before = choose_started(&s, limit, link, (true, runtime_knobs()), None, false);
        let (old, _, left) = runs_on(&s, &before.plan, link, limit, held(), (true, false));
        println!("{name}: the clean-start dry run's steady runs {steady:?}, first run {first:?}");
        println!("  the runs from the host: {clean:?}");
        println!("  against a steady-start dry run ({old:?}): {left:?}");
        assert_eq!((steady.page_maps, steady.device_waits), (0, 0), "{name}");
        assert_eq!(first, (clean[0].maps, clean[0].device_waits), "{name}");
        // (Small's plan keeps the embedding's AdamW state, which leaves clean in the first run.)
        assert!(
            config.layers > 12 || clean[0].off_schedule > 0,
            "{name}: nothing left clean"
        );
        for r in &clean[1..] {
            assert_eq!(
                (r.maps, r.device_waits, r.take_backs, r.off_schedule),
                (0, 0, 0, 0),
                "{name}: {clean:?}"
            );
        }
        departed += left[1..]
            .iter()
            .map(|r| r.maps + r.device_waits)
            .sum::<u64>();
    }
    assert!(
        departed > 0,
        "the steady-start dry run's layout held anyway"
    );
}
