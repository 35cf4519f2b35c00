//! The swap plan's unit tests (a child module of `swap.rs`, kept in its own file).

use super::*;
use crate::graph::TensorKind;
use crate::plan::program::{PoolWalk, Program, Step};
use crate::plan::swap_model::Link;
use crate::plan::test_graph::{G, MB};

/// Attention's shape in small: q stays alive to the end; scores s = f(q) is freed after the
/// softmax p = g(s); p is read again at the end, past nodes that need its room.
fn attention_like() -> (G, [u32; 4], u32) {
    let mut g = G::default();
    let a = g.tensor(1, TensorKind::Input);
    let q = g.tensor(1, TensorKind::Intermediate);
    let s = g.tensor(4, TensorKind::Intermediate);
    let p = g.tensor(4, TensorKind::Intermediate);
    let f1 = g.tensor(10, TensorKind::Intermediate);
    let f2 = g.tensor(2, TensorKind::Intermediate);
    let out = g.tensor(1, TensorKind::Output);
    g.node(&[a], q, false);
    g.node(&[q], s, true);
    g.node(&[s], p, true);
    g.node(&[a], f1, false);
    g.node(&[f1], f2, false);
    let last = g.node(&[p, q, f2], out, false);
    (g, [q, s, p, out], last)
}

/// The softmax output's producer reads scores already freed: the plan rebuilds both (scores
/// first), frees the scores after the reader, and moves neither over the link.
#[test]
fn a_recompute_chains_through_a_freed_input() {
    let (g, [_, s, p, _], last) = attention_like();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let plan = plan_swaps(&g.tensors, &g.nodes, &lv, 14 * MB, 1);
    assert!(plan.infeasible_nodes.is_empty(), "{plan:?}");
    assert_eq!(plan.recompute_before[last as usize], vec![s, p], "{plan:?}");
    assert_eq!(plan.free_after[last as usize], vec![s]);
    assert!(plan.drop_after[2].contains(&p), "{plan:?}");
    assert!(plan.swap_out_after.iter().flatten().all(|&t| t != p));
    assert!(plan.peak <= 14 * MB, "{}", plan.peak);

    // Without recomputation p is copied out and back.
    let off = Policy {
        recompute: false,
        ..Policy::default()
    };
    let copied = plan_with(&g.tensors, &g.nodes, &lv, 14 * MB, 1, off);
    assert_eq!(copied.recomputes(), 0);
    assert!(copied.bytes_out >= plan.bytes_out + 4 * MB, "{copied:?}");
}

/// The chain is not planned when the reader's node has no room for the freed link too.
#[test]
fn a_chain_that_does_not_fit_beside_the_reader_is_copied() {
    let (g, [_, _, p, _], last) = attention_like();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    // The last node needs 8 MB, 12 with the scores rebuilt beside it.
    let plan = plan_swaps(&g.tensors, &g.nodes, &lv, 11 * MB, 1);
    assert!(plan.recompute_before[last as usize].is_empty(), "{plan:?}");
    assert!(
        plan.swap_out_after.iter().flatten().any(|&t| t == p),
        "{plan:?}"
    );
}

/// A GELU-like output g = gelu(f) read before its input f is: both are dropped (f first,
/// used farther away), and g's rebuild moves f's forward to g's reader, where f then stays
/// for its own use (not freed, not rebuilt twice).
#[test]
fn a_dropped_input_rebuilt_later_is_rebuilt_earlier_for_a_chain() {
    let mut g = G::default();
    let a = g.tensor(1, TensorKind::Input);
    let h = g.tensor(1, TensorKind::Intermediate);
    let f = g.tensor(4, TensorKind::Intermediate);
    let gl = g.tensor(4, TensorKind::Intermediate);
    let f1 = g.tensor(10, TensorKind::Intermediate);
    let f2 = g.tensor(2, TensorKind::Intermediate);
    let (out1, out2) = (
        g.tensor(1, TensorKind::Output),
        g.tensor(1, TensorKind::Output),
    );
    g.node(&[a], h, false);
    g.node(&[h], f, true);
    g.node(&[f], gl, true);
    g.node(&[a], f1, false);
    g.node(&[f1], f2, false);
    let reads_g = g.node(&[gl, f2], out1, false);
    let reads_f = g.node(&[f, h], out2, false);
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let plan = plan_swaps(&g.tensors, &g.nodes, &lv, 15 * MB, 1);
    assert!(plan.infeasible_nodes.is_empty(), "{plan:?}");
    assert_eq!(
        plan.recompute_before[reads_g as usize],
        vec![f, gl],
        "{plan:?}"
    );
    assert!(
        plan.recompute_before[reads_f as usize].is_empty(),
        "{plan:?}"
    );
    assert!(plan.free_after.iter().all(Vec::is_empty), "{plan:?}");
    let copied: Vec<u32> = plan.swap_out_after.iter().flatten().copied().collect();
    assert!(!copied.contains(&f) && !copied.contains(&gl), "{plan:?}");
    assert!(plan.peak <= 15 * MB, "{}", plan.peak);
    // The program rebuilds each once per run.
    let program = Program::compile(&g.tensors, &g.nodes, &lv, Some(&plan), None);
    let rebuilds = program
        .steps
        .iter()
        .filter(|x| matches!(x, Step::Recompute { .. }))
        .count();
    assert_eq!(rebuilds, 2);
}

/// The compiled program rebuilds the chain in order before the reader, frees the link after
/// it, and the pool walk allocates and frees it once per run.
#[test]
fn the_program_rebuilds_a_chain_in_order_and_frees_its_link() {
    let (g, [_, s, p, _], last) = attention_like();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let plan = plan_swaps(&g.tensors, &g.nodes, &lv, 14 * MB, 1);
    let program = Program::compile(&g.tensors, &g.nodes, &lv, Some(&plan), None);
    let at =
        |want: &dyn Fn(&Step) -> bool| program.steps.iter().position(want).expect("step present");
    let rebuild_s = at(&|x| matches!(x, Step::Recompute { tensor, .. } if *tensor == s));
    let rebuild_p = at(&|x| matches!(x, Step::Recompute { tensor, .. } if *tensor == p));
    let launch = at(&|x| *x == Step::Launch(last));
    let free_s: Vec<usize> = (0..program.steps.len())
        .filter(|&i| program.steps[i] == Step::Free(s))
        .collect();
    assert!(
        rebuild_s < rebuild_p && rebuild_p < launch,
        "{:?}",
        program.steps
    );
    // Freed after its first last use (node 2) and after the reader.
    assert_eq!(free_s.len(), 2, "{:?}", program.steps);
    assert!(free_s[1] > launch);
    let walk = PoolWalk::runs(&g.tensors, &g.nodes, &program, 2);
    let s_calls = walk
        .calls
        .iter()
        .filter(|c| format!("{c:?}").contains(&format!("Tensor({s})")))
        .count();
    // Per run: produced, freed, rebuilt, freed.
    assert_eq!(s_calls, 8, "{:?}", walk.calls);
    let _ = walk.dry_run_steps(crate::device::StreamId(0));
}

/// A capped policy weighs the rebuild against the copies on the timings: attention's softmax
/// output (4 MB, 4 + 4 ms over a 1 GB/s link) is rebuilt when its two producers take 0.1 ms
/// each, copied when they take 10 ms; without timings the cap does nothing.
#[test]
fn a_capped_policy_rebuilds_only_what_is_cheaper_than_its_copies() {
    let (g, [_, s, p, _], last) = attention_like();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let link = Link {
        in_gbps: 1.0,
        out_gbps: 1.0,
    };
    let capped = Policy {
        recompute_cap_pct: 25,
        ..Policy::default()
    };
    let holds = CommHolds::new(g.tensors.len(), &g.nodes, &lv, &[]);
    let with = |ms: f64| {
        let node_ms = vec![ms; g.nodes.len()];
        let t = Timings {
            node_ms: &node_ms,
            link,
        };
        plan_timed(
            &g.tensors,
            &g.nodes,
            &lv,
            &holds,
            14 * MB,
            1,
            capped,
            Some(t),
        )
    };
    let cheap = with(0.1);
    assert_eq!(
        cheap.recompute_before[last as usize],
        vec![s, p],
        "{cheap:?}"
    );
    assert_eq!(
        cheap,
        plan_timed(&g.tensors, &g.nodes, &lv, &holds, 14 * MB, 1, capped, None)
    );
    let dear = with(10.0);
    assert_eq!(dear.recomputes(), 0, "{dear:?}");
    assert!(dear.swap_out_after.iter().flatten().any(|&t| t == p));
    assert!(dear.bytes_out >= cheap.bytes_out + 4 * MB, "{dear:?}");
}

/// A training step's shape in small: activations `a`, `b` between a weight's first read and
/// its optimizer step at the end, which writes the weight and its state `m` (8 MB: the
/// embedding's AdamW state).
fn optimizer_last() -> (G, [u32; 2]) {
    let mut g = G::default();
    let w = g.tensor(2, TensorKind::Parameter);
    let m = g.tensor(8, TensorKind::Parameter);
    let x = g.tensor(1, TensorKind::Input);
    let a = g.tensor(4, TensorKind::Intermediate);
    let b = g.tensor(4, TensorKind::Intermediate);
    let grad = g.tensor(2, TensorKind::Intermediate);
    g.node(&[x, w], a, false);
    g.node(&[a], b, false);
    g.node(&[a, b], grad, false);
    g.node_writing(&[grad, w, m], &[w, m]);
    (g, [w, m])
}

/// `Policy::keep_last_writes`: what the last nodes write stays on the device at the run's end
/// (no copy home after the last node) and leaves, copied, when the next run needs its room.
#[test]
fn keeping_the_last_writes_moves_their_copies_out_of_the_runs_tail() {
    let (g, [w, m]) = optimizer_last();
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let last = g.nodes.len() - 1;
    let plain = plan_with(&g.tensors, &g.nodes, &lv, 16 * MB, 1, Policy::default());
    assert!(!plain.keep.contains(&m), "{plain:?}");
    assert!(plain.swap_out_after[last].contains(&m), "{plain:?}");
    let keeping = Policy {
        keep_last_writes: true,
        ..Policy::default()
    };
    let kept = plan_with(&g.tensors, &g.nodes, &lv, 16 * MB, 1, keeping);
    assert!(kept.keep.contains(&w) && kept.keep.contains(&m), "{kept:?}");
    assert!(kept.infeasible_nodes.is_empty(), "{kept:?}");
    assert!(!kept.swap_out_after[last].contains(&m), "{kept:?}");
    // It leaves for the activations' room while the run computes, copied: the run wrote it.
    let left: Vec<u32> = kept
        .swap_out_after
        .iter()
        .flatten()
        .chain(&kept.leave_at_start)
        .copied()
        .collect();
    assert!(left.contains(&m), "{kept:?}");
    assert!(kept.bytes_out >= 8 * MB, "{kept:?}");
}
