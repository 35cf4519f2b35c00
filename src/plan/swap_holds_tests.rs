//! The swap plan around collectives: a tensor a collective reads stays on the device from its
//! producer to the collective's completion node (a child module of `swap_holds.rs`).

use super::CommHolds;
use crate::graph::{FusedGroup, Liveness, TensorKind};
use crate::plan::program::{Program, Step};
use crate::plan::swap::{plan_swaps_fused, SwapPlan};
use crate::plan::swap_candidates::candidates;
use crate::plan::test_graph::{G, MB};

/// A gradient `g` produced at node 0 and read next at node 5 (the farthest next use while the
/// activations of nodes 1–4 need room), a parameter `v` read at nodes 1 and 3; node 5 is an
/// in-place all-reduce of `g` (`collective`) or a plain node writing it; node 6 overlaps it,
/// node 7 reads `g` (the all-reduce's completion node). Returns the graph and `g`.
fn gradient_graph(collective: bool) -> (G, u32) {
    let mut g = G::default();
    let x = g.tensor(1, TensorKind::Input);
    let v = g.tensor(4, TensorKind::Parameter);
    let grad = g.tensor(4, TensorKind::Intermediate);
    let a1 = g.tensor(2, TensorKind::Intermediate);
    let a2 = g.tensor(2, TensorKind::Intermediate);
    let c = g.tensor(1, TensorKind::Intermediate);
    let a3 = g.tensor(2, TensorKind::Intermediate);
    let b = g.tensor(2, TensorKind::Intermediate);
    let out = g.tensor(1, TensorKind::Output);
    g.node_writing(&[x], &[grad]);
    g.node_writing(&[x, v], &[a1]);
    g.node_writing(&[a1], &[a2]);
    g.node_writing(&[v], &[c]);
    g.node_writing(&[a2, c], &[a3]);
    if collective {
        g.all_reduce(&[grad]);
    } else {
        g.node_writing(&[grad], &[grad]);
    }
    g.node_writing(&[a3], &[b]);
    g.node_writing(&[grad, b], &[out]);
    (g, grad)
}

/// The nodes after which `plan` copies `t` out or drops it.
fn leaves(plan: &SwapPlan, t: u32) -> Vec<u32> {
    let after = |lists: &[Vec<u32>]| -> Vec<u32> {
        (0..lists.len() as u32)
            .filter(|&k| lists[k as usize].contains(&t))
            .collect()
    };
    let mut at = after(&plan.swap_out_after);
    at.extend(after(&plan.drop_after));
    at
}

#[test]
fn a_tensor_a_collective_reads_never_leaves_between_its_producer_and_the_completion() {
    let budget = 11 * MB;
    // Without the collective the plan moves the gradient out (its next use is the farthest):
    // the check below can fail.
    let (plain, grad) = gradient_graph(false);
    let lv = Liveness::analyse(&plain.tensors, &plain.nodes, 1);
    let plan = plan_swaps_fused(&plain.tensors, &plain.nodes, &lv, &[], budget, 1);
    assert!(plan.infeasible_nodes.is_empty(), "{plan:?}");
    assert_eq!(leaves(&plan, grad), vec![0], "{plan:?}");

    let (g, grad) = gradient_graph(true);
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let holds = CommHolds::new(g.tensors.len(), &g.nodes, &lv, &[]);
    // Pinned from its producer (node 0) through the completion node (7, which reads it).
    for n in 0..8 {
        assert!(holds.pinned_at(grad, n), "node {n}");
    }
    let all = candidates(&g.tensors, &g.nodes, &lv, &[], budget, 1);
    assert!(!all.is_empty());
    let mut swapped = 0;
    for (policy, plan) in all {
        assert!(plan.infeasible_nodes.is_empty(), "{policy:?}: {plan:?}");
        swapped += plan.bytes_out + plan.bytes_in;
        assert_eq!(
            leaves(&plan, grad),
            Vec::<u32>::new(),
            "{policy:?}: {plan:?}"
        );
        assert!(
            !plan.recompute_before.iter().flatten().any(|&t| t == grad),
            "{policy:?}"
        );
        // The program queues the all-reduce after the gradient's producer and waits for it
        // before node 7; the gradient is freed only after that.
        let program = Program::compile_fused(&g.tensors, &g.nodes, &lv, Some(&plan), None, &[]);
        let at = |s: Step| program.steps.iter().position(|&x| x == s).unwrap();
        assert!(at(Step::AwaitCollective(5)) < at(Step::Launch(7)));
        assert!(at(Step::Free(grad)) > at(Step::Launch(7)));
        assert!(!program.steps.contains(&Step::CopyOut(grad)));
    }
    // The room the gradient keeps is made elsewhere: the parameter leaves and comes back.
    assert!(swapped > 0, "the budget under the peak moved nothing");
}

/// A persistent tensor whose last use is a collective that completes only at the run's end
/// leaves with the run's final sends home (after the final wait), not right after the
/// collective; a fused block's members never leave alone; the least limit counts the block.
#[test]
fn copies_of_collective_tensors_wait_for_the_completion() {
    let mut g = G::default();
    let x = g.tensor(1, TensorKind::Input);
    let g1 = g.tensor(2, TensorKind::Intermediate);
    let g2 = g.tensor(2, TensorKind::Intermediate);
    let w = g.tensor(3, TensorKind::Parameter);
    let big = g.tensor(4, TensorKind::Intermediate);
    let out = g.tensor(1, TensorKind::Output);
    let sent = g.tensor(2, TensorKind::Output);
    g.node_writing(&[x], &[g1]); // 0
    g.node_writing(&[x, w], &[big]); // 1
    g.node_writing(&[x], &[g2]); // 2
    g.all_reduce(&[g1, g2]); // 3: fused block [g1, g2]
    g.node_writing(&[big], &[sent]); // 4
    g.all_reduce(&[sent]); // 5: completes at the run's end
    g.node_writing(&[g1, g2, w], &[out]); // 6
    let fused = vec![FusedGroup {
        node: 3,
        members: vec![g1, g2],
        offsets: vec![0, 2 * MB],
        bytes: 4 * MB,
    }];
    let lv = Liveness::analyse(&g.tensors, &g.nodes, 1);
    let holds = CommHolds::new(g.tensors.len(), &g.nodes, &lv, &fused);
    for n in 0..=6 {
        assert!(holds.pinned_at(g1, n) && holds.pinned_at(g2, n), "node {n}");
    }
    assert_eq!(
        holds.leave_after(sent, 4, 7),
        None,
        "completes at the run's end"
    );
    let mut moved = 0;
    for budget in [12 * MB, 10 * MB] {
        for (policy, plan) in candidates(&g.tensors, &g.nodes, &lv, &fused, budget, 1) {
            moved += plan.bytes_out + plan.bytes_in;
            for t in [g1, g2, sent] {
                assert_eq!(
                    leaves(&plan, t),
                    Vec::<u32>::new(),
                    "{policy:?} {budget}: {plan:?}"
                );
            }
            let program =
                Program::compile_fused(&g.tensors, &g.nodes, &lv, Some(&plan), None, &fused);
            // (The run's start sends it home too, before anything runs.)
            let last = |s: Step| program.steps.iter().rposition(|&x| x == s);
            let wait = last(Step::AwaitCollective(5)).expect("the run's end waits for node 5");
            assert!(last(Step::SendHome(sent)).unwrap() > wait);
            assert!(!program.steps.contains(&Step::CopyOut(sent)));
        }
    }
    assert!(moved > 0, "budgets under the working set moved nothing");
    // The least limit counts what is held: at node 1, its own x, w and big (8 MB) and the fused
    // block (4 MB, produced at node 0, all-reduced at node 3).
    use crate::plan::min_limit::{min_memory_limit, min_memory_limit_held};
    assert_eq!(min_memory_limit(&g.tensors, &g.nodes, 1), 8 * MB);
    assert_eq!(
        min_memory_limit_held(&g.tensors, &g.nodes, &lv, &fused, 1),
        12 * MB
    );
}
