//! Recomputation instead of copies: ReLUs declared recomputable are rebuilt (moving fewer bytes
//! than copying), and chains of recomputable nodes match the dry run's pool calls and the
//! reference.

use crate::harness::{build, peak_and_least, run_and_stats, run_spec_with_limit, runtime};
use crate::pool_calls::pool_calls_per_policy;
use crate::spec::{reference, Op, Spec};
use gkrt::runtime::MemoryMode;
use gkrt::runtime::SwapPolicy as Policy;

/// A training-like chain (matrix products, ReLUs declared recomputable, then a backward pass
/// that reads every activation again): under budgets below its peak, plans drop ReLU outputs
/// and run the ReLU again before the backward reader, outputs stay bit-identical under every
/// plan, and a plan that recomputes moves fewer bytes than one that may not.
/// Three layers and their backward over values 0, 1 (parameters), with `x1`'s op given: x0 = fill,
/// z_i = x_i·w, x_{i+1} = relu(z_i) (x1 = `x1`); dz_i = relu'(g, z_i) and a product with x_i (a
/// far use of each layer's output). Value 14 is the result.
fn three_layers(x1: Op) -> Vec<Op> {
    use Op::*;
    vec![
        Fill(0.5),       // 2: x0
        Matmul(2, 0),    // 3: z0
        x1,              // 4: x1
        Matmul(4, 1),    // 5: z1
        Relu(5),         // 6: x2
        Matmul(6, 0),    // 7: z2
        Relu(7),         // 8: x3
        ReluGrad(8, 7),  // 9: dz2
        Matmul(6, 9),    // 10: reads x2
        ReluGrad(10, 5), // 11: dz1
        Matmul(4, 11),   // 12: reads x1 far away
        ReluGrad(12, 3), // 13: dz0
        Add(13, 10),     // 14
    ]
}

#[test]
fn recomputable_relus_are_rebuilt_instead_of_copied() {
    use Op::*;
    // Values 0, 1: parameters. Forward: x0 = fill, z_i = x_i·w, x_{i+1} = relu(z_i).
    // Backward: dz_i = relu'(g, z_i) and a product with x_i (a far use of each ReLU output).
    let ops = three_layers(Relu(3));
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

/// The bit-identity checks above would catch a rebuild that computes different bits: the ReLU
/// chain with its first activation made by a host callback, pure (`Op::Callback`) or not
/// (`Op::Impure`: every call after the first adds 1), declared recomputable. One run under a
/// budget whose plan rebuilds it: the pure callback's outputs match the reference bit for bit,
/// the impure one's do not — its second call, the rebuild, fed the backward pass.
#[test]
fn a_rebuild_that_differs_changes_the_bits_the_tests_compare() {
    use crate::harness::IMPURE_CALLS;
    use std::sync::atomic::Ordering;
    use Op::*;
    let chain = |first: Op| Spec {
        side: 16,
        params: 2,
        ops: three_layers(first), // x1 = z0 * 2 + 1 (recomputable)
        outputs: vec![14],
        workspace: 0,
        recomputable: (1 << 2) | (1 << 4) | (1 << 6),
    };
    let (pure, impure) = (chain(Callback(3)), chain(Impure(3)));
    let want = reference(&pure);
    assert_eq!(reference(&impure)[0], want[0], "one reference for both");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (peak, least) = peak_and_least(&pure);
    let mut rebuilt = 0;
    for budget in [peak * 3 / 4, peak / 2, least + least / 2, least] {
        if budget < least {
            continue;
        }
        let (got, stats) = run_and_stats(&pure, MemoryMode::Dynamic, 1, budget);
        assert_eq!(bits(&got[0]), bits(&want[0]), "pure, budget {budget}");
        IMPURE_CALLS.store(0, Ordering::SeqCst);
        let (odd, odd_stats) = run_and_stats(&impure, MemoryMode::Dynamic, 1, budget);
        let calls = IMPURE_CALLS.load(Ordering::SeqCst);
        // The callback ran again only for a rebuild, and only then did the bits move.
        assert!(calls == 1 || odd_stats.counters.tensors_recomputed > 0);
        assert_eq!(
            stats.counters.tensors_recomputed, odd_stats.counters.tensors_recomputed,
            "budget {budget}: one plan for both"
        );
        if calls > 1 {
            rebuilt += 1;
            assert_ne!(
                bits(&odd[0]),
                bits(&want[0]),
                "budget {budget}: the rebuild went unseen"
            );
        } else {
            assert_eq!(bits(&odd[0]), bits(&want[0]), "budget {budget}");
        }
    }
    assert!(rebuilt > 0, "no budget rebuilt the callback's output");
}
