//! Room for copy-outs in flight, node by node, from the timeline model (`Policy::timed_slack`).
//!
//! A copy-out's block is not reusable until its copy ends, so the plan keeps room free for
//! copies in flight (the slack). One slack for the whole step must cover the forward pass,
//! where the out-link is busy and blocks stay pending for milliseconds, and then costs the
//! same bytes where nothing is in flight: on GPT-2 small at a third, the slack the
//! pending-aware dry run needs (a largest tensor, the logits' 824 MB) evicts the embedding's
//! weights at the logits' gradient, and they go out and back while compute waits 5.8 ms. Here
//! a plan made without slack is timed by the model, and each node gets as slack the bytes of
//! the copy-outs still running when it starts; the plan is made again with those, twice.

use crate::graph::liveness::round_up;
use crate::graph::{Liveness, Node, Tensor};
use crate::plan::program::{Program, Step};
use crate::plan::swap::{SwapPlan, Timings};
use crate::plan::swap_model::estimate;

/// How many times the plan is made again with the slack of the last one's copies.
pub(crate) const TIMED_SLACK_ROUNDS: usize = 2;

/// Per node: the bytes of `plan`'s copy-outs that the model on `timings` finds still running
/// when the node is queued (a copy counted from the step after its own).
pub fn in_flight_out_bytes(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    plan: &SwapPlan,
    timings: Timings,
    align: u64,
) -> Vec<u64> {
    let program = Program::compile_fused(tensors, nodes, lv, Some(plan), None, &[]);
    let e = estimate(
        tensors,
        nodes,
        &program,
        timings.node_ms,
        timings.link,
        align,
    );
    // The step each node is launched at (a rebuild relaunches a node: its first launch).
    let mut launch = vec![None; nodes.len()];
    for (i, step) in program.steps.iter().enumerate() {
        if let Step::Launch(n) = *step {
            launch[n as usize].get_or_insert(i);
        }
    }
    let mut bytes = vec![0u64; nodes.len()];
    for &(s, t, end) in &e.copy_ends {
        let size = round_up(tensors[t as usize].size, align);
        for (n, at) in launch.iter().enumerate() {
            let Some(at) = *at else { continue };
            let clock = e.step_clock.get(at).copied().unwrap_or(f64::INFINITY);
            if at > s as usize && clock < end {
                bytes[n] += size;
            }
        }
    }
    bytes
}

/// The larger of `a` and `b`, node by node (`a` may be empty).
pub fn at_least(a: &[u64], b: &[u64]) -> Vec<u64> {
    b.iter()
        .enumerate()
        .map(|(n, &x)| x.max(a.get(n).copied().unwrap_or(0)))
        .collect()
}
