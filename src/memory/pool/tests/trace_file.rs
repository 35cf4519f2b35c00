//! Allocation traces read from their files (`a ID BYTES STREAM` / `f ID`, the format of
//! `../shared/traces/README.md`) for the replays, and what a replay derives from a trace's events
//! alone.

use std::collections::HashMap;

#[derive(Clone, Copy)]
pub(crate) enum Ev {
    A(u32, u64, u32),
    F(u32),
}

/// Events of a trace file (`a ID BYTES STREAM` / `f ID`, gzipped or not), ids made dense, and
/// the ids it never frees.
pub(crate) fn load_trace(path: &str) -> (Vec<Ev>, Vec<u32>) {
    let raw = std::process::Command::new("gzip")
        .args(["-dcf", path])
        .output()
        .expect("gzip runs");
    assert!(raw.status.success(), "reading {path}");
    let text = String::from_utf8(raw.stdout).expect("utf-8 trace");
    let mut ids = HashMap::new();
    let mut streams = HashMap::new();
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut w = line.split_whitespace();
        let (op, id) = (w.next().unwrap(), w.next().unwrap().to_string());
        if op == "a" {
            let n = out.len() as u32;
            let bytes = w.next().unwrap().parse().unwrap();
            let s: u64 = w.next().map_or(0, |s| s.parse().unwrap());
            let k = streams.len() as u32;
            let s = *streams.entry(s).or_insert(k);
            ids.insert(id, n);
            out.push(Ev::A(n, bytes, s));
        } else {
            out.push(Ev::F(ids.remove(&id).expect("free of a live id")));
        }
    }
    let mut unfreed: Vec<u32> = ids.into_values().collect();
    unfreed.sort_unstable();
    (out, unfreed)
}

/// The ids a trace allocates in its opening run of allocations and frees in its closing run of
/// frees (`GKRT_REPLAY_KEEP_START`).
pub(super) fn kept_from_start(evs: &[Ev]) -> Vec<bool> {
    let mut keep = vec![false; evs.len()];
    let mut opening = vec![false; evs.len()];
    for e in evs {
        match *e {
            Ev::A(i, _, _) => opening[i as usize] = true,
            Ev::F(_) => break,
        }
    }
    for e in evs.iter().rev() {
        match *e {
            Ev::F(i) => keep[i as usize] = opening[i as usize],
            Ev::A(..) => break,
        }
    }
    keep
}
