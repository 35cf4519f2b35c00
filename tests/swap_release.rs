//! `GKRT_SWAP_RELEASE` (`RuntimeGraph::release_copies`) on the host backend: random training-like
//! chains (products, ReLUs declared recomputable at random, residual sums, an in-place update of
//! every weight) under budgets below their working set. Once the timed runs have chosen a plan
//! fitted with its copy-outs' blocks pending until the model's copy ends, every run gives those
//! blocks back as scheduled and makes exactly its program's pool calls without a fallback, the
//! pool never waits for the device in the steady runs, and every run's results are bit-identical
//! to the same runs without a limit.

mod common;

use common::{bytes, floats, DIMS};
use gkrt::runtime::{
    BuiltinKind, Config, DeviceChoice, Kernel, MemoryMode, Runtime, RuntimeGraph, TensorKind,
};

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A random chain: (side, layers, per layer recomputable ReLU, per layer residual sum).
struct Chain {
    side: u32,
    layers: usize,
    recomputable: Vec<bool>,
    residual: Vec<bool>,
}

fn random_chain(rng: &mut Rng) -> Chain {
    let layers = 2 + rng.below(6) as usize;
    Chain {
        side: 8 * (1 + rng.below(3) as u32),
        layers,
        recomputable: (0..layers).map(|_| rng.below(2) == 0).collect(),
        residual: (0..layers).map(|_| rng.below(3) == 0).collect(),
    }
}

/// The chain's graph under `limit` (0: none), its weights set; returns it with the ids read
/// back after each run (the weights, then the input's gradient).
fn build(c: &Chain, limit: u64, release: bool) -> (RuntimeGraph, Vec<u64>) {
    let rt = Runtime::new(Config {
        device: DeviceChoice::Host,
        host_jitter_us: 20,
        memory_mode: MemoryMode::Dynamic,
        memory_limit: limit,
        ..Config::default()
    })
    .unwrap();
    let mut g = RuntimeGraph::new(rt);
    let size = u64::from(c.side * c.side * 4);
    let mm: Vec<u8> = [c.side; 3].iter().flat_map(|d| d.to_ne_bytes()).collect();
    let b = Kernel::Builtin;
    let mut n = 0;
    let mut tensor = |g: &mut RuntimeGraph, kind| {
        n += 1;
        g.add_tensor(size, kind, &format!("t{n}")).unwrap()
    };
    let ws: Vec<u64> = (0..c.layers)
        .map(|_| tensor(&mut g, TensorKind::Parameter))
        .collect();
    let x0 = tensor(&mut g, TensorKind::Intermediate);
    let fill = 0.25f32.to_ne_bytes();
    g.graph
        .add_node(b(BuiltinKind::Fill), &[], &[x0], &[], DIMS, &fill)
        .unwrap();
    let (mut xs, mut zs) = (vec![x0], Vec::new());
    for i in 0..c.layers {
        let prev = xs[i];
        let z = tensor(&mut g, TensorKind::Intermediate);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[prev, ws[i]], &[z], &[], DIMS, &mm)
            .unwrap();
        let mut x = tensor(&mut g, TensorKind::Intermediate);
        let relu = g
            .graph
            .add_node(b(BuiltinKind::Relu), &[z], &[x], &[], DIMS, &[])
            .unwrap();
        g.graph.set_recomputable(relu, c.recomputable[i]).unwrap();
        if c.residual[i] {
            let sum = tensor(&mut g, TensorKind::Intermediate);
            g.graph
                .add_node(b(BuiltinKind::Add), &[x, prev], &[sum], &[], DIMS, &[])
                .unwrap();
            x = sum;
        }
        zs.push(z);
        xs.push(x);
    }
    let mut d = xs[c.layers];
    let mut dx0 = d;
    for i in (0..c.layers).rev() {
        let dz = tensor(&mut g, TensorKind::Intermediate);
        g.graph
            .add_node(b(BuiltinKind::ReluGrad), &[d, zs[i]], &[dz], &[], DIMS, &[])
            .unwrap();
        let dw = tensor(&mut g, TensorKind::Intermediate);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[xs[i], dz], &[dw], &[], DIMS, &mm)
            .unwrap();
        let kind = if i == 0 {
            TensorKind::Output
        } else {
            TensorKind::Intermediate
        };
        let dx = tensor(&mut g, kind);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[dz, ws[i]], &[dx], &[], DIMS, &mm)
            .unwrap();
        // The weight's update, in place: w += -1/64 dw.
        let step = tensor(&mut g, TensorKind::Intermediate);
        let rate = (-1.0f32 / 64.0).to_ne_bytes();
        g.graph
            .add_node(b(BuiltinKind::Scale), &[dw], &[step], &[], DIMS, &rate)
            .unwrap();
        g.graph
            .add_node(
                b(BuiltinKind::Add),
                &[ws[i], step],
                &[ws[i]],
                &[],
                DIMS,
                &[],
            )
            .unwrap();
        d = dx;
        dx0 = dx;
    }
    for (i, &w) in ws.iter().enumerate() {
        let v: Vec<f32> = (0..c.side * c.side)
            .map(|k| ((k as usize * 7 + i * 3) % 17) as f32 / 64.0 - 0.125)
            .collect();
        g.write(w, &bytes(&v)).unwrap();
    }
    g.finalize().unwrap();
    // (Finalize reads `GKRT_SWAP_RELEASE`: the test's choice comes after.)
    g.release_copies(release);
    let mut read = ws;
    read.push(dx0);
    (g, read)
}

fn read_all(g: &mut RuntimeGraph, ids: &[u64], size: usize) -> Vec<Vec<u32>> {
    ids.iter()
        .map(|&id| {
            let mut buf = vec![0u8; size];
            g.read(id, &mut buf).unwrap();
            floats(&buf).iter().map(|x| x.to_bits()).collect()
        })
        .collect()
}

#[test]
fn runs_giving_copy_outs_blocks_back_as_scheduled_match_the_dry_run_and_the_unconstrained_runs() {
    const RUNS: usize = 6;

    let mut rng = Rng(23);
    let (mut scheduled, mut released, mut steady) = (0, 0u64, 0);
    for _ in 0..24 {
        let c = random_chain(&mut rng);
        let size = (c.side * c.side * 4) as usize;
        let (mut free, ids) = build(&c, 0, false);
        let want: Vec<_> = (0..RUNS)
            .map(|_| {
                free.run().unwrap();
                read_all(&mut free, &ids, size)
            })
            .collect();
        // The working set: the weights and every activation the backward reads.
        let working = (3 * c.layers as u64 + 2) * size as u64;
        for divisor in [2, 3] {
            let limit = working / divisor + 4 * size as u64;
            let (mut g, ids) = build(&c, limit, true);
            if g.swap_plan().is_none() {
                continue;
            }
            g.record_pool_calls(true);
            let mut counts = Vec::new();
            for (run, want) in want.iter().enumerate() {
                g.run().unwrap();
                let what = format!(
                    "{} layers of {}, limit {limit}, run {run}",
                    c.layers, c.side
                );
                assert_eq!(&read_all(&mut g, &ids, size), want, "{what}");
                let stats = g.runtime().stats().unwrap().pool;
                counts.push((stats.page_map_count, stats.device_wait_count));
                let Some(n) = g.release_schedule_len() else {
                    continue;
                };
                // The runs after the one that tuned the plan (the second).
                if run < 2 {
                    continue;
                }
                scheduled += (run == 2) as usize;
                released += g.last_run_released();
                assert!(g.last_run_released() <= n as u64, "{what}");
                assert_eq!(g.last_run_fallbacks(), 0, "{what}");
                let made = g.last_pool_calls().unwrap().to_vec();
                assert_eq!(made, g.planned_pool_calls(), "{what}");
                if run > 2 {
                    steady += 1;
                    assert_eq!(counts[run], counts[run - 1], "{what}: pages mapped, waits");
                }
            }
        }
    }
    println!("{scheduled} plans with a release schedule, {steady} steady runs, {released} blocks released");
    assert!(scheduled >= 8, "{scheduled} plans with a release schedule");
    assert!(released > 0);
}
