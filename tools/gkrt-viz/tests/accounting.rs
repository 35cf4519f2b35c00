//! What a trace accounts for, on traces made on the host backend through gkrt's C API:
//! - the memory stacked by tensor is the device residency the runtime recorded: it never
//!   exceeds the memory limit, nor the measured allocated bytes (plus the blocks pending on a
//!   copy out) at any sample — on a swapping graph whose weights leave the device without a
//!   copy, which the slice model (`live_from_slices`) keeps for the whole run;
//! - the compute track's slices lie within each run's measured host interval and their union
//!   covers at least 90% of it, on a chain whose nodes take 5 ms each.

mod common;

use common::{node, ok, runtime, tensor, trace_runs, write, K};
use gkrt::capi::*;
use gkrt_viz::model::{Live, Trace};
use std::ffi::c_void;
use std::ptr::null_mut;

const LIMIT: u64 = 4 * K;

/// h_i = h_{i-1} + w_i over eight weights (inputs the host wrote: their host copy is current,
/// so they leave the device without a copy), h_0 = relu(x), y = h_8 + x; a limit of four
/// tensors against ten persistent ones.
fn weights_trace() -> String {
    unsafe {
        let rt = runtime(LIMIT);
        let mut g = null_mut();
        ok(gkrt_graph_create(rt, &mut g));
        let (mut relu, mut add) = (null_mut(), null_mut());
        ok(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &mut relu));
        ok(gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, &mut add));
        let x = tensor(g, "x", GKRT_TENSOR_INPUT);
        let w: Vec<u64> = (0..8)
            .map(|i| tensor(g, &format!("w{i}"), GKRT_TENSOR_PARAMETER))
            .collect();
        let mut h = tensor(g, "h0", GKRT_TENSOR_INTERMEDIATE);
        node(g, relu, &[x], &[h]);
        for (i, &wi) in w.iter().enumerate() {
            let next = tensor(g, &format!("h{}", i + 1), GKRT_TENSOR_INTERMEDIATE);
            node(g, add, &[h, wi], &[next]);
            h = next;
        }
        let y = tensor(g, "y", GKRT_TENSOR_OUTPUT);
        node(g, add, &[h, x], &[y]);
        ok(gkrt_graph_finalize(g));
        let ones = 1.0f32.to_ne_bytes().repeat((K / 4) as usize);
        for t in std::iter::once(x).chain(w.iter().copied()) {
            write(g, t, &ones);
        }
        let json = trace_runs(rt, g, 3, "weights");
        ok(gkrt_kernel_release(relu));
        ok(gkrt_kernel_release(add));
        ok(gkrt_graph_release(g));
        ok(gkrt_runtime_release(rt));
        json
    }
}

/// The largest stacked total at any interval's start (where the stack grows).
fn max_stacked(t: &Trace, live: &[Live]) -> u64 {
    live.iter()
        .map(|l| t.stacked_at(live, l.start))
        .max()
        .unwrap_or(0)
}

/// The last sample of `series` at or before `at` (0 before the first).
fn value_at(series: &[(f64, u64)], at: f64) -> u64 {
    series.iter().rev().find(|s| s.0 <= at).map_or(0, |s| s.1)
}

#[test]
fn stacked_memory_is_the_recorded_residency_within_the_limit_and_the_counter() {
    let json = weights_trace();
    let t = Trace::parse(&json).unwrap();
    assert_eq!(t.runs.len(), 3, "three traced runs");
    assert!(
        t.runs.iter().all(|r| !r.changes.is_empty()),
        "every run recorded residency changes"
    );
    let live = t.live();
    assert!(
        live.iter()
            .any(|l| t.tensors[l.tensor].name.contains("'w3'")),
        "the weights are stacked"
    );
    let most = max_stacked(&t, &live);
    assert!(most <= LIMIT, "stacked {most} bytes over the limit {LIMIT}");
    assert!(
        most >= 2 * K,
        "a node's inputs and output are stacked: {most}"
    );
    assert!(!t.allocated.is_empty());
    for &(at, allocated) in &t.allocated {
        let measured = allocated + value_at(&t.pending, at);
        let stacked = t.stacked_at(&live, at);
        assert!(
            stacked <= measured,
            "at {at:.3} ms: stacked {stacked} bytes, allocated + pending {measured}"
        );
    }
    // The check can fail: the slice model keeps every weight for the whole run.
    let modelled = t.live_from_slices();
    assert!(
        max_stacked(&t, &modelled) > LIMIT,
        "the slice model was expected to overstate this trace"
    );
}

/// A node that sleeps `*user` microseconds.
unsafe extern "C" fn sleeper(_args: *const gkrt::runtime::CallbackArgs, user: *mut c_void) -> i32 {
    std::thread::sleep(std::time::Duration::from_micros(*(user as *const u64)));
    0
}

#[test]
fn compute_slices_account_for_each_runs_measured_interval() {
    // 5 ms: the host's own work around a run (enqueueing, the final wait's wake-up on a loaded
    // machine) stays far under 10% of the step.
    static MICROS: u64 = 5000;
    let json = unsafe {
        let rt = runtime(0);
        let mut g = null_mut();
        ok(gkrt_graph_create(rt, &mut g));
        let mut k = null_mut();
        ok(gkrt_kernel_from_callback(
            rt,
            Some(sleeper),
            &MICROS as *const u64 as *mut c_void,
            &mut k,
        ));
        let x = tensor(g, "x", GKRT_TENSOR_INPUT);
        let mut prev = x;
        for i in 0..10 {
            let kind = if i == 9 {
                GKRT_TENSOR_OUTPUT
            } else {
                GKRT_TENSOR_INTERMEDIATE
            };
            let next = tensor(g, &format!("h{i}"), kind);
            node(g, k, &[prev], &[next]);
            prev = next;
        }
        ok(gkrt_graph_finalize(g));
        write(g, x, &vec![0u8; K as usize]);
        let json = trace_runs(rt, g, 3, "coverage");
        ok(gkrt_kernel_release(k));
        ok(gkrt_graph_release(g));
        ok(gkrt_runtime_release(rt));
        json
    };
    let report = gkrt_viz::report(&json).unwrap();
    assert_eq!(report.lines().count(), 3, "{report}");
    assert!(report.contains("10 slices, 0 outside"), "{report}");
    let t = Trace::parse(&json).unwrap();
    // One event per node boundary: within a run, each node starts where the previous one ended
    // (nothing else is queued on the compute stream between them).
    let nodes: Vec<_> = t.slices.iter().filter(|s| s.track == 1).collect();
    // (Equal to the JSON's rounding: ts and dur are each written to the nanosecond.)
    let shared = nodes
        .windows(2)
        .filter(|w| (w[1].start - w[0].end).abs() < 1e-5)
        .count();
    assert_eq!(
        shared,
        3 * 9,
        "nodes sharing a boundary with the previous one"
    );
    let cov = t.compute_coverage(0.01);
    assert_eq!(cov.len(), 3);
    for c in &cov {
        assert_eq!(c.slices, 10, "{c:?}");
        assert_eq!(c.outside, 0, "a compute slice outside its run: {c:?}");
        assert!(c.wall >= 50.0, "ten 5 ms nodes: {c:?}");
        // An untraced gap over 10% of the step fails.
        assert!(
            c.covered >= 0.9 * c.wall,
            "slices cover {:.1}%: {c:?}",
            100.0 * c.covered / c.wall
        );
    }
}
