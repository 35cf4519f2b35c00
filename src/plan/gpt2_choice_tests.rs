//! The plan the runtime chooses for the GPT-2 shape on the H200's own measured costs (session 12,
//! run 9, and session 14, run 2: the last timed step of small and medium at a third,
//! `testdata/gpt2_*_third_{r9,s14}_h200.csv`),
//! made as `RuntimeGraph::tune_swap_plan` makes it with release schedules on (the default):
//! finalize's candidates fitted to the pool, fitted again with copy-outs' blocks pending until
//! their copies end (the plain fit kept when none fits so), the timed candidates, the model's
//! choice, the refinement. `cargo test --release --lib gpt2_choice -- --nocapture` prints the
//! model's step against the nodes' sum for each size at a third and a half, and where the chosen
//! plan's time goes by tensor role (copied, rebuilt).

use super::gpt2_shape_tests::{build, pool_for, transient_peak, Config, Step, MEDIUM, SMALL};
use crate::device::StreamId;
use crate::graph::Liveness;
use crate::plan::program::Buf;
use crate::plan::program::Program;
use crate::plan::swap::{Policy, SwapPlan, Timings};
use crate::plan::swap_candidates::{fitted_candidates_with, fitted_timed_candidates_with, Knobs};
use crate::plan::swap_fit::{fits_pool, PoolMisfit};
use crate::plan::swap_model::dirty_at_end;
use crate::plan::swap_model::{choose_feasible, estimate, Estimate, Link};
use crate::plan::swap_placements_tests::{Emulator, RunFigures};
use crate::plan::swap_refine::RefineInput;
use crate::plan::swap_release::{fits_pool_released, released_candidates};
use crate::plan::swap_release::{fits_pool_released_over, SEARCH_STEADY_RUNS, STEADY_RUNS};
use crate::plan::swap_release::{Releases, RELEASE_MARGIN_MS};
use crate::plan::swap_search::search;
use std::collections::BTreeMap;

const ALIGN: u64 = 256;
const S: StreamId = StreamId(0);

pub(super) const SMALL_R9: &str = include_str!("testdata/gpt2_small_third_r9_h200.csv");
pub(super) const MEDIUM_R9: &str = include_str!("testdata/gpt2_medium_third_r9_h200.csv");
/// Session 14's run 2 (the interim with small tensors pinned): the timed run's last step.
pub(super) const SMALL_S14: &str = include_str!("testdata/gpt2_small_third_s14_h200.csv");
pub(super) const MEDIUM_S14: &str = include_str!("testdata/gpt2_medium_third_s14_h200.csv");
/// The stored H200 cost sets, named: (name, shape, timeline).
pub(super) const H200_SETS: [(&str, Config, &str); 4] = [
    ("small, run 9", SMALL, SMALL_R9),
    ("small, session 14", SMALL, SMALL_S14),
    ("medium, run 9", MEDIUM, MEDIUM_R9),
    ("medium, session 14", MEDIUM, MEDIUM_S14),
];

/// The shape of `config` (products recomputable, `--recompute 2`) with the node times of a
/// timeline's last run and the link speeds its copies measured.
pub(super) fn on_h200_costs(config: Config, csv: &str) -> (Step, Link) {
    let mut s = build(Config {
        recompute: 2,
        ..config
    });
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    let last = rows.iter().map(|r| r[0]).max().expect("rows");
    let num = |x: &str| x.parse::<f64>().expect("a number");
    let mut moved = [(0.0, 0.0); 2];
    let mut seen = vec![false; s.nodes.len()];
    for r in rows.iter().filter(|r| r[0] == last) {
        let (a, b) = (num(r[3]), num(r[4]));
        match r[1] {
            "node" => {
                let n = num(r[2]) as usize;
                s.cost_ms[n] = b - a;
                seen[n] = true;
            }
            "in" | "out" => {
                let d = (r[1] == "in") as usize;
                moved[d] = (moved[d].0 + num(r[2]), moved[d].1 + b - a);
            }
            _ => {}
        }
    }
    assert!(seen.iter().all(|&x| x), "the timeline has every node");
    let gbps = |(bytes, ms): (f64, f64)| bytes / (ms * 1e6);
    let link = Link {
        out_gbps: gbps(moved[0]),
        in_gbps: gbps(moved[1]),
    };
    (s, link)
}

/// The plan `tune_swap_plan` ends with, and its estimate.
pub(super) struct Choice {
    pub policy: Policy,
    pub plan: SwapPlan,
    pub estimate: Estimate,
    /// Fitted with blocks pending until their copies end (else the plain fit).
    pub released: bool,
    /// The default policy's plan fitted so.
    pub default_released: bool,
    pub candidates: usize,
    /// The model's choice before the refinement, and its estimate.
    pub unrefined: (SwapPlan, Estimate),
    /// The largest budget a candidate got at finalize (the refinement's most).
    pub available: u64,
}

/// What the runtime chooses at `limit` on `s`'s costs and `link` (see the module's comment).
pub(super) fn choose_as_runtime(s: &Step, limit: u64, link: Link) -> Choice {
    choose_with(s, limit, link, true, runtime_knobs())
}

/// The planner's knobs as the runtime sets them by default on the shape's pool: its page
/// (`crate::plan::test_vmm::PAGE`, as on NVIDIA GPUs) pinned (`GKRT_SWAP_PIN_SMALL`).
pub(super) fn runtime_knobs() -> Knobs {
    Knobs {
        pin_below: crate::plan::test_vmm::PAGE,
        ..Knobs::default()
    }
}

/// `choose_as_runtime` with `GKRT_SWAP_RELEASE_ANY_FIT` set to `any_fit` and the planner's
/// `knobs`.
pub(super) fn choose_with(s: &Step, limit: u64, link: Link, any_fit: bool, knobs: Knobs) -> Choice {
    choose_from(s, limit, link, any_fit, knobs, None)
}

/// `choose_with`, the tuning's refit fitting plans to `tuned` (a pool as the runtime holds it
/// then, and the graph's blocks in it that the dry run gives back first) when given, else to
/// a fresh pool (finalize's fit is on a fresh pool either way).
pub(super) fn choose_from(
    s: &Step,
    limit: u64,
    link: Link,
    any_fit: bool,
    knobs: Knobs,
    tuned: Option<(&crate::memory::pool::Pool, &[u64])>,
) -> Choice {
    // The runtime's first run starts clean after emptying the pool (`Releases::clean_start`),
    // with the kept tensors where the first runs left them otherwise.
    let clean = tuned.is_none_or(|(_, freed)| freed.is_empty());
    choose_started(s, limit, link, (any_fit, knobs), tuned, clean)
}

/// `choose_from` with the released fit's first run starting clean or as a steady run
/// (`clean`), whatever the pool.
pub(super) fn choose_started(
    s: &Step,
    limit: u64,
    link: Link,
    (any_fit, knobs): (bool, Knobs),
    tuned: Option<(&crate::memory::pool::Pool, &[u64])>,
    clean: bool,
) -> Choice {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let pool = pool_for(limit, true);
    let (tpool, freed) = tuned.unwrap_or((&pool, &[]));
    let program = |p: &SwapPlan| Program::compile(&s.tensors, &s.nodes, &lv, Some(p), None);
    let plain = |p: &SwapPlan| fits_pool(&s.tensors, &s.nodes, &program(p), &pool, S, &[]);
    let released_over = |p: &SwapPlan, steady| {
        let rates = (&s.cost_ms[..], link, ALIGN);
        let graph = (&s.tensors[..], &s.nodes[..], &program(p));
        fits_pool_released_over(graph, (tpool, S, freed), rates, clean, steady).map(|_| ())
    };
    let released = |p: &SwapPlan| released_over(p, STEADY_RUNS);
    // Finalize: every policy fitted to the pool.
    let g = (&s.tensors[..], &s.nodes[..], &lv, &[][..]);
    let (_, finalized) = fitted_candidates_with(g, limit, ALIGN, knobs, plain);
    let available = finalized.iter().map(|(_, p)| p.budget).max().unwrap_or(0);
    // The first runs' tuning.
    let (default, refit) = fitted_candidates_with(g, available, ALIGN, knobs, released);
    let default_released = released(&default).is_ok();
    let kept = released_candidates(default_released, refit, any_fit);
    let is_released = kept.is_some();
    let fits: &dyn Fn(&SwapPlan) -> Result<(), PoolMisfit> =
        if is_released { &released } else { &plain };
    let mut cands = kept.unwrap_or(finalized);
    let known: Vec<SwapPlan> = cands.iter().map(|(_, p)| p.clone()).collect();
    let timings = Timings {
        node_ms: &s.cost_ms,
        link,
    };
    let most = known[0].infeasible_nodes.len();
    cands.extend(fitted_timed_candidates_with(
        g, available, ALIGN, timings, knobs, &known, most, fits,
    ));
    let estimates: Vec<Estimate> = cands
        .iter()
        .map(|(_, p)| estimate(&s.tensors, &s.nodes, &program(p), &s.cost_ms, link, ALIGN))
        .collect();
    let infeasible: Vec<usize> = cands
        .iter()
        .map(|(_, p)| p.infeasible_nodes.len())
        .collect();
    let best = choose_feasible(&estimates, &infeasible);
    if std::env::var("GKRT_TEST_CANDIDATES").is_ok() {
        for (i, ((policy, p), e)) in cands.iter().zip(&estimates).enumerate() {
            println!(
                "  candidate {i}{}: {:.2} ms at {:.3} of the limit, infeasible {}, {} recomputes {:?}",
                if i == best { " (chosen)" } else { "" },
                e.step_ms,
                p.budget as f64 / limit as f64,
                p.infeasible_nodes.len(),
                p.recomputes(),
                policy
            );
        }
    }
    let input = RefineInput {
        tensors: &s.tensors,
        nodes: &s.nodes,
        lv: &lv,
        fused: &[],
        align: ALIGN,
        timings,
    };
    let (policy, plan) = &cands[best];
    // As `RuntimeGraph::refine_swap_plan` by default (`GKRT_SWAP_REFINE_SEARCH`).
    let searched = |p: &SwapPlan| match is_released {
        true => released_over(p, SEARCH_STEADY_RUNS),
        false => plain(p),
    };
    let r = search(&input, *policy, plan, &estimates[best], available, searched);
    Choice {
        policy: *policy,
        plan: r.plan,
        estimate: r.estimate,
        released: is_released,
        default_released,
        candidates: cands.len(),
        unrefined: (plan.clone(), estimates[best].clone()),
        available,
    }
}

/// Per role (a tensor's name without its layer: `f`, `p`, `P.m`): tensors copied out, their
/// bytes, tensors rebuilt, the rebuilds' time on `cost`.
pub(super) fn by_role(s: &Step, plan: &SwapPlan) -> BTreeMap<String, (usize, u64, usize, f64)> {
    let role = |t: u32| {
        let name = &s.tensors[t as usize].name;
        match name.split_once('.') {
            Some((_, r)) => format!("{}.{r}", &name[..1]),
            None => "other".to_string(),
        }
    };
    let mut out: BTreeMap<String, (usize, u64, usize, f64)> = BTreeMap::new();
    for ts in &plan.swap_out_after {
        for &t in ts {
            let e = out.entry(role(t)).or_default();
            e.0 += 1;
            e.1 += s.tensors[t as usize].size;
        }
    }
    for ts in &plan.recompute_before {
        for &t in ts {
            let e = out.entry(role(t)).or_default();
            e.2 += 1;
            let producer = s.tensors[t as usize].producer.expect("rebuilt from a node");
            e.3 += s.cost_ms[producer as usize];
        }
    }
    out
}

/// Prints a choice: the step against the nodes' sum, and by role.
pub(super) fn print_choice(what: &str, s: &Step, c: &Choice, limit: u64) {
    let nodes: f64 = s.cost_ms.iter().sum();
    let e = &c.estimate;
    println!(
        "{what}: {:.2} ms = {:.3}x of the nodes' {nodes:.2} ({}; {} candidates; {:?}); planned for {:.3} of the limit; rebuilds {:.2} ms, compute waits {:.2} ms; {:.2} GB out, {:.2} GB in",
        e.step_ms,
        e.step_ms / nodes,
        if c.released { "released fit" } else { "plain fit" },
        c.candidates,
        c.policy,
        c.plan.budget as f64 / limit as f64,
        e.compute_ms - nodes,
        e.compute_waited_ms,
        c.plan.bytes_out as f64 / 1e9,
        c.plan.bytes_in as f64 / 1e9,
    );
    let mut waits: Vec<(usize, f64)> = e.starts.iter().map(|&(_, w)| w).enumerate().collect();
    waits.sort_by(|a, b| b.1.total_cmp(&a.1));
    let waits: Vec<String> = waits
        .iter()
        .take(6)
        .filter(|w| w.1 > 0.05)
        .map(|&(n, w)| format!("{w:.2} ms before node {n}"))
        .collect();
    println!("  largest compute waits: {}", waits.join(", "));
    println!("  {}", roles_line(s, &c.plan));
}

/// `by_role` as one line: per role, tensors copied out (their bytes) and rebuilt (their time).
pub(super) fn roles_line(s: &Step, plan: &SwapPlan) -> String {
    let roles: Vec<String> = by_role(s, plan)
        .into_iter()
        .map(|(r, (o, b, n, ms))| {
            format!(
                "{r} out {o} ({:.0} MB) rebuilt {n} ({ms:.2} ms)",
                b as f64 / 1e6
            )
        })
        .collect();
    roles.join("; ")
}

/// A share of the working set of `s`.
pub(super) fn limit_at(s: &Step, share: f64) -> u64 {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    (share * (s.persistent_bytes() + transient_peak(s, &lv)) as f64) as u64
}

/// The runtime's choice on the H200's costs: at a third, within what the H200 ran (its plain
/// fit's estimate at most), feasible, and every chosen plan released-fitted (`--nocapture` prints
/// the figures).
#[test]
fn the_runtimes_choice_on_the_h200s_costs() {
    for (name, config, csv) in H200_SETS {
        let (s, link) = on_h200_costs(config, csv);
        for (share, label) in [(1.0 / 3.0, "a third"), (0.5, "a half")] {
            let limit = limit_at(&s, share);
            let c = choose_as_runtime(&s, limit, link);
            print_choice(&format!("{name} at {label}"), &s, &c, limit);
            assert!(c.plan.infeasible_nodes.is_empty(), "{name} at {label}");
        }
    }
}

/// The timed planner's plan for `s` under `limit` with `policy`, on the nodes' costs and `link`.
fn plan_at(s: &Step, lv: &Liveness, limit: u64, policy: Policy, link: Link) -> SwapPlan {
    let holds = crate::plan::swap_holds::CommHolds::new(s.tensors.len(), &s.nodes, lv, &[]);
    let timings = Timings {
        node_ms: &s.cost_ms,
        link,
    };
    crate::plan::swap::plan_timed(
        &s.tensors,
        &s.nodes,
        lv,
        &holds,
        limit,
        ALIGN,
        policy,
        Some(timings),
    )
}

/// Rebuilds before node `k` that nothing reads there: not node `k`, no other rebuild there, no
/// node at or after `k`.
fn dead_links(s: &Step, lv: &Liveness, plan: &SwapPlan) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for (k, at) in plan.recompute_before.iter().enumerate() {
        for &x in at {
            let read_by_rebuild = at.iter().any(|&w| {
                let p = s.tensors[w as usize].producer.expect("rebuilt");
                s.nodes[p as usize].inputs.contains(&x)
            });
            let used_later = lv.last_use[x as usize].is_some_and(|l| l as usize >= k);
            if !s.nodes[k].inputs.contains(&x) && !read_by_rebuild && !used_later {
                out.push((k, x));
            }
        }
    }
    out
}

/// The small shape at a third, every policy's plan: with `prune_moved_links` no rebuild is
/// dead; without it (the planner before), every layer's attention scores are rebuilt a second
/// time under the softmax output moved to the attention output's rebuild, read by nothing.
#[test]
fn pruned_plans_rebuild_nothing_that_no_node_reads() {
    let (s, link) = on_h200_costs(SMALL, SMALL_R9);
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = limit_at(&s, 1.0 / 3.0);
    let mut dead_before = 0;
    for keep_last_writes in [false, true] {
        for prune_moved_links in [false, true] {
            let policy = Policy {
                keep_last_writes,
                prune_moved_links,
                ..Policy::default()
            };
            let plan = plan_at(&s, &lv, limit, policy, link);
            let dead = dead_links(&s, &lv, &plan);
            if prune_moved_links {
                assert!(dead.is_empty(), "{dead:?}");
            } else {
                let scores = dead
                    .iter()
                    .filter(|&&(_, x)| s.tensors[x as usize].name.ends_with(".sc"))
                    .count();
                assert_eq!(scores, dead.len(), "only scores are left dead: {dead:?}");
                dead_before += dead.len();
            }
        }
    }
    assert!(
        dead_before >= 12,
        "the old planner's dead scores: {dead_before}"
    );
}

/// What kept small at a third over 1.15 on the model (ARCHITECTURE.md, "What kept small at a
/// third over 1.15"): without the small persistent tensors pinned (`Policy::pin_below` 0, the
/// planner before session 14) the runtime's released choice keeps a logits' worth of slack and
/// is over 1.15x of the nodes, and the plan without slack that keeps the embedding's AdamW
/// state fails the release schedule's dry run; with the pool's page pinned (the runtime's
/// default) the released choice keeps no slack and is under 1.12x, with under a millisecond of
/// compute waits (the embedding's round trip at the logits' gradient gone).
#[test]
fn pinning_the_small_tensors_lets_a_plan_without_slack_fit_released() {
    let (s, link) = on_h200_costs(SMALL, SMALL_R9);
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = limit_at(&s, 1.0 / 3.0);
    let nodes: f64 = s.cost_ms.iter().sum();
    let policy = Policy {
        keep_last_writes: true,
        ..Policy::default()
    };
    let plan = plan_at(&s, &lv, limit, policy, link);
    assert!(plan.infeasible_nodes.is_empty());
    let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(&plan), None);
    let e = estimate(&s.tensors, &s.nodes, &program, &s.cost_ms, link, ALIGN);
    let before = choose_with(&s, limit, link, true, Knobs::default());
    let after = choose_as_runtime(&s, limit, link);
    println!(
        "no slack, nothing pinned: {:.2} ms = {:.3}x of the nodes; the released choice {:.2} ms = {:.3}x unpinned ({:?}), {:.2} ms = {:.3}x pinned ({:?}, compute waits {:.2} ms)",
        e.step_ms,
        e.step_ms / nodes,
        before.estimate.step_ms,
        before.estimate.step_ms / nodes,
        before.policy,
        after.estimate.step_ms,
        after.estimate.step_ms / nodes,
        after.policy,
        after.estimate.compute_waited_ms
    );
    let pool = pool_for(limit, true);
    let rates = (&s.cost_ms[..], link, ALIGN);
    let fit = fits_pool_released(&s.tensors, &s.nodes, &program, &pool, S, &[], rates, true);
    assert!(
        fit.is_err(),
        "the unpinned plan without slack fits released"
    );
    assert!(before.released && before.estimate.step_ms > 1.15 * nodes);
    assert!(before.policy.slack_tensors > 0);
    assert!(after.released && after.plan.infeasible_nodes.is_empty());
    assert_eq!(after.policy.slack_tensors, 0);
    assert!(after.estimate.step_ms < 1.12 * nodes);
    assert!(after.estimate.compute_waited_ms < 1.0);
    let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(&after.plan), None);
    let fit = fits_pool_released(&s.tensors, &s.nodes, &program, &pool, S, &[], rates, true);
    assert!(fit.is_ok(), "the pinned choice fits released");
}

/// The release schedule's refit when the default policy's plan does not fit with copy-outs'
/// blocks pending (`released_candidates`, `GKRT_SWAP_RELEASE_ANY_FIT`): over shares of the small
/// shape's working set around a third, wherever the default's plan fails the pending-aware fit
/// within `fitted`'s rounds (it fits only below 0.85 of the limit, where the logits' gradient is
/// infeasible) while other policies' plans fit, the runtime's choice is still a released plan
/// that passes the pending-aware fit; without the rule it falls back to the plain fit, whose
/// runs move pages (the H200: 411 maps and 3 device waits a step).
#[test]
fn a_released_plan_is_kept_when_the_default_policys_does_not_fit() {
    let (s, link) = on_h200_costs(SMALL, SMALL_R9);
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let mut exercised = 0;
    for k in 0..14 {
        let share = 0.28 + 0.01 * k as f64;
        let limit = limit_at(&s, share);
        let with = choose_with(&s, limit, link, true, runtime_knobs());
        if with.default_released {
            continue;
        }
        exercised += 1;
        let without = choose_with(&s, limit, link, false, runtime_knobs());
        println!(
            "at {share:.2} of the working set the default policy's plan does not fit released; the choice: {:.2} ms released ({:?}), {:.2} ms on the plain fit without the rule",
            with.estimate.step_ms, with.policy, without.estimate.step_ms
        );
        assert!(with.released && !without.released, "at {share:.2}");
        let pool = pool_for(limit, true);
        let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(&with.plan), None);
        let rates = (&s.cost_ms[..], link, ALIGN);
        let fit = fits_pool_released(&s.tensors, &s.nodes, &program, &pool, S, &[], rates, true);
        assert!(fit.is_ok(), "at {share:.2}");
        assert!(with.plan.infeasible_nodes.is_empty(), "at {share:.2}");
    }
    assert!(exercised > 0, "no share where the default's plan fails");
}

/// The pool as the first runs leave it (`TUNING_RUNS`, 2): the emulated executor's runs of the
/// default plan of finalize (fitted with blocks free at once, its copy-outs' blocks pending
/// until taken, as those runs have no release schedule) from the plan's canonical start, every
/// copy done; with the graph's blocks, by buffer.
fn first_runs_pool(s: &Step, limit: u64) -> (crate::memory::pool::Pool, Emulated) {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let pool = pool_for(limit, true);
    let program = |p: &SwapPlan| Program::compile(&s.tensors, &s.nodes, &lv, Some(p), None);
    let plain = |p: &SwapPlan| fits_pool(&s.tensors, &s.nodes, &program(p), &pool, S, &[]);
    let g = (&s.tensors[..], &s.nodes[..], &lv, &[][..]);
    let (default, _) = fitted_candidates_with(g, limit, ALIGN, runtime_knobs(), plain);
    let program = program(&default);
    let mut emu = Emulator::new(s, &program, Default::default(), pool_for(limit, true), None);
    emu.place_kept();
    let runs = [emu.run(None), emu.run(None)];
    assert!(runs.iter().all(|r| r.maps > 0), "the first runs move pages");
    (emu.pool, emu.live)
}

type Emulated = std::collections::HashMap<Buf, u64>;

/// The emulated executor's runs 1–4 of `plan` with its release schedule, from `pool` holding
/// the graph's blocks `live`: the executor's start sends home the tensors the plan does not
/// keep and the others stay where they are; the kept tensors not on the device come in, in
/// the plan's order. With none live (the pool emptied: `Executor::bring_kept`) every tensor
/// starts clean, as the schedule's dry run then assumes (`Releases::clean_start`).
fn runs_from(
    s: &Step,
    plan: &SwapPlan,
    link: Link,
    pool: crate::memory::pool::Pool,
    mut live: Emulated,
) -> Vec<RunFigures> {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(plan), None);
    let e = estimate(&s.tensors, &s.nodes, &program, &s.cost_ms, link, ALIGN);
    let releases = Releases::from_estimate(&program, &e, RELEASE_MARGIN_MS);
    let end = dirty_at_end(s.tensors.len(), &s.nodes, &program);
    let from_host = live.is_empty();
    let mut emu = Emulator::new(s, &program, Default::default(), pool, Some(&releases));
    emu.newer = (0..s.tensors.len()).map(|t| end[t] && !from_host).collect();
    emu.lenient = from_host;
    live.retain(|b, a| {
        let kept = matches!(b, Buf::Tensor(t) if program.keep.binary_search(t).is_ok());
        if !kept {
            emu.pool.free(&emu.dev, *a).expect("ours");
        }
        kept
    });
    emu.live = live;
    emu.place_kept();
    (0..4).map(|_| emu.run(None)).collect()
}

/// What made the H200's small at a third 1.22 (session 14, run 2: the runtime estimated 98.7 ms
/// with 8 ms of compute waits where this module's choice was 93.9 ms with 0.2): the refit fits
/// the candidates with the pool's dry run from the pool as the first runs left it, their blocks
/// given back, and there the kept blocks of the first runs' plan lie where its page moves left
/// them. On both cost sets the choice from that pool is a plan at under 0.8 of the limit, 3%
/// slower than the fresh pool's on the model (over 1.14 of the nodes: its compute waits for
/// copies at the logits and in every backward layer). On run 9's costs the plan the choice
/// from a fresh pool makes maps pages there in every run or fails; on session 14's it maps
/// none after its first run since chunks are a 64th of the heap (session 40; at a 32nd it
/// mapped pages in every run). With the graph's tensors sent home and the pool's free pages
/// given back before the refit (`GKRT_SWAP_TUNE_EMPTY`), the choice is the fresh pool's (under
/// 1.12), and its runs from that pool, the kept tensors brought in in the plan's order, map no
/// page once the first has placed them.
#[test]
fn emptying_the_pool_before_the_refit_gives_the_fresh_pools_choice() {
    for (name, csv, maps_there) in [("run 9", SMALL_R9, true), ("session 14", SMALL_S14, false)] {
        let (s, link) = on_h200_costs(SMALL, csv);
        // As `--limit-frac 0.333` sets it.
        let limit = limit_at(&s, 0.333);
        let nodes: f64 = s.cost_ms.iter().sum();
        let fresh = choose_as_runtime(&s, limit, link);
        let (pool, live) = first_runs_pool(&s, limit);
        let freed: Vec<u64> = live.values().copied().collect();
        let around = choose_from(
            &s,
            limit,
            link,
            true,
            runtime_knobs(),
            Some((&pool, &freed)),
        );
        print_choice(
            &format!("{name}, around the first runs' blocks"),
            &s,
            &around,
            limit,
        );
        // (Over 1.15x with the greedy refinement; 1.146x searched, against 1.095x.)
        assert!(
            around.released && around.estimate.step_ms > 1.03 * fresh.estimate.step_ms,
            "{name}"
        );
        assert!(around.plan.budget < fresh.plan.budget, "{name}");
        let steady_maps = |runs: &[RunFigures]| runs[1..].iter().map(|r| r.maps).sum::<u64>();
        let fresh_there = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runs_from(&s, &fresh.plan, link, pool.clone(), live.clone())
        }));
        println!("  the fresh pool's plan from there: {fresh_there:?}");
        assert_eq!(
            fresh_there.map_or(true, |r| steady_maps(&r) > 0),
            maps_there,
            "{name}"
        );
        // Everything home, the free pages given back.
        let (mut pool, dev) = (pool, crate::plan::test_vmm::Device::default());
        for &a in &freed {
            pool.free(&dev, a).expect("ours");
        }
        pool.release_cached(&dev).expect("released");
        let emptied = choose_from(&s, limit, link, true, runtime_knobs(), Some((&pool, &[])));
        print_choice(&format!("{name}, the pool emptied"), &s, &emptied, limit);
        assert_eq!(emptied.plan, fresh.plan, "{name}");
        assert!(
            emptied.released && emptied.estimate.step_ms < 1.12 * nodes,
            "{name}"
        );
        let runs = runs_from(&s, &emptied.plan, link, pool, Emulated::new());
        println!("  its runs: {runs:?}");
        assert_eq!(steady_maps(&runs), 0, "{name}");
        assert!(runs[1..].iter().all(|r| r.device_waits == 0), "{name}");
    }
}
