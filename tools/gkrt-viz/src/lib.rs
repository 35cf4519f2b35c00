//! gkrt-viz: a gkrt trace (Chrome trace-event JSON written by `gkrt_runtime_trace_end`) drawn as
//! an SVG with plotters. `model.rs` reads the trace; `draw.rs` draws it.

pub mod draw;
pub mod model;

/// The SVG of the trace in `json`; an error says what was wrong with the trace.
pub fn render(json: &str, title: &str, width: u32, height: u32) -> Result<String, String> {
    let trace = model::Trace::parse(json)?;
    draw::svg(&trace, title, width, height)
}
