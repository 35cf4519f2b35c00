//! A broader refinement of the chosen swap plan than `swap_refine`'s greedy one: steepest
//! descent on the timeline model (`swap_model`). Each round makes every move's plan
//! (`swap::plan_masked`), estimates them all, and keeps the best that the pool's dry run
//! (`fits`) accepts; a move the model prefers but the dry run rejects is retried with finer
//! slacks (room for copy-outs in flight), as its pages then fit where they did not. The moves:
//!
//! - windows of alike tensors (`swap_refine::groups_of`: a network's layers repeat) copied
//!   instead of rebuilt or rebuilt instead of copied — the whole group, halves, thirds and
//!   quarters along the step (the links idle and memory is short at different places), and a
//!   window kept in an earlier round grown or shrunk by one tensor at either end;
//! - the slack, the budget (down, or up to what the pool gave any candidate);
//! - the kept tensors that leave as a run starts held on the device until a later node
//!   (`swap::Overrides::held`), so that their copies run where the out-link idles rather than
//!   with the first nodes' evictions.
//!
//! Greedy first-improvement (what `swap_refine` does) keeps the first move that helps, which
//! on another run's timings may be a worse one than the best (session 15's slack retry); the
//! best move of a round is the same on close timings. `MAX_WORK` bounds the plans and dry runs
//! one search makes, whatever the graph.

use crate::plan::swap::{plan_masked, Overrides, Policy, SwapPlan, Victim};
use crate::plan::swap_fit::PoolMisfit;
use crate::plan::swap_holds::CommHolds;
use crate::plan::swap_model::Estimate;
use crate::plan::swap_refine::{
    estimate_plan, groups_of, rebuilt_and_copied, RefineInput, Refined,
};

/// Most plans and dry runs one search makes (about a millisecond each for GPT-2 small's 521
/// nodes on a 2-core host, two for medium's: 120–730 ms a search, the greedy one's 23–54).
const MAX_WORK: usize = 400;

/// Most rounds (moves kept).
const MAX_ROUNDS: usize = 6;

/// A move must shorten the estimated step by this fraction to be kept (as `swap_refine`).
const MIN_GAIN: f64 = 0.002;

/// How many of a round's best moves the dry run rejects are retried with finer slacks.
const RETRIED: usize = 4;

/// The slacks tried, as fractions (1/n) of the budget; the finest ones are the retries'.
const SLACK_DIVISORS: [u64; 5] = [128, 64, 32, 16, 8];
const RETRY_SLACK_DIVISORS: [u64; 3] = [128, 64, 32];

/// Into how many parts a group is cut for its windows (each window overlapping the next by
/// half).
const WINDOW_PARTS: [usize; 3] = [2, 3, 4];

/// How finely a hold's node is chosen: this many steps over a run's nodes.
const HOLD_STEPS: usize = 32;

/// The planner's overrides a search changes.
#[derive(Clone, Debug, PartialEq)]
struct State {
    victims: Vec<Victim>,
    slack: Option<u64>,
    held: Vec<(u32, u32)>,
    budget: u64,
}

#[derive(Clone, Debug)]
enum Move {
    Victims(Vec<u32>, Victim),
    Slack(u64),
    Budget(u64),
    Hold(Vec<u32>, u32),
}

impl Move {
    /// What the move does, for the log.
    fn describe(&self, input: &RefineInput) -> String {
        let name = |t: u32| input.tensors[t as usize].name.as_str();
        match self {
            Move::Victims(ts, rule) => match (ts.first(), ts.last()) {
                (Some(&a), Some(&b)) => {
                    format!(
                        "{rule:?} for {} tensors ({} .. {})",
                        ts.len(),
                        name(a),
                        name(b)
                    )
                }
                _ => format!("{rule:?} for none"),
            },
            Move::Slack(bytes) => format!("slack {bytes} bytes"),
            Move::Budget(bytes) => format!("budget {bytes} bytes"),
            Move::Hold(ts, k) => format!("{} kept tensors held until node {k}", ts.len()),
        }
    }
}

impl State {
    fn with(&self, m: &Move) -> State {
        let mut next = self.clone();
        match m {
            Move::Victims(ts, rule) => {
                for &t in ts {
                    next.victims[t as usize] = *rule;
                }
            }
            Move::Slack(bytes) => next.slack = Some(*bytes),
            Move::Budget(bytes) => next.budget = *bytes,
            Move::Hold(ts, k) => {
                next.held.retain(|(t, _)| !ts.contains(t));
                next.held.extend(ts.iter().map(|&t| (t, *k)));
                next.held.sort_unstable();
            }
        }
        next
    }
}

/// Windows of `group` (node order): whole, then `WINDOW_PARTS` parts overlapping by half.
fn windows(group: &[u32]) -> Vec<&[u32]> {
    let mut out = vec![group];
    for parts in WINDOW_PARTS {
        let len = group.len().div_ceil(parts);
        if len == 0 || len == group.len() {
            continue;
        }
        let step = len.div_ceil(2);
        let mut start = 0;
        while start + len / 2 < group.len() {
            out.push(&group[start..(start + len).min(group.len())]);
            if start + len >= group.len() {
                break;
            }
            start += step;
        }
    }
    out.dedup();
    out
}

/// A window of `group` already set to `rule` grown by the next member at either end, and
/// shrunk by its end members.
fn grown_and_shrunk(group: &[u32], state: &State, rule: Victim) -> Vec<Move> {
    let set: Vec<bool> = group
        .iter()
        .map(|&t| state.victims[t as usize] == rule)
        .collect();
    let mut out = Vec::new();
    for i in 0..group.len() {
        let edge_before = set[i] && (i == 0 || !set[i - 1]);
        let edge_after = set[i] && (i + 1 == group.len() || !set[i + 1]);
        if edge_before && i > 0 {
            out.push(Move::Victims(vec![group[i - 1]], rule));
        }
        if edge_after && i + 1 < group.len() {
            out.push(Move::Victims(vec![group[i + 1]], rule));
        }
        if edge_before || edge_after {
            out.push(Move::Victims(vec![group[i]], Victim::Policy));
        }
    }
    out
}

/// The moves from `state` (whose plan is `plan`): see the module's documentation. Copying a
/// rebuilt window can save at most its rebuilds' time, so windows whose producers take less
/// than `MIN_GAIN` of `step_ms` are left out.
fn moves(
    input: &RefineInput,
    state: &State,
    plan: &SwapPlan,
    step_ms: f64,
    most: u64,
) -> Vec<Move> {
    let (rebuilt, copied) = rebuilt_and_copied(input, plan);
    // Tensors set by earlier rounds stay in their groups, whatever the plan made of them.
    let overridden =
        |rule| (0..state.victims.len() as u32).filter(move |&t| state.victims[t as usize] == rule);
    let ms = |ts: &[u32]| {
        ts.iter()
            .filter_map(|&t| input.tensors[t as usize].producer)
            .map(|p| {
                input
                    .timings
                    .node_ms
                    .get(p as usize)
                    .copied()
                    .unwrap_or(0.0)
            })
            .sum::<f64>()
    };
    let mut out = Vec::new();
    for (victims, rule) in [(rebuilt, Victim::Copy), (copied, Victim::Rebuild)] {
        let all = groups_of(input, victims.into_iter().chain(overridden(rule)));
        for g in &all {
            for w in windows(g) {
                let worth = rule == Victim::Rebuild || ms(w) >= MIN_GAIN * step_ms;
                if worth && w.iter().any(|&t| state.victims[t as usize] != rule) {
                    out.push(Move::Victims(w.to_vec(), rule));
                }
            }
            out.extend(grown_and_shrunk(g, state, rule));
        }
    }
    out.extend(
        SLACK_DIVISORS
            .iter()
            .map(|&d| Move::Slack(state.budget / d)),
    );
    let unit = state.budget / 64;
    out.push(Move::Budget(state.budget - unit));
    for k in 1..=2 {
        if state.budget + k * unit <= most {
            out.push(Move::Budget(state.budget + k * unit));
        }
    }
    let mut leaving = plan.leave_at_start.clone();
    leaving.extend(state.held.iter().map(|&(t, _)| t));
    leaving.sort_unstable();
    leaving.dedup();
    if !leaving.is_empty() {
        let n = input.nodes.len();
        let step = n.div_ceil(HOLD_STEPS).max(1);
        out.extend(
            (step..n)
                .step_by(step)
                .map(|k| Move::Hold(leaving.clone(), k as u32)),
        );
    }
    out
}

/// Searches from `plan` (made by `policy` for `plan.budget` on `input`'s timings, estimated
/// `base`), budgets up to `most`: see the module's documentation. What it returns was made by
/// the planner (`plan_masked`) and accepted by `fits` (or is `plan` itself), with no more
/// infeasible nodes than `plan`.
pub fn search(
    input: &RefineInput,
    policy: Policy,
    plan: &SwapPlan,
    base: &Estimate,
    most: u64,
    fits: impl Fn(&SwapPlan) -> Result<(), PoolMisfit>,
) -> Refined {
    let holds = CommHolds::new(input.tensors.len(), input.nodes, input.lv, input.fused);
    let make = |s: &State| {
        let overrides = Overrides {
            victims: &s.victims,
            slack: s.slack,
            held: &s.held,
        };
        plan_masked(
            input.tensors,
            input.nodes,
            input.lv,
            &holds,
            s.budget,
            input.align,
            policy,
            Some(input.timings),
            overrides,
        )
    };
    let most = most.max(plan.budget);
    let infeasible = plan.infeasible_nodes.len();
    let mut best = Refined {
        plan: plan.clone(),
        estimate: base.clone(),
        tried: 0,
        kept: 0,
    };
    let mut state = State {
        victims: vec![Victim::Policy; input.tensors.len()],
        slack: None,
        held: Vec::new(),
        budget: plan.budget,
    };
    let mut work = 0;
    for _ in 0..MAX_ROUNDS {
        let goal = (1.0 - MIN_GAIN) * best.estimate.step_ms;
        // Every move's plan and estimate, best first.
        let mut scored: Vec<(f64, State, SwapPlan, Estimate, String)> = Vec::new();
        for m in moves(input, &state, &best.plan, best.estimate.step_ms, most) {
            if work >= MAX_WORK {
                break;
            }
            let next = state.with(&m);
            if next == state {
                continue;
            }
            let candidate = make(&next);
            work += 1;
            if candidate == best.plan || candidate.infeasible_nodes.len() > infeasible {
                continue;
            }
            let e = estimate_plan(input, &candidate);
            if e.step_ms <= goal {
                scored.push((e.step_ms, next, candidate, e, m.describe(input)));
            }
        }
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut kept: Option<(State, SwapPlan, Estimate, String)> = None;
        let mut retried = 0;
        for (ms, next, candidate, e, what) in scored {
            if kept.as_ref().is_some_and(|k| k.2.step_ms <= ms) || work >= MAX_WORK {
                break;
            }
            work += 1;
            match fits(&candidate) {
                Ok(()) => {
                    kept = Some((next, candidate, e, what));
                    continue;
                }
                Err(misfit) => log::debug!("searched swap plan {misfit}"),
            }
            if retried == RETRIED {
                continue;
            }
            retried += 1;
            for d in RETRY_SLACK_DIVISORS {
                if work + 2 > MAX_WORK {
                    break;
                }
                let slacked = next.with(&Move::Slack(next.budget / d));
                let p = make(&slacked);
                work += 1;
                if p.infeasible_nodes.len() > infeasible {
                    continue;
                }
                let pe = estimate_plan(input, &p);
                let better = kept.as_ref().is_none_or(|k| pe.step_ms < k.2.step_ms);
                if pe.step_ms <= goal && better {
                    work += 1;
                    if fits(&p).is_ok() {
                        kept = Some((slacked, p, pe, format!("{what}, slack a {d}th")));
                    }
                }
            }
        }
        let Some((next, p, e, what)) = kept else {
            break;
        };
        log::info!(
            "swap plan search kept: {what}: estimated step {:.2} ms",
            e.step_ms
        );
        state = next;
        best.plan = p;
        best.estimate = e;
        best.kept += 1;
    }
    best.tried = work;
    best
}

#[cfg(test)]
#[path = "swap_search_tests.rs"]
mod tests;
