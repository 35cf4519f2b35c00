//! What a swapping graph's runs tell whoever checks the swap plan against the device, and the
//! budget knob for experiments: `GKRT_SWAP_TIMELINE`'s rows (nodes, copies, rebuilds, the host's
//! time of each launch and the run's compute-stream syncs, and the tuned plan's prediction beside
//! them, its pool's page maps and device waits with a release schedule's dry run's) and
//! `GKRT_SWAP_BUDGET_PERMILLE`. One test in its own
//! process: the timeline's variable is read once per process, and both are set before any
//! runtime exists.

use gkrt::runtime::{
    BuiltinKind, Config, DeviceChoice, Kernel, LaunchDims, MemoryMode, Runtime, RuntimeGraph,
    TensorKind,
};
use std::collections::HashMap;

const DIMS: LaunchDims = LaunchDims {
    grid: [1; 3],
    block: [1; 3],
    shared_mem_bytes: 0,
};
const SIDE: u32 = 32;
const BYTES: u64 = (SIDE * SIDE * 4) as u64;
const LAYERS: usize = 6;

/// A chain of products and declared-recomputable ReLUs, forward then a backward that reads
/// every ReLU output again (as benches/swap_chain.c), finalized under `limit`.
fn chain(limit: u64) -> (RuntimeGraph, u64) {
    let rt = Runtime::new(Config {
        device: DeviceChoice::Host,
        memory_mode: MemoryMode::Dynamic,
        memory_limit: limit,
        ..Config::default()
    })
    .unwrap();
    let mut g = RuntimeGraph::new(rt);
    let w = g.add_tensor(BYTES, TensorKind::Parameter, "w").unwrap();
    let mut t = 0;
    let mut tensor = |g: &mut RuntimeGraph, kind| {
        t += 1;
        g.add_tensor(BYTES, kind, &format!("t{t}")).unwrap()
    };
    let mm: Vec<u8> = [SIDE; 3].iter().flat_map(|d| d.to_ne_bytes()).collect();
    let x0 = tensor(&mut g, TensorKind::Intermediate);
    g.graph
        .add_node(
            Kernel::Builtin(BuiltinKind::Fill),
            &[],
            &[x0],
            &[],
            DIMS,
            &0.5f32.to_ne_bytes(),
        )
        .unwrap();
    let (mut xs, mut zs) = (vec![x0], vec![]);
    for _ in 0..LAYERS {
        let z = tensor(&mut g, TensorKind::Intermediate);
        let x = tensor(&mut g, TensorKind::Intermediate);
        let prev = *xs.last().unwrap();
        let b = |k| Kernel::Builtin(k);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[prev, w], &[z], &[], DIMS, &mm)
            .unwrap();
        let relu = g
            .graph
            .add_node(b(BuiltinKind::Relu), &[z], &[x], &[], DIMS, &[])
            .unwrap();
        g.graph.set_recomputable(relu, true).unwrap();
        zs.push(z);
        xs.push(x);
    }
    let mut d = *xs.last().unwrap();
    for i in (0..LAYERS).rev() {
        let kind = if i == 0 {
            TensorKind::Output
        } else {
            TensorKind::Intermediate
        };
        let dz = tensor(&mut g, TensorKind::Intermediate);
        let b = |k| Kernel::Builtin(k);
        g.graph
            .add_node(b(BuiltinKind::ReluGrad), &[d, zs[i]], &[dz], &[], DIMS, &[])
            .unwrap();
        let dx = tensor(&mut g, kind);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[xs[i], dz], &[dx], &[], DIMS, &mm)
            .unwrap();
        d = dx;
    }
    g.write(w, &vec![0u8; BYTES as usize]).unwrap();
    let nodes = g.graph.nodes().len() as u64;
    g.finalize().unwrap();
    (g, nodes)
}

#[test]
fn the_timeline_has_the_prediction_and_the_budget_knob_keeps_headroom() {
    let dir = std::env::temp_dir().join(format!("gkrt_swap_diag_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("timeline.csv");
    let _ = std::fs::remove_file(&csv);
    std::env::set_var("GKRT_SWAP_TIMELINE", &csv);
    // The working set: every tensor of the chain (forward activations live into the backward).
    let limit = 10 * BYTES;

    let (mut g, nodes) = chain(limit);
    let full = g
        .swap_plan()
        .expect("the chain swaps under the limit")
        .budget;
    for _ in 0..4 {
        g.run().unwrap();
    }
    let released = g.release_schedule_len().is_some();
    drop(g);
    let text = std::fs::read_to_string(&csv).unwrap();
    // Per run: kind -> rows.
    let mut runs: HashMap<u64, HashMap<String, Vec<Vec<f64>>>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 5, "{line}");
        let nums: Vec<f64> = [f[2], f[3], f[4]]
            .iter()
            .map(|x| x.parse().unwrap())
            .collect();
        let run = f[0].parse().unwrap();
        let kinds = runs.entry(run).or_default();
        kinds.entry(f[1].to_string()).or_default().push(nums);
    }
    assert_eq!(runs.len(), 4, "{text}");
    for (run, kinds) in &runs {
        assert_eq!(kinds["node"].len() as u64, nodes, "run {run}");
        // The host's time as each node was queued, in node order, and the run's syncs.
        let host = &kinds["host"];
        assert_eq!(host.len() as u64, nodes, "run {run}");
        for (i, w) in host.windows(2).enumerate() {
            assert_eq!(w[0][0] as usize, i, "run {run}: {w:?}");
            assert!(w[1][1] >= w[0][1] && w[0][1] >= 0.0, "run {run}: {w:?}");
        }
        let syncs = &kinds["syncs"];
        assert_eq!(syncs.len(), 1, "run {run}");
        assert_eq!(kinds["polled"].len(), 1, "run {run}");
        assert_eq!(kinds["copy_waits"].len(), 1, "run {run}");
        assert_eq!(kinds["deferred"].len(), 1, "run {run}");
        let between: f64 = host.iter().map(|h| h[2]).sum();
        assert!(
            syncs[0][1] > 0.0 && between <= syncs[0][1],
            "run {run}: {syncs:?}, {between} between launches"
        );
        // The first two runs are timed before the plan is tuned: no prediction yet; later
        // runs have one, with every node and a positive step.
        if *run <= 2 {
            assert!(!kinds.contains_key("pred_step"), "run {run}");
            continue;
        }
        let step = &kinds["pred_step"];
        assert_eq!(step.len(), 1, "run {run}");
        assert!(step[0][1] > 0.0, "run {run}: predicted step {:?}", step[0]);
        let pred = &kinds["pred"];
        assert_eq!(pred.len() as u64, nodes, "run {run}");
        for p in pred {
            assert!(p[2] >= p[1] && p[1] >= 0.0, "run {run}: {p:?}");
        }
        // With a release schedule the plan's first run (run 3) maps and waits where its
        // pending-aware dry run's first run does (`pred_pool_first`), the later ones where its
        // steady runs do (`pred_pool`, which the fit holds at none).
        if released {
            let rows = |k: &str| kinds.get(k).cloned().unwrap_or_default();
            let dry = if *run == 3 {
                rows("pred_pool_first")
            } else {
                rows("pred_pool")
            };
            assert_eq!(rows("pool"), dry, "run {run}");
        }
    }
    // Some run rebuilt a ReLU output, timed as an `re` row naming a ReLU node (odd index).
    let rebuilt: Vec<&Vec<f64>> = runs
        .values()
        .filter_map(|k| k.get("re"))
        .flatten()
        .collect();
    assert!(!rebuilt.is_empty(), "no rebuild timed:\n{text}");
    for r in rebuilt {
        assert!(
            (r[0] as u64).is_multiple_of(2) && r[0] as u64 <= 2 * LAYERS as u64,
            "{r:?}"
        );
        assert!(r[2] >= r[1], "{r:?}");
    }

    // The budget knob: the plan is fitted to half of what the limit leaves; a value out of
    // range is ignored (the full budget again).
    std::env::set_var("GKRT_SWAP_BUDGET_PERMILLE", "500");
    let (g, _) = chain(limit);
    let half = g.swap_plan().expect("swaps").budget;
    assert!(
        half <= limit / 2 && half < full,
        "{half} of {limit} (full {full})"
    );
    drop(g);
    std::env::set_var("GKRT_SWAP_BUDGET_PERMILLE", "2000");
    let (g, _) = chain(limit);
    assert_eq!(g.swap_plan().expect("swaps").budget, full);
    drop(g);
    std::env::remove_var("GKRT_SWAP_BUDGET_PERMILLE");
    std::fs::remove_dir_all(&dir).unwrap();
}
