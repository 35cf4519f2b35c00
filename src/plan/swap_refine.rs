//! Refining the chosen swap plan on a timed run's figures. The policies (`swap::Policy`) decide
//! rebuild-or-copy for every victim by one rule and keep one slack for the whole step, but
//! whether a rebuild pays depends on where the links idle and where memory is short, which only
//! the timeline model (`swap_model`) sees. So after the choice the plan is changed one move at a
//! time, each move a new plan from the planner (`swap::plan_masked`): a group of the plan's
//! rebuilt victims copied instead, a group of its copied ones rebuilt instead (where the
//! rematerialisation rule can), or another slack. A group is the tensors of one size made by
//! producers reading inputs of the same sizes (a network's layers repeat); whole groups are
//! tried first, then their earlier and later halves in node order (the links and the memory
//! left differ along a step). A move stays when the model's estimate drops by `MIN_GAIN` and
//! the pool's dry run (`fits`) accepts the plan, with no more infeasible nodes than before.
//! At most `MAX_TRIES` plans are made, whatever the graph.

use crate::graph::liveness::round_up;
use crate::graph::{FusedGroup, Liveness, Node, Tensor, TensorKind};
use crate::plan::program::Program;
use crate::plan::swap::{plan_masked, Overrides, Policy, SwapPlan, Timings, Victim};
use crate::plan::swap_fit::PoolMisfit;
use crate::plan::swap_holds::CommHolds;
use crate::plan::swap_model::{estimate, Estimate};

/// Most plans one refinement makes, estimates and fits (a few milliseconds each on a graph of
/// a thousand nodes).
const MAX_TRIES: usize = 64;

/// A move must shorten the estimated step by this fraction to stay: the model is coarse, and a
/// change it barely prefers is noise.
const MIN_GAIN: f64 = 0.002;

/// The slacks tried, as fractions (1/n) of the budget: room kept free for copy-outs in flight
/// finer than the policies' unit (the largest tensor, which may be most of the budget).
const SLACK_DIVISORS: [u64; 3] = [64, 32, 16];

/// What a refinement did: the plan (the one given when nothing helped), its estimate, and how
/// many plans it made and kept.
#[derive(Clone, Debug)]
pub struct Refined {
    pub plan: SwapPlan,
    pub estimate: Estimate,
    pub tried: usize,
    pub kept: usize,
}

impl Refined {
    /// Of two refinements of one plan, the one with the shorter estimated step (`self` on a
    /// tie), counting the plans both tried.
    pub fn shorter(self, other: Refined) -> Refined {
        let tried = self.tried + other.tried;
        let best = if other.estimate.step_ms < self.estimate.step_ms {
            other
        } else {
            self
        };
        Refined { tried, ..best }
    }
}

/// The graph and figures a refinement plans with.
pub struct RefineInput<'a> {
    pub tensors: &'a [Tensor],
    pub nodes: &'a [Node],
    pub lv: &'a Liveness,
    pub fused: &'a [FusedGroup],
    pub align: u64,
    pub timings: Timings<'a>,
}

/// The model's estimate of `plan`'s compiled program on `input`'s timings.
pub fn estimate_plan(input: &RefineInput, plan: &SwapPlan) -> Estimate {
    let (tensors, nodes) = (input.tensors, input.nodes);
    let program = Program::compile_fused(tensors, nodes, input.lv, Some(plan), None, input.fused);
    estimate(
        tensors,
        nodes,
        &program,
        input.timings.node_ms,
        input.timings.link,
        input.align,
    )
}

/// `victims` in groups of alike tensors (same size, producer reading inputs of the same
/// sizes), each group's members in node order, the groups by their producers' summed time,
/// largest first.
pub(crate) fn groups_of(input: &RefineInput, victims: impl Iterator<Item = u32>) -> Vec<Vec<u32>> {
    let (tensors, nodes) = (input.tensors, input.nodes);
    let size = |t: u32| round_up(tensors[t as usize].size, input.align);
    let mut keyed: Vec<((u64, Vec<u64>), u32)> = Vec::new();
    for t in victims {
        let Some(p) = tensors[t as usize].producer else {
            continue;
        };
        let mut inputs: Vec<u64> = nodes[p as usize].inputs.iter().map(|&x| size(x)).collect();
        inputs.sort_unstable();
        keyed.push(((size(t), inputs), t));
    }
    keyed.sort();
    keyed.dedup();
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for (i, (key, t)) in keyed.iter().enumerate() {
        if i > 0 && keyed[i - 1].0 == *key {
            groups.last_mut().expect("a group").push(*t);
        } else {
            groups.push(vec![*t]);
        }
    }
    let ms = |t: u32| {
        let p = tensors[t as usize]
            .producer
            .expect("grouped tensors have one") as usize;
        input.timings.node_ms.get(p).copied().unwrap_or(0.0)
    };
    let first_use = |t: u32| input.lv.uses[t as usize].first().copied().unwrap_or(0);
    for g in &mut groups {
        g.sort_by_key(|&t| (first_use(t), t));
    }
    let total = |g: &Vec<u32>| g.iter().map(|&t| ms(t)).sum::<f64>();
    groups.sort_by(|a, b| total(b).total_cmp(&total(a)).then(a.cmp(b)));
    groups
}

/// `plan`'s rebuilt victims, and its copied ones that a recomputable node writes (intermediates
/// the rule could rebuild instead).
pub(crate) fn rebuilt_and_copied(input: &RefineInput, plan: &SwapPlan) -> (Vec<u32>, Vec<u32>) {
    let (tensors, nodes) = (input.tensors, input.nodes);
    let rebuilt = plan.drop_after.iter().flatten().copied().collect();
    let copied = plan
        .swap_out_after
        .iter()
        .flatten()
        .copied()
        .filter(|&t| {
            let tensor = &tensors[t as usize];
            tensor.kind == TensorKind::Intermediate
                && tensor
                    .producer
                    .is_some_and(|p| nodes[p as usize].recomputable)
        })
        .collect();
    (rebuilt, copied)
}

/// One change to try: set these tensors' rule, or the slack.
enum Move {
    Victims(Vec<u32>, Victim),
    Slack(u64),
}

/// The moves for `plan`: its rebuilt victims' groups copied, its copied intermediates' groups
/// (those a recomputable node writes) rebuilt, the slacks; then the groups' halves.
fn moves(input: &RefineInput, plan: &SwapPlan) -> Vec<Move> {
    let (rebuilt, copied) = rebuilt_and_copied(input, plan);
    let rebuilt = groups_of(input, rebuilt.into_iter());
    let copied = groups_of(input, copied.into_iter());
    let mut out = Vec::new();
    let whole = |groups: &[Vec<u32>], rule, out: &mut Vec<Move>| {
        out.extend(groups.iter().map(|g| Move::Victims(g.clone(), rule)));
    };
    let halves = |groups: &[Vec<u32>], rule, out: &mut Vec<Move>| {
        for g in groups.iter().filter(|g| g.len() > 1) {
            let (early, late) = g.split_at(g.len() / 2);
            out.push(Move::Victims(early.to_vec(), rule));
            out.push(Move::Victims(late.to_vec(), rule));
        }
    };
    whole(&rebuilt, Victim::Copy, &mut out);
    whole(&copied, Victim::Rebuild, &mut out);
    out.extend(SLACK_DIVISORS.iter().map(|&d| Move::Slack(plan.budget / d)));
    halves(&rebuilt, Victim::Copy, &mut out);
    halves(&copied, Victim::Rebuild, &mut out);
    out
}

/// Refines `plan` (made by `policy` for `plan.budget` on `input`'s timings, estimated `base`):
/// see the module's documentation. What it returns was made by the planner (`plan_masked`) and
/// accepted by `fits` (or is `plan` itself), with no more infeasible nodes than `plan`.
pub fn refine(
    input: &RefineInput,
    policy: Policy,
    plan: &SwapPlan,
    base: &Estimate,
    fits: impl Fn(&SwapPlan) -> Result<(), PoolMisfit>,
) -> Refined {
    let mut best = Refined {
        plan: plan.clone(),
        estimate: base.clone(),
        tried: 0,
        kept: 0,
    };
    let holds = CommHolds::new(input.tensors.len(), input.nodes, input.lv, input.fused);
    let mut victims = vec![Victim::Policy; input.tensors.len()];
    let mut slack = None;
    for m in moves(input, plan) {
        if best.tried >= MAX_TRIES {
            break;
        }
        let mut next_victims = victims.clone();
        let mut next_slack = slack;
        match &m {
            Move::Victims(group, rule) => {
                if group.iter().all(|&t| victims[t as usize] == *rule) {
                    continue;
                }
                for &t in group {
                    next_victims[t as usize] = *rule;
                }
            }
            Move::Slack(bytes) => next_slack = Some(*bytes),
        }
        let overrides = Overrides {
            victims: &next_victims,
            slack: next_slack,
            held: &[],
        };
        let candidate = plan_masked(
            input.tensors,
            input.nodes,
            input.lv,
            &holds,
            plan.budget,
            input.align,
            policy,
            Some(input.timings),
            overrides,
        );
        best.tried += 1;
        if candidate == best.plan || candidate.infeasible_nodes.len() > plan.infeasible_nodes.len()
        {
            continue;
        }
        let e = estimate_plan(input, &candidate);
        if e.step_ms > (1.0 - MIN_GAIN) * best.estimate.step_ms {
            continue;
        }
        if let Err(misfit) = fits(&candidate) {
            log::debug!("refined swap plan for {} bytes {misfit}", candidate.budget);
            continue;
        }
        victims = next_victims;
        slack = next_slack;
        best.plan = candidate;
        best.estimate = e;
        best.kept += 1;
    }
    best
}

#[cfg(test)]
#[path = "swap_refine_tests.rs"]
mod tests;
