//! A runtime's pool finds periods (`PoolConfig::period_plans`), places step-lived blocks low
//! (`PoolConfig::step_lived_low`), holds requests that raise its high-water mark to that mark
//! (`PoolConfig::tight_peaks`) and sends short-lived requests to its tail
//! (`TailFirst::ShortLived`) only when the runtime has no memory limit: under one its graphs may
//! swap, and the swap planner's dry runs cannot foresee a period or a step-lived block, while its
//! figures were fitted without the tail rule and the tight peaks (`PoolConfig::for_swapping`).
//! In its own process: `GKRT_POOL_PERIOD_PLANS`, `GKRT_POOL_STEP_LIVED`, `GKRT_POOL_TIGHT_PEAKS`
//! and `GKRT_POOL_SHORT_LIVED_TAIL` are read when a runtime is made.

use gkrt::runtime::{Config, DeviceChoice, Runtime};

/// Whether the pool of a runtime with `memory_limit` finds periods, whether it places
/// step-lived blocks low, whether it holds peaks tight, and its tail rule (by name: the pool's
/// types are the crate's own).
fn pool_rules(memory_limit: u64) -> (bool, bool, bool, String) {
    let rt = Runtime::new(Config {
        device: DeviceChoice::Host,
        memory_limit,
        ..Config::default()
    })
    .unwrap();
    let c = rt.lock().pool.config().clone();
    (
        c.period_plans,
        c.step_lived_low,
        c.tight_peaks,
        format!("{:?}", c.tail_first),
    )
}

#[test]
fn periods_step_lived_blocks_tight_peaks_and_the_tail_rule_are_on_only_without_a_memory_limit() {
    assert!(std::env::var("GKRT_POOL_PERIOD_PLANS").is_err());
    assert!(std::env::var("GKRT_POOL_STEP_LIVED").is_err());
    assert!(std::env::var("GKRT_POOL_TIGHT_PEAKS").is_err());
    assert!(std::env::var("GKRT_POOL_SHORT_LIVED_TAIL").is_err());
    assert_eq!(pool_rules(0), (true, true, true, "ShortLived".to_string()));
    assert_eq!(
        pool_rules(1 << 30),
        (false, false, false, "Off".to_string())
    );
}
