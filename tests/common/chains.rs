//! Random training-like chains on the jittery host backend (products, ReLUs declared
//! recomputable at random, residual sums, an in-place update of every weight), for the tests of
//! swapping runs (`swap_release.rs`, `exec_elide.rs`, `exec_poll.rs`, `exec_time_stalls.rs`,
//! `swap_pin_small.rs`).

use super::{bytes, floats, DIMS};
use gkrt::runtime::{
    BuiltinKind, Config, DeviceChoice, Kernel, MemoryMode, Runtime, RuntimeGraph, TensorKind,
};

pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A random chain: (side, layers, per layer recomputable ReLU, per layer residual sum).
#[derive(Clone)]
pub struct Chain {
    pub side: u32,
    pub layers: usize,
    pub recomputable: Vec<bool>,
    pub residual: Vec<bool>,
}

pub fn random_chain(rng: &mut Rng) -> Chain {
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
pub fn build(c: &Chain, limit: u64, release: bool) -> (RuntimeGraph, Vec<u64>) {
    let b = build_with(c, limit, release, None);
    (b.graph, b.read)
}

/// Small parameters added to a chain (`swap_pin_small.rs`): one of `floats` floats per layer,
/// read (halved) by the layer's forward and updated in place at the run's end, and a small input
/// the host writes before every run, added to the first of them; `pin` is the graph's
/// `pin_small_tensors`.
pub struct SmallParams {
    pub floats: usize,
    pub pin: Option<u64>,
}

/// A built chain: its graph, the ids read back after each run (the weights, the small
/// parameters if any, the input's gradient), the small input, and the small tensors' indices.
pub struct Built {
    pub graph: RuntimeGraph,
    pub read: Vec<u64>,
    pub input: Option<u64>,
    pub small: Vec<u32>,
}

/// `build`, with small parameters where `small` says.
pub fn build_with(c: &Chain, limit: u64, release: bool, small: Option<&SmallParams>) -> Built {
    let rt = Runtime::new(Config {
        device: DeviceChoice::Host,
        host_jitter_us: 20,
        memory_mode: MemoryMode::Dynamic,
        memory_limit: limit,
        ..Config::default()
    })
    .unwrap();
    let mut g = RuntimeGraph::new(rt);
    if let Some(sp) = small {
        g.pin_small_tensors(sp.pin);
    }
    let size = c.size() as u64;
    let small_bytes = small.map_or(0, |sp| (sp.floats * 4) as u64);
    let mm: Vec<u8> = [c.side; 3].iter().flat_map(|d| d.to_ne_bytes()).collect();
    let b = Kernel::Builtin;
    let mut n = 0;
    let mut tensor = |g: &mut RuntimeGraph, bytes, kind| {
        n += 1;
        g.add_tensor(bytes, kind, &format!("t{n}")).unwrap()
    };
    let ws: Vec<u64> = (0..c.layers)
        .map(|_| tensor(&mut g, size, TensorKind::Parameter))
        .collect();
    let (ss, input) = if small.is_some() {
        let ss: Vec<u64> = (0..c.layers)
            .map(|_| tensor(&mut g, small_bytes, TensorKind::Parameter))
            .collect();
        (ss, Some(tensor(&mut g, small_bytes, TensorKind::Input)))
    } else {
        (Vec::new(), None)
    };
    let x0 = tensor(&mut g, size, TensorKind::Intermediate);
    let fill = 0.25f32.to_ne_bytes();
    g.graph
        .add_node(b(BuiltinKind::Fill), &[], &[x0], &[], DIMS, &fill)
        .unwrap();
    let (mut xs, mut zs, mut cs) = (vec![x0], Vec::new(), Vec::new());
    let half = 0.5f32.to_ne_bytes();
    for i in 0..c.layers {
        let prev = xs[i];
        let z = tensor(&mut g, size, TensorKind::Intermediate);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[prev, ws[i]], &[z], &[], DIMS, &mm)
            .unwrap();
        if let Some(&s) = ss.get(i) {
            // The small parameter's forward read: half of it, added to it after the backward.
            let ci = tensor(&mut g, small_bytes, TensorKind::Intermediate);
            g.graph
                .add_node(b(BuiltinKind::Scale), &[s], &[ci], &[], DIMS, &half)
                .unwrap();
            cs.push(ci);
        }
        let mut x = tensor(&mut g, size, TensorKind::Intermediate);
        let relu = g
            .graph
            .add_node(b(BuiltinKind::Relu), &[z], &[x], &[], DIMS, &[])
            .unwrap();
        g.graph.set_recomputable(relu, c.recomputable[i]).unwrap();
        if c.residual[i] {
            let sum = tensor(&mut g, size, TensorKind::Intermediate);
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
        let dz = tensor(&mut g, size, TensorKind::Intermediate);
        g.graph
            .add_node(b(BuiltinKind::ReluGrad), &[d, zs[i]], &[dz], &[], DIMS, &[])
            .unwrap();
        let dw = tensor(&mut g, size, TensorKind::Intermediate);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[xs[i], dz], &[dw], &[], DIMS, &mm)
            .unwrap();
        let kind = if i == 0 {
            TensorKind::Output
        } else {
            TensorKind::Intermediate
        };
        let dx = tensor(&mut g, size, kind);
        g.graph
            .add_node(b(BuiltinKind::Matmul), &[dz, ws[i]], &[dx], &[], DIMS, &mm)
            .unwrap();
        // The weight's update, in place: w += -1/64 dw.
        let step = tensor(&mut g, size, TensorKind::Intermediate);
        let rate = (-1.0f32 / 64.0).to_ne_bytes();
        g.graph
            .add_node(b(BuiltinKind::Scale), &[dw], &[step], &[], DIMS, &rate)
            .unwrap();
        let w = ws[i];
        g.graph
            .add_node(b(BuiltinKind::Add), &[w, step], &[w], &[], DIMS, &[])
            .unwrap();
        d = dx;
        dx0 = dx;
    }
    // The small parameters' updates, in place, at the run's end (s += s / 2; s0 += input).
    for (&s, &ci) in ss.iter().zip(&cs) {
        g.graph
            .add_node(b(BuiltinKind::Add), &[s, ci], &[s], &[], DIMS, &[])
            .unwrap();
    }
    if let Some(u) = input {
        g.graph
            .add_node(b(BuiltinKind::Add), &[ss[0], u], &[ss[0]], &[], DIMS, &[])
            .unwrap();
    }
    for (i, &w) in ws.iter().enumerate() {
        let v: Vec<f32> = (0..c.side * c.side)
            .map(|k| ((k as usize * 7 + i * 3) % 17) as f32 / 64.0 - 0.125)
            .collect();
        g.write(w, &bytes(&v)).unwrap();
    }
    if let Some(sp) = small {
        for (i, &s) in ss.iter().enumerate() {
            let v: Vec<f32> = (0..sp.floats).map(|k| (k + i) as f32 / 1024.0).collect();
            g.write(s, &bytes(&v)).unwrap();
        }
    }
    g.finalize().unwrap();
    // (Finalize reads `GKRT_SWAP_RELEASE`: the test's choice comes after.)
    g.release_copies(release);
    let small = ss
        .iter()
        .chain(&input)
        .map(|&s| g.graph.tensor_index(s).unwrap())
        .collect();
    let mut read = ws;
    read.extend(&ss);
    read.push(dx0);
    Built {
        graph: g,
        read,
        input,
        small,
    }
}

pub fn read_all(g: &mut RuntimeGraph, ids: &[u64], size: usize) -> Vec<Vec<u32>> {
    ids.iter()
        .map(|&id| {
            let mut buf = vec![0u8; size];
            g.read(id, &mut buf).unwrap();
            floats(&buf).iter().map(|x| x.to_bits()).collect()
        })
        .collect()
}

impl Chain {
    /// Bytes of one activation (`side` × `side` f32).
    pub fn size(&self) -> usize {
        (self.side * self.side * 4) as usize
    }

    /// The working set: the weights and every activation the backward reads.
    pub fn working_set(&self) -> u64 {
        (3 * self.layers as u64 + 2) * self.size() as u64
    }

    /// Every tensor's bits after each of `runs` runs with no memory limit: what every limited
    /// run must reproduce.
    pub fn unconstrained_outputs(&self, runs: usize) -> Vec<Vec<Vec<u32>>> {
        let (mut free, ids) = build(self, 0, false);
        (0..runs)
            .map(|_| {
                free.run().unwrap();
                read_all(&mut free, &ids, self.size())
            })
            .collect()
    }
}

/// One random chain built to swap: the graph under `limit`, the ids read back after each run,
/// and every run's bits without a limit.
pub struct SwappingCase {
    pub chain: Chain,
    pub limit: u64,
    pub graph: RuntimeGraph,
    pub ids: Vec<u64>,
    pub want: Vec<Vec<Vec<u32>>>,
}

impl SwappingCase {
    /// How an assertion names the case and its run.
    pub fn what(&self, run: usize) -> String {
        format!(
            "{} layers of {}, limit {}, run {run}",
            self.chain.layers, self.chain.side, self.limit
        )
    }
}

/// `chains` random chains from `rng`, each built under its working set divided by every one of
/// `divisors` (plus room for four tensors), giving copy-outs' blocks back as scheduled when
/// `release`; only the graphs that got a swap plan, built one at a time as they are taken.
pub fn swapping_cases<'a>(
    rng: &'a mut Rng,
    chains: usize,
    divisors: &'a [u64],
    release: bool,
    runs: usize,
) -> impl Iterator<Item = SwappingCase> + 'a {
    (0..chains).flat_map(move |_| {
        let c = random_chain(rng);
        let want = c.unconstrained_outputs(runs);
        divisors.iter().filter_map(move |&divisor| {
            let limit = c.working_set() / divisor + 4 * c.size() as u64;
            let (graph, ids) = build(&c, limit, release);
            graph.swap_plan().is_some().then(|| SwappingCase {
                chain: c.clone(),
                limit,
                graph,
                ids,
                want: want.clone(),
            })
        })
    })
}
