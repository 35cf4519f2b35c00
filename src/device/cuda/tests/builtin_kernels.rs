//! The built-in kernels on a GPU, bit for bit against the same arithmetic on the CPU: the
//! element-wise ones and the matrix product.

use super::*;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_elementwise_builtins_match_cpu_bit_exactly() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    // More than 4 blocks/SM × 256 threads: exercises the grid-stride loop.
    const N: usize = 1_000_003;
    let a = values(N, 1);
    let b = values(N, 2);
    let (pa, pb, po) = (upload(&d, s, &a), upload(&d, s, &b), alloc_f32(&d, N));
    let run = |op: BuiltinOp, inputs: &[Buffer]| -> Vec<f32> {
        d.launch_builtin(op, inputs, &[buf(po, N)], s).unwrap();
        download(&d, s, po, N)
    };

    for value in [-1.25f32, 0.0, -0.0, f32::from_bits(0x7fc0_1234)] {
        let got = run(BuiltinOp::Fill { value }, &[]);
        assert!(
            got.iter().all(|g| g.to_bits() == value.to_bits()),
            "Fill {value:e}"
        );
    }
    assert_bits_eq(&run(BuiltinOp::Copy, &[buf(pa, N)]), &a, "Copy");
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_bits_eq(
        &run(BuiltinOp::Add, &[buf(pa, N), buf(pb, N)]),
        &want,
        "Add",
    );
    for alpha in [0.3f32, -7.0, 1e-30] {
        let want: Vec<f32> = a.iter().map(|x| alpha * x).collect();
        assert_bits_eq(
            &run(BuiltinOp::Scale { alpha }, &[buf(pa, N)]),
            &want,
            "Scale",
        );
    }
    let want: Vec<f32> = a.iter().map(|&x| if x > 0.0 { x } else { 0.0 }).collect();
    assert_bits_eq(&run(BuiltinOp::Relu, &[buf(pa, N)]), &want, "Relu");
    let want: Vec<f32> = b
        .iter()
        .zip(&a)
        .map(|(&g, &x)| if x > 0.0 { g } else { 0.0 })
        .collect();
    assert_bits_eq(
        &run(BuiltinOp::ReluGrad, &[buf(pb, N), buf(pa, N)]),
        &want,
        "ReluGrad",
    );

    // In place (out == input).
    d.launch_builtin(
        BuiltinOp::Scale { alpha: 0.5 },
        &[buf(pa, N)],
        &[buf(pa, N)],
        s,
    )
    .unwrap();
    let want: Vec<f32> = a.iter().map(|x| 0.5 * x).collect();
    assert_bits_eq(&download(&d, s, pa, N), &want, "Scale in place");

    // Zero elements: nothing launched, no error.
    d.launch_builtin(BuiltinOp::Relu, &[buf(pa, 0)], &[buf(po, 0)], s)
        .unwrap();
    // Too-small input: rejected before the GPU sees it.
    assert!(matches!(
        d.launch_builtin(
            BuiltinOp::Add,
            &[buf(pa, N), buf(pb, N - 1)],
            &[buf(po, N)],
            s
        ),
        Err(DeviceError::Invalid(_))
    ));
    d.stream_synchronize(s).unwrap();
    for p in [pa, pb, po] {
        d.free_segment(p, 0).unwrap();
    }
}

fn matmul_cpu(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                acc += a[i * k + p] * b[p * n + j]; // two roundings: Rust never fuses into an FMA
            }
            out[i * n + j] = acc;
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_matmul_matches_cpu_bit_exactly() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    // Tile multiples and not, k = 0, and more row tiles than gridDim.y allows (grid-y stride).
    let shapes = [
        (1, 1, 1),
        (16, 16, 16),
        (37, 53, 70),
        (130, 67, 515),
        (3, 5, 0),
        (65_535 * 16 + 17, 1, 2),
    ];
    for (seed, &(m, n, k)) in shapes.iter().enumerate() {
        let a = values(m * k, 10 + seed as u64);
        let b = values(k * n, 20 + seed as u64);
        let (pa, pb, po) = (upload(&d, s, &a), upload(&d, s, &b), alloc_f32(&d, m * n));
        let op = BuiltinOp::Matmul {
            m: m as u32,
            n: n as u32,
            k: k as u32,
        };
        d.launch_builtin(op, &[buf(pa, m * k), buf(pb, k * n)], &[buf(po, m * n)], s)
            .unwrap();
        let got = download(&d, s, po, m * n);
        assert_bits_eq(
            &got,
            &matmul_cpu(&a, &b, m, n, k),
            &format!("Matmul {m}x{n}x{k}"),
        );
        for p in [pa, pb, po] {
            d.free_segment(p, 0).unwrap();
        }
    }
}
