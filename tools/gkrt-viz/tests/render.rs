//! Renders an SVG from a trace made on the host backend (a swapping graph with a recomputed
//! tensor, traced through gkrt's C API) and checks that it is well-formed XML with the memory
//! chart, every stream's lane, and marks for the copies and the recompute; and that traces that
//! are not gkrt's are refused with a reason.

mod common;

use common::{launched, node, ok, runtime, tensor, trace_runs, K};
use gkrt::capi::*;
use std::ptr::null_mut;

/// fill -> h0 (recomputable when asked), relu -> h1, h_i = h_{i-1} + h_{i-2} .. h7, y = h0 + h7,
/// under a limit of three tensors; two traced runs. Returns the trace's JSON.
fn host_trace(recomputable: bool) -> String {
    unsafe {
        let rt = runtime(3 * K);
        let mut g = null_mut();
        ok(gkrt_graph_create(rt, &mut g));
        let (mut fill, mut relu, mut add) = (null_mut(), null_mut(), null_mut());
        ok(gkrt_kernel_builtin(rt, GKRT_BUILTIN_FILL, &mut fill));
        ok(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &mut relu));
        ok(gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, &mut add));
        let value = 1.5f32;
        let launch = gkrt_launch {
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
            params: &value as *const f32 as *const _,
            params_size: 4,
        };
        let intermediate = |name: &str| tensor(g, name, GKRT_TENSOR_INTERMEDIATE);
        let mut h = vec![intermediate("h0")];
        let first = launched(g, fill, &[], &[h[0]], &launch);
        ok(gkrt_graph_set_node_recomputable(
            g,
            first,
            recomputable as i32,
        ));
        h.push(intermediate("h1"));
        node(g, relu, &[h[0]], &[h[1]]);
        for i in 2..8 {
            h.push(intermediate(&format!("h{i}")));
            node(g, add, &[h[i - 1], h[i - 2]], &[h[i]]);
        }
        let y = tensor(g, "y", GKRT_TENSOR_OUTPUT);
        node(g, add, &[h[0], h[7]], &[y]);
        ok(gkrt_graph_finalize(g));
        let json = trace_runs(rt, g, 2, &format!("render-{recomputable}"));
        for k in [fill, relu, add] {
            ok(gkrt_kernel_release(k));
        }
        ok(gkrt_graph_release(g));
        ok(gkrt_runtime_release(rt));
        json
    }
}

fn texts(doc: &roxmltree::Document) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

/// Filled rectangles of `colour` (as plotters writes it: "#RRGGBB").
fn rects(doc: &roxmltree::Document, colour: &str) -> usize {
    doc.descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(colour))
        .count()
}

#[test]
fn a_host_trace_renders_with_every_track_and_the_swaps_marked() {
    for recomputable in [false, true] {
        // The swap plan is chosen by the first run's timings: on a loaded machine the runtime
        // may copy the fill's output rather than recompute it. A recomputable graph is traced
        // again (a new runtime tunes again) until its trace has a recompute to draw.
        let has_recompute = |json: &str| {
            let t = gkrt_viz::model::Trace::parse(json).unwrap();
            t.slices
                .iter()
                .any(|s| s.kind == gkrt_viz::model::SliceKind::Recompute)
        };
        let mut json = host_trace(recomputable);
        for _ in 0..8 {
            if !recomputable || has_recompute(&json) {
                break;
            }
            json = host_trace(recomputable);
        }
        assert!(
            !recomputable || has_recompute(&json),
            "eight runtimes never recomputed the fill"
        );
        let trace = gkrt_viz::model::Trace::parse(&json).unwrap();
        let nodes = trace
            .slices
            .iter()
            .filter(|s| s.kind == gkrt_viz::model::SliceKind::Node)
            .count();
        assert_eq!(nodes, 2 * 9, "two runs of nine nodes");
        let svg = gkrt_viz::render(&json, "test", 1200, 800).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let t = texts(&doc);
        for label in [
            "device memory, stacked by tensor",
            "streams",
            "compute stream",
            "copy in",
            "copy out",
            "communication",
            "allocated bytes",
        ] {
            assert!(t.iter().any(|x| x == label), "no text {label:?} in {t:?}");
        }
        // Recomputes (red) only where the fill is declared recomputable; copies out otherwise.
        let (red, blue) = (rects(&doc, "#CF222E"), rects(&doc, "#1F6FEB"));
        if recomputable {
            assert!(
                red >= 3,
                "recompute marks: {red} (two in the chart, two in the lane, a legend)"
            );
        } else {
            assert!(blue >= 3, "swap-out marks: {blue}");
            assert!(red <= 1, "only the legend's recompute swatch: {red}");
        }
        // The stacked memory names the long-lived tensor.
        let live = trace.live();
        assert!(live
            .iter()
            .any(|l| trace.tensors[l.tensor].name.contains("'h0'")));
    }
}

#[test]
fn traces_that_are_not_gkrts_are_refused_with_a_reason() {
    let e = gkrt_viz::render("not json", "t", 800, 600).unwrap_err();
    assert!(e.contains("not JSON"), "{e}");
    let e = gkrt_viz::render("{\"events\": []}", "t", 800, 600).unwrap_err();
    assert!(e.contains("traceEvents"), "{e}");
    let e = gkrt_viz::render("{\"traceEvents\": []}", "t", 800, 600).unwrap_err();
    assert!(e.contains("no slices"), "{e}");
}
