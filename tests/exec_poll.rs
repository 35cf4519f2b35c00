//! `GKRT_EXEC_POLL_IN_ORDER` (`RuntimeGraph::poll_copies_in_order`, `exec/poll.rs`) on the jittery
//! host backend: random training-like chains under budgets below their working set, swapping
//! without a release schedule, the executor polling the copy-outs' events oldest first in some
//! runs and the pool polling every pending event in the others. Every run gives the bits of the
//! same runs without a limit, and the executor asks about at most one running copy per
//! allocation besides each copy it sees done.

mod common;

use common::chains::{read_all, swapping_cases, Rng};

#[test]
fn runs_polling_copies_oldest_first_give_the_same_bits_with_few_queries() {
    const RUNS: usize = 6;

    let mut rng = Rng(57);
    let (mut polled, mut ordered_runs) = (0u64, 0);
    for mut case in swapping_cases(&mut rng, 12, &[2, 3], false, RUNS) {
        let size = case.chain.size();
        for run in 0..RUNS {
            let ordered = run % 2 == 0;
            let what = format!("{} (in order {ordered})", case.what(run));
            let g = &mut case.graph;
            g.poll_copies_in_order(ordered);
            let before = g.runtime().stats().unwrap().counters;
            g.run().unwrap();
            assert_eq!(read_all(g, &case.ids, size), case.want[run], "{what}");
            let after = g.runtime().stats().unwrap().counters;
            let queries = g.last_run_events_polled();
            if !ordered {
                assert_eq!(queries, 0, "{what}: the pool polls");
                continue;
            }
            ordered_runs += 1;
            polled += queries;
            let out = after.tensors_swapped_out - before.tensors_swapped_out;
            assert!(
                queries <= out + after.last_run_pool_allocs,
                "{what}: {queries} queries for {out} copies out and {} allocations",
                after.last_run_pool_allocs
            );
        }
    }
    println!("{ordered_runs} runs polling in order, {polled} events queried");
    assert!(ordered_runs >= 20, "{ordered_runs}");
    assert!(polled > 0);
}
