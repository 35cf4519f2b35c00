//! Collective nodes in graphs on the host backend's communicator model (2 and 4 ranks as
//! threads, jitter on): results against a direct computation, the executor's pool calls equal
//! to the program's dry run (as `random_graphs/` checks for graphs without collectives), and
//! nothing left allocated after a run — with tensors freed while their collective may still run;
//! and the same graphs in planned mode (the arena holds a collective's tensors until its event).

mod common;
use common::*;

use gkrt::runtime::{
    BuiltinKind, CollectiveKind, Comm, DType, Kernel, MemoryMode, ReduceOp, Runtime, RuntimeGraph,
    TensorKind,
};
use std::sync::Arc;

const N: usize = 64;

fn input(rank: usize) -> Vec<f32> {
    (0..N).map(|i| (rank * 7 + i) as f32 * 0.25 - 5.0).collect()
}

/// Rank `rank`'s graph: two gradients all-reduced (one in place, one out of place, its input
/// freed while the collective may still read it), compute that overlaps them, and readers.
fn rank_graph(rt: &Arc<Runtime>, comm: &Comm) -> (RuntimeGraph, u64, [u64; 3]) {
    let mut g = RuntimeGraph::new(Arc::clone(rt));
    let t = |g: &mut RuntimeGraph, kind| g.add_tensor((N * 4) as u64, kind, "").unwrap();
    let x = t(&mut g, TensorKind::Input);
    let (h, g2, s, a) = (
        t(&mut g, TensorKind::Intermediate),
        t(&mut g, TensorKind::Intermediate),
        t(&mut g, TensorKind::Intermediate),
        t(&mut g, TensorKind::Intermediate),
    );
    let (y, z, out2) = (
        t(&mut g, TensorKind::Output),
        t(&mut g, TensorKind::Output),
        t(&mut g, TensorKind::Output),
    );
    let two = 2.0f32.to_ne_bytes();
    let three = 3.0f32.to_ne_bytes();
    let b = |k| Kernel::Builtin(k);
    let graph = &mut g.graph;
    graph
        .add_node(b(BuiltinKind::Scale), &[x], &[h], &[], DIMS, &two)
        .unwrap();
    graph
        .add_node(b(BuiltinKind::Scale), &[x], &[g2], &[], DIMS, &three)
        .unwrap();
    g.add_collective(
        comm,
        CollectiveKind::AllReduce(ReduceOp::Sum),
        DType::F32,
        &[h],
        &[h],
    )
    .unwrap();
    g.add_collective(
        comm,
        CollectiveKind::AllReduce(ReduceOp::Max),
        DType::F32,
        &[g2],
        &[s],
    )
    .unwrap();
    let graph = &mut g.graph;
    // Independent of both collectives: overlaps them.
    graph
        .add_node(b(BuiltinKind::Relu), &[x], &[a], &[], DIMS, &[])
        .unwrap();
    graph
        .add_node(b(BuiltinKind::Scale), &[a], &[z], &[], DIMS, &two)
        .unwrap();
    // Readers of the results.
    graph
        .add_node(b(BuiltinKind::Relu), &[h], &[y], &[], DIMS, &[])
        .unwrap();
    graph
        .add_node(b(BuiltinKind::Copy), &[s], &[out2], &[], DIMS, &[])
        .unwrap();
    g.finalize().unwrap();
    (g, x, [y, z, out2])
}

fn ranks(n: usize, mode: MemoryMode) {
    let id = runtime(mode).comm_unique_id().unwrap();
    std::thread::scope(|scope| {
        for r in 0..n {
            scope.spawn(move || {
                let rt = runtime(mode);
                let comm =
                    Comm::init_rank(Arc::clone(&rt), &id, r as u32, n as u32, 20_000).unwrap();
                let (mut g, x, [y, z, out2]) = rank_graph(&rt, &comm);
                g.record_pool_calls(true);
                g.write(x, &bytes(&input(r))).unwrap();
                for run in 0..3 {
                    g.run().unwrap();
                    // Persistent tensors get their blocks at the host's write or their first run
                    // (the dry run of a graph that does not swap starts with none): compare the
                    // intermediates' calls, in order.
                    let ran = common::transient_calls(&g, g.last_pool_calls().unwrap());
                    // Planned mode: the intermediates live in the arena (no pool calls).
                    let want = if mode == MemoryMode::Planned { 0 } else { 8 };
                    assert_eq!(
                        ran.len(),
                        want,
                        "rank {r}: four intermediates, each allocated and freed"
                    );
                    assert_eq!(g.is_planned(), mode == MemoryMode::Planned);
                    assert_eq!(
                        ran,
                        common::transient_calls(&g, &g.planned_pool_calls()),
                        "rank {r}, run {run}: the executor's pool calls differ from the dry run's"
                    );
                    assert_eq!(
                        rt.stats().unwrap().pool.allocated_bytes,
                        g.resident_bytes(),
                        "rank {r}, run {run}: a transient buffer outlived the run"
                    );
                    let read = |g: &mut RuntimeGraph, t| {
                        let mut out = vec![0u8; N * 4];
                        g.read(t, &mut out).unwrap();
                        floats(&out)
                    };
                    let (got_y, got_z, got_2) =
                        (read(&mut g, y), read(&mut g, z), read(&mut g, out2));
                    for i in 0..N {
                        let mut sum = 0.0f32;
                        let mut max = f32::NEG_INFINITY;
                        for k in 0..n {
                            sum += input(k)[i] * 2.0;
                            max = max.max(input(k)[i] * 3.0);
                        }
                        assert_eq!(
                            got_y[i],
                            sum.max(0.0),
                            "rank {r}: relu(all-reduce sum) at {i}"
                        );
                        assert_eq!(got_2[i], max, "rank {r}: all-reduce max at {i}");
                        assert_eq!(
                            got_z[i],
                            input(r)[i].max(0.0) * 2.0,
                            "rank {r}: overlapping node at {i}"
                        );
                    }
                }
                drop(g);
                assert_eq!(rt.stats().unwrap().pool.allocated_bytes, 0);
            });
        }
    });
}

#[test]
fn two_ranks_match_the_direct_computation_and_the_dry_run() {
    ranks(2, MemoryMode::Dynamic);
}

#[test]
fn two_ranks_planned_match_the_direct_computation() {
    ranks(2, MemoryMode::Planned);
}

#[test]
fn four_ranks_planned_match_the_direct_computation() {
    ranks(4, MemoryMode::Planned);
}

#[test]
fn four_ranks_match_the_direct_computation_and_the_dry_run() {
    ranks(4, MemoryMode::Dynamic);
}
