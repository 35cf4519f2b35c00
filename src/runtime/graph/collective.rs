//! Collective nodes of a graph bound to its runtime: adding them (the communicator must be of
//! the same runtime), the per-node events their runs record, and what a failed run does to
//! their communicators (aborts them, so that the other ranks fail instead of waiting).

use super::RuntimeGraph;
use crate::device::comm::CollectiveKind;
use crate::kernels::collective::DType;
use crate::runtime::{Comm, Error, Result};
use std::sync::Arc;

impl RuntimeGraph {
    /// Adds a collective node over `comm` (a communicator of this graph's runtime); returns the
    /// node's index.
    pub fn add_collective(
        &mut self,
        comm: &Comm,
        kind: CollectiveKind,
        dtype: DType,
        inputs: &[u64],
        outputs: &[u64],
    ) -> Result<u32> {
        if !Arc::ptr_eq(comm.runtime(), &self.runtime) {
            return Err(Error::InvalidArgument(
                "the communicator belongs to another runtime than the graph".into(),
            ));
        }
        Ok(self.graph.add_collective(
            Arc::clone(comm.communicator()),
            kind,
            dtype,
            inputs,
            outputs,
        )?)
    }

    /// Sets how consecutive all-reduces are fused into buckets at finalize: the first bucket
    /// holds at most `first_bytes`, later ones `bucket_bytes`; `bucket_bytes == 0` turns fusion
    /// off. The defaults are PyTorch DDP's: 1 MiB, then 25 MiB. Every rank must use the same.
    pub fn set_collective_buckets(&mut self, first_bytes: u64, bucket_bytes: u64) -> Result<()> {
        if self.graph.is_finalized() {
            return Err(Error::InvalidState(
                "the graph is finalized already; bucket sizes apply at finalize".into(),
            ));
        }
        self.bucket_bytes = (first_bytes, bucket_bytes);
        Ok(())
    }

    /// The collective calls one run issues (after fusion by size; the first run's digest
    /// exchange not counted).
    pub fn collective_calls(&self) -> usize {
        self.program
            .steps
            .iter()
            .filter(|s| matches!(s, crate::plan::program::Step::Collective(_)))
            .count()
    }

    /// One event per collective node, made at finalize.
    pub(super) fn make_collective_events(&mut self) -> Result<()> {
        let device = self.runtime.device();
        for (n, node) in self.graph.nodes().iter().enumerate() {
            if node.comm.is_some() {
                if self.collective_events.len() <= n {
                    self.collective_events.resize(n + 1, None);
                }
                if self.collective_events[n].is_none() {
                    self.collective_events[n] = Some(device.create_event()?);
                }
            }
        }
        Ok(())
    }

    /// After a failed run: every communicator of the graph is aborted, so that ranks waiting
    /// for this one's collectives fail with `PeerFailed` instead of waiting for their timeout.
    pub(super) fn abort_communicators(&self, why: &Error) {
        for node in self.graph.nodes() {
            if let Some(comm) = &node.comm {
                if comm.0.aborted().is_none() {
                    comm.0.abort(&format!("its run failed: {why}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::TensorKind;
    use crate::kernels::collective::{CollectiveKind, DType, ReduceOp};
    use crate::kernels::{BuiltinKind, Kernel};
    use crate::runtime::{Comm, Config, DeviceChoice, LaunchDims, Runtime, RuntimeGraph};
    use std::sync::Arc;

    const DIMS: LaunchDims = LaunchDims {
        grid: [1; 3],
        block: [1; 3],
        shared_mem_bytes: 0,
    };

    /// The planned arena holds an out-of-place collective's input until the compute stream
    /// waits for the collective (here: the last node), not only until the collective node:
    /// the node right after it, which overlaps the collective, must not get its memory.
    #[test]
    fn the_arena_holds_a_collectives_tensors_until_its_event() {
        let rt = Runtime::new(Config {
            device: DeviceChoice::Host,
            ..Config::default()
        })
        .unwrap();
        let id = rt.comm_unique_id().unwrap();
        let comm = Comm::init_rank(Arc::clone(&rt), &id, 0, 1, 1_000).unwrap();
        let mut g = RuntimeGraph::new(Arc::clone(&rt));
        let t = |g: &mut RuntimeGraph, kind| g.add_tensor(4096, kind, "").unwrap();
        let x = t(&mut g, TensorKind::Input);
        let (h, s, a) = (
            t(&mut g, TensorKind::Intermediate),
            t(&mut g, TensorKind::Intermediate),
            t(&mut g, TensorKind::Intermediate),
        );
        let (z, y) = (t(&mut g, TensorKind::Output), t(&mut g, TensorKind::Output));
        let b = |k| Kernel::Builtin(k);
        let one = 1.0f32.to_ne_bytes();
        g.graph
            .add_node(b(BuiltinKind::Scale), &[x], &[h], &[], DIMS, &one)
            .unwrap();
        g.add_collective(
            &comm,
            CollectiveKind::AllReduce(ReduceOp::Sum),
            DType::F32,
            &[h],
            &[s],
        )
        .unwrap();
        g.graph
            .add_node(b(BuiltinKind::Relu), &[x], &[a], &[], DIMS, &[])
            .unwrap();
        g.graph
            .add_node(b(BuiltinKind::Copy), &[a], &[z], &[], DIMS, &[])
            .unwrap();
        g.graph
            .add_node(b(BuiltinKind::Copy), &[s], &[y], &[], DIMS, &[])
            .unwrap();
        g.graph.finalize(256).unwrap();
        let index = |id| g.graph.tensor_index(id).unwrap() as usize;
        let (h, s, a) = (index(h), index(s), index(a));
        assert_eq!(
            g.graph.collective_holds()[h],
            4,
            "h is held until node 4 waits"
        );
        let layout =
            crate::plan::plan_graph_arena(&g.graph, 256, std::time::Duration::ZERO).unwrap();
        let range = |t: usize| layout.tensor_offsets[t]..layout.tensor_offsets[t] + 4096;
        for other in [s, h] {
            let (r, ra) = (range(other), range(a));
            assert!(
                r.end <= ra.start || ra.end <= r.start,
                "node 2's output {ra:?} overlaps the collective's tensor {r:?}"
            );
        }
    }
}
