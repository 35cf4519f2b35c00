//! Running a `Spec` on the host backend: the graph built through the Rust API (built-ins and a
//! host callback), run with jitter under a memory limit, its outputs read back, and after every
//! run the memory back at its baseline; the graph's peak and the smallest budget that can work.

use crate::spec::{param_values, Op, Spec};
use gkrt::runtime::{
    BuiltinKind, CallbackArgs, Config, DeviceChoice, HostCallback, Kernel, LaunchDims, MemoryMode,
    Runtime, RuntimeGraph, TensorKind,
};
use std::ffi::c_void;

pub const DIMS: LaunchDims = LaunchDims {
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

/// How many times `not_pure` has run in this process (the test using `Op::Impure` resets it).
pub static IMPURE_CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// `twice_plus_one`, plus 1 on every call after the first (`IMPURE_CALLS`): a node that is not
/// the pure function a recomputable declaration promises.
unsafe extern "C" fn not_pure(args: *const CallbackArgs, user: *mut c_void) -> i32 {
    let calls = IMPURE_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let status = twice_plus_one(args, user);
    let out = &*(*args).outputs;
    for i in 0..out.size / 4 {
        *(out.ptr as *mut f32).add(i) += calls.min(1) as f32;
    }
    status
}

pub fn runtime(mode: MemoryMode, memory_limit: u64) -> std::sync::Arc<Runtime> {
    Runtime::new(Config {
        device: DeviceChoice::Host,
        memory_mode: mode,
        host_jitter_us: 30,
        memory_limit,
        ..Config::default()
    })
    .unwrap()
}

pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Builds, runs `runs` times and returns the outputs; checks memory returns to its baseline.
pub fn run_spec(spec: &Spec, mode: MemoryMode, runs: usize) -> Vec<Vec<f32>> {
    run_spec_with_limit(spec, mode, runs, 64 << 20)
}

pub fn build(spec: &Spec, rt: &std::sync::Arc<Runtime>) -> (RuntimeGraph, Vec<u64>) {
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
            Op::Impure(a) => {
                let f = HostCallback {
                    func: not_pure,
                    user_data: 0,
                    owner: None,
                };
                (Kernel::Callback(f), vec![ids[a]], vec![])
            }
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

pub fn run_spec_with_limit(
    spec: &Spec,
    mode: MemoryMode,
    runs: usize,
    limit: u64,
) -> Vec<Vec<f32>> {
    run_and_stats(spec, mode, runs, limit).0
}

pub fn run_and_stats(
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
pub fn peak_and_least(spec: &Spec) -> (u64, u64) {
    let probe = runtime(MemoryMode::Dynamic, 64 << 20);
    let (g, _) = build(spec, &probe);
    let lv = g.graph.liveness().unwrap();
    (
        lv.persistent_bytes + lv.peak_transient_bytes,
        smallest_budget(&g),
    )
}
