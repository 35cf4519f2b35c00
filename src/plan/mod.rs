//! Planning: fixed arena offsets for planned mode (`crate::arena` is the general planner; this
//! module turns a finalized graph into its problem and back), the swap plan and its timeline
//! model, and the step program (`program`) that a run executes, compiled from all of them.

pub mod min_limit;
pub mod program;
pub mod swap;
pub mod swap_candidates;
pub mod swap_fit;
pub(crate) mod swap_holds;
pub mod swap_model;
pub mod swap_placements;
pub mod swap_refine;
pub mod swap_release;
pub mod swap_search;
mod swap_sim;

#[cfg(test)]
mod gpt2_choice_tests;
#[cfg(test)]
mod gpt2_refine_tests;
#[cfg(test)]
mod gpt2_search_tests;
#[cfg(test)]
pub(crate) mod gpt2_shape_tests;
#[cfg(test)]
mod pool_fidelity_tests;
#[cfg(test)]
mod swap_placements_tests;
#[cfg(test)]
mod swap_release_tests;
#[cfg(test)]
mod test_graph;
#[cfg(test)]
mod test_vmm;

use crate::arena::{self, ArenaProblem, BufferSpec};
use crate::graph::liveness::round_up;
use crate::graph::{Graph, TensorKind};
use std::time::Duration;

/// Where every transient buffer of a graph lives inside one arena.
#[derive(Clone, Debug)]
pub struct ArenaLayout {
    /// Per tensor: offset of an intermediate (0 for others, unused).
    pub tensor_offsets: Vec<u64>,
    /// Per node, per workspace: offset.
    pub workspace_offsets: Vec<Vec<u64>>,
    pub size: u64,
    /// The peak of live transient bytes: no layout can be smaller.
    pub lower_bound: u64,
}

/// Plans the arena of a finalized graph: each intermediate lives from the node that first
/// touches it to the node that last does; a workspace lives during its node. The search runs
/// for at most `search_time` after the greedy placement (zero: greedy only).
pub fn plan_graph_arena(
    graph: &Graph,
    align: u64,
    search_time: Duration,
) -> Result<ArenaLayout, String> {
    let lv = graph.liveness().ok_or("the graph is not finalized")?;
    enum Owner {
        Tensor(usize),
        Workspace(usize, usize),
        Group(usize),
    }
    let mut buffers = Vec::new();
    let mut owners = Vec::new();
    // A collective's tensors stay until the compute stream has waited for its event, not only
    // until their last use (the communication stream may still read or write them).
    let holds = graph.collective_holds();
    let interval = |t: usize| -> Option<(u32, u32)> {
        match (lv.first_use[t], lv.last_use[t]) {
            (Some(first), Some(last)) => Some((first, (last + 1).max(holds[t]))),
            _ => None,
        }
    };
    for (t, tensor) in graph.tensors().iter().enumerate() {
        if tensor.kind != TensorKind::Intermediate || graph.fused_slot(t as u32).is_some() {
            continue;
        }
        if let Some((start, end)) = interval(t) {
            buffers.push(BufferSpec {
                start,
                end,
                size: round_up(tensor.size, align),
                align,
            });
            owners.push(Owner::Tensor(t));
        }
    }
    // A fused group is one buffer over the hull of its members' intervals, its members back to
    // back inside without padding (one collective call covers the block: no gaps). The arena
    // planner's own contiguity groups would pad each member to the alignment.
    for (g, group) in graph.fused_groups().iter().enumerate() {
        let spans: Vec<(u32, u32)> = group
            .members
            .iter()
            .filter_map(|&t| interval(t as usize))
            .collect();
        let (Some(start), Some(end)) = (
            spans.iter().map(|s| s.0).min(),
            spans.iter().map(|s| s.1).max(),
        ) else {
            continue;
        };
        buffers.push(BufferSpec {
            start,
            end,
            size: round_up(group.bytes, align),
            align,
        });
        owners.push(Owner::Group(g));
    }
    for (n, node) in graph.nodes().iter().enumerate() {
        for (i, &w) in node.workspaces.iter().enumerate() {
            buffers.push(BufferSpec {
                start: n as u32,
                end: n as u32 + 1,
                size: round_up(w, align),
                align,
            });
            owners.push(Owner::Workspace(n, i));
        }
    }
    let mut layout = ArenaLayout {
        tensor_offsets: vec![0; graph.tensors().len()],
        workspace_offsets: graph
            .nodes()
            .iter()
            .map(|n| vec![0; n.workspaces.len()])
            .collect(),
        size: 0,
        lower_bound: 0,
    };
    if buffers.is_empty() {
        return Ok(layout);
    }
    let problem = ArenaProblem {
        buffers,
        groups: Vec::new(),
    };
    layout.lower_bound = arena::lower_bound(&problem);
    let placement = if search_time.is_zero() {
        arena::plan_greedy(&problem)
    } else {
        arena::plan_search(&problem, search_time, None)
    }
    .map_err(|e| format!("{e:?}"))?;
    arena::check_placement(&problem, &placement)?;
    for (owner, &offset) in owners.iter().zip(&placement.offsets) {
        match *owner {
            Owner::Tensor(t) => layout.tensor_offsets[t] = offset,
            Owner::Workspace(n, i) => layout.workspace_offsets[n][i] = offset,
            Owner::Group(g) => {
                let group = &graph.fused_groups()[g];
                for (&t, &at) in group.members.iter().zip(&group.offsets) {
                    layout.tensor_offsets[t as usize] = offset + at;
                }
            }
        }
    }
    layout.size = placement.size;
    Ok(layout)
}
