//! The swap plan: when a graph's working set exceeds the device budget, which tensors leave the
//! device after which node, and when each comes back.
//!
//! It is made by simulating, over byte counts, the policy the executor itself falls back on:
//! when a node needs room, evict the resident tensor whose next use is farthest away (Belady).
//! The simulation then moves each eviction as early as it can go (right after the tensor's last
//! use before it was needed out), and each return as early as the memory profile allows, so both
//! copies overlap compute. A tensor whose host copy is still current (a parameter not written
//! since it was last saved) leaves without a copy.
//!
//! Run boundaries are canonical in swap mode, so every run follows the same plan: the
//! persistent tensors in `keep` are on the device when a run starts and again when it ends,
//! every other one on the host. Runs repeat, so the policy looks across the boundary: after its
//! last use a persistent tensor's next use is its first use in the next run (see `plan_swaps`).
//!
//! Rematerialisation (`Policy::recompute`): when the victim is the only output of a node the
//! host declared recomputable (`Node::recomputable`) and that node's inputs are still on hand,
//! unchanged, at the victim's next use, the plan drops it without a copy and runs its producer
//! again right before that use. Its bytes never cross the link; the producer's inputs gain a use
//! there (they are kept or brought back for it). Only the plan reruns nodes, and only those.
//!
//! The simulation and the rematerialisation rule live in `swap_sim.rs`; this file holds the plan,
//! the policy's knobs and the search over run-boundary states.
//!
//! Collectives (`swap_holds.rs`): a tensor a collective may still touch is pinned — never a
//! victim — from its last use before the collective to the node that waits for it, and a fused
//! group arrives, stays and leaves as one block.
//!
//! `swap_fit.rs` checks a plan against the real pool (a dry run of its compiled step program).

use crate::graph::liveness::round_up;
use crate::graph::{Liveness, Node, Tensor};
use crate::plan::swap_holds::CommHolds;
use crate::plan::swap_sim::{simulate, Pass};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SwapPlan {
    pub budget: u64,
    /// After node n is queued: copy these tensors out (or drop a clean device copy).
    pub swap_out_after: Vec<Vec<u32>>,
    /// Before node n is queued: start copying these tensors back in. It has one entry more
    /// than there are nodes: returns queued after the last node, for the next run.
    pub prefetch_before: Vec<Vec<u32>>,
    /// Persistent tensors on the device at the start and the end of every run (sorted); every
    /// other persistent tensor ends a run on the host.
    pub keep: Vec<u32>,
    /// Kept tensors that leave as a run starts (the policy needs their room before their first
    /// use in the run).
    pub leave_at_start: Vec<u32>,
    /// After node n: drop these intermediates without a copy (they are recomputed later).
    pub drop_after: Vec<Vec<u32>>,
    /// Before node n (after its returns start): run each tensor's producer again to rebuild it,
    /// in this order (a chain's freed links before the tensors built from them).
    pub recompute_before: Vec<Vec<u32>>,
    /// After node n: free these links of a recompute chain, rebuilt before n only to rebuild
    /// another tensor there (see `rebuild_chain`).
    pub free_after: Vec<Vec<u32>>,
    /// Bytes the plan moves each way in one run (both include the run-boundary traffic).
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Largest device bytes in use during any node under the plan.
    pub peak: u64,
    /// Nodes whose own inputs, outputs and workspaces exceed the budget: a run fails there.
    pub infeasible_nodes: Vec<u32>,
}

impl SwapPlan {
    /// Tensors the plan rebuilds by running their producer again, per run.
    pub fn recomputes(&self) -> usize {
        self.recompute_before.iter().map(Vec::len).sum()
    }
}

/// The distinct tensors a node touches.
pub fn node_tensors(node: &Node) -> Vec<u32> {
    let mut ts: Vec<u32> = node.inputs.iter().chain(&node.outputs).copied().collect();
    ts.sort_unstable();
    ts.dedup();
    ts
}

/// Plans swaps for `budget` bytes of device memory: the policy that needs no measurement (see
/// `Policy::default`). `candidates` gives the alternatives the runtime chooses among once a
/// run has been timed. The tests' shorthand for a graph without fused groups.
#[cfg(test)]
pub fn plan_swaps(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
) -> SwapPlan {
    plan_swaps_fused(tensors, nodes, lv, &[], budget, align)
}

/// `plan_swaps` for a graph whose collectives have fused groups `fused`.
#[cfg(test)]
pub fn plan_swaps_fused(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    fused: &[crate::graph::FusedGroup],
    budget: u64,
    align: u64,
) -> SwapPlan {
    let holds = CommHolds::new(tensors.len(), nodes, lv, fused);
    plan_timed(
        tensors,
        nodes,
        lv,
        &holds,
        budget,
        align,
        Policy::default(),
        None,
    )
}

/// The knobs of the planning policy. Which setting is best depends on how long nodes take
/// against the link, which the plan cannot know before a run; `candidates` tries them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// After its last use in a run, a persistent tensor that the next run reads waits on the
    /// device for its first use there, evicted first when room is needed (runs repeat, so the schedule is
    /// cyclic: a weight used at the end of a backward pass and at the start of the next
    /// forward pass need not leave at all). The tensors resident at a run boundary (`keep`)
    /// are then found by iterating: plan from a state, take the state that plan ends in, plan
    /// again, until it repeats. Off: a persistent tensor leaves for the host after its last
    /// use, and only what the first nodes of a run read is kept.
    pub linger: bool,
    /// Bytes the plan keeps free (in units of the largest tensor): returns leave them and
    /// evictions make them. Room for copy-outs in flight, whose memory is not reusable until
    /// their copy ends, so a node's allocation need not wait for one.
    pub slack_tensors: u64,
    /// With `linger` off: a kept tensor stays on the device after its last use in a run
    /// (evicted first when room is needed) instead of leaving and coming back at the run's end
    /// (cheaper when it is used late in the run; dearer when it is used only at the start).
    pub kept_wait: bool,
    /// A victim that a recomputable node can rebuild is dropped and recomputed rather than
    /// copied out and back (see the module's documentation). On by default: the host declared
    /// those nodes cheap enough to rerun; the first run's timings may still prefer copies.
    pub recompute: bool,
    /// With `recompute`, on a timed run's figures (`Timings`): a victim is rebuilt only when
    /// running its producers again takes at most this many percent of the time its copies
    /// would take on the link (out when its host copy is stale, and back in); 0: whenever it
    /// can be. Rebuilding costs compute-stream time, copying costs link time that is idle for
    /// much of a step, so a cap trades rebuilt products for copies (see `swap_candidates`).
    pub recompute_cap_pct: u32,
    /// The parameters the last nodes of a run write (`KEEP_LAST_NODES`: an optimizer
    /// step at the end, such as the embedding's AdamW state) stay on the device at the run's
    /// end: their copies home would start after the last writer and end after the last node,
    /// where no compute overlaps them. Kept, they leave (copied, as the run wrote them) when the
    /// next run needs their room, while its first nodes compute, or never.
    pub keep_last_writes: bool,
    /// A chain link rebuilt before a node only to feed a rebuild that was then moved to an
    /// earlier reader (the scores under a softmax output rebuilt for the attention's output
    /// first) is not rebuilt there any more: it would run for nothing and hold its block
    /// through that node. Off: the rebuild stays (the planner before session 13; see
    /// `swap_sim.rs`).
    pub prune_moved_links: bool,
    /// Persistent tensors of at most this many bytes stay on the device for the whole run:
    /// kept at its boundaries and never evicted (0: none). The runtime passes the pool's page
    /// (`Knobs::pin_below`): a block of at most a page shares pages with its neighbours, and one
    /// evicted and brought back lands wherever a hole's end is free, so a step's small tensors
    /// coming and going leave the large ranges in pieces (GPT-2 small at a third: no 824 MB range
    /// for the logits' gradient without moving pages, see `swap_release`), for a few megabytes.
    /// Not applied when those tensors together exceed `PIN_BELOW_SHARE` of the budget.
    pub pin_below: u64,
}

/// The most of a budget the tensors `Policy::pin_below` keeps may take together (a 64th: GPT-2
/// small's at a third are 86 tensors, 5.3 MB of 2.3 GB).
pub(crate) const PIN_BELOW_SHARE: u64 = 64;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            linger: false,
            slack_tensors: 0,
            kept_wait: false,
            recompute: true,
            recompute_cap_pct: 0,
            keep_last_writes: false,
            prune_moved_links: true,
            pin_below: 0,
        }
    }
}

/// Measured bandwidth of the host link each way, in GB/s (the first run's copies).
#[derive(Clone, Copy, Debug)]
pub struct Link {
    pub in_gbps: f64,
    pub out_gbps: f64,
}

/// A timed run's figures, which a capped policy weighs rebuilds by
/// (`Policy::recompute_cap_pct`).
#[derive(Clone, Copy, Debug)]
pub struct Timings<'a> {
    /// Per node, milliseconds.
    pub node_ms: &'a [f64],
    pub link: Link,
}

/// How many times the run-boundary state is refined (`Policy::linger`).
const BOUNDARY_ROUNDS: usize = 4;

/// The tensors the first nodes of a run read are kept across runs (`Policy::linger` off).
const KEEP_FIRST_NODES: u32 = 2;

/// The persistent outputs of this many last nodes of a run are kept across runs
/// (`Policy::keep_last_writes`).
const KEEP_LAST_NODES: usize = 4;

#[cfg(test)]
fn plan_with(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
    policy: Policy,
) -> SwapPlan {
    let holds = CommHolds::new(tensors.len(), nodes, lv, &[]);
    plan_timed(tensors, nodes, lv, &holds, budget, align, policy, None)
}

/// `plan_with`, with what collectives hold (`swap_holds.rs`) and the timings a capped policy
/// weighs its rebuilds by.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_timed(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    holds: &CommHolds,
    budget: u64,
    align: u64,
    policy: Policy,
    timings: Option<Timings>,
) -> SwapPlan {
    plan_masked(
        tensors,
        nodes,
        lv,
        holds,
        budget,
        align,
        policy,
        timings,
        Overrides::default(),
    )
}

/// What a refinement (`swap_refine`) overrides of a policy's rules for one tensor as a victim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Victim {
    /// As the policy says.
    #[default]
    Policy,
    /// Copied out and back, never dropped for a rebuild.
    Copy,
    /// Dropped and rebuilt wherever the rematerialisation rule can, whatever the policy's cap
    /// (`Policy::recompute_cap_pct`) says.
    Rebuild,
}

/// Per-tensor overrides of a policy (`Victim`; empty: none) and of its slack in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overrides<'a> {
    pub victims: &'a [Victim],
    pub slack: Option<u64>,
    /// Kept tensors `(t, k)` that stay on the device until node `k`: no victim before it, and
    /// when one leaves it leaves after node `k - 1` at the earliest (where a kept tensor not
    /// used yet would leave as the run starts), so its copy runs where the link idles rather
    /// than with the first nodes' evictions (see `swap_refine`).
    pub held: &'a [(u32, u32)],
}

/// `plan_timed` with `overrides`: `swap_refine` turns rebuilds into copies and back with them,
/// one group of tensors at a time.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_masked(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    holds: &CommHolds,
    budget: u64,
    align: u64,
    policy: Policy,
    timings: Option<Timings>,
    overrides: Overrides,
) -> SwapPlan {
    let largest = tensors
        .iter()
        .map(|t| round_up(t.size, align))
        .max()
        .unwrap_or(0);
    let slack = overrides.slack.unwrap_or(policy.slack_tensors * largest);
    let pinned = pinned_small(tensors, holds, budget, policy.pin_below);
    let pass = Pass {
        tensors,
        nodes,
        lv,
        holds,
        budget,
        align,
        policy,
        slack,
        timings,
        victims: overrides.victims,
        pinned: &pinned,
        held: overrides.held,
    };
    let sim = |keep: &[u32]| {
        if pinned.is_empty() {
            return simulate(&pass, keep);
        }
        let mut with: Vec<u32> = keep.iter().chain(&pinned).copied().collect();
        with.sort_unstable();
        with.dedup();
        simulate(&pass, &with)
    };
    let (cold, end_state) = sim(&[]);
    let mut best = cold;
    let consider = |plan: SwapPlan, best: &mut SwapPlan| {
        // Keeping tensors must not cost a node its feasibility; then fewer bytes moved wins.
        let key = |p: &SwapPlan| (p.infeasible_nodes.len(), p.bytes_in + p.bytes_out);
        if key(&plan) <= key(best) {
            *best = plan;
        }
    };
    // Persistent tensors the first nodes of a run read.
    let read_first: Vec<u32> = (0..tensors.len() as u32)
        .filter(|&t| {
            tensors[t as usize].kind.persists()
                && lv.uses[t as usize].first().is_some_and(|&u| {
                    u <= KEEP_FIRST_NODES && nodes[u as usize].inputs.contains(&t)
                })
        })
        .collect();
    if policy.linger {
        let mut keep = end_state;
        for _ in 0..BOUNDARY_ROUNDS {
            let (plan, next_keep) = sim(&keep);
            consider(plan, &mut best);
            if next_keep == keep {
                break;
            }
            keep = next_keep;
        }
        // What the first nodes read but the cycle evicts (a weight used only at the start)
        // comes back at the end of the run, while other copies run, rather than at the start
        // of the next, where the first node would wait for it.
        let mut with_first = keep;
        with_first.extend(read_first.iter().copied());
        // And what the last node writes stays: its copy out would end the run, where nothing
        // overlaps it; kept, it leaves when the next run needs its room (or never).
        let last = &nodes[nodes.len() - 1];
        with_first.extend(
            last.outputs
                .iter()
                .copied()
                .filter(|&t| tensors[t as usize].kind.persists()),
        );
        with_first.sort_unstable();
        with_first.dedup();
        let (plan, _) = sim(&with_first);
        consider(plan, &mut best);
    } else {
        let mut first: Vec<u32> = best.prefetch_before[0]
            .iter()
            .copied()
            .filter(|&t| {
                tensors[t as usize].kind.persists()
                    && lv.uses[t as usize]
                        .first()
                        .is_some_and(|&u| u <= KEEP_FIRST_NODES)
            })
            .collect();
        first.sort_unstable();
        if !first.is_empty() {
            let (plan, _) = sim(&first);
            // Only what the first nodes read: bringing back more at the end of a run moves
            // copies from the start of the next run to the end of this one.
            if plan.infeasible_nodes.len() <= best.infeasible_nodes.len() {
                best = plan;
            }
        }
    }
    if policy.keep_last_writes {
        let mut keep = best.keep.clone();
        keep.extend(
            nodes
                .iter()
                .rev()
                .take(KEEP_LAST_NODES)
                .flat_map(|node| &node.outputs)
                .copied()
                // Parameters (what the host reads after a run is sent home at its end), and
                // none a collective holds: it leaves after the collective, not when room is
                // needed.
                .filter(|&t| {
                    tensors[t as usize].kind == crate::graph::TensorKind::Parameter
                        && !holds.held(t)
                }),
        );
        keep.sort_unstable();
        keep.dedup();
        if keep != best.keep {
            let (plan, _) = sim(&keep);
            if plan.infeasible_nodes.len() <= best.infeasible_nodes.len() {
                best = plan;
            }
        }
    }
    best
}

/// The persistent tensors `Policy::pin_below` keeps on the device (none a collective holds:
/// those leave after their collective), or none when they would take more than
/// `PIN_BELOW_SHARE` of `budget`.
pub(crate) fn pinned_small(
    tensors: &[Tensor],
    holds: &CommHolds,
    budget: u64,
    pin_below: u64,
) -> Vec<u32> {
    if pin_below == 0 {
        return Vec::new();
    }
    let small: Vec<u32> = (0..tensors.len() as u32)
        .filter(|&t| {
            let x = &tensors[t as usize];
            x.kind.persists() && x.size > 0 && x.size <= pin_below && !holds.held(t)
        })
        .collect();
    let bytes: u64 = small.iter().map(|&t| tensors[t as usize].size).sum();
    if bytes > budget / PIN_BELOW_SHARE {
        return Vec::new();
    }
    small
}

#[cfg(test)]
#[path = "swap_tests.rs"]
mod tests;
