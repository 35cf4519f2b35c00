//! Random graphs of built-ins and host callbacks, run through the Rust API on the host backend
//! with jitter: dynamic and planned mode give bit-identical outputs, equal to a plain
//! interpretation of the same graph, and every run returns allocated memory to its baseline.

use gkrt::device::LaunchDims;
use gkrt::graph::TensorKind;
use gkrt::kernels::{BuiltinKind, CallbackArgs, HostCallback, Kernel};
use gkrt::runtime::{Config, DeviceChoice, MemoryMode, Runtime, RuntimeGraph};
use proptest::prelude::*;
use std::ffi::c_void;

const DIMS: LaunchDims = LaunchDims { grid: [1; 3], block: [1; 3], shared_mem_bytes: 0 };

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
}

fn spec() -> impl Strategy<Value = Spec> {
    (1usize..5, 1usize..4, 1usize..24).prop_flat_map(|(side8, params, n_ops)| {
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
        (Just(side), Just(params), ops, proptest::collection::vec(params..total, 1..3), 0u64..3000)
    })
    .prop_map(|(side, params, ops, mut outputs, workspace)| {
        outputs.sort();
        outputs.dedup();
        Spec { side, params, ops, outputs, workspace }
    })
}

fn param_values(spec: &Spec, p: usize) -> Vec<f32> {
    let n = spec.side * spec.side;
    (0..n).map(|i| (((i * 7 + p * 13) % 17) as f32 - 8.0) / 4.0).collect()
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
            Op::Relu(a) => vals[a].iter().map(|&x| if x > 0.0 { x } else { 0.0 }).collect(),
            Op::ReluGrad(g, x) => vals[g].iter().zip(&vals[x]).map(|(&g, &x)| if x > 0.0 { g } else { 0.0 }).collect(),
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

fn runtime(mode: MemoryMode) -> std::sync::Arc<Runtime> {
    Runtime::new(Config {
        device: DeviceChoice::Host,
        memory_mode: mode,
        host_jitter_us: 30,
        memory_limit: 64 << 20,
        ..Config::default()
    })
    .unwrap()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
}

/// Builds, runs `runs` times and returns the outputs; checks memory returns to its baseline.
fn run_spec(spec: &Spec, mode: MemoryMode, runs: usize) -> Vec<Vec<f32>> {
    let rt = runtime(mode);
    let mut g = RuntimeGraph::new(rt.clone());
    let bytes = (spec.side * spec.side * 4) as u64;
    let mut ids = Vec::new();
    for p in 0..spec.params {
        ids.push(g.add_tensor(bytes, TensorKind::Parameter, &format!("p{p}")).unwrap());
    }
    for (i, _) in spec.ops.iter().enumerate() {
        let value = spec.params + i;
        let kind = if spec.outputs.contains(&value) { TensorKind::Output } else { TensorKind::Intermediate };
        ids.push(g.add_tensor(bytes, kind, &format!("v{value}")).unwrap());
    }
    let s = spec.side as u32;
    let callback = Kernel::Callback(HostCallback { func: twice_plus_one, user_data: 0 });
    for (i, op) in spec.ops.iter().enumerate() {
        let out = [ids[spec.params + i]];
        let b = |k| Kernel::Builtin(k);
        let (kernel, inputs, params): (Kernel, Vec<u64>, Vec<u8>) = match *op {
            Op::Fill(x) => (b(BuiltinKind::Fill), vec![], x.to_ne_bytes().to_vec()),
            Op::Add(a, c) => (b(BuiltinKind::Add), vec![ids[a], ids[c]], vec![]),
            Op::Scale(a, k) => (b(BuiltinKind::Scale), vec![ids[a]], k.to_ne_bytes().to_vec()),
            Op::Relu(a) => (b(BuiltinKind::Relu), vec![ids[a]], vec![]),
            Op::ReluGrad(a, c) => (b(BuiltinKind::ReluGrad), vec![ids[a], ids[c]], vec![]),
            Op::Copy(a) => (b(BuiltinKind::Copy), vec![ids[a]], vec![]),
            Op::Callback(a) => (callback.clone(), vec![ids[a]], vec![]),
            Op::Matmul(a, c) => {
                let p: Vec<u8> = [s, s, s].iter().flat_map(|d| d.to_ne_bytes()).collect();
                (b(BuiltinKind::Matmul), vec![ids[a], ids[c]], p)
            }
        };
        let ws: Vec<u64> = if spec.workspace > 0 && i % 2 == 0 { vec![spec.workspace] } else { vec![] };
        g.graph.add_node(kernel, &inputs, &out, &ws, DIMS, &params).unwrap();
    }
    g.finalize().unwrap();
    assert_eq!(g.is_planned(), mode == MemoryMode::Planned);
    for (p, &id) in ids.iter().enumerate().take(spec.params) {
        g.write(id, &to_bytes(&param_values(spec, p))).unwrap();
    }
    let mut outs = Vec::new();
    for run in 0..runs {
        let before = rt.stats().pool.allocated_bytes;
        g.run().unwrap();
        let after = rt.stats();
        if run > 0 {
            // Outputs and (planned) the arena are taken by the first run; later runs hold
            // nothing more afterwards.
            assert_eq!(after.pool.allocated_bytes, before, "allocated bytes return to the baseline");
            if mode == MemoryMode::Planned {
                assert_eq!(after.counters.last_run_pool_allocs, 0, "planned runs make no pool calls");
            }
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
    outs
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
