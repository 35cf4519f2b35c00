//! Release schedules (`swap_release`): when the model's copies end, and the GPT-2 shape's steady
//! step through the pending-aware dry run against the executor's emulation with the same
//! schedule. `cargo test --release --lib swap_release -- --nocapture` prints the figures.

use super::gpt2_shape_tests::{
    build, finalize_at, pool_for, transient_peak, Config, LINK, MEDIUM, SMALL,
};
use super::swap_placements_tests::{Emulator, RunFigures};
use super::swap_release::{
    fits_pool_released, steady_run, Releases, SteadyRun, RELEASE_MARGIN_MS, STEADY_RUNS,
};
use super::test_vmm::Device;
use crate::device::StreamId;
use crate::graph::Liveness;
use crate::plan::program::{Program, Step};
use crate::plan::swap::{SwapPlan, Timings};
use crate::plan::swap_candidates::{fitted_candidates_with, fitted_timed_candidates_with};
use crate::plan::swap_fit::pool_moves;
use crate::plan::swap_model::{choose, dirty_at_end, estimate, Estimate, Link};

const ALIGN: u64 = 256;
const S: StreamId = StreamId(0);

/// A program of `n` launches (the schedule reads only its length).
fn launches(n: u32) -> Program {
    Program {
        steps: (0..n).map(Step::Launch).collect(),
        step_node: (0..n).collect(),
        ..Program::default()
    }
}

#[test]
fn a_copys_block_goes_back_at_the_first_step_past_its_end() {
    let program = launches(6);
    let e = Estimate {
        step_clock: vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        // Tensor 7 copied out at step 0, ending at 2.5; tensor 8 at step 1, ending at 9 (no
        // step outlasts it); tensor 9 at step 1 ending at 1.0 and again at step 2 ending 2.2.
        copy_ends: vec![(0, 7, 2.5), (1, 8, 9.0), (1, 9, 1.0), (2, 9, 2.2)],
        ..Estimate::default()
    };
    let r = Releases::from_estimate(&program, &e, 0.25);
    // 7 at step 3 (clock 3.0 >= 2.75); 9's first copy at step 2 (2.0 >= 1.25), where it is
    // copied out again: not before that (the event is the tensor's); its second at step 3.
    assert_eq!(r.at(0), &[] as &[u32]);
    assert_eq!(r.at(2), &[9]);
    assert_eq!(r.at(3), &[7, 9]);
    assert_eq!(r.count(), 3);
    assert!(r.copies(0, 7) && r.copies(1, 8) && !r.copies(0, 8));
    // With a wider margin 7 waits a step longer; the first copy of 9 would be given back where
    // it is copied again, after which its release would wait for the second copy: left out.
    let late = Releases::from_estimate(&program, &e, 1.1);
    assert_eq!(late.at(3), &[] as &[u32]);
    assert_eq!(late.at(4), &[7, 9]);
    assert_eq!(late.count(), 2);
    assert_eq!(late.at(99), &[] as &[u32]);
}

/// `plan`'s release schedule from its estimate `e`, its steady dry runs and its emulated runs 1–3
/// at `limit`.
fn released_runs(
    s: &super::gpt2_shape_tests::Step,
    lv: &Liveness,
    plan: &SwapPlan,
    e: &Estimate,
    limit: u64,
) -> (Releases, SteadyRun, Vec<RunFigures>) {
    let program = Program::compile(&s.tensors, &s.nodes, lv, Some(plan), None);
    let releases = Releases::from_estimate(&program, e, RELEASE_MARGIN_MS);
    let pool = pool_for(limit, true);
    let steady =
        steady_run(&s.tensors, &s.nodes, &program, &releases, &pool, S, &[]).expect("fits");
    let runs = emulate(s, &program, limit, Some(&releases));
    (releases, steady, runs)
}

/// The emulated executor's runs 1–3 of the small shape's plan (the kept tensors the run writes
/// start newer on the device, as the previous run left them).
fn emulate(
    s: &super::gpt2_shape_tests::Step,
    program: &Program,
    limit: u64,
    releases: Option<&Releases>,
) -> Vec<RunFigures> {
    // As the previous run left them.
    let end = dirty_at_end(s.tensors.len(), &s.nodes, program);
    let mut newer = vec![false; s.tensors.len()];
    for &t in &program.keep {
        newer[t as usize] = end[t as usize];
    }
    let mut emu = Emulator::new(
        s,
        program,
        Device::default(),
        pool_for(limit, true),
        releases,
    );
    emu.newer = newer;
    emu.place_kept();
    (0..=STEADY_RUNS).map(|_| emu.run(None)).skip(1).collect()
}

/// The small shape at a third (`--recompute 2`), the plan the runtime chooses today on the
/// shape's costs (fitted with blocks free at once): its plain dry run maps no page in the steady
/// state, but with its copy-outs' blocks pending until the model's copies end it moves pages
/// every run, and so do the executor's emulated runs, with the schedule or without (blocks
/// pending to the run's end: the H200's 400–500 maps a step). The plain fit hides memory that
/// copies in flight hold.
#[test]
fn the_plain_dry_run_hides_the_moves_that_pending_blocks_cause() {
    let mut s = build(Config {
        recompute: 2,
        ..SMALL
    });
    // The planner of session 12, whose plan this was written on: with the moved rebuilds' dead
    // links pruned the plain fit's plan does not even run through the emulated executor with
    // blocks pending to the run's end (it runs out of memory), which says the same louder.
    s.knobs.prune_moved_links = false;
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = (0.333 * (s.persistent_bytes() + transient_peak(&s, &lv)) as f64) as u64;
    let (all, best, _) = finalize_at(&s, limit, true, true, true, true);
    let (plan, e) = &all[best];
    let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(plan), None);
    let releases = Releases::from_estimate(&program, e, RELEASE_MARGIN_MS);
    let pool = pool_for(limit, true);
    let plain_maps: u64 = pool_moves(&s.tensors, &s.nodes, &program, &pool, S, &[])
        .expect("fits")
        .iter()
        .map(|m| m.maps)
        .sum();
    let steady = steady_run(&s.tensors, &s.nodes, &program, &releases, &pool, S, &[])
        .expect("the plan's calls succeed");
    let left = emulate(&s, &program, limit, None);
    let released = emulate(&s, &program, limit, Some(&releases));
    println!(
        "model {:.2} ms; {} copies, {} released early; plain dry run maps {plain_maps}; \
         pending-aware dry run ({STEADY_RUNS} runs) {steady:?}",
        e.step_ms,
        e.copy_ends.len(),
        releases.count()
    );
    println!("emulated, blocks pending until the run's end: {left:?}");
    println!("emulated, with the release schedule: {released:?}");
    assert!(releases.count() > 0);
    assert_eq!(plain_maps, 0);
    assert!(steady.page_maps > 0, "{steady:?}");
    for runs in [&left, &released] {
        assert!(runs.iter().all(|f| f.maps > 0), "{runs:?}");
    }
}

/// Finalize's and the first runs' candidates (`gpt2_shape_tests::finalize_at`, every mode on)
/// fitted with the pending-aware dry run (`fits_pool_released` on the shape's costs): each
/// with its estimate, and the index `choose` takes.
fn released_candidates(
    s: &super::gpt2_shape_tests::Step,
    limit: u64,
    link: Link,
) -> (Vec<(SwapPlan, Estimate)>, usize) {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let pool = pool_for(limit, true);
    let check = |plan: &SwapPlan| {
        let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(plan), None);
        let rates = (&s.cost_ms[..], link, ALIGN);
        let fit = fits_pool_released(&s.tensors, &s.nodes, &program, &pool, S, &[], rates, false);
        fit.map(|_| ())
    };
    let graph = (&s.tensors[..], &s.nodes[..], &lv, &[][..]);
    let mut cands = fitted_candidates_with(graph, limit, ALIGN, s.knobs, check).1;
    let known: Vec<SwapPlan> = cands.iter().map(|(_, p)| p.clone()).collect();
    let available = known.iter().map(|p| p.budget).max().unwrap_or(0);
    let timings = Timings {
        node_ms: &s.cost_ms,
        link,
    };
    let most = known[0].infeasible_nodes.len();
    cands.extend(fitted_timed_candidates_with(
        graph, available, ALIGN, timings, s.knobs, &known, most, check,
    ));
    let all: Vec<(SwapPlan, Estimate)> = cands
        .into_iter()
        .map(|(_, plan)| {
            let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(&plan), None);
            let e = estimate(&s.tensors, &s.nodes, &program, &s.cost_ms, link, ALIGN);
            (plan, e)
        })
        .collect();
    let best = choose(&all.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>());
    (all, best)
}

/// At a third of the working set (`--recompute 2`), plans fitted with their copy-outs' blocks
/// pending until the model's copies end: the chosen one maps no page and never waits for the
/// device in its steady runs, in the dry run and in the emulated executor's runs alike, at the
/// price the model puts on the smaller budget that takes. `--nocapture` prints both choices.
#[test]
fn plans_fitted_with_pending_blocks_run_without_page_moves() {
    for (name, config) in [("small", SMALL), ("medium", MEDIUM)] {
        let s = build(Config {
            recompute: 2,
            ..config
        });
        let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
        let limit = (0.333 * (s.persistent_bytes() + transient_peak(&s, &lv)) as f64) as u64;
        let nodes: f64 = s.cost_ms.iter().sum();
        let (plain, plain_best, _) = finalize_at(&s, limit, true, true, true, true);
        let started = std::time::Instant::now();
        let (all, best) = released_candidates(&s, limit, LINK);
        let fitting = started.elapsed().as_secs_f64();
        let mut order: Vec<usize> = (0..all.len()).collect();
        order.sort_by(|&a, &b| all[a].1.step_ms.total_cmp(&all[b].1.step_ms));
        for &i in order.iter().take(4) {
            let (p, e) = &all[i];
            println!(
                "  {name} candidate {i}: {:.2} ms at {:.3} of the limit, {:.2} GB out, {} recomputes",
                e.step_ms,
                p.budget as f64 / limit as f64,
                p.bytes_out as f64 / 1e9,
                p.recomputes()
            );
        }
        let (plan, e) = &all[best];
        let (_, steady, runs) = released_runs(&s, &lv, plan, e, limit);
        println!(
            "{name}: plain fit {:.2} ms = {:.3}x at {:.3} of the limit; pending-aware fit {:.2} ms = {:.3}x at {:.3} of the limit ({} candidates, fitted in {fitting:.1} s); steady dry runs {steady:?}; emulated {runs:?}",
            plain[plain_best].1.step_ms,
            plain[plain_best].1.step_ms / nodes,
            plain[plain_best].0.budget as f64 / limit as f64,
            e.step_ms,
            e.step_ms / nodes,
            plan.budget as f64 / limit as f64,
            all.len()
        );
        assert_eq!((steady.page_maps, steady.device_waits), (0, 0), "{name}");
        for f in &runs {
            assert_eq!((f.maps, f.device_waits), (0, 0), "{name}: {f:?}");
        }
        let takes = runs.iter().map(|f| (f.take_backs, f.pending_takes));
        let (all, one) = takes.fold((0, 0), |(a, o), (x, y)| (a + x, o + y));
        assert_eq!((all, one), (steady.takes.all, steady.takes.one), "{name}");
    }
}

/// The same on the H200's measured node times and link rates (the small shape at a third,
/// session 10 run 5: `gpt2_shape_tests::the_model_against_the_h200_timeline_of_the_small_shape`'s
/// file): the model's step of the plan the runtime chooses today and of the one fitted with
/// pending blocks, which must run without page moves. `--nocapture` prints both.
#[test]
fn on_the_h200s_timings_the_pending_aware_plan_runs_without_page_moves() {
    let (s, link) = super::gpt2_choice_tests::on_h200_costs(
        SMALL,
        include_str!("testdata/gpt2_small_third_r2_h200.csv"),
    );
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = (0.333 * (s.persistent_bytes() + transient_peak(&s, &lv)) as f64) as u64;
    let nodes: f64 = s.cost_ms.iter().sum();
    let (plain, plain_best, _) = finalize_at(&s, limit, true, true, true, true);
    let (all, best) = released_candidates(&s, limit, link);
    let (plan, e) = &all[best];
    let (releases, steady, runs) = released_runs(&s, &lv, plan, e, limit);
    println!(
        "H200 timings (nodes {nodes:.2} ms, link in {:.1} / out {:.1} GB/s): plain fit {:.2} ms at {:.3} of the limit; pending-aware fit {:.2} ms = {:.3}x at {:.3} of the limit, {} recomputes, {} blocks released; steady {steady:?}",
        link.in_gbps,
        link.out_gbps,
        plain[plain_best].1.step_ms,
        plain[plain_best].0.budget as f64 / limit as f64,
        e.step_ms,
        e.step_ms / nodes,
        plan.budget as f64 / limit as f64,
        plan.recomputes(),
        releases.count()
    );
    // Where the time goes: rebuilds, compute waits, the link each way.
    for (what, p, e) in [
        ("plain", &plain[plain_best].0, &plain[plain_best].1),
        ("pending-aware", plan, e),
    ] {
        println!(
            "  {what}: rebuilds {:.2} ms, compute waits {:.2} ms, {:.2} GB out ({:.1} ms of link), {:.2} GB in ({:.1} ms)",
            e.compute_ms - nodes,
            e.compute_waited_ms,
            p.bytes_out as f64 / 1e9,
            e.bytes_out as f64 / (link.out_gbps * 1e6),
            p.bytes_in as f64 / 1e9,
            e.bytes_in as f64 / (link.in_gbps * 1e6)
        );
    }
    assert_eq!((steady.page_maps, steady.device_waits), (0, 0));
    for f in &runs {
        assert_eq!((f.maps, f.device_waits, f.take_backs), (0, 0, 0), "{f:?}");
    }
}

/// The runtime's choice for the small shape at a third on the H200's run-9 costs with the small
/// persistent tensors pinned (`Policy::pin_below`, the default: a plan without slack that keeps
/// the embedding's AdamW state), fitted for runs that start as steady ones: its steady dry runs
/// and the emulated executor's runs map no page and never wait for the device. (The plan fitted
/// for a clean first run, the runtime's default, is `pool_fidelity_tests`'; since session 16's
/// search, whose best plans fit with less to spare, the two differ.)
#[test]
fn the_pinned_choice_runs_without_page_moves() {
    use super::gpt2_choice_tests::{choose_started, limit_at, on_h200_costs, runtime_knobs};
    let (s, link) = on_h200_costs(SMALL, super::gpt2_choice_tests::SMALL_R9);
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = limit_at(&s, 1.0 / 3.0);
    // Fitted for runs that start as steady ones, as `emulate`'s do (the runtime's tuning with
    // `GKRT_SWAP_RELEASE_CLEAN_START=0`).
    let c = choose_started(&s, limit, link, (true, runtime_knobs()), None, false);
    assert!(c.policy.pin_below > 0 && c.released);
    let (releases, steady, runs) = released_runs(&s, &lv, &c.plan, &c.estimate, limit);
    println!(
        "pinned choice {:.2} ms, {} blocks released; steady {steady:?}; emulated {runs:?}",
        c.estimate.step_ms,
        releases.count()
    );
    assert_eq!((steady.page_maps, steady.device_waits), (0, 0));
    for f in &runs {
        assert_eq!((f.maps, f.device_waits), (0, 0), "{f:?}");
    }
}
