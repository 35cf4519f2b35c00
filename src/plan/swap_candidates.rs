//! The swap plans the runtime chooses among: one per setting of `swap::Policy`'s knobs, each for
//! the largest budget the pool's dry run accepts (`fitted_candidates_with`, at finalize), and once the
//! first runs have been timed, plans that weigh each rebuild against its copies on those timings
//! (`fitted_timed_candidates_with`). The timeline model (`swap_model`) ranks them.

use crate::graph::{FusedGroup, Liveness, Node, Tensor};
use crate::plan::swap::{plan_timed, Policy, SwapPlan, Timings};
use crate::plan::swap_fit::PoolMisfit;
use crate::plan::swap_holds::CommHolds;

/// How many times a policy's budget is lowered (by a sixteenth each time) before the policy is
/// given up, and how many times the gap between the budget that fit and the one that failed is
/// then halved: a sixteenth of a third of GPT-2's working set is 140 MB.
const FIT_ROUNDS: usize = 8;
const FIT_BISECTIONS: usize = 3;

/// The caps (`Policy::recompute_cap_pct`) the timed candidates try. On the GPT-2 shape's model
/// (`gpt2_shape_tests`) the medium size at a third of its working set was best at 6%: its
/// fully connected layer's output (64 MiB) is then copied, not rebuilt by a product.
const RECOMPUTE_CAPS_PCT: [u32; 2] = [6, 25];

/// What the runtime's knobs choose of the candidates (`GKRT_SWAP_PRUNE_LINKS`); the default is
/// the planner's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Every candidate's `Policy::prune_moved_links`.
    pub prune_moved_links: bool,
    /// Every candidate's `Policy::pin_below`: the pool's page where it has one and
    /// `GKRT_SWAP_PIN_SMALL` is on, else 0.
    pub pin_below: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            prune_moved_links: true,
            pin_below: 0,
        }
    }
}

/// `policy`'s plan for about the largest budget up to `available` that `fits` accepts (the
/// runtime's dry run of the pool, `swap_fit::fits_pool`, which fails a plan where fragmentation
/// leaves no block its bytes would fit or where the pool would wait for the device), and whether
/// one did (if not, the last plan tried).
#[allow(clippy::too_many_arguments)]
fn fitted(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    holds: &CommHolds,
    available: u64,
    align: u64,
    policy: Policy,
    timings: Option<Timings>,
    fits: &dyn Fn(&SwapPlan) -> Result<(), PoolMisfit>,
) -> (SwapPlan, bool) {
    let plan = |budget: u64| plan_timed(tensors, nodes, lv, holds, budget, align, policy, timings);
    let try_fit = |plan: &SwapPlan| match fits(plan) {
        Ok(()) => true,
        Err(misfit) => {
            log::debug!("swap plan {policy:?} for {} bytes {misfit}", plan.budget);
            false
        }
    };
    // Down by sixteenths to a budget that fits, then bisect towards the lowest that failed.
    let (mut budget, mut failed) = (available, available);
    let mut best = plan(budget);
    let mut rounds = 0;
    while !try_fit(&best) {
        rounds += 1;
        if rounds > FIT_ROUNDS {
            return (best, false);
        }
        failed = budget;
        budget -= budget / 16;
        best = plan(budget);
    }
    for _ in 0..if rounds > 0 { FIT_BISECTIONS } else { 0 } {
        let mid = budget + (failed - budget) / 2;
        let p = plan(mid);
        if try_fit(&p) {
            budget = mid;
            best = p;
        } else {
            failed = mid;
        }
    }
    (best, true)
}

/// The plans of every policy (`policies`, with the runtime's `knobs`), each fitted on its own
/// to the pool (`fitted`): a budget lowered for the default plan would take the better plans
/// out of the choice (on GPT-2's step at a third of its working set, the lingering plan the
/// model ranks first). Returns the default policy's plan (the last one tried if none fit) and
/// the distinct plans that fit, the default first, none with more infeasible nodes than it.
pub fn fitted_candidates_with(
    (tensors, nodes, lv, fused): (&[Tensor], &[Node], &Liveness, &[FusedGroup]),
    available: u64,
    align: u64,
    knobs: Knobs,
    fits: impl Fn(&SwapPlan) -> Result<(), PoolMisfit>,
) -> (SwapPlan, Vec<(Policy, SwapPlan)>) {
    let holds = CommHolds::new(tensors.len(), nodes, lv, fused);
    let fit = |policy| {
        fitted(
            tensors, nodes, lv, &holds, available, align, policy, None, &fits,
        )
    };
    let all = policies(knobs);
    let (default, _) = fit(all[0]);
    let mut out = vec![(all[0], default.clone())];
    for policy in all.into_iter().skip(1) {
        let (plan, ok) = fit(policy);
        if ok
            && plan.infeasible_nodes.len() <= default.infeasible_nodes.len()
            && !out.iter().any(|(_, p)| *p == plan)
        {
            out.push((policy, plan));
        }
    }
    (default, out)
}

/// The plans that weigh each rebuild against its copies on a timed run's figures: every cap
/// of `RECOMPUTE_CAPS_PCT` with every setting of the other knobs (the runtime's `knobs`),
/// fitted to the pool, distinct from each other and from `known`, with no more infeasible nodes
/// than `most_infeasible`.
#[allow(clippy::too_many_arguments)]
pub fn fitted_timed_candidates_with(
    (tensors, nodes, lv, fused): (&[Tensor], &[Node], &Liveness, &[FusedGroup]),
    available: u64,
    align: u64,
    timings: Timings,
    knobs: Knobs,
    known: &[SwapPlan],
    most_infeasible: usize,
    fits: impl Fn(&SwapPlan) -> Result<(), PoolMisfit>,
) -> Vec<(Policy, SwapPlan)> {
    let holds = CommHolds::new(tensors.len(), nodes, lv, fused);
    let mut out: Vec<(Policy, SwapPlan)> = Vec::new();
    for recompute_cap_pct in RECOMPUTE_CAPS_PCT {
        for policy in policies(knobs).into_iter().filter(|p| p.recompute) {
            let policy = Policy {
                recompute_cap_pct,
                ..policy
            };
            let (plan, ok) = fitted(
                tensors,
                nodes,
                lv,
                &holds,
                available,
                align,
                policy,
                Some(timings),
                &fits,
            );
            if ok
                && plan.infeasible_nodes.len() <= most_infeasible
                && !known.contains(&plan)
                && !out.iter().any(|(_, p)| *p == plan)
            {
                out.push((policy, plan));
            }
        }
    }
    out
}

/// Every setting of the policy's knobs that needs no timing, the default first, with the
/// runtime's `knobs`.
fn policies(knobs: Knobs) -> Vec<Policy> {
    let mut out = Vec::new();
    let settings = [(false, false), (false, true), (true, false)];
    let default = Policy {
        prune_moved_links: knobs.prune_moved_links,
        pin_below: knobs.pin_below,
        ..Policy::default()
    };
    for recompute in [default.recompute, !default.recompute] {
        for (linger, kept_wait) in settings {
            for slack_tensors in [0, 1, 2] {
                for keep_last_writes in [false, true] {
                    out.push(Policy {
                        linger,
                        slack_tensors,
                        kept_wait,
                        recompute,
                        keep_last_writes,
                        ..default
                    });
                }
            }
        }
    }
    out
}

/// The plans of every policy for `budget` (a graph whose collectives have fused groups
/// `fused`), the default first, distinct ones only (no dry run).
#[cfg(test)]
pub fn candidates(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    fused: &[FusedGroup],
    budget: u64,
    align: u64,
) -> Vec<(Policy, SwapPlan)> {
    let holds = CommHolds::new(tensors.len(), nodes, lv, fused);
    let mut out: Vec<(Policy, SwapPlan)> = Vec::new();
    for policy in policies(Knobs::default()) {
        let plan = plan_timed(tensors, nodes, lv, &holds, budget, align, policy, None);
        if !out.iter().any(|(_, p)| *p == plan) {
            out.push((policy, plan));
        }
    }
    out
}
