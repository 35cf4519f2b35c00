//! The smallest memory limit a graph can run under in dynamic mode, with swapping and the
//! executor's fallback: every node needs its own inputs, outputs and workspaces on the device at
//! once (each rounded to the allocation granule, a tensor read twice counted once); everything
//! else — persistent tensors, intermediates not used by the node — can wait on the host (or be
//! rebuilt by a recompute). So the limit is the largest such sum over the nodes. Below it some
//! node cannot run; at it, the swap plan and the fallback (which, with only the node's own
//! tensors left, returns their blocks and takes them again largest first from exact-size
//! segments) run every node. Pool rounding beyond the granule (segments, pages) is not counted:
//! the pool takes exact-size segments when the budget is tight.
//!
//! With collectives (`min_memory_limit_held`), the tensors a collective or a fused block holds
//! on the device at a node (`swap_holds.rs`: they cannot wait on the host) count at that node
//! too, a fused block once, whole.

use crate::graph::liveness::round_up;
use crate::graph::{FusedGroup, Liveness, Node, Tensor};
use crate::plan::swap_holds::CommHolds;

/// Bytes node `node` needs on the device while it runs.
pub fn node_own_bytes(tensors: &[Tensor], node: &Node, align: u64) -> u64 {
    let tensor_bytes: u64 = super::swap::node_tensors(node)
        .iter()
        .map(|&t| round_up(tensors[t as usize].size, align))
        .sum();
    tensor_bytes
        + node
            .workspaces
            .iter()
            .map(|&w| round_up(w, align))
            .sum::<u64>()
}

/// The smallest memory limit under which every node of the graph can run (0 without nodes).
pub fn min_memory_limit(tensors: &[Tensor], nodes: &[Node], align: u64) -> u64 {
    nodes
        .iter()
        .map(|n| node_own_bytes(tensors, n, align))
        .max()
        .unwrap_or(0)
}

/// `min_memory_limit` of a finalized graph whose collectives hold tensors on the device.
pub fn min_memory_limit_held(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    fused: &[FusedGroup],
    align: u64,
) -> u64 {
    let holds = CommHolds::new(tensors.len(), nodes, lv, fused);
    let held: Vec<u32> = (0..tensors.len() as u32)
        .filter(|&t| holds.held(t))
        .collect();
    if held.is_empty() {
        return min_memory_limit(tensors, nodes, align);
    }
    let mut largest = 0;
    for (n, node) in nodes.iter().enumerate() {
        let mut at_n = super::swap::node_tensors(node);
        at_n.extend(
            held.iter()
                .copied()
                .filter(|&t| holds.pinned_at(t, n as u32)),
        );
        at_n.sort_unstable();
        at_n.dedup();
        let mut blocks = vec![false; fused.len()];
        let mut bytes: u64 = node.workspaces.iter().map(|&w| round_up(w, align)).sum();
        for t in at_n {
            match holds.block_of(t) {
                Some(b) if !std::mem::replace(&mut blocks[b as usize], true) => {
                    bytes += round_up(fused[b as usize].bytes, align)
                }
                Some(_) => {}
                None => bytes += round_up(tensors[t as usize].size, align),
            }
        }
        largest = largest.max(bytes);
    }
    largest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Graph, TensorKind};
    use crate::kernels::{BuiltinKind, Kernel, LaunchDims};

    fn kernel(kind: BuiltinKind) -> Kernel {
        Kernel::Builtin(kind)
    }

    #[test]
    fn the_largest_node_counts_each_tensor_once_and_its_workspaces() {
        let mut g = Graph::new();
        let a = g.add_tensor(1000, TensorKind::Input, "a").unwrap(); // rounds to 1024
        let b = g.add_tensor(1000, TensorKind::Intermediate, "b").unwrap();
        let c = g.add_tensor(1000, TensorKind::Output, "c").unwrap();
        let big = g.add_tensor(1 << 20, TensorKind::Parameter, "big").unwrap();
        let d = LaunchDims {
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
        };
        // add(a, a) -> b: a counted once; 2 tensors.
        g.add_node(kernel(BuiltinKind::Add), &[a, a], &[b], &[], d, &[])
            .unwrap();
        // relu(b) -> c with a 5000-byte workspace (5120): 2 tensors + workspace.
        g.add_node(kernel(BuiltinKind::Relu), &[b], &[c], &[5000], d, &[])
            .unwrap();
        g.finalize(256).unwrap();
        let (t, n) = (g.tensors(), g.nodes());
        assert_eq!(node_own_bytes(t, &n[0], 256), 2048);
        assert_eq!(node_own_bytes(t, &n[1], 256), 2048 + 5120);
        // `big` is used by no node: it can wait on the host, and does not count.
        let _ = big;
        assert_eq!(min_memory_limit(t, n, 256), 7168);
        assert_eq!(min_memory_limit(t, &[], 256), 0);
    }
}
