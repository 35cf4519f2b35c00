//! The executor's pool calls against its program's dry run, call by call, under every budget and
//! swap policy; and how often runs fall back when the pool places blocks itself.

use crate::harness::{build, peak_and_least, runtime, to_bytes};
use crate::spec::{param_values, spec, Spec};
use gkrt::runtime::SwapPolicy as Policy;
use gkrt::runtime::{MemoryMode, PoolCall};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

/// Runs every swap policy of `spec` under each budget below its peak, twice each, recording the
/// executor's pool calls. Returns per plan's second run: (what, calls made, calls its program's
/// dry run makes, the run's fallbacks).
pub fn pool_calls_per_policy(spec: &Spec) -> Vec<(String, Vec<PoolCall>, Vec<PoolCall>, u64)> {
    pool_calls_following(spec, true)
}

/// `pool_calls_per_policy`, the runs taking their dry run's placements (`follow`) or not.
fn pool_calls_following(
    spec: &Spec,
    follow: bool,
) -> Vec<(String, Vec<PoolCall>, Vec<PoolCall>, u64)> {
    let (peak, least) = peak_and_least(spec);
    let mut budgets = vec![peak * 3 / 4, peak / 2, peak / 3, least + least / 2, least];
    budgets.retain(|&b| b >= least && b < peak);
    budgets.dedup();
    let mut out = Vec::new();
    for budget in budgets {
        let rt = runtime(MemoryMode::Dynamic, budget);
        let (mut g, ids) = build(spec, &rt);
        for (p, &id) in ids.iter().enumerate().take(spec.params) {
            g.write(id, &to_bytes(&param_values(spec, p))).unwrap();
        }
        if g.swap_plan().is_none() {
            continue;
        }
        let mut policies = g.swap_policies();
        if policies.is_empty() {
            policies.push(Policy::default());
        }
        g.record_pool_calls(true);
        g.follow_placements(follow);
        for policy in policies {
            if g.swap_policies().contains(&policy) {
                g.use_swap_policy(policy).unwrap();
            }
            g.run().unwrap();
            g.run().unwrap();
            let fallback = g.last_run_fallbacks();
            out.push((
                format!("budget {budget} (peak {peak}, least {least}), {policy:?}"),
                g.last_pool_calls().unwrap().to_vec(),
                g.planned_pool_calls(),
                fallback,
            ));
        }
    }
    out
}

/// The executor makes exactly the pool calls of its program's dry run, call by call, under
/// every budget and every swap policy: the dry run and the run walk one program, so a change to
/// the order of either makes this fail. From each plan's second run on: the first starts from
/// whatever the previous plan left on the device, not from the plan's canonical start.
///
/// A run whose pool places blocks otherwise than the dry run did (copy-outs complete at times the
/// dry run cannot know, and the pool reuses their blocks when it sees them done) may take the
/// fallback — an eviction, a batch taken again, a deferred return — and then its calls differ
/// by those; such runs (`last_run_fallbacks`) are counted, not compared, and must stay under a
/// quarter.
#[test]
fn the_executor_makes_the_dry_runs_pool_calls() {
    // The same graphs every run: the default configuration's ChaCha generator, fixed seed.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut compared, mut fell_back) = (0usize, 0usize);
    for _ in 0..48 {
        let spec = spec().new_tree(&mut runner).unwrap().current();
        for (what, made, planned, fallback) in pool_calls_per_policy(&spec) {
            if fallback > 0 {
                fell_back += 1;
                continue;
            }
            compared += 1;
            let first_difference = planned.iter().zip(&made).position(|(a, b)| a != b);
            assert!(
                made == planned && !made.is_empty(),
                "{what}: {} pool calls made, {} planned; first difference at {first_difference:?}: \
                 made {:?}, planned {:?}\nspec {spec:?}",
                made.len(),
                planned.len(),
                first_difference.map(|i| made[i]),
                first_difference.map(|i| planned[i])
            );
        }
    }
    println!("{compared} runs compared, {fell_back} took the fallback");
    // Runs take the ranges their dry run placed blocks in (`plan::swap_placements`): 26 of 719
    // took the fallback; letting the pool place them, 112 (`the_pool_left_to_itself_...`).
    assert!(
        compared >= 8 * fell_back && compared > 100,
        "{compared} runs compared, {fell_back} took the fallback"
    );
}

/// The same graphs with the pool left to place every block itself: its copy-outs' blocks are
/// still pending when the dry run, which freed them at once, reused them, so the layouts part
/// and runs fall back (evict, defer a return) several times as often as runs that take the dry
/// run's placements.
#[test]
fn the_pool_left_to_itself_falls_back_more_often_than_runs_following_placements() {
    // The same graphs every run: the default configuration's ChaCha generator, fixed seed.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut following, mut left) = (0usize, 0usize);
    for _ in 0..24 {
        let spec = spec().new_tree(&mut runner).unwrap().current();
        for (follow, count) in [(true, &mut following), (false, &mut left)] {
            *count += pool_calls_following(&spec, follow)
                .iter()
                .filter(|(_, _, _, fallback)| *fallback > 0)
                .count();
        }
    }
    println!("runs falling back: {following} following placements, {left} without");
    assert!(
        left >= 2 * following.max(1),
        "runs falling back: {following} following placements, {left} without"
    );
}
