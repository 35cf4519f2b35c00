//! A runtime's pool finds periods (`PoolConfig::period_plans`) only when the runtime has no memory
//! limit: under one its graphs may swap, and the swap planner's dry runs cannot foresee a period.
//! In its own process: `GKRT_POOL_PERIOD_PLANS` is read when a runtime is made.

use gkrt::runtime::{Config, DeviceChoice, Runtime};

fn periods(memory_limit: u64) -> bool {
    let rt = Runtime::new(Config {
        device: DeviceChoice::Host,
        memory_limit,
        ..Config::default()
    })
    .unwrap();
    let on = rt.lock().pool.config().period_plans;
    on
}

#[test]
fn periods_are_found_only_without_a_memory_limit() {
    assert!(std::env::var("GKRT_POOL_PERIOD_PLANS").is_err());
    assert!(periods(0));
    assert!(!periods(1 << 30));
}
