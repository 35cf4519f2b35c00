//! Swapping around collectives (host model, 2 and 4 ranks as threads, jitter on): a
//! data-parallel training step whose memory limit is under its working set swaps (the runtime's
//! swap counters are non-zero), and its weights after several steps are bit-identical, on every
//! rank, to the same step run without a limit; the gradients are all-reduced (average, in
//! place) in buckets of one and two, so fused blocks and single collectives both meet the swap
//! plan. Nothing outlives a run, nothing is left allocated once the graph and communicator go,
//! and a swapping run that took no fallback made exactly its program's dry-run pool calls.

mod common;
use common::*;

use gkrt::runtime::{
    BuiltinKind, CollectiveKind, Comm, Config, DType, DeviceChoice, Kernel, MemoryMode, ReduceOp,
    Runtime, RuntimeGraph, TensorKind,
};
use std::sync::Arc;

/// Elements per tensor: 1 MiB, the pool's largest small request (two to a segment), so a limit
/// in whole segments is a limit in tensors.
const N: usize = 1 << 18;
const LAYERS: usize = 4;
const STEPS: usize = 4;
const LR: f32 = 0.125;

fn values(seed: usize) -> Vec<f32> {
    (0..N)
        .map(|i| ((i * 37 + seed * 101) % 251) as f32 / 64.0 - 1.9)
        .collect()
}

/// One rank's step: layers a_i = relu(a_{i-1} + w_i); the error d = a_L − target; backward,
/// per layer from the last: g_i = relu_grad(d, z_i), d = copy(g_i) for the layer below, then
/// g_i all-reduced (average, in place; in buckets of one, then two); last, SGD w_next_i = w_i − lr·g_i.
struct Step {
    g: RuntimeGraph,
    x: u64,
    target_neg: u64,
    w: Vec<u64>,
    w_next: Vec<u64>,
}

fn step_graph(rt: &Arc<Runtime>, comm: &Comm) -> Step {
    let mut g = RuntimeGraph::new(Arc::clone(rt));
    // A first bucket of one gradient, then two: single and fused collectives both.
    g.set_collective_buckets((N as u64) * 4, 2 * (N as u64) * 4)
        .unwrap();
    let t = |g: &mut RuntimeGraph, kind, name: String| {
        g.add_tensor((N * 4) as u64, kind, &name).unwrap()
    };
    let x = t(&mut g, TensorKind::Input, "x".into());
    let target_neg = t(&mut g, TensorKind::Input, "-target".into());
    let w: Vec<u64> = (0..LAYERS)
        .map(|i| t(&mut g, TensorKind::Parameter, format!("w{i}")))
        .collect();
    let w_next: Vec<u64> = (0..LAYERS)
        .map(|i| t(&mut g, TensorKind::Output, format!("w_next{i}")))
        .collect();
    let b = |k| Kernel::Builtin(k);
    let node = |g: &mut RuntimeGraph, k, ins: &[u64], out: u64, params: &[u8]| {
        g.graph
            .add_node(b(k), ins, &[out], &[], DIMS, params)
            .unwrap();
    };
    let mut a = x;
    let mut z = Vec::new();
    for (i, &wi) in w.iter().enumerate() {
        let zi = t(&mut g, TensorKind::Intermediate, format!("z{i}"));
        let ai = t(&mut g, TensorKind::Intermediate, format!("a{i}"));
        node(&mut g, BuiltinKind::Add, &[a, wi], zi, &[]);
        node(&mut g, BuiltinKind::Relu, &[zi], ai, &[]);
        z.push(zi);
        a = ai;
    }
    let mut d = t(&mut g, TensorKind::Intermediate, "d".into());
    node(&mut g, BuiltinKind::Add, &[a, target_neg], d, &[]);
    let mut grads = [0; LAYERS];
    for i in (0..LAYERS).rev() {
        let gi = t(&mut g, TensorKind::Intermediate, format!("g{i}"));
        node(&mut g, BuiltinKind::ReluGrad, &[d, z[i]], gi, &[]);
        if i > 0 {
            d = t(&mut g, TensorKind::Intermediate, format!("d{i}"));
            node(&mut g, BuiltinKind::Copy, &[gi], d, &[]);
        }
        let avg = CollectiveKind::AllReduce(ReduceOp::Avg);
        g.add_collective(comm, avg, DType::F32, &[gi], &[gi])
            .unwrap();
        grads[i] = gi;
    }
    let minus_lr = (-LR).to_ne_bytes();
    for i in 0..LAYERS {
        let u = t(&mut g, TensorKind::Intermediate, format!("u{i}"));
        node(&mut g, BuiltinKind::Scale, &[grads[i]], u, &minus_lr);
        node(&mut g, BuiltinKind::Add, &[w[i], u], w_next[i], &[]);
    }
    g.finalize().unwrap();
    Step {
        g,
        x,
        target_neg,
        w,
        w_next,
    }
}

fn host_runtime(memory_limit: u64) -> Arc<Runtime> {
    Runtime::new(Config {
        device: DeviceChoice::Host,
        host_jitter_us: 30,
        memory_mode: MemoryMode::Dynamic,
        memory_limit,
        ..Config::default()
    })
    .unwrap()
}

/// What one rank ends with: its weights' bits, the runtime's swap counters (bytes out, bytes
/// in), and whether its graph had a swap plan.
struct RankResult {
    weights: Vec<Vec<u32>>,
    swapped: (u64, u64),
    planned_swaps: bool,
    /// Swapping runs after the two timed ones whose pool calls were compared with the program's dry
    /// run (equal), and those that took the fallback (not compared).
    compared: usize,
    fell_back: usize,
}

/// Trains `STEPS` steps on `n` ranks with `limit` (0: none).
fn train(n: usize, limit: u64) -> Vec<RankResult> {
    let id = host_runtime(0).comm_unique_id().unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                scope.spawn(move || {
                    let rt = host_runtime(limit);
                    let comm =
                        Comm::init_rank(Arc::clone(&rt), &id, r as u32, n as u32, 20_000).unwrap();
                    let mut s = step_graph(&rt, &comm);
                    s.g.write(s.x, &bytes(&values(r + 1))).unwrap();
                    let target: Vec<f32> = values(77).iter().map(|v| -v * 0.5).collect();
                    s.g.write(s.target_neg, &bytes(&target)).unwrap();
                    for (i, &w) in s.w.iter().enumerate() {
                        s.g.write(w, &bytes(&values(1000 + i))).unwrap();
                    }
                    let mut buf = vec![0u8; N * 4];
                    s.g.record_pool_calls(true);
                    let (mut compared, mut fell_back) = (0, 0);
                    for step in 0..STEPS {
                        s.g.run()
                            .unwrap_or_else(|e| panic!("rank {r} step {step}: {e}"));
                        // From the third run on (the plan may switch after the second: the first
                        // two are timed for its choice), a run that took no fallback made exactly
                        // its program's pool calls.
                        if step > 1 && s.g.swap_plan().is_some() {
                            if s.g.last_run_fallbacks() == 0 {
                                assert_eq!(
                                    s.g.last_pool_calls().unwrap(),
                                    &s.g.planned_pool_calls()[..],
                                    "rank {r}, step {step}: the executor's pool calls differ from the dry run's"
                                );
                                compared += 1;
                            } else {
                                fell_back += 1;
                            }
                        }
                        assert_eq!(
                            rt.stats().unwrap().pool.allocated_bytes,
                            s.g.resident_bytes(),
                            "rank {r}, step {step}: a transient buffer outlived the run"
                        );
                        for i in 0..LAYERS {
                            s.g.read(s.w_next[i], &mut buf).unwrap();
                            s.g.write(s.w[i], &buf).unwrap();
                        }
                    }
                    let weights =
                        s.w.iter()
                            .map(|&w| {
                                s.g.read(w, &mut buf).unwrap();
                                floats(&buf).iter().map(|v| v.to_bits()).collect()
                            })
                            .collect();
                    let planned_swaps = s.g.swap_plan().is_some();
                    let c = rt.stats().unwrap().counters;
                    drop(s);
                    drop(comm);
                    assert_eq!(
                        rt.stats().unwrap().pool.allocated_bytes,
                        0,
                        "rank {r}: memory left allocated after the graph and communicator went"
                    );
                    RankResult {
                        weights,
                        swapped: (c.swap_out_bytes, c.swap_in_bytes),
                        planned_swaps,
                        compared,
                        fell_back,
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The step's working set (persistent bytes plus the transient peak) and the least limit that
/// can run it, from a graph on an unlimited runtime.
fn working_set() -> (u64, u64) {
    let rt = host_runtime(0);
    let id = rt.comm_unique_id().unwrap();
    let comm = Comm::init_rank(Arc::clone(&rt), &id, 0, 1, 20_000).unwrap();
    let s = step_graph(&rt, &comm);
    let lv = s.g.graph.liveness().unwrap();
    (
        lv.persistent_bytes + lv.peak_transient_bytes,
        s.g.min_memory_limit(),
    )
}

fn swapped_equals_unlimited(n: usize) {
    let (ws, least) = working_set();
    let free = train(n, 0);
    // The training moved the weights (the comparison is not of untouched inputs).
    let initial: Vec<u32> = values(1000).iter().map(|v| v.to_bits()).collect();
    assert!(free[0].weights[0] != initial);
    // Two thirds and half of the working set, and the least limit (which counts the gradients
    // their all-reduces hold from their producers to the SGD at the end), in whole 2 MiB
    // segments.
    let segment = 2 << 20;
    let (mut runs_compared, mut runs_fell_back) = (0, 0);
    for limit in [ws * 2 / 3, ws / 2, least.next_multiple_of(segment)] {
        let limit = limit / segment * segment;
        assert!(
            limit < ws && limit >= least,
            "limit {limit}, working set {ws}, least {least}"
        );
        let tight = train(n, limit);
        let compared: usize = tight.iter().map(|t| t.compared).sum();
        let fell_back: usize = tight.iter().map(|t| t.fell_back).sum();
        runs_compared += compared;
        runs_fell_back += fell_back;
        for r in 0..n {
            assert!(!free[r].planned_swaps && free[r].swapped == (0, 0));
            assert!(
                tight[r].planned_swaps,
                "rank {r}: a limit of {limit} under {ws} made no swap plan"
            );
            assert!(
                tight[r].swapped.0 > 0 && tight[r].swapped.1 > 0,
                "rank {r}: nothing was swapped under a limit of {limit} (working set {ws}): {:?}",
                tight[r].swapped
            );
            for i in 0..LAYERS {
                assert!(
                    tight[r].weights[i] == free[r].weights[i],
                    "rank {r}, limit {limit}: w{i} differs between the swapped and the unlimited run"
                );
                assert!(
                    tight[r].weights[i] == tight[0].weights[i],
                    "rank {r}, limit {limit}: w{i} differs from rank 0's"
                );
            }
        }
    }
    // The executor and the dry run walk one program: some runs made exactly its pool calls
    // (the rest took the fallback: copy-outs done at times the dry run cannot know).
    assert!(
        runs_compared > 0,
        "no swapping run made its program's pool calls ({runs_fell_back} took the fallback)"
    );
}

#[test]
fn swapping_data_parallel_step_two_ranks() {
    swapped_equals_unlimited(2);
}

#[test]
fn swapping_data_parallel_step_four_ranks() {
    swapped_equals_unlimited(4);
}
