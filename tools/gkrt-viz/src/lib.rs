//! gkrt-viz: a gkrt trace (Chrome trace-event JSON written by `gkrt_runtime_trace_end`) drawn as
//! an SVG with plotters. `model.rs` reads the trace; `draw.rs` draws it.

pub mod draw;
pub mod model;

/// The SVG of the trace in `json`; an error says what was wrong with the trace.
pub fn render(json: &str, title: &str, width: u32, height: u32) -> Result<String, String> {
    let trace = model::Trace::parse(json)?;
    draw::svg(&trace, title, width, height)
}

/// What the trace in `json` accounts for, one line per run: the union of its compute-stream
/// slices against the run's measured host interval (and slices outside it), and the peak of the
/// memory stacked by tensor against the peak of the measured allocated bytes.
pub fn report(json: &str) -> Result<String, String> {
    let trace = model::Trace::parse(json)?;
    let live = trace.live();
    let mut out = String::new();
    for (i, (r, c)) in trace
        .runs
        .iter()
        .zip(trace.compute_coverage(0.0))
        .enumerate()
    {
        let inside = |t: f64| r.began <= t && t < r.ended;
        let stacked = live
            .iter()
            .map(|l| l.start.max(r.began))
            .filter(|&t| inside(t))
            .map(|t| trace.stacked_at(&live, t))
            .max()
            .unwrap_or(0);
        let allocated = trace
            .allocated
            .iter()
            .filter(|s| inside(s.0))
            .map(|s| s.1)
            .max()
            .unwrap_or(0);
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        out += &format!(
            "run {i}: compute slices cover {:.3} of the measured call ({:.3} of {:.3} ms, {} slices, {} outside); \
             stacked memory peak {:.1} MiB, allocated bytes peak {:.1} MiB\n",
            c.covered / c.wall.max(1e-9),
            c.covered,
            c.wall,
            c.slices,
            c.outside,
            mib(stacked),
            mib(allocated),
        );
    }
    Ok(out)
}
