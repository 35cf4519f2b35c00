//! Trace replay through the pool alone (host only; `cargo test --release -- --ignored replay
//! --nocapture`): figures for BENCHMARKS.md, and the measure for callgrind
//! (`GKRT_REPLAY_VMM_ONLY=1`, see BENCHMARKS.md §3).

use super::*;
use std::collections::HashMap;

#[derive(Clone, Copy)]
enum Ev {
    A(u32, u64),
    F(u32),
}

/// Events of a trace file (`a ID BYTES STREAM` / `f ID`, gzipped or not), ids made dense.
fn load_trace(path: &str) -> Vec<Ev> {
    let raw = std::process::Command::new("gzip")
        .args(["-dcf", path])
        .output()
        .expect("gzip runs");
    assert!(raw.status.success(), "reading {path}");
    let text = String::from_utf8(raw.stdout).expect("utf-8 trace");
    let mut ids = HashMap::new();
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut w = line.split_whitespace();
        let (op, id) = (w.next().unwrap(), w.next().unwrap().to_string());
        if op == "a" {
            let n = ids.len() as u32;
            let bytes = w.next().unwrap().parse().unwrap();
            ids.insert(id, n);
            out.push(Ev::A(n, bytes));
        } else {
            out.push(Ev::F(ids[&id]));
        }
    }
    out
}

fn trace_paths() -> Vec<String> {
    match std::env::var("GKRT_TRACES") {
        Ok(v) => v.split(':').map(str::to_string).collect(),
        Err(_) => ["gpt2_train", "resnet50_train"]
            .iter()
            .map(|t| {
                format!(
                    "{}/../shared/traces/{t}.trace.gz",
                    env!("CARGO_MANIFEST_DIR")
                )
            })
            .collect(),
    }
}

fn replay(evs: &[Ev], cfg: PoolConfig, vmm: bool, passes: usize) -> (f64, Vec<f64>, u64, u64, u64) {
    // Counts only: the figures are the pool's own cost.
    let b = FakeConfig::counting(vmm).build();
    let mut p = Pool::new(cfg);
    let n = evs.iter().filter(|e| matches!(e, Ev::A(..))).count();
    let mut addr = vec![0u64; n];
    let (mut live, mut peak) = (0u64, 0u64);
    let mut sizes = vec![0u64; n];
    let mut per_pass = Vec::new();
    let mut unmaps_after_first = 0;
    let thrash_mb: usize = std::env::var("GKRT_REPLAY_THRASH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut junk = vec![0u8; thrash_mb << 20];
    for pass in 0..passes {
        let u0 = b.unmaps();
        for k in (0..junk.len()).step_by(64) {
            junk[k] = junk[k].wrapping_add(pass as u8);
        }
        std::hint::black_box(&junk);
        let t = std::time::Instant::now();
        for e in evs {
            match *e {
                Ev::A(i, bytes) => {
                    addr[i as usize] = p.alloc(&b, bytes, st(0)).unwrap();
                    if pass == 0 {
                        sizes[i as usize] = bytes;
                        live += bytes;
                        peak = peak.max(live);
                    }
                }
                Ev::F(i) => {
                    p.free(&b, addr[i as usize]).unwrap();
                    if pass == 0 {
                        live -= sizes[i as usize];
                    }
                }
            }
        }
        per_pass.push(t.elapsed().as_secs_f64() * 1e9 / evs.len() as f64);
        if std::env::var("GKRT_REPLAY_VERBOSE").is_ok() {
            println!(
                "pass {pass}: unmapped {} mapped {} reserved {}",
                b.unmaps() - u0,
                b.maps(),
                p.stats().reserved_bytes
            );
        }
        if pass > 0 {
            unmaps_after_first += b.unmaps() - u0;
        }
    }
    check(&p);
    let frag = p.stats().peak_reserved_bytes as f64 / peak as f64;
    (frag, per_pass, unmaps_after_first, b.maps(), b.allocs())
}

#[test]
#[ignore = "benchmark: replays ../shared/traces (or GKRT_TRACES) and prints figures"]
fn replay_traces_through_the_pool() {
    let passes: usize = std::env::var("GKRT_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    println!("| trace | pool | peak reserved / peak live | ns/op (median pass) | first pass | pages mapped | pages unmapped after pass 1 |");
    println!("|---|---|---|---|---|---|---|");
    for path in trace_paths() {
        let evs = load_trace(&path);
        let name = path
            .rsplit('/')
            .next()
            .unwrap()
            .trim_end_matches(".gz")
            .trim_end_matches(".trace");
        // The defaults, or GKRT_POOL_* knobs (read by Pool::new) for exploring.
        for (label, vmm, cfg) in [
            ("virtual ranges", true, PoolConfig::default()),
            ("plain segments", false, PoolConfig::default()),
        ] {
            // GKRT_REPLAY_VMM_ONLY: the virtual-range rows alone (for profiling the default).
            if !vmm && std::env::var("GKRT_REPLAY_VMM_ONLY").is_ok() {
                continue;
            }
            let (frag, mut t, unmaps, maps, _) = replay(&evs, cfg, vmm, passes);
            let first = t[0];
            t.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "| {name} | {label} | {frag:.4} | {:.1} | {first:.1} | {maps} | {unmaps} |",
                t[t.len() / 2]
            );
        }
    }
}
