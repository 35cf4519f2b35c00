//! Random graphs give the reference's outputs bit for bit: in dynamic and planned mode, and
//! swapping under every budget from the graph's peak down to the smallest that can work.
//! (proptest keeps past failures' seeds in tests/proptest-regressions/matches_reference.txt.)

use crate::harness::{peak_and_least, run_and_stats, run_spec};
use crate::spec::{reference, spec};
use gkrt::runtime::MemoryMode;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn dynamic_and_planned_match_the_reference(spec in spec()) {
        let want = reference(&spec);
        let dynamic = run_spec(&spec, MemoryMode::Dynamic, 2);
        let planned = run_spec(&spec, MemoryMode::Planned, 2);
        for (i, w) in want.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&dynamic[i]), bits(w), "dynamic output {}", i);
            prop_assert_eq!(bits(&planned[i]), bits(w), "planned output {}", i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Under every budget from the graph's peak down to the smallest that can work, swapping
    /// gives bit-identical outputs, and memory returns to its baseline after every run.
    #[test]
    fn swapping_is_bit_exact_under_any_budget(spec in spec()) {
        let want = reference(&spec);
        let (peak, least) = peak_and_least(&spec);
        let mut budgets = vec![peak, peak * 3 / 4, peak / 2, peak / 3, least + least / 2, least];
        budgets.retain(|&b| b >= least);
        budgets.dedup();
        for budget in budgets {
            let (got, stats) = run_and_stats(&spec, MemoryMode::Dynamic, 2, budget);
            if budget < peak {
                let moved = stats.counters.swap_out_bytes + stats.counters.swap_in_bytes;
                let rebuilt = stats.counters.tensors_recomputed;
                prop_assert!(moved + rebuilt > 0, "a budget of {} under the peak {} moved and recomputed nothing: {:?}", budget, peak, stats.counters);
            }
            prop_assert!(stats.pool.peak_reserved_bytes <= budget, "reserved {} over the budget {}", stats.pool.peak_reserved_bytes, budget);
            for (i, w) in want.iter().enumerate() {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got[i]), bits(w), "output {} under a budget of {} (peak {}, least {})", i, budget, peak, least);
            }
        }
    }
}
