//! The random graphs: a graph as a list of ops over tensors of one shape (`Spec`), the proptest
//! strategy that makes them, their parameters' values, and the same graph interpreted in plain
//! Rust (the reference every run is compared with).

use proptest::prelude::*;

#[derive(Clone, Debug)]
pub enum Op {
    Fill(f32),
    Add(usize, usize),
    Scale(usize, f32),
    Relu(usize),
    ReluGrad(usize, usize),
    Copy(usize),
    Callback(usize),
    Matmul(usize, usize),
    /// `Callback`'s function on its first call in the process, then 1 more on every later call:
    /// not pure, so a rebuild of it differs (`harness::impure_calls`). Never generated at random.
    Impure(usize),
}

/// A graph over tensors of one shape (rows×cols f32, square for matmul), as a list of ops each
/// producing a new value from earlier values (indices into the values list: 0..params are the
/// parameters).
#[derive(Clone, Debug)]
pub struct Spec {
    pub side: usize,
    pub params: usize,
    pub ops: Vec<Op>,
    pub outputs: Vec<usize>,
    pub workspace: u64,
    /// Bit `i % 32` set: op `i`'s node is declared recomputable (every op here is pure).
    pub recomputable: u32,
}

pub fn spec() -> impl Strategy<Value = Spec> {
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

pub fn param_values(spec: &Spec, p: usize) -> Vec<f32> {
    let n = spec.side * spec.side;
    (0..n)
        .map(|i| (((i * 7 + p * 13) % 17) as f32 - 8.0) / 4.0)
        .collect()
}

/// The same graph interpreted directly (the arithmetic the built-ins promise).
pub fn reference(spec: &Spec) -> Vec<Vec<f32>> {
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
            Op::Callback(a) | Op::Impure(a) => vals[a].iter().map(|x| x * 2.0 + 1.0).collect(),
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
