//! The GPT-2 shape's judge of the refinement (`swap_refine`): at a third of the working set, the
//! plan finalize and the timed candidates choose (`gpt2_shape_tests::finalize_at`), then refined
//! on the shape's node costs as `RuntimeGraph::tune_swap_plan` does; `--nocapture` prints, per
//! size, the estimate before and after, the rebuilds' time, the bytes each way and how long the
//! refinement took.

use crate::device::StreamId;
use crate::graph::Liveness;
use crate::plan::gpt2_shape_tests::*;
use crate::plan::program::Program;
use crate::plan::swap::{SwapPlan, Timings};
use crate::plan::swap_fit::fits_pool;
use crate::plan::swap_model::Estimate;
use crate::plan::swap_refine::{refine, RefineInput};

const ALIGN: u64 = 256;

/// Before/after on the shape's costs, planning time on this (shared, 2-core) machine: small
/// 1.160x, refinement none kept; medium 1.089x refined to 1.084x. Dropping the idle score
/// rebuilds too (session 11: small 1.142x on the shape) measured slower on the H200, so the
/// planner keeps them (`swap_sim.rs`) and the bounds below are today's figures.
#[test]
fn the_refinement_at_a_third_of_the_gpt2_shapes() {
    for (name, config, most) in [("small", SMALL, 1.17), ("medium", MEDIUM, 1.09)] {
        let s = build(Config {
            recompute: 2,
            ..config
        });
        let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
        let limit = (0.333 * (s.persistent_bytes() + transient_peak(&s, &lv)) as f64) as u64;
        let (all, best, policies) = finalize_at(&s, limit, true, true, true, true);
        let (plan, e) = &all[best];
        let nodes: f64 = s.cost_ms.iter().sum();
        let pool = pool_for(limit, true);
        let fits = |p: &SwapPlan| {
            let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(p), None);
            fits_pool(&s.tensors, &s.nodes, &program, &pool, StreamId(0), &[])
        };
        let input = RefineInput {
            tensors: &s.tensors,
            nodes: &s.nodes,
            lv: &lv,
            fused: &[],
            align: ALIGN,
            timings: Timings {
                node_ms: &s.cost_ms,
                link: LINK,
            },
        };
        let started = std::time::Instant::now();
        let r = refine(&input, policies[best], plan, e, fits);
        let took = started.elapsed().as_secs_f64() * 1e3;
        let line = |what: &str, p: &SwapPlan, e: &Estimate| {
            println!(
                "{name} {what}: {:.2} ms = {:.3}x of the nodes' {nodes:.2} (rebuilds {:.2} ms, compute waits {:.2}), {} recomputes, {:.2} GB in, {:.2} GB out",
                e.step_ms,
                e.step_ms / nodes,
                e.compute_ms - nodes,
                e.compute_waited_ms,
                p.recomputes(),
                p.bytes_in as f64 / 1e9,
                p.bytes_out as f64 / 1e9
            );
        };
        line(&format!("chosen {:?}", policies[best]), plan, e);
        line(
            &format!(
                "refined in {took:.0} ms ({} plans, {} kept)",
                r.tried, r.kept
            ),
            &r.plan,
            &r.estimate,
        );
        assert!(r.estimate.step_ms <= e.step_ms);
        assert!(r.plan.infeasible_nodes.is_empty());
        assert!(fits(&r.plan).is_ok());
        assert!(
            r.estimate.step_ms <= most * nodes,
            "{name}: {:.3}x",
            r.estimate.step_ms / nodes
        );
    }
}

/// The same on the H200 run's measured node times and link speeds (session 10's small shape at
/// a third, `testdata/gpt2_small_third_r2_h200.csv`'s last run): the estimate of the plan gkrt
/// would choose there, before and after the refinement, against that run's 82.2 ms unconstrained
/// step (`--nocapture` prints them).
#[test]
fn the_refinement_on_the_h200_small_runs_costs() {
    let (s, link) = crate::plan::gpt2_choice_tests::on_h200_costs(
        SMALL,
        include_str!("testdata/gpt2_small_third_r2_h200.csv"),
    );
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = (0.333 * (s.persistent_bytes() + transient_peak(&s, &lv)) as f64) as u64;
    let (all, best, policies) = finalize_at(&s, limit, true, true, true, true);
    let (plan, _) = &all[best];
    let pool = pool_for(limit, true);
    let fits = |p: &SwapPlan| {
        let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(p), None);
        fits_pool(&s.tensors, &s.nodes, &program, &pool, StreamId(0), &[])
    };
    let input = RefineInput {
        tensors: &s.tensors,
        nodes: &s.nodes,
        lv: &lv,
        fused: &[],
        align: ALIGN,
        timings: Timings {
            node_ms: &s.cost_ms,
            link,
        },
    };
    let base = crate::plan::swap_refine::estimate_plan(&input, plan);
    let r = refine(&input, policies[best], plan, &base, fits);
    let nodes: f64 = s.cost_ms.iter().sum();
    for (what, e) in [("chosen", &base), ("refined", &r.estimate)] {
        println!(
            "H200 small costs, {what}: {:.2} ms = {:.3}x of the unconstrained 82.2 ms (nodes {nodes:.2}, rebuilds {:.2}, compute waits {:.2}); {} plans tried, {} kept",
            e.step_ms,
            e.step_ms / 82.155,
            e.compute_ms - nodes,
            e.compute_waited_ms,
            r.tried,
            r.kept
        );
    }
    assert!(r.estimate.step_ms <= base.step_ms);
    assert!(fits(&r.plan).is_ok() && r.plan.infeasible_nodes.is_empty());
}
