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
                    // Only ever waited for and queried: untimed.
                    self.collective_events[n] = Some(device.create_sync_event()?);
                }
            }
        }
        Ok(())
    }

    /// The graph's communicators, each once.
    pub(super) fn communicators(
        &self,
    ) -> Vec<std::sync::Arc<dyn crate::device::comm::Communicator>> {
        let mut out: Vec<std::sync::Arc<dyn crate::device::comm::Communicator>> = Vec::new();
        for comm in self.graph.nodes().iter().filter_map(|n| n.comm.as_ref()) {
            if !out.iter().any(|c| std::sync::Arc::ptr_eq(c, &comm.0)) {
                out.push(std::sync::Arc::clone(&comm.0));
            }
        }
        out
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

    /// The tests' graph, f32 tensors of `bytes` each: h = 2x, s = all-reduce(h) with `op`, then
    /// a = relu(x) (overlapping the collective), z = a, y = 3s. Returns [x, h, s, a, y, z].
    fn overlapped_all_reduce(
        g: &mut RuntimeGraph,
        comm: &Comm,
        bytes: u64,
        op: ReduceOp,
    ) -> [u64; 6] {
        let mut t = |kind| g.add_tensor(bytes, kind, "").unwrap();
        let x = t(TensorKind::Input);
        let (h, s, a) = (
            t(TensorKind::Intermediate),
            t(TensorKind::Intermediate),
            t(TensorKind::Intermediate),
        );
        let (y, z) = (t(TensorKind::Output), t(TensorKind::Output));
        let b = |k| Kernel::Builtin(k);
        let scale = |by: f32| by.to_ne_bytes();
        g.graph
            .add_node(b(BuiltinKind::Scale), &[x], &[h], &[], DIMS, &scale(2.0))
            .unwrap();
        g.add_collective(comm, CollectiveKind::AllReduce(op), DType::F32, &[h], &[s])
            .unwrap();
        g.graph
            .add_node(b(BuiltinKind::Relu), &[x], &[a], &[], DIMS, &[])
            .unwrap();
        g.graph
            .add_node(b(BuiltinKind::Copy), &[a], &[z], &[], DIMS, &[])
            .unwrap();
        g.graph
            .add_node(b(BuiltinKind::Scale), &[s], &[y], &[], DIMS, &scale(3.0))
            .unwrap();
        [x, h, s, a, y, z]
    }

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
        let [_, h, s, a, _, _] = overlapped_all_reduce(&mut g, &comm, 4096, ReduceOp::Sum);
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

    /// On CUDA with NCCL (one rank): a planned graph with an out-of-place all-reduce (average)
    /// between kernels is captured at its second run and replayed after, the replay including
    /// the collective: every run computes on the input written before it (a replay that skipped
    /// the collective would leave the output of the last non-replayed run). After an abort of
    /// its communicator a replay is refused with PeerFailed instead of running NCCL kernels of
    /// a freed communicator.
    #[test]
    #[ignore = "needs a CUDA GPU and libnccl"]
    fn gpu_nccl_planned_graph_captures_its_all_reduce() {
        use crate::runtime::{Error, MemoryMode};
        let rt = Runtime::new(Config {
            device: DeviceChoice::Cuda,
            memory_mode: MemoryMode::Planned,
            ..Config::default()
        })
        .unwrap();
        let id = rt.comm_unique_id().unwrap();
        let comm = Comm::init_rank(Arc::clone(&rt), &id, 0, 1, 20_000).unwrap();
        const N: usize = 4096;
        let mut g = RuntimeGraph::new(Arc::clone(&rt));
        let [x, _, _, _, y, z] =
            overlapped_all_reduce(&mut g, &comm, (N * 4) as u64, ReduceOp::Avg);
        g.finalize().unwrap();
        assert!(g.is_planned());
        let runs = 6;
        for run in 0..runs {
            let input: Vec<f32> = (0..N)
                .map(|i| (i % 97) as f32 * 0.5 - 20.0 + run as f32)
                .collect();
            let raw: Vec<u8> = input.iter().flat_map(|v| v.to_ne_bytes()).collect();
            g.write(x, &raw).unwrap();
            g.run().unwrap();
            let mut out = vec![0u8; N * 4];
            let read = |g: &mut RuntimeGraph, t, out: &mut Vec<u8>| -> Vec<f32> {
                g.read(t, out).unwrap();
                out.chunks_exact(4)
                    .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                    .collect()
            };
            let (got_y, got_z) = (read(&mut g, y, &mut out), read(&mut g, z, &mut out));
            for i in 0..N {
                // One rank: the average is the input (2x, exactly).
                assert_eq!(got_y[i], input[i] * 2.0 * 3.0, "run {run}, y[{i}]");
                assert_eq!(got_z[i], input[i].max(0.0), "run {run}, z[{i}]");
            }
        }
        // The first run is the ordinary one; the second captures and replays; the rest replay.
        assert_eq!(
            g.replays(),
            runs - 1,
            "the planned graph with an all-reduce was not replayed"
        );
        comm.abort("the test aborts it");
        match g.run() {
            Err(Error::PeerFailed(m)) => assert!(m.contains("aborted"), "{m}"),
            other => panic!("a replay after an abort: {other:?}"),
        }
        drop(g);
        drop(comm);
    }
}
