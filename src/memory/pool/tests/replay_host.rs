//! The traces recorded on a machine without a GPU (`benches/traces_host/`, written by
//! `benches/record_host_traces.py`): programs of kinds the pool's rules were not chosen on —
//! weights shared between layers, a state-space scan, a static key/value cache, a recurrent
//! model, checkpointing under bf16, a 12 MiB heap, among others. They check the rules; a rule
//! is never chosen on them.

use super::replay::{goal, load_trace, replay_with, CostModel};
use super::*;

/// Every host-recorded trace replayed as `trace_replay --passes 5` replays it, at both paces:
/// its peak reserved within the goal, and its median later pass mapping nothing (the
/// pool's recycling settles rather than moving pages every step).
#[test]
fn traces_recorded_on_the_cpu_stay_within_their_goals() {
    let dir = format!("{}/benches/traces_host", env!("CARGO_MANIFEST_DIR"));
    let mut paths: Vec<String> = std::fs::read_dir(&dir)
        .expect("benches/traces_host")
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .filter(|p| p.ends_with(".trace.gz"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 14, "{} traces in {dir}", paths.len());
    let mut missed = Vec::new();
    for path in &paths {
        let (evs, unfreed) = load_trace(path);
        let name = path
            .rsplit('/')
            .next()
            .unwrap()
            .trim_end_matches(".trace.gz");
        for fast in [false, true] {
            let cfg = PoolConfig::default();
            let f = replay_with(
                &evs,
                &unfreed,
                Pool::new(cfg),
                (true, 11),
                CostModel::at_pace(fast),
                false,
            );
            let mut later = f.steady_maps.clone();
            later.sort_unstable();
            let ratio = f.peak_reserved as f64 / f.peak_live as f64;
            let g = goal(name, f.peak_live);
            if f.peak_reserved > g || later[later.len() / 2] != 0 {
                missed.push(format!(
                    "{name} (fast {fast}): {ratio:.4} of its peak live, goal {:.4}; maps per later pass {later:?}",
                    g as f64 / f.peak_live as f64
                ));
            }
        }
    }
    assert!(missed.is_empty(), "{missed:#?}");
}
