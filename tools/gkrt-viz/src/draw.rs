//! The picture: above, device memory over the run stacked by tensor (each tensor a colour, the
//! allocated-bytes counter as a line, swap copies and recomputes marked along the top); below,
//! the streams as a timeline (a lane per track: nodes, recomputes, copies in and out).

use crate::model::{SliceKind, Trace, TRACKS};
use plotters::prelude::*;

const MIB: f64 = 1024.0 * 1024.0;
const COPY_IN: RGBColor = RGBColor(46, 160, 67);
const COPY_OUT: RGBColor = RGBColor(31, 111, 235);
const RECOMPUTE: RGBColor = RGBColor(207, 34, 46);

/// A stable, distinct colour for tensor `k`.
fn tensor_colour(k: usize) -> RGBColor {
    let hue = (k as f64 * 0.618_033_988_75).fract();
    let (s, l) = (0.45, 0.55 + 0.15 * ((k / 7) % 2) as f64);
    let hsl = HSLColor(hue, s, l);
    let (r, g, b) = hsl.rgb();
    RGBColor(r, g, b)
}

type DrawResult = Result<(), String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing failed: {e}")
}

/// The SVG of `trace`, `width` × `height` pixels.
pub fn svg(trace: &Trace, title: &str, width: u32, height: u32) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, ("sans-serif", 20)).map_err(err)?;
        let (top, bottom) = root.split_vertically((height as f64 * 0.6) as u32);
        memory(trace, &top)?;
        streams(trace, &bottom)?;
        root.present().map_err(err)?;
    }
    Ok(out)
}

fn memory<DB: DrawingBackend>(
    trace: &Trace,
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> DrawResult {
    let (t0, t1) = trace.span();
    let live = trace.live();
    // Breakpoints: every interval's ends; between two, the set of live tensors is constant.
    let mut cuts: Vec<f64> = live.iter().flat_map(|l| [l.start, l.end]).collect();
    cuts.sort_by(f64::total_cmp);
    cuts.dedup();
    let mut bars: Vec<(f64, f64, usize, f64, f64)> = Vec::new(); // x0, x1, tensor, y0, y1 (MiB)
    let mut ymax: f64 = 0.0;
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let mid = (a + b) / 2.0;
        let mut y = 0.0;
        for l in live.iter().filter(|l| l.start <= mid && mid < l.end) {
            let h = trace.tensors[l.tensor].bytes as f64 / MIB;
            bars.push((a, b, l.tensor, y, y + h));
            y += h;
        }
        ymax = ymax.max(y);
    }
    for &(_, b) in trace.allocated.iter().chain(&trace.reserved) {
        ymax = ymax.max(b as f64 / MIB);
    }
    let ymax = if ymax > 0.0 { ymax * 1.08 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption("device memory, stacked by tensor", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(64)
        .build_cartesian_2d(t0..t1, 0.0..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("ms")
        .y_desc("MiB")
        .disable_x_mesh()
        .draw()
        .map_err(err)?;
    chart
        .draw_series(bars.iter().map(|&(a, b, k, y0, y1)| {
            Rectangle::new([(a, y0), (b, y1)], tensor_colour(k).filled())
        }))
        .map_err(err)?;
    if !trace.allocated.is_empty() {
        // A step line: each sample holds until the next (samples are taken where it changes).
        let mut pts: Vec<(f64, f64)> = Vec::with_capacity(2 * trace.allocated.len());
        for (i, &(t, b)) in trace.allocated.iter().enumerate() {
            if i > 0 {
                pts.push((t, pts[pts.len() - 1].1));
            }
            pts.push((t, b as f64 / MIB));
        }
        chart
            .draw_series(LineSeries::new(pts, BLACK.stroke_width(1)))
            .map_err(err)?
            .label("allocated bytes")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
    }
    // Swap copies and recomputes: marks along the top of the chart.
    let band = ymax * 0.025;
    let marks = trace.slices.iter().filter_map(|s| {
        let (colour, row) = match (&s.kind, s.track) {
            (SliceKind::Copy, 2) => (COPY_IN, 0.0),
            (SliceKind::Copy, _) => (COPY_OUT, 1.0),
            (SliceKind::Recompute, _) => (RECOMPUTE, 2.0),
            _ => return None,
        };
        let y1 = ymax - row * band;
        Some(Rectangle::new(
            [(s.start, y1 - band), (s.end.max(s.start), y1)],
            colour.filled(),
        ))
    });
    chart.draw_series(marks).map_err(err)?;
    for (colour, label) in [
        (COPY_IN, "swap in"),
        (COPY_OUT, "swap out"),
        (RECOMPUTE, "recompute"),
    ] {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn streams<DB: DrawingBackend>(
    trace: &Trace,
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> DrawResult {
    let (t0, t1) = trace.span();
    let lanes = TRACKS.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption("streams", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(64)
        .build_cartesian_2d(t0..t1, 0.0..lanes)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("ms")
        .disable_y_mesh()
        .y_labels(0)
        .draw()
        .map_err(err)?;
    let lane_of = |track: u64| TRACKS.iter().position(|&(t, _)| t == track);
    let mut node_parity = 0usize;
    let rects: Vec<Rectangle<(f64, f64)>> = trace
        .slices
        .iter()
        .filter_map(|s| {
            let lane = lane_of(s.track)? as f64;
            let top = lanes - lane - 0.15;
            let colour = match s.kind {
                SliceKind::Recompute => RECOMPUTE,
                SliceKind::Copy if s.track == 2 => COPY_IN,
                SliceKind::Copy => COPY_OUT,
                _ => {
                    node_parity += 1;
                    if node_parity.is_multiple_of(2) {
                        RGBColor(110, 118, 129)
                    } else {
                        RGBColor(160, 168, 178)
                    }
                }
            };
            Some(Rectangle::new(
                [(s.start, top - 0.7), (s.end.max(s.start), top)],
                colour.filled(),
            ))
        })
        .collect();
    chart.draw_series(rects).map_err(err)?;
    for (i, &(_, name)) in TRACKS.iter().enumerate() {
        let y = lanes - i as f64 - 0.1;
        chart
            .draw_series(std::iter::once(Text::new(
                name.to_string(),
                (t0, y),
                ("sans-serif", 12).into_font(),
            )))
            .map_err(err)?;
    }
    for (t, name) in &trace.instants {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(*t, 0.0), (*t, lanes)],
                RECOMPUTE,
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                name.clone(),
                (*t, 0.3),
                ("sans-serif", 11).into_font(),
            )))
            .map_err(err)?;
    }
    Ok(())
}
