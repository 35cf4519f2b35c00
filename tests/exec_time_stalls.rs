//! `GKRT_EXEC_TIME_STALLS` (`RuntimeGraph::time_copy_waits`) on the jittery host backend: random
//! training-like chains under budgets below their working set, run with the compute stream's
//! waits on copies timed and untimed. Both give the bits of the same runs without a limit;
//! untimed runs leave the runtime's `copy_wait_ns` where it was; and where a run's pool calls are
//! fixed by its plan, an untimed run queues the timed one's syncs less its timing records (the
//! same syncs queued and left out in all), never more.

mod common;

use common::chains::{read_all, swapping_cases, Rng};

#[test]
fn untimed_waits_give_the_same_bits_and_queue_only_the_timing_records_less() {
    const RUNS: usize = 9;

    let mut rng = Rng(43);
    let (mut timed_syncs, mut untimed_syncs, mut compared, mut timed_wait_ns) =
        (0u64, 0u64, 0, 0u64);
    for mut case in swapping_cases(&mut rng, 12, &[2, 3], true, RUNS) {
        let size = case.chain.size();
        // Timed in even runs, untimed in odd ones: one plan, one schedule for both.
        let mut last: Option<(u64, u64)> = None;
        for run in 0..RUNS {
            let timed = run % 2 == 0;
            let what = format!("{} (timed {timed})", case.what(run));
            let g = &mut case.graph;
            g.time_copy_waits(timed);
            let before = g.runtime().stats().unwrap().counters.copy_wait_ns;
            g.run().unwrap();
            let waited = g.runtime().stats().unwrap().counters.copy_wait_ns - before;
            assert_eq!(read_all(g, &case.ids, size), case.want[run], "{what}");
            if timed {
                timed_wait_ns += waited;
            } else {
                assert_eq!(waited, 0, "{what}: an untimed run adds no copy wait");
            }
            if run < 3 {
                continue;
            }
            let fixed = g.release_schedule_len().is_some() && g.last_run_fallbacks() == 0;
            let now = fixed.then(|| g.last_run_syncs());
            if let (Some(a), Some(b)) = (last, now) {
                let (t, u) = if timed { (b, a) } else { (a, b) };
                compared += 1;
                assert_eq!(t.0 + t.1, u.0 + u.1, "{what}: queued + left out");
                assert!(
                    u.0 <= t.0,
                    "{what}: untimed queues no more: {u:?} against {t:?}"
                );
                timed_syncs += t.0;
                untimed_syncs += u.0;
            }
            last = now;
        }
    }
    println!(
        "neighbouring steady runs compared: {compared}; compute-stream syncs queued timed \
         {timed_syncs}, untimed {untimed_syncs}; timed runs' copy waits {timed_wait_ns} ns"
    );
    assert!(compared >= 20, "{compared} runs compared");
    assert!(
        untimed_syncs < timed_syncs,
        "untimed runs leave out the timing records: {untimed_syncs} against {timed_syncs}"
    );
}
