//! `GKRT_SWAP_RELEASE` (`RuntimeGraph::release_copies`) on the host backend: random training-like
//! chains (products, ReLUs declared recomputable at random, residual sums, an in-place update of
//! every weight) under budgets below their working set. Once the timed runs have chosen a plan
//! fitted with its copy-outs' blocks pending until the model's copy ends (to the pool emptied
//! of the graph's tensors, `GKRT_SWAP_TUNE_EMPTY`), every run gives those
//! blocks back as scheduled and makes exactly its program's pool calls without a fallback, the
//! pool never waits for the device in the steady runs, and every run's results are bit-identical
//! to the same runs without a limit.

mod common;

use common::chains::{read_all, swapping_cases, Rng};

#[test]
fn runs_giving_copy_outs_blocks_back_as_scheduled_match_the_dry_run_and_the_unconstrained_runs() {
    const RUNS: usize = 6;

    let mut rng = Rng(23);
    let (mut scheduled, mut released, mut steady) = (0, 0u64, 0);
    for mut case in swapping_cases(&mut rng, 24, &[2, 3], true, RUNS) {
        let size = case.chain.size();
        case.graph.record_pool_calls(true);
        let mut counts = Vec::new();
        for run in 0..RUNS {
            let what = case.what(run);
            let g = &mut case.graph;
            g.run().unwrap();
            assert_eq!(read_all(g, &case.ids, size), case.want[run], "{what}");
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
            // (Its candidates fitted to the pool emptied of the graph, as its runs start.)
            assert!(g.tuned_from_empty_pool(), "{what}");
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
    println!("{scheduled} plans with a release schedule, {steady} steady runs, {released} blocks released");
    assert!(scheduled >= 8, "{scheduled} plans with a release schedule");
    assert!(released > 0);
}
