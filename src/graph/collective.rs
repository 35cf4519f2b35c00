//! Collective nodes: a collective (all-reduce, all-gather, reduce-scatter, broadcast, reduce,
//! send, receive) over a communicator, as a node of the graph. Its element count follows from
//! its tensors' sizes, checked here against NCCL's buffer rules (`kernels::collective`).
//!
//! Each collective node has one input and one output tensor (the same one for in place), a send
//! only an input, a receive only an output. Several inputs fused into one contiguous block are
//! not supported yet: such a node is refused with a message saying so.

use super::{invalid, Graph, GraphResult, LaunchDims};
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
        let (want_in, want_out) = match kind {
            CollectiveKind::Send { .. } => (1, 0),
            CollectiveKind::Recv { .. } => (0, 1),
            _ => (1, 1),
        };
        if input_ids.len() > 1 && want_in == 1 {
            return invalid(format!(
                "{}: {} inputs; fusing several tensors into one collective is not supported yet (give each its own node)",
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
        let (count_from, bytes) = match input_ids.first() {
            Some(&id) => ("input", size_of(id)?),
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
        if let Some(&out) = output_ids.first() {
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
        Ok(index)
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
            Some(&t) => {
                let elems = self.tensors[t as usize].size / dtype.size();
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
