//! `swap_refine`'s unit tests (a child module of it, kept in its own file): on a constructed
//! graph a dear rebuild becomes a copy and the estimate drops; a refinement whose plans the pool
//! rejects keeps the plan it was given; every plan it returns fits.

use super::*;
use crate::device::StreamId;
use crate::memory::pool::{Pool, PoolConfig};
use crate::plan::swap::{plan_swaps, Link};
use crate::plan::swap_fit::fits_pool;
use crate::plan::test_graph::{G, MB};

/// 1 GB/s each way: a MB moves in a millisecond.
const SLOW: Link = Link {
    in_gbps: 1.0,
    out_gbps: 1.0,
};

/// What `refine` reads of `g`, with `cost` per node and the slow link.
fn input<'a>(g: &'a G, lv: &'a Liveness, cost: &'a [f64]) -> RefineInput<'a> {
    RefineInput {
        tensors: &g.tensors,
        nodes: &g.nodes,
        lv,
        fused: &[],
        align: 1,
        timings: Timings {
            node_ms: cost,
            link: SLOW,
        },
    }
}

/// `a` (1 MB) is written from `x` by a recomputable node that takes 10 ms, then read with `x`
/// again at the end,
/// past two 1 ms nodes that need its room: rebuilding it costs 10 ms of compute, copying it
/// out and back 1 ms each way beside those nodes.
fn dear_rebuild() -> (G, Vec<f64>, u32) {
    let mut g = G::default();
    let x = g.tensor(1, TensorKind::Input);
    let a = g.tensor(1, TensorKind::Intermediate);
    let big = g.tensor(6, TensorKind::Intermediate);
    let b = g.tensor(1, TensorKind::Intermediate);
    let out = g.tensor(1, TensorKind::Output);
    g.node(&[x], a, true); // 10 ms
    g.node(&[x], big, false);
    g.node(&[big], b, false);
    g.node(&[a, b, x], out, false);
    (g, vec![10.0, 1.0, 1.0, 1.0], a)
}

fn pool(limit: u64) -> Pool {
    // As the runtime makes it under a memory limit.
    Pool::new(
        PoolConfig {
            alignment: 1,
            memory_limit: limit,
            ..PoolConfig::default()
        }
        .for_swapping(),
    )
}

fn fits_in<'a>(
    g: &'a G,
    lv: &'a Liveness,
    pool: &'a Pool,
) -> impl Fn(&SwapPlan) -> Result<(), PoolMisfit> + 'a {
    move |plan: &SwapPlan| {
        let program = Program::compile(&g.tensors, &g.nodes, lv, Some(plan), None);
        fits_pool(&g.tensors, &g.nodes, &program, pool, StreamId(0), &[])
    }
}

#[test]
fn a_dear_rebuild_becomes_a_copy_when_the_model_says_so() {
    let (g, cost, a) = dear_rebuild();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let budget = 7 * MB;
    let plan = plan_swaps(&g.tensors, &g.nodes, &lv, budget, 1);
    assert!(
        plan.drop_after.iter().flatten().any(|&t| t == a),
        "{plan:?}"
    );
    let input = input(&g, &lv, &cost);
    let base = estimate_plan(&input, &plan);
    // (Room over the budget: the copy-out's block is pending while node 1 allocates, and a
    // dry run that would wait for the device does not fit.)
    let pool = pool(2 * budget);
    let fits = fits_in(&g, &lv, &pool);
    let copy = |p: &SwapPlan| p.swap_out_after.iter().flatten().any(|&t| t == a);
    let r = refine(&input, Policy::default(), &plan, &base, &fits);
    assert!(r.kept >= 1 && r.tried >= r.kept, "{r:?}");
    assert_eq!(r.plan.recomputes(), 0, "{:?}", r.plan);
    assert!(copy(&r.plan) && !copy(&plan));
    assert!(r.plan.infeasible_nodes.is_empty());
    assert!(fits(&r.plan).is_ok());
    // The rebuild's 10 ms are gone; the copies hide behind the 1 ms nodes but for a wait.
    assert!(
        r.estimate.step_ms < base.step_ms - 5.0,
        "{r:?} from {base:?}"
    );
    assert_eq!(r.estimate.step_ms, estimate_plan(&input, &r.plan).step_ms);

    // With the nodes cheap against the link, the rebuild stays.
    let cheap: Vec<f64> = vec![0.01; cost.len()];
    let input = RefineInput {
        timings: Timings {
            node_ms: &cheap,
            link: SLOW,
        },
        ..input
    };
    let base = estimate_plan(&input, &plan);
    let r = refine(&input, Policy::default(), &plan, &base, &fits);
    assert_eq!((r.kept, &r.plan), (0, &plan));
}

/// A refinement whose every plan the pool's dry run rejects returns the plan it was given.
#[test]
fn plans_the_pool_rejects_are_never_taken() {
    let (g, cost, _) = dear_rebuild();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let plan = plan_swaps(&g.tensors, &g.nodes, &lv, 7 * MB, 1);
    let input = input(&g, &lv, &cost);
    let base = estimate_plan(&input, &plan);
    let rejected = std::cell::Cell::new(0);
    let r = refine(&input, Policy::default(), &plan, &base, |_: &SwapPlan| {
        rejected.set(rejected.get() + 1);
        Err(PoolMisfit::Fails { node: 0 })
    });
    assert!(rejected.get() >= 1, "no plan was checked");
    assert_eq!(r.kept, 0);
    assert_eq!(r.plan, plan);
    assert_eq!(r.estimate.step_ms, base.step_ms);
}

/// Overrides that change nothing give the policy's own plan.
#[test]
fn no_overrides_give_the_policys_plan() {
    let (g, cost, _) = dear_rebuild();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let holds = CommHolds::new(g.tensors.len(), &g.nodes, &lv, &[]);
    let timings = Timings {
        node_ms: &cost,
        link: SLOW,
    };
    for policy in [
        Policy::default(),
        Policy {
            recompute_cap_pct: 6,
            ..Policy::default()
        },
    ] {
        let plain = crate::plan::swap::plan_timed(
            &g.tensors,
            &g.nodes,
            &lv,
            &holds,
            7 * MB,
            1,
            policy,
            Some(timings),
        );
        let victims = vec![Victim::Policy; g.tensors.len()];
        let overrides = Overrides {
            victims: &victims,
            slack: None,
            held: &[],
        };
        let masked = plan_masked(
            &g.tensors,
            &g.nodes,
            &lv,
            &holds,
            7 * MB,
            1,
            policy,
            Some(timings),
            overrides,
        );
        assert_eq!(plain, masked);
    }
    // A capped policy copies the dear victim; `Victim::Rebuild` rebuilds it all the same.
    let capped = Policy {
        recompute_cap_pct: 6,
        ..Policy::default()
    };
    let mut victims = vec![Victim::Policy; g.tensors.len()];
    let copied = plan_masked(
        &g.tensors,
        &g.nodes,
        &lv,
        &holds,
        7 * MB,
        1,
        capped,
        Some(timings),
        Overrides::default(),
    );
    assert_eq!(copied.recomputes(), 0, "{copied:?}");
    victims[1] = Victim::Rebuild;
    let rebuilt = plan_masked(
        &g.tensors,
        &g.nodes,
        &lv,
        &holds,
        7 * MB,
        1,
        capped,
        Some(timings),
        Overrides {
            victims: &victims,
            slack: None,
            held: &[],
        },
    );
    assert_eq!(rebuilt.recomputes(), 1, "{rebuilt:?}");
}

/// Of two refinements the shorter estimate is kept (the first on a tie), with both searches'
/// plans counted: the runtime keeps the better of the search and the greedy refinement.
#[test]
fn the_shorter_of_two_refinements_is_kept() {
    let made = |ms: f64, tried: usize, budget: u64| Refined {
        plan: SwapPlan {
            budget,
            ..SwapPlan::default()
        },
        estimate: Estimate {
            step_ms: ms,
            ..Estimate::default()
        },
        tried,
        kept: 1,
    };
    let r = made(10.0, 3, 1).shorter(made(9.5, 4, 2));
    assert_eq!((r.plan.budget, r.tried), (2, 7));
    let r = made(9.0, 3, 1).shorter(made(9.5, 4, 2));
    assert_eq!((r.plan.budget, r.tried), (1, 7));
    let r = made(9.0, 1, 1).shorter(made(9.0, 1, 2));
    assert_eq!(r.plan.budget, 1, "a tie keeps the first");
}
