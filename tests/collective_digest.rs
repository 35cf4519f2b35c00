//! The first run's consistency check of the ranks' collective sequences (host model, 2 and 4
//! ranks as threads): a rank whose graph differs makes every rank's first run fail at once with
//! `PeerFailed`, naming the first collective that differs by node, before any real collective
//! runs; nothing leaks and each runtime stays usable.

mod common;
use common::*;

use gkrt::runtime::{
    BuiltinKind, CollectiveKind, Comm, DType, Error, Kernel, MemoryMode, ReduceOp, Runtime,
    RuntimeGraph, TensorKind,
};
use std::sync::Arc;
use std::time::Instant;

/// Two all-reduces (named "first", "second"); `odd` makes the second reduce with max instead
/// of sum (same sizes: only the digest tells the ranks apart before the call itself).
fn graph(rt: &Arc<Runtime>, comm: &Comm, odd: bool) -> (RuntimeGraph, u64) {
    let mut g = RuntimeGraph::new(Arc::clone(rt));
    let x = g.add_tensor(64, TensorKind::Input, "x").unwrap();
    let (a, b) = (
        g.add_tensor(64, TensorKind::Intermediate, "a").unwrap(),
        g.add_tensor(64, TensorKind::Output, "b").unwrap(),
    );
    let c = g.add_tensor(64, TensorKind::Output, "c").unwrap();
    g.graph
        .add_node(
            Kernel::Builtin(BuiltinKind::Copy),
            &[x],
            &[a],
            &[],
            DIMS,
            &[],
        )
        .unwrap();
    g.add_collective(
        comm,
        CollectiveKind::AllReduce(ReduceOp::Sum),
        DType::F32,
        &[a],
        &[b],
    )
    .unwrap();
    let op = if odd { ReduceOp::Max } else { ReduceOp::Sum };
    let second = g
        .add_collective(comm, CollectiveKind::AllReduce(op), DType::F32, &[b], &[c])
        .unwrap();
    g.graph.set_node_name(second, "second").unwrap();
    g.finalize().unwrap();
    (g, x)
}

fn mismatch(n: usize) {
    let id = runtime(MemoryMode::Dynamic).comm_unique_id().unwrap();
    std::thread::scope(|scope| {
        for r in 0..n {
            scope.spawn(move || {
                let rt = runtime(MemoryMode::Dynamic);
                let comm =
                    Comm::init_rank(Arc::clone(&rt), &id, r as u32, n as u32, 20_000).unwrap();
                let (mut g, x) = graph(&rt, &comm, r == n - 1);
                g.write(x, &[0u8; 64]).unwrap();
                let start = Instant::now();
                let err = g.run().unwrap_err();
                assert!(
                    start.elapsed().as_secs() < 10,
                    "rank {r} waited for its timeout"
                );
                let Error::PeerFailed(m) = &err else {
                    panic!("rank {r}: {err:?}");
                };
                assert!(m.contains("issue different collectives"), "rank {r}: {m}");
                assert!(
                    m.contains("collective 1 on the communicator"),
                    "rank {r}: {m}"
                );
                assert!(m.contains("node 2 'second'"), "rank {r}: {m}");
                assert!(
                    m.contains("its node 2 is a different collective"),
                    "rank {r}: {m}"
                );
                let mine = if r == n - 1 {
                    "AllReduce(Max)"
                } else {
                    "AllReduce(Sum)"
                };
                assert!(m.contains(mine), "rank {r}: {m}");
                drop(g);
                drop(comm);
                assert_eq!(rt.stats().unwrap().pool.allocated_bytes, 0, "rank {r}");
                // The runtime stays usable: a graph without collectives runs.
                let mut h = RuntimeGraph::new(Arc::clone(&rt));
                let (i, o) = (
                    h.add_tensor(16, TensorKind::Input, "").unwrap(),
                    h.add_tensor(16, TensorKind::Output, "").unwrap(),
                );
                h.graph
                    .add_node(
                        Kernel::Builtin(BuiltinKind::Copy),
                        &[i],
                        &[o],
                        &[],
                        DIMS,
                        &[],
                    )
                    .unwrap();
                h.finalize().unwrap();
                h.write(i, &[1u8; 16]).unwrap();
                h.run().unwrap();
            });
        }
    });
}

#[test]
fn two_ranks_mismatch_names_the_node() {
    mismatch(2);
}

#[test]
fn four_ranks_mismatch_names_the_node() {
    mismatch(4);
}

/// Matching graphs (3 ranks) pass the check and run, again and again.
#[test]
fn matching_ranks_pass_and_check_once() {
    let n = 3;
    let id = runtime(MemoryMode::Dynamic).comm_unique_id().unwrap();
    std::thread::scope(|scope| {
        for r in 0..n {
            scope.spawn(move || {
                let rt = runtime(MemoryMode::Dynamic);
                let comm =
                    Comm::init_rank(Arc::clone(&rt), &id, r as u32, n as u32, 20_000).unwrap();
                let (mut g, x) = graph(&rt, &comm, false);
                g.write(x, &[0u8; 64]).unwrap();
                for _ in 0..3 {
                    g.run().unwrap();
                }
            });
        }
    });
}
