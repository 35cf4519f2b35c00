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
//! `check_with_pool` replays the plan's allocations through a dry run of the real pool, so a plan
//! that fits on paper fits at run time; the runtime lowers the budget and replans when it does not.

use crate::device::StreamId;
use crate::graph::liveness::{round_up, NEVER};
use crate::graph::{Liveness, Node, Tensor};
use crate::memory::pool::{DryRunStep, Pool};
use std::collections::BTreeSet;

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
    /// Bytes the plan moves each way in one run (both include the run-boundary traffic).
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Largest device bytes in use during any node under the plan.
    pub peak: u64,
    /// Nodes whose own inputs, outputs and workspaces exceed the budget: a run fails there.
    pub infeasible_nodes: Vec<u32>,
}

/// The distinct tensors a node touches.
pub fn node_tensors(node: &Node) -> Vec<u32> {
    let mut ts: Vec<u32> = node.inputs.iter().chain(&node.outputs).copied().collect();
    ts.sort_unstable();
    ts.dedup();
    ts
}

struct Sim<'a> {
    tensors: &'a [Tensor],
    align: u64,
    resident: Vec<bool>,
    host_valid: Vec<bool>,
    /// Node after which the tensor last left the device (-1: on the host since the run began).
    left_after: Vec<i64>,
    /// Resident tensors by (next use, clean): the last entry is the Belady victim, and of two
    /// used next at the same node the clean one (host copy current: leaves without a copy).
    by_next_use: BTreeSet<(u32, bool, u32)>,
    next_key: Vec<(u32, bool)>,
    used: u64,
    usage: Vec<u64>,
}

impl Sim<'_> {
    fn size(&self, t: u32) -> u64 {
        round_up(self.tensors[t as usize].size, self.align)
    }

    fn arrive(&mut self, t: u32, n: u32) {
        self.resident[t as usize] = true;
        self.used += self.size(t);
        self.index(t, n);
    }

    /// (Re)indexes resident `t` under its next use `n`.
    fn index(&mut self, t: u32, n: u32) {
        let key = (n, self.host_valid[t as usize]);
        self.next_key[t as usize] = key;
        self.by_next_use.insert((key.0, key.1, t));
    }

    fn unindex(&mut self, t: u32) {
        let (n, clean) = self.next_key[t as usize];
        self.by_next_use.remove(&(n, clean, t));
    }

    fn leave(&mut self, t: u32) {
        self.resident[t as usize] = false;
        self.used -= self.size(t);
        self.unindex(t);
    }
}

/// Plans swaps for `budget` bytes of device memory: the policy that needs no measurement (see
/// `Policy::default`). `candidates` gives the alternatives the runtime chooses among once a
/// run has been timed.
pub fn plan_swaps(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
) -> SwapPlan {
    plan_with(tensors, nodes, lv, budget, align, Policy::default())
}

/// The knobs of the planning policy. Which setting is best depends on how long nodes take
/// against the link, which the plan cannot know before a run; `candidates` tries them all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// After its last use in a run, a persistent tensor that the next run reads waits on the
    /// device for its first use there, evicted first when room is needed (runs repeat, so the schedule is
    /// cyclic: a weight used at the end of a backward pass and at the start of the next
    /// forward pass need not leave at all). The tensors resident at a run boundary (`keep`)
    /// are then found by iterating: plan from a state, take the state that plan ends in, plan
    /// again, until it repeats. Off: a persistent tensor leaves for the host after its last
    /// use, and only what the first nodes of a run read is kept.
    pub linger: bool,
    /// Bytes the returns leave free (in units of the largest tensor): room for copy-outs in
    /// flight, whose memory is not reusable until their copy ends, so a node's allocation
    /// need not wait for one.
    pub slack_tensors: u64,
    /// With `linger` off: a kept tensor stays on the device after its last use in a run
    /// (evicted first when room is needed) instead of leaving and coming back at the run's end
    /// (cheaper when it is used late in the run; dearer when it is used only at the start).
    pub kept_wait: bool,
}

/// How many times the run-boundary state is refined (`Policy::linger`).
const BOUNDARY_ROUNDS: usize = 4;

/// The tensors the first nodes of a run read are kept across runs (`Policy::linger` off).
const KEEP_FIRST_NODES: u32 = 2;

fn plan_with(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
    policy: Policy,
) -> SwapPlan {
    let largest = tensors
        .iter()
        .map(|t| round_up(t.size, align))
        .max()
        .unwrap_or(0);
    let slack = policy.slack_tensors * largest;
    let sim = |keep: &[u32]| {
        simulate(
            tensors,
            nodes,
            lv,
            budget,
            align,
            keep,
            policy.linger,
            policy.kept_wait,
            slack,
        )
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
    best
}

/// The plans of every policy for `budget`, the default first, distinct ones only.
pub fn candidates(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
) -> Vec<(Policy, SwapPlan)> {
    let mut out: Vec<(Policy, SwapPlan)> = Vec::new();
    let knobs = [(false, false), (false, true), (true, false)];
    for (linger, kept_wait) in knobs {
        for slack_tensors in [0, 1, 2] {
            let policy = Policy {
                linger,
                slack_tensors,
                kept_wait,
            };
            let plan = plan_with(tensors, nodes, lv, budget, align, policy);
            if !out.iter().any(|(_, p)| *p == plan) {
                out.push((policy, plan));
            }
        }
    }
    out
}

/// One planning pass; `keep` are resident when the run starts and must be again when it ends.
/// Also returns the persistent tensors the policy would leave resident at the end.
#[allow(clippy::too_many_arguments)]
fn simulate(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
    keep: &[u32],
    linger: bool,
    kept_wait: bool,
    slack: u64,
) -> (SwapPlan, Vec<u32>) {
    let n_nodes = nodes.len();
    let mut sim = Sim {
        tensors,
        align,
        resident: vec![false; tensors.len()],
        // Persistent tensors start on the host with their contents there.
        host_valid: tensors.iter().map(|t| t.kind.persists()).collect(),
        left_after: vec![-1; tensors.len()],
        by_next_use: BTreeSet::new(),
        next_key: vec![(NEVER, false); tensors.len()],
        used: 0,
        usage: vec![0; n_nodes + 1],
    };
    let mut plan = SwapPlan {
        budget,
        swap_out_after: vec![Vec::new(); n_nodes],
        prefetch_before: vec![Vec::new(); n_nodes + 1],
        keep: keep.to_vec(),
        ..SwapPlan::default()
    };
    let mut kept = vec![false; tensors.len()];
    for &t in keep {
        kept[t as usize] = true;
        let first = lv.uses[t as usize].first().copied().unwrap_or(NEVER);
        sim.arrive(t, first);
    }
    // (node that needs it, tensor, node after which it left)
    let mut returns: Vec<(u32, u32, i64)> = Vec::new();

    for (n, node) in nodes.iter().enumerate() {
        let n32 = n as u32;
        let touched = node_tensors(node);
        let workspace: u64 = node.workspaces.iter().map(|&w| round_up(w, align)).sum();
        let incoming: Vec<u32> = touched
            .iter()
            .copied()
            .filter(|&t| !sim.resident[t as usize])
            .collect();
        let need: u64 = incoming.iter().map(|&t| sim.size(t)).sum::<u64>() + workspace;

        // Make room: evict the resident tensor used farthest in the future.
        while sim.used + need > budget {
            let Some(&(key, _, victim)) = sim.by_next_use.iter().next_back() else {
                break;
            };
            if key <= n32 {
                break; // only this node's own tensors are left
            }
            sim.leave(victim);
            // It leaves right after its last use, so a copy overlaps what runs until now; a
            // clean one (host copy current) leaves without a copy. A kept tensor not used yet
            // in this run leaves as the run starts.
            let last = lv.last_use_before(victim, n32);
            match last {
                Some(last) => plan.swap_out_after[last as usize].push(victim),
                None => plan.leave_at_start.push(victim),
            }
            if !sim.host_valid[victim as usize] {
                plan.bytes_out += sim.size(victim);
                sim.host_valid[victim as usize] = true;
            }
            let left = last.map_or(-1, |l| l as i64);
            sim.left_after[victim as usize] = left;
            // It has been off the device since then: lower the profile retroactively.
            let size = sim.size(victim);
            for u in &mut sim.usage[(left + 1) as usize..n] {
                *u -= size;
            }
        }
        if sim.used + need > budget {
            plan.infeasible_nodes.push(n32);
        }

        for &t in &incoming {
            if node.inputs.contains(&t) {
                returns.push((n32, t, sim.left_after[t as usize]));
                plan.bytes_in += sim.size(t);
            }
            sim.arrive(t, n32);
        }
        for &t in &node.outputs {
            sim.host_valid[t as usize] = false;
        }
        sim.usage[n] = sim.used + workspace;

        // After the node: dead intermediates leave; a persistent tensor at its last use in
        // the run waits for its first use in the next one (evicted first when room is needed);
        // the rest move to their next use.
        for &t in &touched {
            sim.unindex(t);
            let tensor = &tensors[t as usize];
            if lv.last_use[t as usize] == Some(n32) {
                // Only what the next run reads lingers: one it first overwrites (an output)
                // has no use for its device contents and leaves now, its copy overlapping
                // this run. With `kept_wait`, a kept tensor waits too (rather than leave and
                // come back at the end).
                let first = lv.uses[t as usize][0];
                let read_next = nodes[first as usize].inputs.contains(&t);
                let waits = (linger && read_next) || (kept_wait && kept[t as usize]);
                if tensor.kind.persists() && waits {
                    sim.index(t, n_nodes as u32 + first);
                } else {
                    if tensor.kind.persists() {
                        plan.swap_out_after[n].push(t);
                        if !sim.host_valid[t as usize] {
                            plan.bytes_out += sim.size(t);
                            sim.host_valid[t as usize] = true;
                        }
                    }
                    sim.resident[t as usize] = false;
                    sim.used -= sim.size(t);
                    sim.left_after[t as usize] = n as i64;
                }
            } else {
                let next = lv.next_use_after(t, n32);
                sim.index(t, next);
            }
        }
    }

    // Run boundary. What the policy leaves resident is the next state to try; what is resident
    // but not kept leaves after its last use (copied if dirty), and the kept ones that left
    // come back.
    let mut end_state: Vec<u32> = (0..tensors.len() as u32)
        .filter(|&t| sim.resident[t as usize] && tensors[t as usize].kind.persists())
        .collect();
    end_state.sort_unstable();
    for &t in &end_state {
        if kept[t as usize] {
            continue;
        }
        let last = lv.last_use[t as usize].expect("a resident tensor was used");
        sim.leave(t);
        plan.swap_out_after[last as usize].push(t);
        if !sim.host_valid[t as usize] {
            plan.bytes_out += sim.size(t);
            sim.host_valid[t as usize] = true;
        }
        sim.left_after[t as usize] = last as i64;
        let size = sim.size(t);
        for u in &mut sim.usage[last as usize + 1..n_nodes] {
            *u -= size;
        }
    }
    sim.usage[n_nodes] = sim.used;
    for &t in keep {
        if !sim.resident[t as usize] {
            returns.push((n_nodes as u32, t, sim.left_after[t as usize]));
            plan.bytes_in += sim.size(t);
        }
    }

    // Returns: as early as the profile leaves room, in the order they are needed.
    returns.sort_unstable();
    for (m, t, left) in returns {
        let size = sim.size(t);
        let earliest = (left + 1).max(0) as usize;
        let mut k = m as usize;
        while k > earliest && sim.usage[k - 1] + size + slack <= budget {
            k -= 1;
        }
        for u in &mut sim.usage[k..m as usize] {
            *u += size;
        }
        plan.prefetch_before[k].push(t);
    }
    plan.peak = sim.usage.iter().copied().max().unwrap_or(0);
    (plan, end_state)
}

/// Replays the allocations the executor will make under `plan` through a dry run of `pool` (its
/// current state and limit). Returns the index of the first node that would not fit.
pub fn check_with_pool(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    plan: &SwapPlan,
    pool: &Pool,
    stream: StreamId,
) -> Result<(), u32> {
    let mut steps: Vec<DryRunStep> = Vec::new();
    let mut step_node: Vec<u32> = Vec::new();
    let mut block: Vec<Option<usize>> = vec![None; tensors.len()];
    let mut push = |steps: &mut Vec<DryRunStep>, node: u32, s: DryRunStep| {
        steps.push(s);
        step_node.push(node);
        steps.len() - 1
    };
    for &t in &plan.keep {
        let bytes = tensors[t as usize].size;
        block[t as usize] = Some(push(&mut steps, 0, DryRunStep::Alloc { bytes, stream }));
    }
    for &t in &plan.leave_at_start {
        if let Some(step) = block[t as usize].take() {
            push(&mut steps, 0, DryRunStep::Free { step });
        }
    }
    for (n, node) in nodes.iter().enumerate() {
        let n32 = n as u32;
        for &t in plan.prefetch_before[n].iter().chain(&node_tensors(node)) {
            if block[t as usize].is_none() {
                let bytes = tensors[t as usize].size;
                block[t as usize] =
                    Some(push(&mut steps, n32, DryRunStep::Alloc { bytes, stream }));
            }
        }
        let ws: Vec<usize> = node
            .workspaces
            .iter()
            .map(|&bytes| push(&mut steps, n32, DryRunStep::Alloc { bytes, stream }))
            .collect();
        for step in ws {
            push(&mut steps, n32, DryRunStep::Free { step });
        }
        for &t in &node_tensors(node) {
            if !tensors[t as usize].kind.persists() && lv.last_use[t as usize] == Some(n32) {
                if let Some(step) = block[t as usize].take() {
                    push(&mut steps, n32, DryRunStep::Free { step });
                }
            }
        }
        for &t in &plan.swap_out_after[n] {
            if let Some(step) = block[t as usize].take() {
                push(&mut steps, n32, DryRunStep::Free { step });
            }
        }
    }
    let last = nodes.len() as u32;
    for &t in &plan.prefetch_before[nodes.len()] {
        if block[t as usize].is_none() {
            let bytes = tensors[t as usize].size;
            block[t as usize] = Some(push(&mut steps, last, DryRunStep::Alloc { bytes, stream }));
        }
    }
    pool.dry_run(&steps)
        .map(|_| ())
        .map_err(|(i, _)| step_node[i])
}
