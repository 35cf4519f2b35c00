//! Fusion by size at finalize (host model, 2 and 4 ranks as threads, jitter on): consecutive
//! in-place all-reduces of gradients, each produced right before its own all-reduce (as in a
//! backward pass), are fused into buckets — the first at most `first` bytes, later ones at most
//! `cap` — so a run issues fewer collective calls; the results are those of the unfused graph
//! and of a direct computation, the pool calls those of the dry run, in both memory modes.

mod common;
use common::*;

use gkrt::runtime::{
    BuiltinKind, CollectiveKind, Comm, DType, Kernel, MemoryMode, ReduceOp, Runtime, RuntimeGraph,
    TensorKind,
};
use std::sync::Arc;

/// Gradient sizes in f32 elements (bytes: 256, 128, 512, 256, 256, 128).
const GRADS: [usize; 6] = [64, 32, 128, 64, 64, 32];

fn input(rank: usize, i: usize) -> Vec<f32> {
    (0..GRADS[i])
        .map(|e| (rank * 3 + i * 11 + e) as f32 * 0.125 - 4.0)
        .collect()
}

/// Per gradient: x_i (input) → g_i = 2·x_i → all-reduce(sum) in place; then out_i = copy(g_i).
/// With `reader`: a copy of g_reader right after its all-reduce (it must see the reduced value,
/// so the bucket closes there) into one more output. Returns the outputs: the finals in
/// gradient order, then the early copy.
fn graph(
    rt: &Arc<Runtime>,
    comm: &Comm,
    buckets: (u64, u64),
    reader: Option<usize>,
) -> (RuntimeGraph, Vec<u64>, Vec<u64>) {
    let mut g = RuntimeGraph::new(Arc::clone(rt));
    g.set_collective_buckets(buckets.0, buckets.1).unwrap();
    let t = |g: &mut RuntimeGraph, n: usize, kind, name: String| {
        g.add_tensor((n * 4) as u64, kind, &name).unwrap()
    };
    let mut xs = Vec::new();
    let mut grads = Vec::new();
    let mut outs = Vec::new();
    for (i, &n) in GRADS.iter().enumerate() {
        xs.push(t(&mut g, n, TensorKind::Input, format!("x{i}")));
        grads.push(t(&mut g, n, TensorKind::Intermediate, format!("g{i}")));
        outs.push(t(&mut g, n, TensorKind::Output, format!("out{i}")));
    }
    let copy = Kernel::Builtin(BuiltinKind::Copy);
    for i in 0..GRADS.len() {
        let two = 2.0f32.to_ne_bytes();
        g.graph
            .add_node(
                Kernel::Builtin(BuiltinKind::Scale),
                &[xs[i]],
                &[grads[i]],
                &[],
                DIMS,
                &two,
            )
            .unwrap();
        let sum = CollectiveKind::AllReduce(ReduceOp::Sum);
        g.add_collective(comm, sum, DType::F32, &[grads[i]], &[grads[i]])
            .unwrap();
        if reader == Some(i) {
            let early = t(&mut g, GRADS[i], TensorKind::Output, "early".into());
            g.graph
                .add_node(copy.clone(), &[grads[i]], &[early], &[], DIMS, &[])
                .unwrap();
            outs.push(early);
        }
    }
    for i in 0..GRADS.len() {
        g.graph
            .add_node(copy.clone(), &[grads[i]], &[outs[i]], &[], DIMS, &[])
            .unwrap();
    }
    g.finalize().unwrap();
    (g, xs, outs)
}

fn ranks(n: usize, mode: MemoryMode, buckets: (u64, u64), reader: Option<usize>, calls: usize) {
    let id = runtime(mode).comm_unique_id().unwrap();
    std::thread::scope(|scope| {
        for r in 0..n {
            scope.spawn(move || {
                let rt = runtime(mode);
                let comm =
                    Comm::init_rank(Arc::clone(&rt), &id, r as u32, n as u32, 20_000).unwrap();
                let (mut g, xs, outs) = graph(&rt, &comm, buckets, reader);
                assert_eq!(
                    g.collective_calls(),
                    calls,
                    "rank {r}: collective calls per run"
                );
                g.record_pool_calls(true);
                for (i, &x) in xs.iter().enumerate() {
                    let v: Vec<u8> = input(r, i).iter().flat_map(|f| f.to_ne_bytes()).collect();
                    g.write(x, &v).unwrap();
                }
                for run in 0..2 {
                    g.run().unwrap();
                    for (k, &o) in outs.iter().enumerate() {
                        let i = if k < GRADS.len() { k } else { reader.unwrap() };
                        let mut b = vec![0u8; GRADS[i] * 4];
                        g.read(o, &mut b).unwrap();
                        for e in 0..GRADS[i] {
                            let got = f32::from_ne_bytes(b[e * 4..e * 4 + 4].try_into().unwrap());
                            let want: f32 = (0..n).map(|k| input(k, i)[e] * 2.0).sum();
                            assert_eq!(got, want, "rank {r}, run {run}: gradient {i} element {e}");
                        }
                    }
                    let ran = common::transient_calls(&g, g.last_pool_calls().unwrap());
                    assert_eq!(
                        ran,
                        common::transient_calls(&g, &g.planned_pool_calls()),
                        "rank {r}, run {run}"
                    );
                    assert_eq!(rt.stats().unwrap().pool.allocated_bytes, g.resident_bytes());
                }
            });
        }
    });
}

/// first 400 bytes: [g0, g1] (384); then 700: [g2] (g3 would make 768), [g3, g4, g5] (640).
const BUCKETS: (u64, u64) = (400, 700);

#[test]
fn two_ranks_buckets() {
    ranks(2, MemoryMode::Dynamic, BUCKETS, None, 3);
}

#[test]
fn four_ranks_buckets() {
    ranks(4, MemoryMode::Dynamic, BUCKETS, None, 3);
}

#[test]
fn four_ranks_buckets_planned() {
    ranks(4, MemoryMode::Planned, BUCKETS, None, 3);
}

#[test]
fn two_ranks_unfused() {
    ranks(2, MemoryMode::Dynamic, (400, 0), None, GRADS.len());
}

/// A reader of g4 right after its all-reduce closes the bucket there: [g0, g1], [g2], [g3, g4],
/// [g5]; the reader sees the reduced gradient.
#[test]
fn a_reader_closes_the_bucket() {
    ranks(2, MemoryMode::Dynamic, BUCKETS, Some(4), 4);
    ranks(4, MemoryMode::Planned, BUCKETS, Some(4), 4);
}

#[test]
fn default_buckets_take_all_six() {
    // 1.5 KiB of gradients fit DDP's first bucket of 1 MiB.
    ranks(2, MemoryMode::Dynamic, (1 << 20, 25 << 20), None, 1);
}

/// A traced run puts one slice per collective call on the communication track (tid 4), none for
/// the absorbed nodes, and keeps the kernel nodes on the compute track (tid 1).
#[test]
fn traces_put_collectives_on_the_communication_track() {
    let n = 2;
    let id = runtime(MemoryMode::Dynamic).comm_unique_id().unwrap();
    let dir = std::env::temp_dir();
    std::thread::scope(|scope| {
        for r in 0..n {
            let dir = dir.clone();
            scope.spawn(move || {
                let rt = runtime(MemoryMode::Dynamic);
                let comm =
                    Comm::init_rank(Arc::clone(&rt), &id, r as u32, n as u32, 20_000).unwrap();
                let (mut g, xs, _) = graph(&rt, &comm, BUCKETS, None);
                for (i, &x) in xs.iter().enumerate() {
                    g.write(x, &vec![0u8; GRADS[i] * 4]).unwrap();
                }
                rt.trace_begin().unwrap();
                g.run().unwrap();
                let path = dir.join(format!("gkrt_coll_trace_{}_{r}.json", std::process::id()));
                rt.trace_end(&path).unwrap();
                let text = std::fs::read_to_string(&path).unwrap();
                std::fs::remove_file(&path).unwrap();
                let slices = |tid: u32, cat: &str| {
                    text.matches(&format!("{{\"ph\":\"X\",\"pid\":1,\"tid\":{tid},"))
                        .count()
                        .min(text.matches(&format!("\"cat\":\"{cat}\"")).count())
                };
                assert_eq!(
                    text.matches("\"tid\":4,\"name\":\"node ").count(),
                    3,
                    "rank {r}: one slice per bucket's call: {text}"
                );
                // Buckets end at nodes 3, 5 and 11 (absorbed: 1, 7, 9).
                for node in [3, 5, 11] {
                    assert!(
                        text.contains(&format!("\"tid\":4,\"name\":\"node {node} (collective")),
                        "rank {r}: node {node}'s call: {text}"
                    );
                }
                assert_eq!(slices(1, "node"), 12, "rank {r}: the kernel nodes: {text}");
            });
        }
    });
}
