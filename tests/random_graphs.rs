//! Random graphs of built-ins and host callbacks, run through the Rust API on the host backend
//! with jitter: dynamic and planned mode give bit-identical outputs, equal to a plain
//! interpretation of the same graph, and every run returns allocated memory to its baseline.

use gkrt::runtime::SwapPolicy as Policy;
use gkrt::runtime::{
    BuiltinKind, CallbackArgs, Config, DeviceChoice, HostCallback, Kernel, LaunchDims, MemoryMode,
    PoolCall, Runtime, RuntimeGraph, TensorKind,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use std::ffi::c_void;

const DIMS: LaunchDims = LaunchDims {
    grid: [1; 3],
    block: [1; 3],
    shared_mem_bytes: 0,
};

/// A host callback: out[i] = in[i] * 2 + 1 (elementwise over f32), touching memory directly,
/// which the host backend allows because it runs callbacks in stream order.
unsafe extern "C" fn twice_plus_one(args: *const CallbackArgs, _: *mut c_void) -> i32 {
    let a = &*args;
    let (inp, out) = (&*a.inputs, &*a.outputs);
    let n = out.size / 4;
    for i in 0..n {
        let x = *(inp.ptr as *const f32).add(i);
        *(out.ptr as *mut f32).add(i) = x * 2.0 + 1.0;
    }
    0
}

#[derive(Clone, Debug)]
enum Op {
    Fill(f32),
    Add(usize, usize),
    Scale(usize, f32),
    Relu(usize),
    ReluGrad(usize, usize),
    Copy(usize),
    Callback(usize),
    Matmul(usize, usize),
}

/// A graph over tensors of one shape (rows×cols f32, square for matmul), as a list of ops each
/// producing a new value from earlier values (indices into the values list: 0..params are the
/// parameters).
#[derive(Clone, Debug)]
struct Spec {
    side: usize,
    params: usize,
    ops: Vec<Op>,
    outputs: Vec<usize>,
    workspace: u64,
    /// Bit `i % 32` set: op `i`'s node is declared recomputable (every op here is pure).
    recomputable: u32,
}

fn spec() -> impl Strategy<Value = Spec> {
    (1usize..5, 1usize..4, 1usize..24)
        .prop_flat_map(|(side8, params, n_ops)| {
            let side = side8 * 8;
            let ops = (0..n_ops)
                .map(move |i| {
                    let avail = params + i;
                    prop_oneof![
                        (-2.0f32..2.0).prop_map(Op::Fill),
                        (0..avail, 0..avail).prop_map(|(a, b)| Op::Add(a, b)),
                        (0..avail, -1.5f32..1.5).prop_map(|(a, s)| Op::Scale(a, s)),
                        (0..avail).prop_map(Op::Relu),
                        (0..avail, 0..avail).prop_map(|(a, b)| Op::ReluGrad(a, b)),
                        (0..avail).prop_map(Op::Copy),
                        (0..avail).prop_map(Op::Callback),
                        (0..avail, 0..avail).prop_map(|(a, b)| Op::Matmul(a, b)),
                    ]
                    .boxed()
                })
                .collect::<Vec<_>>();
            let total = params + n_ops;
            (
                Just(side),
                Just(params),
                ops,
                proptest::collection::vec(params..total, 1..3),
                0u64..3000,
                any::<u32>(),
            )
        })
        .prop_map(
            |(side, params, ops, mut outputs, workspace, recomputable)| {
                outputs.sort();
                outputs.dedup();
                Spec {
                    side,
                    params,
                    ops,
                    outputs,
                    workspace,
                    recomputable,
                }
            },
        )
}

fn param_values(spec: &Spec, p: usize) -> Vec<f32> {
    let n = spec.side * spec.side;
    (0..n)
        .map(|i| (((i * 7 + p * 13) % 17) as f32 - 8.0) / 4.0)
        .collect()
}

/// The same graph interpreted directly (the arithmetic the built-ins promise).
fn reference(spec: &Spec) -> Vec<Vec<f32>> {
    let s = spec.side;
    let mut vals: Vec<Vec<f32>> = (0..spec.params).map(|p| param_values(spec, p)).collect();
    for op in &spec.ops {
        let v = match *op {
            Op::Fill(x) => vec![x; s * s],
            Op::Add(a, b) => vals[a].iter().zip(&vals[b]).map(|(x, y)| x + y).collect(),
            Op::Scale(a, k) => vals[a].iter().map(|x| k * x).collect(),
            Op::Relu(a) => vals[a]
                .iter()
                .map(|&x| if x > 0.0 { x } else { 0.0 })
                .collect(),
            Op::ReluGrad(g, x) => vals[g]
                .iter()
                .zip(&vals[x])
                .map(|(&g, &x)| if x > 0.0 { g } else { 0.0 })
                .collect(),
            Op::Copy(a) => vals[a].clone(),
            Op::Callback(a) => vals[a].iter().map(|x| x * 2.0 + 1.0).collect(),
            Op::Matmul(a, b) => {
                let mut c = vec![0f32; s * s];
                for i in 0..s {
                    for j in 0..s {
                        let mut acc = 0f32;
                        for p in 0..s {
                            acc += vals[a][i * s + p] * vals[b][p * s + j];
                        }
                        c[i * s + j] = acc;
                    }
                }
                c
            }
        };
        vals.push(v);
    }
    spec.outputs.iter().map(|&o| vals[o].clone()).collect()
}

fn runtime(mode: MemoryMode, memory_limit: u64) -> std::sync::Arc<Runtime> {
    Runtime::new(Config {
        device: DeviceChoice::Host,
        memory_mode: mode,
        host_jitter_us: 30,
        memory_limit,
        ..Config::default()
    })
    .unwrap()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Builds, runs `runs` times and returns the outputs; checks memory returns to its baseline.
fn run_spec(spec: &Spec, mode: MemoryMode, runs: usize) -> Vec<Vec<f32>> {
    run_spec_with_limit(spec, mode, runs, 64 << 20)
}

fn build(spec: &Spec, rt: &std::sync::Arc<Runtime>) -> (RuntimeGraph, Vec<u64>) {
    let mut g = RuntimeGraph::new(rt.clone());
    let bytes = (spec.side * spec.side * 4) as u64;
    let mut ids = Vec::new();
    for p in 0..spec.params {
        ids.push(
            g.add_tensor(bytes, TensorKind::Parameter, &format!("p{p}"))
                .unwrap(),
        );
    }
    for (i, _) in spec.ops.iter().enumerate() {
        let value = spec.params + i;
        let kind = if spec.outputs.contains(&value) {
            TensorKind::Output
        } else {
            TensorKind::Intermediate
        };
        ids.push(g.add_tensor(bytes, kind, &format!("v{value}")).unwrap());
    }
    let s = spec.side as u32;
    let callback = Kernel::Callback(HostCallback {
        func: twice_plus_one,
        user_data: 0,
        owner: None,
    });
    for (i, op) in spec.ops.iter().enumerate() {
        let out = [ids[spec.params + i]];
        let b = |k| Kernel::Builtin(k);
        let (kernel, inputs, params): (Kernel, Vec<u64>, Vec<u8>) = match *op {
            Op::Fill(x) => (b(BuiltinKind::Fill), vec![], x.to_ne_bytes().to_vec()),
            Op::Add(a, c) => (b(BuiltinKind::Add), vec![ids[a], ids[c]], vec![]),
            Op::Scale(a, k) => (
                b(BuiltinKind::Scale),
                vec![ids[a]],
                k.to_ne_bytes().to_vec(),
            ),
            Op::Relu(a) => (b(BuiltinKind::Relu), vec![ids[a]], vec![]),
            Op::ReluGrad(a, c) => (b(BuiltinKind::ReluGrad), vec![ids[a], ids[c]], vec![]),
            Op::Copy(a) => (b(BuiltinKind::Copy), vec![ids[a]], vec![]),
            Op::Callback(a) => (callback.clone(), vec![ids[a]], vec![]),
            Op::Matmul(a, c) => {
                let p: Vec<u8> = [s, s, s].iter().flat_map(|d| d.to_ne_bytes()).collect();
                (b(BuiltinKind::Matmul), vec![ids[a], ids[c]], p)
            }
        };
        let ws: Vec<u64> = if spec.workspace > 0 && i % 2 == 0 {
            vec![spec.workspace]
        } else {
            vec![]
        };
        let node = g
            .graph
            .add_node(kernel, &inputs, &out, &ws, DIMS, &params)
            .unwrap();
        if spec.recomputable & (1 << (i % 32)) != 0 {
            g.graph.set_recomputable(node, true).unwrap();
        }
    }
    g.finalize().unwrap();
    (g, ids)
}

fn run_spec_with_limit(spec: &Spec, mode: MemoryMode, runs: usize, limit: u64) -> Vec<Vec<f32>> {
    run_and_stats(spec, mode, runs, limit).0
}

fn run_and_stats(
    spec: &Spec,
    mode: MemoryMode,
    runs: usize,
    limit: u64,
) -> (Vec<Vec<f32>>, gkrt::runtime::Stats) {
    let rt = runtime(mode, limit);
    let (mut g, ids) = build(spec, &rt);
    let bytes = (spec.side * spec.side * 4) as u64;
    if limit >= 64 << 20 {
        assert_eq!(g.is_planned(), mode == MemoryMode::Planned);
    }
    for (p, &id) in ids.iter().enumerate().take(spec.params) {
        g.write(id, &to_bytes(&param_values(spec, p))).unwrap();
    }
    let mut outs = Vec::new();
    // With several swap plans, the first run after the timed ones (two: the plan is chosen on
    // the warmer of them) runs the plan tuning left (refined on the model: `swap_refine`), the
    // next ones go through each candidate in turn (switching between plans must be seamless
    // too), those the timed runs added among them.
    const TIMED: usize = 2;
    let mut policies = Vec::new();
    for r in 0.. {
        if r == TIMED && runs > 1 {
            policies = g.swap_policies();
        }
        let cycled = if policies.is_empty() {
            0
        } else {
            TIMED + 1 + policies.len()
        };
        if r >= runs.max(cycled) {
            break;
        }
        if r > TIMED && !policies.is_empty() {
            g.use_swap_policy(policies[(r - TIMED - 1) % policies.len()])
                .unwrap();
        }
        g.run().unwrap();
        let after = rt.stats().unwrap();
        // No transient buffer outlives the run: what stays allocated is exactly the persistent
        // tensors left on the device (none when the graph swaps: runs end with them on the host).
        assert_eq!(
            after.pool.allocated_bytes,
            g.resident_bytes(),
            "allocated bytes after a run"
        );
        if let Some(plan) = g.swap_plan() {
            let kept: u64 = plan
                .keep
                .iter()
                .map(|&t| g.graph.tensors()[t as usize].size.div_ceil(256) * 256)
                .sum();
            assert!(
                after.pool.allocated_bytes <= kept,
                "a swapping graph ends its runs with only the kept tensors on the device"
            );
        }
        if mode == MemoryMode::Planned && g.is_planned() && after.counters.runs > 1 {
            assert_eq!(
                after.counters.last_run_pool_allocs, 0,
                "planned runs make no pool calls"
            );
        }
        outs = spec
            .outputs
            .iter()
            .map(|&o| {
                let mut buf = vec![0u8; bytes as usize];
                g.read(ids[o], &mut buf).unwrap();
                from_bytes(&buf)
            })
            .collect();
    }
    (outs, rt.stats().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn dynamic_and_planned_match_the_reference(spec in spec()) {
        let want = reference(&spec);
        let dynamic = run_spec(&spec, MemoryMode::Dynamic, 2);
        let planned = run_spec(&spec, MemoryMode::Planned, 2);
        for (i, w) in want.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&dynamic[i]), bits(w), "dynamic output {}", i);
            prop_assert_eq!(bits(&planned[i]), bits(w), "planned output {}", i);
        }
    }
}

/// The least memory any schedule of the graph needs: the largest node's own tensors and
/// workspaces (256-byte granules, as the pool counts them).
fn smallest_budget(g: &RuntimeGraph) -> u64 {
    let round = |b: u64| b.div_ceil(256) * 256;
    g.graph
        .nodes()
        .iter()
        .map(|n| {
            let mut ts: Vec<u32> = n.inputs.iter().chain(&n.outputs).copied().collect();
            ts.sort_unstable();
            ts.dedup();
            ts.iter()
                .map(|&t| round(g.graph.tensors()[t as usize].size))
                .sum::<u64>()
                + n.workspaces.iter().map(|&w| round(w)).sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// The graph's working set (its peak with no limit) and the smallest budget that can work.
fn peak_and_least(spec: &Spec) -> (u64, u64) {
    let probe = runtime(MemoryMode::Dynamic, 64 << 20);
    let (g, _) = build(spec, &probe);
    let lv = g.graph.liveness().unwrap();
    (
        lv.persistent_bytes + lv.peak_transient_bytes,
        smallest_budget(&g),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Under every budget from the graph's peak down to the smallest that can work, swapping
    /// gives bit-identical outputs, and memory returns to its baseline after every run.
    #[test]
    fn swapping_is_bit_exact_under_any_budget(spec in spec()) {
        let want = reference(&spec);
        let (peak, least) = peak_and_least(&spec);
        let mut budgets = vec![peak, peak * 3 / 4, peak / 2, peak / 3, least + least / 2, least];
        budgets.retain(|&b| b >= least);
        budgets.dedup();
        for budget in budgets {
            let (got, stats) = run_and_stats(&spec, MemoryMode::Dynamic, 2, budget);
            if budget < peak {
                let moved = stats.counters.swap_out_bytes + stats.counters.swap_in_bytes;
                let rebuilt = stats.counters.tensors_recomputed;
                prop_assert!(moved + rebuilt > 0, "a budget of {} under the peak {} moved and recomputed nothing: {:?}", budget, peak, stats.counters);
            }
            prop_assert!(stats.pool.peak_reserved_bytes <= budget, "reserved {} over the budget {}", stats.pool.peak_reserved_bytes, budget);
            for (i, w) in want.iter().enumerate() {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got[i]), bits(w), "output {} under a budget of {} (peak {}, least {})", i, budget, peak, least);
            }
        }
    }
}

/// A node whose own tensors exceed the budget fails with out-of-memory naming it; the runtime
/// then runs a graph that fits.
#[test]
fn a_node_too_large_fails_cleanly_and_the_runtime_stays_usable() {
    let rt = runtime(MemoryMode::Dynamic, 64 << 10);
    let mut big = RuntimeGraph::new(rt.clone());
    let x = big.add_tensor(40 << 10, TensorKind::Input, "x").unwrap();
    let y = big.add_tensor(40 << 10, TensorKind::Output, "y").unwrap();
    big.graph
        .add_node(
            Kernel::Builtin(BuiltinKind::Relu),
            &[x],
            &[y],
            &[],
            DIMS,
            &[],
        )
        .unwrap();
    big.finalize().unwrap();
    assert_eq!(
        big.swap_plan().map(|p| p.infeasible_nodes.clone()),
        Some(vec![0])
    );
    big.write(x, &vec![0u8; 40 << 10]).unwrap();
    let baseline = rt.stats().unwrap().pool.allocated_bytes;
    let err = big.run().unwrap_err();
    assert!(
        matches!(err, gkrt::runtime::Error::OutOfMemory(_)),
        "{err:?}"
    );
    assert!(err.message().contains("node 0"), "{}", err.message());
    assert_eq!(rt.stats().unwrap().pool.allocated_bytes, baseline);

    let mut small = RuntimeGraph::new(rt.clone());
    let a = small.add_tensor(1024, TensorKind::Input, "a").unwrap();
    let b = small.add_tensor(1024, TensorKind::Output, "b").unwrap();
    small
        .graph
        .add_node(
            Kernel::Builtin(BuiltinKind::Scale),
            &[a],
            &[b],
            &[],
            DIMS,
            &2f32.to_ne_bytes(),
        )
        .unwrap();
    small.finalize().unwrap();
    small.write(a, &to_bytes(&[1.5; 256])).unwrap();
    small.run().unwrap();
    let mut out = vec![0u8; 1024];
    small.read(b, &mut out).unwrap();
    assert_eq!(from_bytes(&out), vec![3.0; 256]);
}

/// Parameters alone larger than the budget: a chain that streams its weights through.
#[test]
fn weights_larger_than_the_budget_stream_through() {
    let side = 64usize; // 16 KiB per tensor
    let bytes = (side * side * 4) as u64;
    let layers = 12;
    let rt = runtime(MemoryMode::Dynamic, 6 * bytes); // weights alone are 12 tensors
    let mut g = RuntimeGraph::new(rt.clone());
    let x = g.add_tensor(bytes, TensorKind::Input, "x").unwrap();
    let ws: Vec<u64> = (0..layers)
        .map(|i| {
            g.add_tensor(bytes, TensorKind::Parameter, &format!("w{i}"))
                .unwrap()
        })
        .collect();
    let mut h = x;
    let mm: Vec<u8> = [side as u32; 3]
        .iter()
        .flat_map(|d| d.to_ne_bytes())
        .collect();
    for (i, &w) in ws.iter().enumerate() {
        let kind = if i + 1 == layers {
            TensorKind::Output
        } else {
            TensorKind::Intermediate
        };
        let next = g.add_tensor(bytes, kind, &format!("h{i}")).unwrap();
        g.graph
            .add_node(
                Kernel::Builtin(BuiltinKind::Matmul),
                &[h, w],
                &[next],
                &[],
                DIMS,
                &mm,
            )
            .unwrap();
        h = next;
    }
    g.finalize().unwrap();
    assert!(g.swap_plan().is_some());
    let xv: Vec<f32> = (0..side * side)
        .map(|i| ((i % 7) as f32 - 3.0) / 8.0)
        .collect();
    let wv: Vec<Vec<f32>> = (0..layers)
        .map(|l| {
            (0..side * side)
                .map(|i| (((i * 5 + l) % 11) as f32 - 5.0) / 32.0)
                .collect()
        })
        .collect();
    g.write(x, &to_bytes(&xv)).unwrap();
    for (w, v) in ws.iter().zip(&wv) {
        g.write(*w, &to_bytes(v)).unwrap();
    }
    let mut want = xv.clone();
    for v in &wv {
        let mut c = vec![0f32; side * side];
        for i in 0..side {
            for p in 0..side {
                let a = want[i * side + p];
                for j in 0..side {
                    c[i * side + j] += a * v[p * side + j];
                }
            }
        }
        want = c;
    }
    for _ in 0..3 {
        g.run().unwrap();
        let mut out = vec![0u8; bytes as usize];
        g.read(h, &mut out).unwrap();
        assert_eq!(from_bytes(&out), want);
    }
    let s = rt.stats().unwrap();
    assert!(
        s.counters.swap_in_bytes >= 3 * (layers as u64) * bytes,
        "weights came in every run: {:?}",
        s.counters
    );
    assert!(
        s.pool.peak_reserved_bytes <= 6 * bytes,
        "the budget held: {:?}",
        s.pool
    );
}

/// A training-like chain (matrix products, ReLUs declared recomputable, then a backward pass
/// that reads every activation again): under budgets below its peak, plans drop ReLU outputs
/// and run the ReLU again before the backward reader, outputs stay bit-identical under every
/// plan, and a plan that recomputes moves fewer bytes than one that may not.
#[test]
fn recomputable_relus_are_rebuilt_instead_of_copied() {
    use Op::*;
    // Values 0, 1: parameters. Forward: x0 = fill, z_i = x_i·w, x_{i+1} = relu(z_i).
    // Backward: dz_i = relu'(g, z_i) and a product with x_i (a far use of each ReLU output).
    let ops = vec![
        Fill(0.5),       // 2: x0
        Matmul(2, 0),    // 3: z0
        Relu(3),         // 4: x1
        Matmul(4, 1),    // 5: z1
        Relu(5),         // 6: x2
        Matmul(6, 0),    // 7: z2
        Relu(7),         // 8: x3
        ReluGrad(8, 7),  // 9: dz2
        Matmul(6, 9),    // 10: reads x2
        ReluGrad(10, 5), // 11: dz1
        Matmul(4, 11),   // 12: reads x1
        ReluGrad(12, 3), // 13: dz0
        Add(13, 10),     // 14
    ];
    let relus = (1 << 2) | (1 << 4) | (1 << 6);
    let spec = Spec {
        side: 16,
        params: 2,
        ops,
        outputs: vec![14],
        workspace: 0,
        recomputable: relus,
    };
    let want = reference(&spec);
    let (peak, least) = peak_and_least(&spec);
    let (mut recomputed, mut compared, mut fewer) = (0, 0, 0);
    for budget in [peak * 3 / 4, peak / 2, least + least / 2, least] {
        if budget < least {
            continue;
        }
        // The default plan recomputes; the same policy without recomputing moves no fewer bytes
        // (and more under some budget).
        let rt = runtime(MemoryMode::Dynamic, budget);
        let (mut g, _) = build(&spec, &rt);
        if let Some(plan) = g.swap_plan().cloned() {
            let copy_only = Policy {
                recompute: false,
                ..Policy::default()
            };
            if plan.recomputes() > 0 && g.use_swap_policy(copy_only).is_ok() {
                let other = g.swap_plan().unwrap();
                let (mine, theirs) = (
                    plan.bytes_in + plan.bytes_out,
                    other.bytes_in + other.bytes_out,
                );
                assert!(
                    mine <= theirs,
                    "budget {budget}: recomputing moved {mine} bytes, copying {theirs}"
                );
                fewer += (mine < theirs) as u32;
                compared += 1;
            }
        }
        drop(g);
        let (got, stats) = run_and_stats(&spec, MemoryMode::Dynamic, 2, budget);
        recomputed += stats.counters.tensors_recomputed;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got[0]),
            bits(&want[0]),
            "budget {budget} (peak {peak})"
        );
        assert!(stats.pool.peak_reserved_bytes <= budget);
    }
    assert!(recomputed > 0, "no plan recomputed a ReLU output");
    assert!(
        compared > 0,
        "no budget had plans with and without recomputing"
    );
    assert!(
        fewer > 0,
        "recomputing never moved fewer bytes than copying"
    );
}

/// Runs every swap policy of `spec` under each budget below its peak, twice each, recording the
/// executor's pool calls. Returns per plan's second run: (what, calls made, calls its program's
/// dry run makes, the run's fallbacks).
fn pool_calls_per_policy(spec: &Spec) -> Vec<(String, Vec<PoolCall>, Vec<PoolCall>, u64)> {
    pool_calls_following(spec, true)
}

/// `pool_calls_per_policy`, the runs taking their dry run's placements (`follow`) or not.
fn pool_calls_following(
    spec: &Spec,
    follow: bool,
) -> Vec<(String, Vec<PoolCall>, Vec<PoolCall>, u64)> {
    let (peak, least) = peak_and_least(spec);
    let mut budgets = vec![peak * 3 / 4, peak / 2, peak / 3, least + least / 2, least];
    budgets.retain(|&b| b >= least && b < peak);
    budgets.dedup();
    let mut out = Vec::new();
    for budget in budgets {
        let rt = runtime(MemoryMode::Dynamic, budget);
        let (mut g, ids) = build(spec, &rt);
        for (p, &id) in ids.iter().enumerate().take(spec.params) {
            g.write(id, &to_bytes(&param_values(spec, p))).unwrap();
        }
        if g.swap_plan().is_none() {
            continue;
        }
        let mut policies = g.swap_policies();
        if policies.is_empty() {
            policies.push(Policy::default());
        }
        g.record_pool_calls(true);
        g.follow_placements(follow);
        for policy in policies {
            if g.swap_policies().contains(&policy) {
                g.use_swap_policy(policy).unwrap();
            }
            g.run().unwrap();
            g.run().unwrap();
            let fallback = g.last_run_fallbacks();
            out.push((
                format!("budget {budget} (peak {peak}, least {least}), {policy:?}"),
                g.last_pool_calls().unwrap().to_vec(),
                g.planned_pool_calls(),
                fallback,
            ));
        }
    }
    out
}

/// The executor makes exactly the pool calls of its program's dry run, call by call, under
/// every budget and every swap policy: the dry run and the run walk one program, so a change to
/// the order of either makes this fail. From each plan's second run on: the first starts from
/// whatever the previous plan left on the device, not from the plan's canonical start.
///
/// A run whose pool places blocks otherwise than the dry run did (copy-outs complete at times the
/// dry run cannot know, and the pool reuses their blocks when it sees them done) may take the
/// fallback — an eviction, a batch taken again, a deferred return — and then its calls differ
/// by those; such runs (`last_run_fallbacks`) are counted, not compared, and must stay under a
/// quarter.
#[test]
fn the_executor_makes_the_dry_runs_pool_calls() {
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig {
            cases: 48,
            ..ProptestConfig::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let (mut compared, mut fell_back) = (0usize, 0usize);
    for _ in 0..48 {
        let spec = spec().new_tree(&mut runner).unwrap().current();
        for (what, made, planned, fallback) in pool_calls_per_policy(&spec) {
            if fallback > 0 {
                fell_back += 1;
                continue;
            }
            compared += 1;
            let first_difference = planned.iter().zip(&made).position(|(a, b)| a != b);
            assert!(
                made == planned && !made.is_empty(),
                "{what}: {} pool calls made, {} planned; first difference at {first_difference:?}: \
                 made {:?}, planned {:?}\nspec {spec:?}",
                made.len(),
                planned.len(),
                first_difference.map(|i| made[i]),
                first_difference.map(|i| planned[i])
            );
        }
    }
    println!("{compared} runs compared, {fell_back} took the fallback");
    // Runs take the ranges their dry run placed blocks in (`plan::swap_placements`): 26 of 719
    // took the fallback; letting the pool place them, 112 (`the_pool_left_to_itself_...`).
    assert!(
        compared >= 8 * fell_back && compared > 100,
        "{compared} runs compared, {fell_back} took the fallback"
    );
}

/// The same graphs with the pool left to place every block itself: its copy-outs' blocks are
/// still pending when the dry run, which freed them at once, reused them, so the layouts part
/// and runs fall back (evict, defer a return) several times as often as runs that take the dry
/// run's placements.
#[test]
fn the_pool_left_to_itself_falls_back_more_often_than_runs_following_placements() {
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig {
            cases: 48,
            ..ProptestConfig::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let (mut following, mut left) = (0usize, 0usize);
    for _ in 0..24 {
        let spec = spec().new_tree(&mut runner).unwrap().current();
        for (follow, count) in [(true, &mut following), (false, &mut left)] {
            *count += pool_calls_following(&spec, follow)
                .iter()
                .filter(|(_, _, _, fallback)| *fallback > 0)
                .count();
        }
    }
    println!("runs falling back: {following} following placements, {left} without");
    assert!(
        left >= 2 * following.max(1),
        "runs falling back: {following} following placements, {left} without"
    );
}

/// Chained recomputation on a training-like graph whose products are declared recomputable
/// too (as GPT-2's `--recompute 2`): an attention-like softmax stand-in rebuilt from freed
/// scores, and a GELU stand-in read before its input. Under every budget and swap policy the
/// executor makes its program's dry-run pool calls and the outputs are bit-identical; some plan
/// chains through a freed tensor, and some rebuilds a dropped input early for a chain.
#[test]
fn chained_recomputes_match_the_dry_run_and_the_reference() {
    use Op::*;
    let ops = vec![
        Fill(0.5),       // 2: x
        Matmul(2, 0),    // 3: h (kept for the backward)
        Matmul(3, 1),    // 4: f = h·w1 (recomputable)
        Relu(4),         // 5: g = relu(f) (recomputable)
        Matmul(5, 0),    // 6: a
        Matmul(3, 0),    // 7: scores (recomputable), freed after the next
        Relu(7),         // 8: p (recomputable)
        Matmul(8, 6),    // 9
        Relu(9),         // 10
        Matmul(5, 10),   // 11: reads g
        ReluGrad(11, 4), // 12: reads f after g
        Matmul(8, 12),   // 13: reads p far away
        Matmul(3, 13),   // 14: reads h
        Matmul(14, 0),   // 15: the weights are read to the end, as a backward's are
        Add(15, 1),      // 16
    ];
    let spec = Spec {
        side: 16,
        params: 2,
        ops,
        outputs: vec![16],
        workspace: 0,
        recomputable: (1 << 2) | (1 << 3) | (1 << 5) | (1 << 6),
    };
    let want = reference(&spec);
    let (peak, least) = peak_and_least(&spec);
    let (mut chained, mut moved_early) = (0, 0);
    for budget in [
        peak * 3 / 4,
        peak * 2 / 3,
        peak / 2,
        least + least / 2,
        least,
    ] {
        if budget < least {
            continue;
        }
        let rt = runtime(MemoryMode::Dynamic, budget);
        let (mut g, _) = build(&spec, &rt);
        let mut plans: Vec<_> = g.swap_plan().cloned().into_iter().collect();
        for policy in g.swap_policies() {
            g.use_swap_policy(policy).unwrap();
            plans.extend(g.swap_plan().cloned());
        }
        for plan in &plans {
            chained += plan.free_after.iter().flatten().count();
            // A rebuilt tensor that its node does not read and that is not freed after it: a
            // dropped input rebuilt early for a chain.
            for (n, rebuilt) in plan.recompute_before.iter().enumerate() {
                let inputs = &g.graph.nodes()[n].inputs;
                moved_early += rebuilt
                    .iter()
                    .filter(|&t| !inputs.contains(t) && !plan.free_after[n].contains(t))
                    .count();
            }
        }
        drop(g);
        let got = run_spec_with_limit(&spec, MemoryMode::Dynamic, 3, budget);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[0]), bits(&want[0]), "budget {budget}");
    }
    assert!(chained > 0, "no plan chained through a freed tensor");
    assert!(moved_early > 0, "no plan rebuilt a dropped input early");
    let (mut compared, mut fell_back) = (0, 0);
    for (what, made, planned, fallback) in pool_calls_per_policy(&spec) {
        if fallback > 0 {
            fell_back += 1;
            continue;
        }
        compared += 1;
        assert!(
            made == planned && !made.is_empty(),
            "{what}: pool calls differ"
        );
    }
    assert!(
        compared > 3 * fell_back,
        "{compared} compared, {fell_back} fell back"
    );
}
