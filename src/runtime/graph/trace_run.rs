//! A run's contribution to the runtime's trace (`runtime/trace.rs`), made from its profile's
//! events once the run has finished: slices for the nodes, copies and recomputes it timed,
//! counter samples of the pools' bytes at each node's end, instants for fallback evictions and
//! an out-of-memory failure.
//!
//! Device times are measured from the run's first node's start event; the run is placed on the
//! trace's clock at the host time it began (no earlier than where the previous run ended). A
//! replayed planned graph (a CUDA graph) has no events inside it: it is one slice, timed on the
//! host.

use super::RuntimeGraph;
use crate::device::{Device, EventId};
use crate::exec::RunCounters;
use crate::runtime::trace::{Arg, Trace, Track};
use crate::runtime::{Error, Result};

impl RuntimeGraph {
    /// Adds the run that began at `began_us` (trace time) and ended with `outcome`.
    pub(super) fn trace_run(
        &self,
        trace: &mut Trace,
        device: &dyn Device,
        began_us: f64,
        counters: &RunCounters,
        replayed: bool,
        outcome: &Result<()>,
    ) {
        trace.runs += 1;
        let ended_us = trace.now_us();
        let serial = self.graph.serial();
        let tensors = self.graph.tensors().iter().enumerate();
        trace.describe_graph(
            serial,
            tensors.map(|(t, x)| (x.describe(t as u32), x.kind.name(), x.size)),
        );
        let run_args = [("run", Arg::Int(self.successful_runs))];
        if replayed {
            let start = began_us.max(trace.last_end_us);
            trace.slice(
                Track::Compute,
                "graph replay",
                "replay",
                start,
                ended_us - start,
                &run_args,
            );
            trace.last_end_us = ended_us.max(start);
        } else {
            self.trace_profile(trace, device, began_us, counters);
        }
        if let Err(e) = outcome {
            let name = match e {
                Error::OutOfMemory(_) => "out of memory",
                _ => "run failed",
            };
            let at = trace.last_end_us.max(ended_us);
            trace.instant(
                Track::Compute,
                name,
                "failure",
                at,
                &[("message", Arg::Text(e.to_string()))],
            );
        }
    }

    fn trace_profile(
        &self,
        trace: &mut Trace,
        device: &dyn Device,
        began_us: f64,
        counters: &RunCounters,
    ) {
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let p = &self.profile;
        let ran = (counters.reached as usize)
            .min(p.nodes.len())
            .min(nodes.len());
        let Some(&(zero, _)) = p.nodes.first().filter(|_| ran > 0) else {
            return;
        };
        // µs from the first node's start; None when the device cannot tell (an event never
        // recorded in a failed run).
        let at = |e: EventId| -> Option<f64> {
            match device.event_elapsed_ms(zero, e) {
                Ok(ms) => Some(f64::from(ms) * 1e3),
                Err(_) => device
                    .event_elapsed_ms(e, zero)
                    .ok()
                    .map(|ms| -f64::from(ms) * 1e3),
            }
        };
        let span = |(a, b): (EventId, EventId)| Some((at(a)?, at(b)?));
        let node_spans: Vec<Option<(f64, f64)>> =
            p.nodes[..ran].iter().map(|&pair| span(pair)).collect();
        let copy_spans: Vec<Option<(f64, f64)>> =
            p.copies.iter().map(|c| span((c.0, c.1))).collect();
        let re_spans: Vec<Option<(f64, f64)>> =
            p.recomputes.iter().map(|r| span((r.0, r.1))).collect();
        let all = node_spans
            .iter()
            .chain(&copy_spans)
            .chain(&re_spans)
            .flatten();
        let (lo, hi) = all.fold((0.0f64, 0.0f64), |(lo, hi), &(a, b)| (lo.min(a), hi.max(b)));
        let base = began_us.max(trace.last_end_us - lo);
        trace.last_end_us = base + hi;
        let bytes_of = |ts: &[u32]| ts.iter().map(|&t| tensors[t as usize].size).sum::<u64>();
        let ids = |ts: &[u32]| ts.iter().map(|&t| t as u64).collect::<Vec<u64>>();
        let serial = self.graph.serial();
        for (n, s) in node_spans.iter().enumerate() {
            let Some((a, b)) = *s else { continue };
            let node = &nodes[n];
            // Collectives were timed on the communication stream (absorbed ones not at all:
            // their bucket's node carries their tensors).
            let (track, category) = match &node.comm {
                Some(_) => (Track::Communication, "collective"),
                None => (Track::Compute, "node"),
            };
            if node.is_absorbed() {
                continue;
            }
            trace.slice(
                track,
                &node.describe(n as u32),
                category,
                base + a,
                b - a,
                &[
                    ("graph", Arg::Int(serial as u64)),
                    ("node", Arg::Int(n as u64)),
                    ("input_bytes", Arg::Int(bytes_of(&node.inputs))),
                    ("output_bytes", Arg::Int(bytes_of(&node.outputs))),
                    ("inputs", Arg::Ints(ids(&node.inputs))),
                    ("outputs", Arg::Ints(ids(&node.outputs))),
                ],
            );
        }
        for (c, s) in p.copies.iter().zip(&copy_spans) {
            let (Some((a, b)), &(_, _, bytes, incoming, t)) = (*s, c) else {
                continue;
            };
            let (track, verb) = if incoming {
                (Track::CopyIn, "swap in")
            } else {
                (Track::CopyOut, "swap out")
            };
            let what = tensors
                .get(t as usize)
                .map_or(String::new(), |x| x.describe(t));
            trace.slice(
                track,
                &format!("{verb}: {what}"),
                "copy",
                base + a,
                b - a,
                &[
                    ("graph", Arg::Int(serial as u64)),
                    ("bytes", Arg::Int(bytes)),
                    ("tensor", Arg::Int(t as u64)),
                ],
            );
        }
        for (r, s) in p.recomputes.iter().zip(&re_spans) {
            let (Some((a, b)), &(_, _, n, t)) = (*s, r) else {
                continue;
            };
            let bytes = tensors.get(t as usize).map_or(0, |x| x.size);
            trace.slice(
                Track::Compute,
                &format!("recompute: {}", nodes[n as usize].describe(n)),
                "recompute",
                base + a,
                b - a,
                &[
                    ("graph", Arg::Int(serial as u64)),
                    ("tensor", Arg::Int(t as u64)),
                    ("bytes", Arg::Int(bytes)),
                ],
            );
        }
        for &(n, allocated, reserved, pinned) in &p.memory {
            let Some(Some((_, b))) = node_spans.get(n as usize) else {
                continue;
            };
            trace.counter("allocated bytes", base + b, allocated);
            trace.counter("reserved bytes", base + b, reserved);
            trace.counter("pinned bytes", base + b, pinned);
        }
        for &(n, t) in &p.evictions {
            let ts = match node_spans.get(n as usize) {
                Some(Some((a, _))) => base + a,
                _ => trace.last_end_us,
            };
            let what = tensors
                .get(t as usize)
                .map_or(String::new(), |x| x.describe(t));
            trace.instant(
                Track::Compute,
                &format!("fallback eviction: {what}"),
                "eviction",
                ts,
                &[
                    ("node", Arg::Int(n as u64)),
                    (
                        "bytes",
                        Arg::Int(tensors.get(t as usize).map_or(0, |x| x.size)),
                    ),
                ],
            );
        }
    }
}
