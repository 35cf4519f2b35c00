//! The GPT-2 example's training step (examples_c/gpt2/model.c: the same nodes, tensors, sizes and
//! recomputable declarations) with H200-like node costs, for judging swap plans on the host:
//! the timeline model's estimate of the plan gkrt would choose at a third of the working set.

use crate::device::StreamId;
use crate::graph::liveness::round_up;
use crate::graph::{Liveness, Node, Tensor, TensorKind};
use crate::memory::pool::{Pool, PoolConfig};
use crate::plan::program::Program;
use crate::plan::swap::{Policy, SwapPlan, Timings};
use crate::plan::swap_candidates::{
    candidates, fitted_candidates_with, fitted_timed_candidates_with, Knobs,
};
use crate::plan::swap_fit::{check_with_pool, fits_pool, pool_moves, PoolMisfit};
use crate::plan::swap_model::{choose, estimate, Estimate, Link};
use crate::plan::test_vmm::Device;

const ALIGN: u64 = 256;
/// H200-like rates: f32 products (cuBLAS) and element-wise memory traffic; with these the small
/// config's step sums to about the 82 ms measured unconstrained (see the test below).
const GEMM_TFLOPS: f64 = 48.0;
const MEM_TBPS: f64 = 2.4;
/// The pinned link each way (ANCHORS.md: 54–55 GB/s one way, ~47 each when both run).
pub(super) const LINK: Link = Link {
    in_gbps: 50.0,
    out_gbps: 50.0,
};

#[derive(Clone, Copy)]
pub struct Config {
    pub layers: u64,
    pub channels: u64,
    pub heads: u64,
    pub seq: u64,
    pub batch: u64,
    pub vocab: u64,
    /// 0, 1 (element-wise and row-wise nodes) or 2 (forward products too), as `--recompute`.
    pub recompute: u32,
}

pub const SMALL: Config = Config {
    layers: 12,
    channels: 768,
    heads: 12,
    seq: 512,
    batch: 8,
    vocab: 50304,
    recompute: 1,
};

#[derive(Default)]
pub struct Step {
    pub tensors: Vec<Tensor>,
    pub nodes: Vec<Node>,
    pub cost_ms: Vec<f64>,
    recompute: u32,
    /// The planner's knobs `finalize_at` makes its candidates with (the runtime's defaults).
    pub knobs: Knobs,
}

enum Cost {
    Flops(u64),
    Memory,
}

impl Step {
    fn tensor(&mut self, floats: u64, kind: TensorKind) -> u32 {
        self.tensors.push(Tensor {
            size: 4 * floats,
            kind,
            name: format!("t{}", self.tensors.len()),
            producer: None,
        });
        self.tensors.len() as u32 - 1
    }

    /// A node; `level` > 0 declares it recomputable at that `--recompute` level.
    fn node(&mut self, inputs: &[u32], outputs: &[u32], level: u32, cost: Cost) {
        let n = self.nodes.len() as u32;
        for &t in outputs {
            self.tensors[t as usize].producer.get_or_insert(n);
        }
        let bytes: u64 = inputs
            .iter()
            .chain(outputs)
            .map(|&t| self.tensors[t as usize].size)
            .sum();
        self.cost_ms.push(match cost {
            Cost::Flops(f) => f as f64 / (GEMM_TFLOPS * 1e9),
            Cost::Memory => bytes as f64 / (MEM_TBPS * 1e9),
        });
        self.nodes.push(Node::test_callback(
            inputs,
            outputs,
            level > 0 && self.recompute >= level,
            format!("n{n}"),
        ));
    }

    /// A new intermediate of `floats` written by one node.
    fn op(&mut self, inputs: &[u32], floats: u64, level: u32, cost: Cost) -> u32 {
        let t = self.tensor(floats, TensorKind::Intermediate);
        self.node(inputs, &[t], level, cost);
        t
    }

    pub fn persistent_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .filter(|t| t.kind.persists())
            .map(|t| round_up(t.size, ALIGN))
            .sum()
    }
}

const EW: u32 = 1;
const PRODUCTS: u32 = 2;

/// A parameter with its AdamW state.
struct Param {
    w: u32,
    m: u32,
    v: u32,
}

pub fn build(c: Config) -> Step {
    let mut s = Step {
        recompute: c.recompute,
        ..Step::default()
    };
    let (l, cc, h, t, v) = (c.layers, c.channels, c.heads, c.seq, c.vocab);
    let bt = c.batch * t;
    let bh = c.batch * h;
    let d = cc / h;
    let bhtd = bt * cc;
    let mut counts = vec![v * cc, t * cc];
    for _ in 0..l {
        counts.extend([
            2 * cc,
            3 * cc * cc + 3 * cc,
            cc * cc + cc,
            2 * cc,
            4 * cc * cc + 4 * cc,
            4 * cc * cc + cc,
        ]);
    }
    counts.push(2 * cc);
    let params: Vec<Param> = counts
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut named = |role: &str| {
                let t = s.tensor(n, TensorKind::Parameter);
                s.tensors[t as usize].name = format!("P{i}.{role}");
                t
            };
            Param {
                w: named("w"),
                m: named("m"),
                v: named("v"),
            }
        })
        .collect();
    let input = |s: &mut Step, n| s.tensor(n, TensorKind::Input);
    let tokens = input(&mut s, bt);
    let targets = input(&mut s, bt);
    let order = input(&mut s, bt);
    let start = input(&mut s, bt + 1);
    let token = input(&mut s, bt);
    let ones = input(&mut s, bt);
    let step = input(&mut s, 1);
    let loss = s.tensor(1, TensorKind::Output);
    let gemm = |m: u64, n: u64, k: u64| Cost::Flops(2 * m * n * k);
    let adamw = |s: &mut Step, i: usize, grad: u32| {
        let p = &params[i];
        let (w, m, v) = (p.w, p.m, p.v);
        s.node(&[grad, step, w, m, v], &[w, m, v], 0, Cost::Memory);
    };

    let mut x = s.op(
        &[tokens, params[0].w, params[1].w],
        bt * cc,
        0,
        Cost::Memory,
    );
    struct Saved {
        x: u32,
        s1: u32,
        h1: u32,
        qkvp: u32,
        p: u32,
        y: u32,
        x2: u32,
        s2: u32,
        h2: u32,
        f: u32,
        g: u32,
    }
    let mut saved = Vec::new();
    for i in 0..l as usize {
        let base = 2 + 6 * i;
        let w = |k: usize| params[base + k].w;
        let s1 = s.op(&[x], 2 * bt, EW, Cost::Memory);
        let h1 = s.op(&[x, s1, w(0)], bt * cc, EW, Cost::Memory);
        let qkv = s.op(
            &[h1, w(1), ones],
            bt * 3 * cc,
            PRODUCTS,
            gemm(bt, 3 * cc, cc),
        );
        let qkvp = s.op(&[qkv], 3 * bhtd, EW, Cost::Memory);
        let sc = s.op(&[qkvp], bh * t * t, PRODUCTS, gemm(bh * t, t, d));
        let p = s.op(&[sc], bh * t * t, EW, Cost::Memory);
        let yp = s.op(&[p, qkvp], bhtd, PRODUCTS, gemm(bh * t, d, t));
        let y = s.op(&[yp], bhtd, EW, Cost::Memory);
        let ao = s.op(&[y, w(2), ones], bt * cc, PRODUCTS, gemm(bt, cc, cc));
        let x2 = s.op(&[x, ao], bt * cc, EW, Cost::Memory);
        let s2 = s.op(&[x2], 2 * bt, EW, Cost::Memory);
        let h2 = s.op(&[x2, s2, w(3)], bt * cc, EW, Cost::Memory);
        let f = s.op(
            &[h2, w(4), ones],
            bt * 4 * cc,
            PRODUCTS,
            gemm(bt, 4 * cc, cc),
        );
        let g = s.op(&[f], bt * 4 * cc, EW, Cost::Memory);
        let mo = s.op(&[g, w(5), ones], bt * cc, PRODUCTS, gemm(bt, cc, 4 * cc));
        // Names by role and layer (`L3.f`), for the printouts that sort a plan by role.
        let roles = [
            (s1, "s1"),
            (h1, "h1"),
            (qkv, "qkv"),
            (qkvp, "qkvp"),
            (sc, "sc"),
            (p, "p"),
            (yp, "yp"),
            (y, "y"),
            (ao, "ao"),
            (x2, "x2"),
            (s2, "s2"),
            (h2, "h2"),
            (f, "f"),
            (g, "g"),
            (mo, "mo"),
        ];
        for (t, role) in roles {
            s.tensors[t as usize].name = format!("L{i}.{role}");
        }
        saved.push(Saved {
            x,
            s1,
            h1,
            qkvp,
            p,
            y,
            x2,
            s2,
            h2,
            f,
            g,
        });
        x = s.op(&[x2, mo], bt * cc, EW, Cost::Memory);
        s.tensors[x as usize].name = format!("L{i}.x");
    }
    let lnf = params.len() - 1;
    let sf = s.op(&[x], 2 * bt, EW, Cost::Memory);
    let hf = s.op(&[x, sf, params[lnf].w], bt * cc, EW, Cost::Memory);
    let logits = s.op(&[hf, params[0].w], bt * v, PRODUCTS, gemm(bt, v, cc));
    let losses = s.op(&[logits, targets], bt, 0, Cost::Memory);
    s.node(&[losses], &[loss], 0, Cost::Memory);
    let dlogits = s.op(&[logits, targets], bt * v, 0, Cost::Memory);
    let dhf = s.op(&[dlogits, params[0].w], bt * cc, 0, gemm(bt, cc, v));
    let dwte = s.op(&[hf, dlogits], v * cc, 0, gemm(bt, cc, v));
    // A layer norm's backward: dx (with the residual's gradient when given), then the packed
    // (weight, bias) gradient from partial sums, and its AdamW.
    let ln_bwd = |s: &mut Step, dy: u32, x: u32, st: u32, i: usize, res: Option<u32>| {
        let mut ins = vec![dy, x, st, params[i].w];
        ins.extend(res);
        let dx = s.op(&ins, bt * cc, 0, Cost::Memory);
        let parts = s.op(&[dy, x, st], 2 * cc * 32, 0, Cost::Memory);
        let dw = s.op(&[parts], 2 * cc, 0, Cost::Memory);
        adamw(s, i, dw);
        dx
    };
    let linear_bwd = |s: &mut Step, dy: u32, x: u32, i: usize, ic: u64, oc: u64| {
        let dx = s.op(&[dy, params[i].w], bt * ic, 0, gemm(bt, ic, oc));
        let dw = s.op(&[x, dy, ones], oc * ic + oc, 0, gemm(ic, oc, bt));
        adamw(s, i, dw);
        dx
    };
    let mut dx = ln_bwd(&mut s, dhf, x, sf, lnf, None);
    for i in (0..l as usize).rev() {
        let base = 2 + 6 * i;
        let sv = &saved[i];
        let dg = linear_bwd(&mut s, dx, sv.g, base + 5, 4 * cc, cc);
        let df = s.op(&[dg, sv.f], bt * 4 * cc, EW, Cost::Memory);
        let dh2 = linear_bwd(&mut s, df, sv.h2, base + 4, cc, 4 * cc);
        let dx2 = ln_bwd(&mut s, dh2, sv.x2, sv.s2, base + 3, Some(dx));
        let dy = linear_bwd(&mut s, dx2, sv.y, base + 2, cc, cc);
        let dyp = s.op(&[dy], bhtd, EW, Cost::Memory);
        let dp = s.op(&[dyp, sv.qkvp], bh * t * t, 0, gemm(bh * t, t, d));
        let ds = s.op(&[dp, sv.p], bh * t * t, EW, Cost::Memory);
        let dqkvp = s.op(
            &[ds, sv.qkvp, dyp, sv.p],
            3 * bhtd,
            0,
            gemm(3 * bh * t, d, t),
        );
        let dqkv = s.op(&[dqkvp], 3 * bhtd, EW, Cost::Memory);
        let dh1 = linear_bwd(&mut s, dqkv, sv.h1, base + 1, cc, 3 * cc);
        dx = ln_bwd(&mut s, dh1, sv.x, sv.s1, base, Some(dx2));
    }
    s.node(&[dx, order, start, token, dwte], &[dwte], 0, Cost::Memory);
    adamw(&mut s, 0, dwte);
    let dwpe = s.op(&[dx], t * cc, 0, Cost::Memory);
    adamw(&mut s, 1, dwpe);
    s
}

/// The largest bytes of intermediates alive at once (the example's "transient peak").
pub fn transient_peak(s: &Step, lv: &Liveness) -> u64 {
    let mut live = vec![0i64; s.nodes.len() + 1];
    for (i, t) in s.tensors.iter().enumerate() {
        if t.kind == TensorKind::Intermediate {
            if let (Some(&a), Some(b)) = (lv.uses[i].first(), lv.last_use[i]) {
                live[a as usize] += round_up(t.size, ALIGN) as i64;
                live[b as usize + 1] -= round_up(t.size, ALIGN) as i64;
            }
        }
    }
    let mut acc = 0;
    live.iter()
        .map(|d| {
            acc += d;
            acc
        })
        .max()
        .unwrap_or(0) as u64
}

/// Every candidate plan for `budget` with its estimate, and the index `choose` takes.
pub fn plans(s: &Step, budget: u64) -> (Vec<(SwapPlan, Estimate)>, usize) {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    estimated(
        s,
        &lv,
        candidates(&s.tensors, &s.nodes, &lv, &[], budget, ALIGN),
    )
}

/// Each plan of `cands` with the model's estimate of its compiled program, and the index
/// `choose` takes.
pub(super) fn estimated(
    s: &Step,
    lv: &Liveness,
    cands: Vec<(Policy, SwapPlan)>,
) -> (Vec<(SwapPlan, Estimate)>, usize) {
    let all: Vec<(SwapPlan, Estimate)> = cands
        .into_iter()
        .map(|(_, plan)| {
            let program = Program::compile(&s.tensors, &s.nodes, lv, Some(&plan), None);
            let e = estimate(&s.tensors, &s.nodes, &program, &s.cost_ms, LINK, ALIGN);
            (plan, e)
        })
        .collect();
    let estimates: Vec<Estimate> = all.iter().map(|(_, e)| e.clone()).collect();
    let best = choose(&estimates);
    (all, best)
}

/// The shape matches the example's printout for the small config (working set 6.79 GB =
/// persistent 1.49 + transient peak 5.30), and the rates give about its 82 ms step.
#[test]
fn the_small_config_has_the_examples_sizes_and_step() {
    let s = build(SMALL);
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let gb = |b: u64| b as f64 / 1e9;
    let (persistent, peak) = (s.persistent_bytes(), transient_peak(&s, &lv));
    assert!((gb(persistent) - 1.49).abs() < 0.01, "{}", gb(persistent));
    assert!((gb(peak) - 5.30).abs() < 0.05, "{}", gb(peak));
    let step: f64 = s.cost_ms.iter().sum();
    assert!((step - 82.3).abs() < 82.3 * 0.15, "{step}");
}

/// What the plan does at a third of the working set, on the model (`--nocapture` prints every
/// candidate). Before chained recomputation the model put the candidates with the H200 run's
/// 37 recomputes a step at 167–177 ms (2.17–2.29x its 77 ms sum of nodes), against 178.7 ms
/// (2.17x) measured; the plan it then chose was 143 ms (1.86x) at either level. At level 1 the
/// bound was 1.80 (a lingering plan at 1.72x) until the model charged the copy of a kept tensor
/// the run writes when it leaves (the previous run left it newer on the device): that plan is
/// 2.03x now, and the chosen one 1.81x.
#[test]
fn a_third_of_the_small_configs_working_set() {
    // Most the chosen plan's step may be, as a multiple of the nodes' sum, per level.
    for (recompute, most) in [(1, 1.85), (2, 1.15)] {
        let s = build(Config { recompute, ..SMALL });
        let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
        let ws = s.persistent_bytes() + transient_peak(&s, &lv);
        let budget = (0.333 * ws as f64) as u64;
        let (all, best) = plans(&s, budget);
        let step: f64 = s.cost_ms.iter().sum();
        for (i, (plan, e)) in all.iter().enumerate() {
            println!(
                "recompute {recompute} plan {i}{}: step {:.1} ms = {:.2}x of {step:.1}; {:.2} GB out, {:.2} GB in, {} recomputes, infeasible {}",
                if i == best { " (chosen)" } else { "" },
                e.step_ms,
                e.step_ms / step,
                plan.bytes_out as f64 / 1e9,
                plan.bytes_in as f64 / 1e9,
                plan.recomputes(),
                plan.infeasible_nodes.len()
            );
            // The profile never holds more than everything at once (a departure counted twice,
            // where a rebuild had brought the tensor back, wrapped it round), and no tensor is
            // dropped twice after one node.
            assert!(plan.peak <= ws, "plan {i}: peak {} over {ws}", plan.peak);
            for (k, drops) in plan.drop_after.iter().enumerate() {
                let mut d = drops.clone();
                d.sort_unstable();
                d.dedup();
                assert_eq!(
                    d.len(),
                    drops.len(),
                    "plan {i}: a tensor dropped twice after node {k}"
                );
            }
        }
        let (plan, e) = &all[best];
        assert!(plan.infeasible_nodes.is_empty());
        assert!(plan.recomputes() > 0);
        assert!(
            e.step_ms <= most * step,
            "level {recompute}: {} ms",
            e.step_ms
        );
    }
}

pub const MEDIUM: Config = Config {
    layers: 24,
    channels: 1024,
    heads: 16,
    ..SMALL
};

/// Deeper than the benchmark's sizes: 48 layers at the small width.
pub const DEEP: Config = Config {
    layers: 48,
    ..SMALL
};

/// A pool under `limit` on a device with virtual memory, as finalize meets it; `primed`: with
/// its virtual range (as `prime_virtual_range` gives it).
pub(super) fn pool_for(limit: u64, primed: bool) -> Pool {
    // As the runtime makes it under a memory limit.
    let mut pool = Pool::new(
        PoolConfig {
            alignment: ALIGN,
            memory_limit: limit,
            ..PoolConfig::default()
        }
        .for_swapping(),
    );
    let backing = Device::default();
    if primed {
        let block = pool.alloc(&backing, ALIGN, StreamId(0)).expect("room");
        pool.free(&backing, block).expect("ours");
    }
    pool
}

/// What finalize does at `limit` on a fresh runtime (`make_swap_plan`): the pool's dry run
/// decides each policy's budget; returns the candidates with their estimates and the index
/// `choose` takes. `primed`: the pool has its virtual range (as `prime_virtual_range` gives it
/// on a device with virtual memory); otherwise it is fresh and its dry run simulates plain
/// segments. `per_policy` off: the earlier finalize, which lowered the default plan's budget
/// and dropped every other policy's plan that failed the dry run at it. `no_waits`: a plan whose
/// dry run waits for the device does not fit (`fits_pool`). `timed`: with the
/// candidates the first run adds, which weigh rebuilds against copies on the shape's costs.
pub(super) fn finalize_at(
    s: &Step,
    limit: u64,
    primed: bool,
    per_policy: bool,
    no_waits: bool,
    timed: bool,
) -> (Vec<(SwapPlan, Estimate)>, usize, Vec<Policy>) {
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let pool = pool_for(limit, primed);
    let check = |plan: &SwapPlan| {
        let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(plan), None);
        if no_waits {
            return fits_pool(&s.tensors, &s.nodes, &program, &pool, StreamId(0), &[]);
        }
        check_with_pool(&s.tensors, &s.nodes, &program, &pool, StreamId(0), &[])
            .map(|_| ())
            .map_err(|node| PoolMisfit::Fails { node })
    };
    let graph = (&s.tensors[..], &s.nodes[..], &lv, &[][..]);
    let mut cands = if per_policy {
        fitted_candidates_with(graph, limit, ALIGN, s.knobs, check).1
    } else {
        let (default, _) = fitted_candidates_with(graph, limit, ALIGN, s.knobs, |p| {
            check(p)?;
            Ok(())
        });
        candidates(&s.tensors, &s.nodes, &lv, &[], default.budget, ALIGN)
            .into_iter()
            .filter(|(_, p)| *p == default || check(p).is_ok())
            .collect()
    };
    if timed {
        // What the first run adds (`RuntimeGraph::add_timed_candidates`), on the shape's costs.
        let known: Vec<SwapPlan> = cands.iter().map(|(_, p)| p.clone()).collect();
        let available = known.iter().map(|p| p.budget).max().unwrap_or(0);
        let timings = Timings {
            node_ms: &s.cost_ms,
            link: LINK,
        };
        let most = known[0].infeasible_nodes.len();
        cands.extend(fitted_timed_candidates_with(
            graph, available, ALIGN, timings, s.knobs, &known, most, check,
        ));
    }
    let policies: Vec<Policy> = cands.iter().map(|(p, _)| *p).collect();
    let (all, best) = estimated(s, &lv, cands);
    if timed {
        // The chosen plan's page maps in the steady state (`pool_moves`) are the second run's:
        // the two runs' total less the first's.
        let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(&all[best].0), None);
        let moves = pool_moves(&s.tensors, &s.nodes, &program, &pool, StreamId(0), &[])
            .expect("the chosen plan fits");
        let maps = |runs| {
            let walk = crate::plan::program::PoolWalk::runs(&s.tensors, &s.nodes, &program, runs);
            let stats = pool
                .dry_run(&walk.dry_run_steps(StreamId(0)))
                .expect("fits");
            stats.page_map_count - pool.stats().page_map_count
        };
        let second: u64 = moves.iter().map(|m| m.maps).sum();
        assert_eq!(second, maps(2) - maps(1));
        println!(
            "  the pool's dry run, second run: {second} pages mapped, {} device waits; before nodes {:?}",
            moves.iter().map(|m| m.waits).sum::<u64>(),
            moves.iter().map(|m| m.node).collect::<Vec<_>>()
        );
    }
    (all, best, policies)
}

/// At a third of the working set, through finalize's dry runs of the pool: the budget a plan
/// gets, and the model's estimate of the chosen plan against the nodes' sum, small, medium and
/// 48 layers deep, products recomputable (`--recompute 2`); `--nocapture` prints each step.
/// Before: a fresh pool's dry run simulated plain segments, the budget fell to about 72% of the
/// limit and the model's step to 1.24x on the small shape (the H200 measured 1.445), its longest
/// waits before node 199 (the backward's first layer, where the H200's timeline waited most)
/// and node 518 (the embedding's AdamW, whose state comes in last). With the pool's range given
/// first and each policy fitted on its own (`fitted_candidates_with`): 1.14x at 92% of the limit,
/// but that plan's dry run waits for the device 10 times in two runs (pages moved under the
/// limit: a context synchronisation each on CUDA, which the model cannot see), so plans must
/// now fit without (`fits_pool`): 1.21x at 84% (small), 1.145x (medium, at the full limit),
/// 1.117x (deep); the first run's timed candidates take medium to 1.089x. Keeping what the
/// embedding's AdamW writes across runs (`Policy::keep_last_writes`: its state's copy home had
/// ended 6 ms after the last node) takes small to 1.160x and deep to 1.113x.
#[test]
fn finalize_at_a_third_gives_plans_most_of_the_limit() {
    for (name, config) in [("small", SMALL), ("medium", MEDIUM), ("deep", DEEP)] {
        let s = build(Config {
            recompute: 2,
            ..config
        });
        let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
        let limit = (0.333 * (s.persistent_bytes() + transient_peak(&s, &lv)) as f64) as u64;
        let step: f64 = s.cost_ms.iter().sum();
        let mut ratios = Vec::new();
        let modes = [
            (false, false, false, false),
            (true, false, false, false),
            (true, true, false, false),
            (true, true, true, false),
            (true, true, true, true),
        ];
        for (primed, per_policy, no_waits, timed) in modes {
            let (all, best, _) = finalize_at(&s, limit, primed, per_policy, no_waits, timed);
            let (plan, e) = &all[best];
            println!(
                "{name}: pool range {primed}, per-policy budgets {per_policy}, no waits {no_waits}, timed {timed}: {} candidates, chosen planned for {:.3} of the limit, {:.1} ms = {:.3}x of {step:.1} (waited {:.1}), {:.2} GB out, {:.2} GB in, {} recomputes",
                all.len(),
                plan.budget as f64 / limit as f64,
                e.step_ms,
                e.step_ms / step,
                e.compute_waited_ms,
                plan.bytes_out as f64 / 1e9,
                plan.bytes_in as f64 / 1e9,
                plan.recomputes()
            );
            // Before, the small shape's plan could not fit the dlogits node (the logits and
            // their gradient, 1.65 GB, over 1.64): the fallback evicted around it.
            assert!(!per_policy || plan.infeasible_nodes.is_empty(), "{name}");
            // Where the compute stream waits: the nodes it waits longest before.
            let mut waits: Vec<(f64, usize)> = e
                .starts
                .iter()
                .enumerate()
                .map(|(n, &(_, w))| (w, n))
                .collect();
            waits.sort_by(|a, b| b.0.total_cmp(&a.0));
            let top: Vec<String> = waits
                .iter()
                .take(3)
                .filter(|(w, _)| *w > 0.05)
                .map(|(w, n)| format!("{w:.1} ms before node {n}"))
                .collect();
            println!("  waits: {}", top.join(", "));
            ratios.push((plan.budget as f64 / limit as f64, e.step_ms / step));
        }
        let (before, now) = (ratios[0], ratios[4]);
        assert!(
            now.0 >= 0.8,
            "{name}: planned for {:.3} of the limit",
            now.0
        );
        assert!(
            now.1 <= before.1 + 1e-9,
            "{name}: {now:?} against {before:?}"
        );
        assert!(now.1 <= 1.17, "{name}: {:.3}x", now.1);
    }
}

/// The H200's timeline of the small shape at a third with `--recompute 2` (session 10, run 5:
/// the last of 8 steps, 112.3 ms against 82.4 unconstrained), in `GKRT_SWAP_TIMELINE`'s format.
const H200_SMALL_THIRD: &str = include_str!("testdata/gpt2_small_third_r2_h200.csv");

/// The model against that measured run: its node times and link rates replace the shape's, and
/// the chosen plan must be the one the H200 ran (the same bytes each way); `--nocapture` prints
/// the model's step, rebuilds and waits beside the measured step and where the measured run fell
/// behind the model (drift jumps by size, the largest). What it showed: on the measured costs the
/// model says 96.4 ms (rebuilds 11.4, waits 0.3) against 112.3 measured; of the 15.9 ms, 6.0 are
/// two jumps before the logits product and its gradient (nodes 195, 198: no copy running, the
/// pool moving pages after waiting for the device), 4.3 fifteen jumps of 0.1–1 ms, and 5.8
/// small gaps at nearly every node (launches and events the model does not charge). Every
/// candidate is printed with its estimate: on these costs none is under 95.8 ms (1.16 times the
/// 82.4 ms unconstrained step), the rebuilds alone of the chosen plan being 11.4 ms — the nodes
/// timed with events take 84.7 ms, the whole untimed unconstrained step 82.4.
/// `GKRT_TEST_TIMELINE=FILE` compares another run of the same shape instead.
#[test]
fn the_model_against_the_h200_timeline_of_the_small_shape() {
    let text = match std::env::var("GKRT_TEST_TIMELINE") {
        Ok(path) => std::fs::read_to_string(&path).expect("readable"),
        Err(_) => H200_SMALL_THIRD.to_string(),
    };
    let rows: Vec<(u64, String, f64, f64, f64)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let n = |i: usize| f[i].parse::<f64>().expect("a number");
            (n(0) as u64, f[1].to_string(), n(2), n(3), n(4))
        })
        .collect();
    let last = rows.iter().map(|r| r.0).max().expect("rows");
    let rows: Vec<_> = rows.into_iter().filter(|r| r.0 == last).collect();
    let mut s = build(Config {
        recompute: 2,
        ..SMALL
    });
    let mut start = vec![f64::NAN; s.nodes.len()];
    for (_, kind, k, a, b) in &rows {
        if kind == "node" {
            s.cost_ms[*k as usize] = b - a;
            start[*k as usize] = *a;
        }
    }
    assert!(start.iter().all(|t| t.is_finite()), "a node missing");
    let moved = |dir: &str| {
        rows.iter()
            .filter(|r| r.1 == dir)
            .fold((0.0, 0.0), |(b, t), r| (b + r.2, t + r.4 - r.3))
    };
    let ((bytes_in, ms_in), (bytes_out, ms_out)) = (moved("in"), moved("out"));
    let link = Link {
        in_gbps: bytes_in / (ms_in * 1e6),
        out_gbps: bytes_out / (ms_out * 1e6),
    };
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = (0.333 * (s.persistent_bytes() + transient_peak(&s, &lv)) as f64) as u64;
    let (all, best, _) = finalize_at(&s, limit, true, true, true, true);
    for (i, (p, e)) in all.iter().enumerate() {
        println!(
            "  candidate {i}{}: {:.2} ms, {} recomputes, {:.2} GB in, planned for {:.3} of the limit",
            if i == best { " (chosen)" } else { "" },
            e.step_ms,
            p.recomputes(),
            p.bytes_in as f64 / 1e9,
            p.budget as f64 / limit as f64
        );
    }
    let (plan, _) = &all[best];
    // The plan the H200 ran: the same bytes each way (within 2%: since that run the planner no
    // longer rebuilds a layer's scores twice (`swap_sim`, moved rebuilds), which let the plan
    // fit a larger budget and moved 1% fewer bytes in).
    let near = |a: f64, b: f64| (a - b).abs() <= 0.02 * b;
    assert!(
        near(plan.bytes_in as f64, bytes_in) && near(plan.bytes_out as f64, bytes_out),
        "plan {} in / {} out, measured {bytes_in} / {bytes_out}",
        plan.bytes_in,
        plan.bytes_out
    );
    let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(plan), None);
    let e = estimate(&s.tensors, &s.nodes, &program, &s.cost_ms, link, ALIGN);
    let nodes: f64 = s.cost_ms.iter().sum();
    let measured = rows
        .iter()
        .filter(|r| r.1 != "pool")
        .map(|r| r.4)
        .fold(0.0, f64::max);
    println!(
        "link in {:.1} / out {:.1} GB/s; nodes {nodes:.2} ms; model: step {:.2} ms, rebuilds {:.2} ms, \
         compute waits {:.2} ms, {} recomputes; measured step {measured:.2} ms",
        link.in_gbps,
        link.out_gbps,
        e.step_ms,
        e.compute_ms - nodes,
        e.compute_waited_ms,
        plan.recomputes()
    );
    // Drift: how far each measured start is behind the modelled one; its jumps, by size.
    let mut drift: Vec<(f64, usize)> = Vec::new();
    let mut prev = 0.0;
    for (n, &(p, _)) in e.starts.iter().enumerate() {
        let d = start[n] - p;
        drift.push((d - prev, n));
        prev = d;
    }
    let bands = [
        (1.0, f64::INFINITY),
        (0.1, 1.0),
        (0.02, 0.1),
        (0.0, 0.02),
        (f64::NEG_INFINITY, 0.0),
    ];
    let summary: Vec<String> = bands
        .iter()
        .map(|&(lo, hi)| {
            let (n, sum) = drift
                .iter()
                .filter(|(j, _)| *j >= lo && *j < hi)
                .fold((0, 0.0), |(n, s), (j, _)| (n + 1, s + j));
            format!("[{lo}, {hi}) ms: {n} nodes, {sum:+.2} ms")
        })
        .collect();
    drift.sort_by(|a, b| b.0.total_cmp(&a.0));
    let top: Vec<String> = drift
        .iter()
        .take(8)
        .map(|(j, n)| format!("+{j:.2} before {n}"))
        .collect();
    println!(
        "measured behind the model by {prev:.2} ms at the last node; jumps {}; largest {}",
        summary.join("; "),
        top.join(", ")
    );
    // The model is optimistic, but not by more than a fifth on the run its plan was made for.
    assert!(
        e.step_ms <= measured && e.step_ms >= 0.8 * measured,
        "model {:.2} ms, measured {measured:.2}",
        e.step_ms
    );
}
