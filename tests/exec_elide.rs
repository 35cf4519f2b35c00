//! `GKRT_EXEC_ELIDE` (`RuntimeGraph::elide_implied_syncs`, `exec/stream_order.rs`) on the
//! jittery host backend: random training-like chains under budgets below their working set, run
//! with and without the compute-stream syncs the streams' order implies. Both give the bits of
//! the same runs without a limit; eliding queues fewer syncs; and where a run's pool calls are
//! fixed by its plan (a release schedule, no fallback) it queues exactly what the run without
//! elision queues less what it left out — elision only removes syncs, and only those (on the
//! compute stream, and the copy streams' waits for other copies).

mod common;

use common::chains::{build, random_chain, read_all, Rng};

#[test]
fn runs_leaving_out_implied_syncs_give_the_same_bits_with_fewer_compute_syncs() {
    const RUNS: usize = 9;

    let mut rng = Rng(41);
    // Over runs 3..9: three with elision, three without, in every graph.
    let (mut lean, mut full, mut elided, mut compared) = (0u64, 0u64, 0u64, 0);
    let mut copy_elided = 0u64;
    for _ in 0..16 {
        let c = random_chain(&mut rng);
        let size = c.size();
        let want = c.unconstrained_outputs(RUNS);
        let working = c.working_set();
        for (divisor, release) in [(2, true), (3, true), (3, false)] {
            let limit = working / divisor + 4 * size as u64;
            let (mut g, ids) = build(&c, limit, release);
            if g.swap_plan().is_none() {
                continue;
            }
            // Elision on in even runs, off in odd ones: one plan, one schedule for both.
            let mut last: Option<((u64, u64), (u64, u64))> = None;
            for (run, want) in want.iter().enumerate() {
                let on = run % 2 == 0;
                g.elide_implied_syncs(on);
                g.run().unwrap();
                let what = format!(
                    "{} layers of {}, limit {limit}, release {release}, run {run} (eliding {on})",
                    c.layers, c.side
                );
                assert_eq!(&read_all(&mut g, &ids, size), want, "{what}");
                let (syncs, left_out) = g.last_run_syncs();
                let copy_waits = g.last_run_copy_waits();
                if !on {
                    assert_eq!(left_out, 0, "{what}: nothing is left out with elision off");
                    assert_eq!(copy_waits.1, 0, "{what}: every copy stream's wait is made");
                }
                // The runs after the one that tuned the plan (the second) and its next.
                if run < 3 {
                    continue;
                }
                if on {
                    lean += syncs;
                    elided += left_out;
                } else {
                    full += syncs;
                }
                // A steady run following its release schedule makes its program's pool calls:
                // the same copies and waits each run.
                let fixed = g.release_schedule_len().is_some() && g.last_run_fallbacks() == 0;
                let now = fixed.then_some(((syncs, left_out), copy_waits));
                if let (Some(a), Some(b)) = (last, now) {
                    let (with, without) = if on { (b, a) } else { (a, b) };
                    compared += 1;
                    assert_eq!(
                        with.0 .0 + with.0 .1,
                        without.0 .0,
                        "{what}: queued + left out"
                    );
                    assert_eq!(
                        with.1 .0 + with.1 .1,
                        without.1 .0,
                        "{what}: copy streams' waits queued + left out"
                    );
                    copy_elided += with.1 .1;
                }
                last = now;
            }
        }
    }
    println!(
        "steady runs' compute-stream syncs: {lean} eliding ({elided} left out), {full} not; \
         {compared} neighbouring runs compared one to one, their copy streams leaving out \
         {copy_elided} waits"
    );
    assert!(copy_elided > 0);
    assert!(compared >= 20, "{compared} runs compared");
    assert!(elided > 0);
    assert!(
        lean * 10 < full * 9,
        "eliding should leave out more than a tenth of the syncs: {lean} against {full}"
    );
}
