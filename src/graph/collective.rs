//! Collective nodes: a collective (all-reduce, all-gather, reduce-scatter, broadcast, reduce,
//! send, receive) over a communicator, as a node of the graph. Its element count follows from
//! its tensors' sizes, checked here against NCCL's buffer rules (`kernels::collective`).
//!
//! Each collective node has one input and one output tensor (the same one for in place), a send
//! only an input, a receive only an output. An all-reduce, broadcast or reduce may take several
//! inputs and as many outputs (pairwise of equal size): they are fused into one contiguous block
//! each, in the order given (`fused.rs`), and one call covers them all. All-gather and
//! reduce-scatter take one of each: over a fused block their results would interleave the ranks'
//! members instead of matching the outputs one for one.

use super::{invalid, Graph, GraphResult, LaunchDims, Node};
use crate::device::comm::Communicator;
use crate::kernels::collective::{CollectiveKind, DType};
use crate::kernels::Kernel;
use std::sync::Arc;

/// A node's communicator; the graph keeps it alive.
#[derive(Clone)]
pub struct CommRef(pub Arc<dyn Communicator>);

impl std::fmt::Debug for CommRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "comm(rank {} of {})", self.0.rank(), self.0.nranks())
    }
}

impl Graph {
    /// Adds a collective node over `comm`; returns its index.
    pub fn add_collective(
        &mut self,
        comm: Arc<dyn Communicator>,
        kind: CollectiveKind,
        dtype: DType,
        input_ids: &[u64],
        output_ids: &[u64],
    ) -> GraphResult<u32> {
        let node = self.nodes.len() as u32;
        let kernel = Kernel::Collective { kind, dtype };
        let what = || format!("node {node} ({})", kernel.describe());
        let fusable = matches!(
            kind,
            CollectiveKind::AllReduce(_)
                | CollectiveKind::Broadcast { .. }
                | CollectiveKind::Reduce { .. }
        );
        let (want_in, want_out) = match kind {
            CollectiveKind::Send { .. } => (1, 0),
            CollectiveKind::Recv { .. } => (0, 1),
            _ if fusable && input_ids.len() > 1 => (input_ids.len(), input_ids.len()),
            _ => (1, 1),
        };
        if input_ids.len() > 1 && !fusable {
            return invalid(format!(
                "{}: {} inputs; only all-reduce, broadcast and reduce fuse several tensors (an \
                 all-gather or reduce-scatter over a fused block would interleave the ranks' \
                 tensors): give each its own node",
                what(),
                input_ids.len()
            ));
        }
        if input_ids.len() != want_in || output_ids.len() != want_out {
            return invalid(format!(
                "{}: takes {want_in} input(s) and {want_out} output(s), got {} and {}",
                what(),
                input_ids.len(),
                output_ids.len()
            ));
        }
        let (rank, nranks) = (comm.rank(), comm.nranks());
        let probe = crate::kernels::collective::Collective {
            kind,
            dtype,
            count: 0,
            send: 0,
            recv: 0,
            node,
        };
        probe
            .check_ranks(rank, nranks)
            .map_err(|e| super::GraphError::Invalid(format!("{}: {e}", what())))?;
        // The count: from the input (the output for a receive), which must hold whole elements.
        let size_of = |id: u64| -> GraphResult<u64> {
            let t = self
                .tensor_index(id)
                .map_err(|e| super::GraphError::Invalid(format!("{}: {e}", what())))?;
            Ok(self.tensors[t as usize].size)
        };
        let elem = dtype.size();
        let fused = input_ids.len() > 1;
        if fused {
            for (i, (&a, &b)) in input_ids.iter().zip(output_ids).enumerate() {
                let (ia, ib) = (size_of(a)?, size_of(b)?);
                if !ia.is_multiple_of(elem) || ia != ib {
                    return invalid(format!(
                        "{}: fused pair {i} has an input of {ia} bytes and an output of {ib} bytes; \
                         each pair must be equal and a whole number of {} elements ({elem} bytes each)",
                        what(),
                        dtype.name()
                    ));
                }
            }
        }
        let (count_from, bytes) = match input_ids.first() {
            Some(_) => (
                "input",
                input_ids
                    .iter()
                    .map(|&id| size_of(id))
                    .sum::<GraphResult<u64>>()?,
            ),
            None => ("output", size_of(output_ids[0])?),
        };
        if !bytes.is_multiple_of(elem) {
            return invalid(format!(
                "{}: its {count_from} of {bytes} bytes is not a whole number of {} elements ({elem} bytes each)",
                what(),
                dtype.name()
            ));
        }
        let elems = bytes / elem;
        let count = match (kind, count_from) {
            (CollectiveKind::ReduceScatter(_), "input") => {
                if !elems.is_multiple_of(nranks as u64) {
                    return invalid(format!(
                        "{}: its input of {elems} elements does not split into {nranks} equal parts",
                        what()
                    ));
                }
                elems / nranks as u64
            }
            _ => elems,
        };
        let call = crate::kernels::collective::Collective { count, ..probe };
        if let Some(&out) = output_ids.first().filter(|_| !fused) {
            let want = call.recv_elems(nranks) * elem;
            let got = size_of(out)?;
            if got != want {
                return invalid(format!(
                    "{}: its output has {got} bytes; {count} {} elements per rank over {nranks} ranks need {want}",
                    what(),
                    dtype.name()
                ));
            }
            let in_place = input_ids.first() == Some(&out);
            if in_place
                && matches!(
                    kind,
                    CollectiveKind::AllGather | CollectiveKind::ReduceScatter(_)
                )
            {
                return invalid(format!(
                    "{}: the input and output are one tensor; in place is for all-reduce, broadcast and reduce",
                    what()
                ));
            }
        }
        // The fused blocks: one when in place (the same tensors in the same order), else one
        // for the inputs and one for the outputs.
        let mut groups = Vec::new();
        if fused {
            let resolve = |ids: &[u64]| -> GraphResult<Vec<u32>> {
                ids.iter()
                    .map(|&id| {
                        self.tensor_index(id)
                            .map_err(|e| super::GraphError::Invalid(format!("{}: {e}", what())))
                    })
                    .collect()
            };
            let (ins, outs) = (resolve(input_ids)?, resolve(output_ids)?);
            groups.push(self.fused_group(node, &ins, &what())?);
            if ins != outs {
                if let Some(&t) = outs.iter().find(|t| ins.contains(t)) {
                    return invalid(format!(
                        "{}: {} is both a fused input and a fused output, but the outputs are \
                         not the inputs in the same order (in place) nor disjoint from them",
                        what(),
                        self.tensors[t as usize].describe(t)
                    ));
                }
                groups.push(self.fused_group(node, &outs, &what())?);
            }
        }
        let index = self.add_node(
            kernel,
            input_ids,
            output_ids,
            &[],
            LaunchDims {
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
            },
            &[],
        )?;
        self.nodes[index as usize].comm = Some(CommRef(comm));
        self.fused.extend(groups);
        Ok(index)
    }

    /// Per tensor: the node index before which a collective may still read or write it (0:
    /// none) — the first later kernel node touching any of that collective's tensors, where the
    /// compute stream waits for its event (the program's `AwaitCollective`), or the node count
    /// when none does (the run waits for the communication stream at its end). Memory that
    /// compute work reuses (the planned arena) must hold those tensors until then.
    pub fn collective_holds(&self) -> Vec<u32> {
        let mut hold = vec![0u32; self.tensors.len()];
        for (c, node) in self.nodes.iter().enumerate() {
            if node.comm.is_none() {
                continue;
            }
            let touched: Vec<u32> = node.inputs.iter().chain(&node.outputs).copied().collect();
            let until = completion_node(&self.nodes, c, &touched);
            for t in touched {
                hold[t as usize] = hold[t as usize].max(until);
            }
        }
        hold
    }

    /// True when any node is a collective.
    pub fn has_collectives(&self) -> bool {
        self.nodes.iter().any(|n| n.comm.is_some())
    }

    /// The element count of collective node `n` (per rank, with NCCL's meaning).
    pub fn collective_call(&self, n: u32) -> crate::kernels::collective::Collective {
        let node = &self.nodes[n as usize];
        let Kernel::Collective { kind, dtype } = node.kernel else {
            panic!("node {n} is not a collective");
        };
        let nranks = node
            .comm
            .as_ref()
            .expect("a collective has a comm")
            .0
            .nranks() as u64;
        let count = match node.inputs.first() {
            Some(_) => {
                let bytes: u64 = node
                    .inputs
                    .iter()
                    .map(|&t| self.tensors[t as usize].size)
                    .sum();
                let elems = bytes / dtype.size();
                match kind {
                    CollectiveKind::ReduceScatter(_) => elems / nranks,
                    _ => elems,
                }
            }
            None => self.tensors[node.outputs[0] as usize].size / dtype.size(),
        };
        crate::kernels::collective::Collective {
            kind,
            dtype,
            count,
            send: 0,
            recv: 0,
            node: n,
        }
    }
}

/// The node before which the compute stream waits for collective `c` (the first later
/// non-collective node touching one of `touched`, as the step program emits the wait), or the
/// node count: the run's end.
pub fn completion_node(nodes: &[Node], c: usize, touched: &[u32]) -> u32 {
    nodes[c + 1..]
        .iter()
        .position(|later| {
            later.comm.is_none()
                && later
                    .inputs
                    .iter()
                    .chain(&later.outputs)
                    .any(|t| touched.contains(t))
        })
        .map_or(nodes.len(), |i| c + 1 + i) as u32
}
