//! `gkrt-plans`: runs the arena planner on the buffer-placement instances of `../shared/plans`.
//!
//! ```text
//! cargo run --release --bin gkrt-plans -- [--time-limit-ms N] [--bench-greedy] [DIR_OR_FILES...]
//! ```
//!
//! For every CSV (a directory is searched one level deep, e.g. `somas/` and `minimalloc/`) it prints
//! the lower bound, the greedy size and time, the searched size and time, their ratio to the
//! bound, for instances named `NAME.CAPACITY.csv` the capacity and whether the plan fits, and the
//! verdict of the independent checker. It exits non-zero if any check fails (2 on bad usage or
//! missing input). Instances with a capacity are searched until they fit (or the time limit, 10 s
//! by default, runs out); instances without one until within 1.01 of the lower bound.
//!
//! `--bench-greedy` also times the greedy path on 20,000 random buffers (median of 5 runs).

use gkrt::planner::{
    check_placement, lower_bound, parse_csv, plan_greedy, plan_search, ArenaProblem, BufferSpec,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn usage() -> ExitCode {
    eprintln!("usage: gkrt-plans [--time-limit-ms N] [--bench-greedy] [DIR_OR_FILES...]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut time_limit = Duration::from_millis(10_000);
    let mut bench = false;
    let mut inputs: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--time-limit-ms" => match args.next().and_then(|v| v.parse::<u64>().ok()) {
                Some(ms) => time_limit = Duration::from_millis(ms),
                None => return usage(),
            },
            "--bench-greedy" => bench = true,
            "-h" | "--help" => {
                usage();
                return ExitCode::SUCCESS;
            }
            s if s.starts_with("--") => return usage(),
            _ => inputs.push(a),
        }
    }
    if bench {
        bench_greedy();
    }
    if inputs.is_empty() {
        if bench {
            return ExitCode::SUCCESS;
        }
        inputs.push("../shared/plans".into());
    }
    let mut files: Vec<PathBuf> = Vec::new();
    for i in &inputs {
        let p = resolve(i);
        if p.is_dir() {
            files.extend(csvs_under(&p));
        } else if p.is_file() {
            files.push(p);
        } else {
            eprintln!("gkrt-plans: {} not found", p.display());
            return ExitCode::from(2);
        }
    }
    if files.is_empty() {
        eprintln!("gkrt-plans: no .csv files under {inputs:?}");
        return ExitCode::from(2);
    }
    println!("time limit per instance: {} ms", time_limit.as_millis());
    println!(
        "{:<22} {:>7} {:>14} {:>14} {:>9} {:>14} {:>9} {:>8} {:>9} {:>5}  check",
        "instance",
        "buffers",
        "lower",
        "greedy",
        "greedy_ms",
        "searched",
        "search_ms",
        "ratio",
        "capacity",
        "fits"
    );
    let (mut failed, mut worst_free, mut fit, mut with_cap) = (0usize, 0f64, 0usize, 0usize);
    let mut total = Duration::ZERO;
    for f in &files {
        let name = instance_name(f);
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                println!("{name:<22} read error: {e}");
                failed += 1;
                continue;
            }
        };
        let p = match parse_csv(&text) {
            Ok(p) => p,
            Err(e) => {
                println!("{name:<22} {e}");
                failed += 1;
                continue;
            }
        };
        let cap = capacity_of(f);
        let lb = lower_bound(&p);
        let t = Instant::now();
        let g = plan_greedy(&p);
        let g_ms = t.elapsed().as_secs_f64() * 1e3;
        // Without a capacity, good enough is within 1.01 of the bound.
        let target = cap.unwrap_or(lb + lb / 100);
        let t = Instant::now();
        let s = plan_search(&p, time_limit, Some(target));
        let s_time = t.elapsed();
        total += s_time;
        let (g, s) = match (g, s) {
            (Ok(g), Ok(s)) => (g, s),
            (Err(e), _) | (_, Err(e)) => {
                println!("{name:<22} plan error: {e}");
                failed += 1;
                continue;
            }
        };
        let verdict = match (check_placement(&p, &g), check_placement(&p, &s)) {
            (Ok(_), Ok(_)) => "check: ok".to_string(),
            (Err(e), _) => format!("check: FAILED (greedy): {e}"),
            (_, Err(e)) => format!("check: FAILED (search): {e}"),
        };
        if !verdict.ends_with("ok") {
            failed += 1;
        }
        let ratio = if lb == 0 {
            1.0
        } else {
            s.size as f64 / lb as f64
        };
        let (cap_s, fits_s) = match cap {
            Some(c) => {
                with_cap += 1;
                let ok = s.size <= c;
                fit += ok as usize;
                (c.to_string(), if ok { "yes" } else { "NO" })
            }
            None => {
                worst_free = worst_free.max(ratio);
                ("-".to_string(), "-")
            }
        };
        println!(
            "{name:<22} {:>7} {lb:>14} {:>14} {g_ms:>9.2} {:>14} {:>9.1} {ratio:>8.4} {cap_s:>9} {fits_s:>5}  {verdict}",
            p.buffers.len(),
            g.size,
            s.size,
            s_time.as_secs_f64() * 1e3,
        );
    }
    println!(
        "summary: {} instances; worst ratio without capacity {:.4}; {fit}/{with_cap} within capacity; \
         {} failures; search time {:.1} s",
        files.len(),
        worst_free,
        failed,
        total.as_secs_f64()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// A path as given if it exists (absolute, or relative to the working directory), else relative
/// to the crate root.
fn resolve(s: &str) -> PathBuf {
    let p = PathBuf::from(s);
    if p.is_absolute() || p.exists() {
        p
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
    }
}

/// `.csv` files in `dir` and in its immediate subdirectories, sorted.
fn csvs_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut subs: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        subs.sort();
        dirs.extend(subs);
    }
    for d in dirs {
        if let Ok(rd) = std::fs::read_dir(&d) {
            let mut fs: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "csv"))
                .collect();
            fs.sort();
            out.extend(fs);
        }
    }
    out
}

/// `parent/stem`, e.g. `somas/resnet50` or `minimalloc/A.1048576`.
fn instance_name(f: &Path) -> String {
    let stem = f
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match f.parent().and_then(|p| p.file_name()) {
        Some(d) => format!("{}/{stem}", d.to_string_lossy()),
        None => stem,
    }
}

/// The capacity in a name such as `A.1048576.csv`.
fn capacity_of(f: &Path) -> Option<u64> {
    let stem = f.file_stem()?.to_str()?;
    let (_, num) = stem.rsplit_once('.')?;
    num.parse().ok()
}

/// Times `plan_greedy` on 20,000 random buffers, median of 5 runs: the main figure on a trace
/// shaped like the SOMAS training graphs, and a stress figure on uniformly scattered lifetimes.
fn bench_greedy() {
    let cases = [
        ("training-like", training_like_problem(20_000, 0x5eed)),
        (
            "stress (uniform lifetimes)",
            uniform_problem(20_000, 0x5eed),
        ),
    ];
    for (what, p) in cases {
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..5 {
            let t = Instant::now();
            let pl = plan_greedy(&p).expect("valid random problem");
            times.push(t.elapsed());
            last = Some(pl);
        }
        times.sort();
        let pl = last.expect("five runs");
        let lb = lower_bound(&p);
        let check = match check_placement(&p, &pl) {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("FAILED: {e}"),
        };
        println!(
            "bench-greedy: 20000 random buffers, {what}: median {:.2} ms (min {:.2}, max {:.2}); \
             size / lower bound = {:.4}; check: {check}",
            times[2].as_secs_f64() * 1e3,
            times[0].as_secs_f64() * 1e3,
            times[4].as_secs_f64() * 1e3,
            pl.size as f64 / lb.max(1) as f64,
        );
    }
}

/// xorshift64.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Log-uniform from 256 B to 64 MiB, a multiple of 256.
fn random_size(rnd: &mut impl FnMut() -> u64) -> u64 {
    let base = 1u64 << (8 + rnd() % 19);
    base + (rnd() % base) / 256 * 256
}

/// A random trace shaped like the SOMAS training graphs of `plans/somas` (about one buffer per
/// step, a forward half then a backward half; their lifetimes have median 6 steps, 90th
/// percentile 1,700-4,300 and 99th 11,000-17,700): 78% temporaries live 1-12 steps, 20% live
/// log-uniformly 12-4,096 steps, 2% are activations saved until the mirrored backward step
/// (nested). Sizes are log-uniform from 256 B to 64 MiB, aligned to 256 B.
fn training_like_problem(n: usize, seed: u64) -> ArenaProblem {
    let mut rnd = rng(seed);
    let steps = n as u64;
    let buffers = (0..steps)
        .map(|step| {
            let r = rnd() % 100;
            let end = if r < 2 && 2 * step < steps {
                steps - step
            } else if r < 22 {
                let l = 12u64 << (rnd() % 9);
                step + l + rnd() % l
            } else {
                step + 1 + rnd() % 12
            };
            let size = random_size(&mut rnd);
            BufferSpec {
                start: step as u32,
                end: end as u32,
                size,
                align: 256,
            }
        })
        .collect();
    ArenaProblem {
        buffers,
        groups: Vec::new(),
    }
}

/// Lifetimes scattered uniformly over 40,000 steps: 80% live 1-32 steps, 15% up to 2,000, 5% up
/// to the whole run. Harder than real traces: long buffers are not nested.
fn uniform_problem(n: usize, seed: u64) -> ArenaProblem {
    let mut rnd = rng(seed);
    let horizon = 2 * n as u64;
    let buffers = (0..n)
        .map(|_| {
            let start = rnd() % horizon;
            let kind = rnd() % 100;
            let life = 1 + rnd()
                % if kind < 80 {
                    32
                } else if kind < 95 {
                    2_000
                } else {
                    horizon
                };
            let size = random_size(&mut rnd);
            BufferSpec {
                start: start as u32,
                end: (start + life) as u32,
                size,
                align: 256,
            }
        })
        .collect();
    ArenaProblem {
        buffers,
        groups: Vec::new(),
    }
}
