//! Fixed graphs at the edge of the budget: a node too large for it fails cleanly and leaves the
//! runtime usable; parameters larger than it stream through.

use crate::harness::{from_bytes, runtime, to_bytes, DIMS};
use gkrt::runtime::{BuiltinKind, Kernel, MemoryMode, RuntimeGraph, TensorKind};

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
