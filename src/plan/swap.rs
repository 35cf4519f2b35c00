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
//! Run boundaries are canonical in swap mode, so every run follows the same plan: a persistent
//! tensor leaves for the host after its last use in the run, and the few the next run's first
//! nodes read (`keep`) come back before the run ends, in memory the end of the run no longer
//! uses, so the next run does not start by waiting for them.
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
    /// Persistent tensors the next run's first nodes read, brought back before a run ends so
    /// its start does not wait for them; every other persistent tensor ends a run on the host.
    pub keep: Vec<u32>,
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
    /// Resident tensors by next use: the last entry is the Belady victim.
    by_next_use: BTreeSet<(u32, u32)>,
    next_key: Vec<u32>,
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
        self.next_key[t as usize] = n;
        self.by_next_use.insert((n, t));
    }

    fn leave(&mut self, t: u32) {
        self.resident[t as usize] = false;
        self.used -= self.size(t);
        self.by_next_use.remove(&(self.next_key[t as usize], t));
    }
}

/// The tensors the first nodes of a run read are kept across runs (see `SwapPlan::keep`).
const KEEP_FIRST_NODES: u32 = 2;

/// Plans swaps for `budget` bytes of device memory.
pub fn plan_swaps(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
) -> SwapPlan {
    let cold = simulate(tensors, nodes, lv, budget, align, &[]);
    // Only what the first nodes read: bringing back more at the end of a run moves copies
    // from the start of the next run, where the link is often idle (a forward pass mostly
    // copies out), to the end of this one, where it is often busy (a backward pass copies in).
    let keep: Vec<u32> = cold.prefetch_before[0]
        .iter()
        .copied()
        .filter(|&t| {
            tensors[t as usize].kind.persists()
                && lv.uses[t as usize]
                    .first()
                    .is_some_and(|&u| u <= KEEP_FIRST_NODES)
        })
        .collect();
    if keep.is_empty() {
        return cold;
    }
    let warm = simulate(tensors, nodes, lv, budget, align, &keep);
    // Keeping them must not cost a node its feasibility.
    if warm.infeasible_nodes.len() > cold.infeasible_nodes.len() {
        cold
    } else {
        warm
    }
}

/// One planning pass; `keep` are resident when the run starts and must be again when it ends.
fn simulate(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    budget: u64,
    align: u64,
    keep: &[u32],
) -> SwapPlan {
    let n_nodes = nodes.len();
    let mut sim = Sim {
        tensors,
        align,
        resident: vec![false; tensors.len()],
        // Persistent tensors start on the host with their contents there.
        host_valid: tensors.iter().map(|t| t.kind.persists()).collect(),
        left_after: vec![-1; tensors.len()],
        by_next_use: BTreeSet::new(),
        next_key: vec![NEVER; tensors.len()],
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
    for &t in keep {
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
            let Some(&(key, victim)) = sim.by_next_use.iter().next_back() else {
                break;
            };
            if key <= n32 {
                break; // only this node's own tensors are left
            }
            sim.leave(victim);
            // A resident tensor arrived at a node before this one, so it has a last use.
            let last = lv
                .last_use_before(victim, n32)
                .expect("a resident tensor was used before");
            // It leaves right after that use, so a copy overlaps what runs until now; a clean
            // one (host copy current) leaves without a copy.
            plan.swap_out_after[last as usize].push(victim);
            if !sim.host_valid[victim as usize] {
                plan.bytes_out += sim.size(victim);
                sim.host_valid[victim as usize] = true;
            }
            let last = last as i64;
            sim.left_after[victim as usize] = last;
            // It has been off the device since `last`: lower the profile retroactively.
            let size = sim.size(victim);
            for u in sim
                .usage
                .iter_mut()
                .take(n)
                .skip((last + 1).max(0) as usize)
            {
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

        // After the node: dead intermediates leave; persistent tensors at their last use in the
        // run leave for the host now (the run would send them there at its end anyway), so
        // their copies overlap the rest of the run and their memory serves it; the rest move
        // to their next use.
        for &t in &touched {
            sim.by_next_use.remove(&(n32, t));
            let tensor = &tensors[t as usize];
            if lv.last_use[t as usize] == Some(n32) {
                sim.resident[t as usize] = false;
                sim.used -= sim.size(t);
                sim.left_after[t as usize] = n as i64;
                if tensor.kind.persists() {
                    plan.swap_out_after[n].push(t);
                    if !sim.host_valid[t as usize] {
                        plan.bytes_out += sim.size(t);
                        sim.host_valid[t as usize] = true;
                    }
                }
            } else {
                let next = lv.next_use_after(t, n32);
                sim.next_key[t as usize] = next;
                sim.by_next_use.insert((next, t));
            }
        }
    }

    // Run boundary: persistent tensors have left after their last use; the kept ones return.
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
        while k > earliest && sim.usage[k - 1] + size <= budget {
            k -= 1;
        }
        for u in &mut sim.usage[k..m as usize] {
            *u += size;
        }
        plan.prefetch_before[k].push(t);
    }
    plan.peak = sim.usage.iter().copied().max().unwrap_or(0);
    plan
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
