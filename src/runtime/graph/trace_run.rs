//! A run's contribution to the runtime's trace (`runtime/trace.rs`), made from its profile's
//! events once the run has finished: numbers only (node, copy and recompute times, the pool's
//! bytes, evictions, residency changes); names and JSON are made when the trace is written.
//!
//! Device times are measured from the run's first compute-stream event, each event read once;
//! the run is placed on the trace's clock at the host time it began (no earlier than where the
//! previous run ended). A replayed planned graph (a CUDA graph) has no events inside it: it is
//! one slice, timed on the host.

use super::RuntimeGraph;
use crate::device::{Device, EventId};
use crate::exec::{Anchor, RunCounters};
use crate::runtime::trace::{GraphNames, NodeNames, RunRecord, Trace};
use crate::runtime::{Error, Result};
use std::sync::Arc;

impl RuntimeGraph {
    /// Adds the run that began at `began_us` (trace time) and ended with `outcome`.
    pub(super) fn trace_run(
        &mut self,
        trace: &mut Trace,
        device: &dyn Device,
        began_us: f64,
        counters: &RunCounters,
        replayed: bool,
        outcome: &Result<()>,
    ) {
        let ended_us = trace.now_us();
        let names = Arc::clone(self.trace_names.get_or_insert_with(|| names(&self.graph)));
        let mut r = RunRecord {
            graph: trace.graph(&names),
            run: self.successful_runs,
            began_us,
            ended_us,
            ..Default::default()
        };
        if replayed {
            let start = began_us.max(trace.last_end_us);
            r.replay = Some((start, ended_us.max(start)));
            trace.last_end_us = ended_us.max(start);
        } else {
            self.record_profile(&mut r, trace, device, counters);
        }
        if let Err(e) = outcome {
            let name = match e {
                Error::OutOfMemory(_) => "out of memory",
                _ => "run failed",
            };
            let at = r.ended_us.max(trace.last_end_us);
            r.failure = Some((name, e.to_string(), at));
        }
        trace.add_run(r);
    }

    fn record_profile(
        &self,
        r: &mut RunRecord,
        trace: &mut Trace,
        device: &dyn Device,
        counters: &RunCounters,
    ) {
        let p = &self.profile;
        let ran = (counters.reached as usize)
            .min(p.nodes.len())
            .min(self.graph.nodes().len());
        let stamps = p.stamps();
        let Some(&zero) = stamps.first() else {
            return;
        };
        // µs from the first stamp; None when the device cannot tell (an event never recorded
        // in a failed run).
        let at = |e: EventId| -> Option<f64> {
            match device.event_elapsed_ms(zero, e) {
                Ok(ms) => Some(f64::from(ms) * 1e3),
                Err(_) => device
                    .event_elapsed_ms(e, zero)
                    .ok()
                    .map(|ms| -f64::from(ms) * 1e3),
            }
        };
        let stamp_at: Vec<Option<f64>> = stamps.iter().map(|&e| at(e)).collect();
        let stamp = |i: u32| stamp_at.get(i as usize).copied().flatten();
        let mut nodes = Vec::with_capacity(ran);
        for n in 0..ran {
            let span = match p.node_stamps[n] {
                (u32::MAX, _) => at(p.nodes[n].0).zip(at(p.nodes[n].1)),
                (a, b) => stamp(a).zip(stamp(b)),
            };
            if let Some((a, b)) = span {
                nodes.push((n as u32, a, b));
            }
        }
        let copies: Vec<Option<(f64, f64)>> =
            p.copies.iter().map(|c| at(c.0).zip(at(c.1))).collect();
        let recomputes = p.recomputes.iter().filter_map(|&(a, b, n, t)| {
            let (a, b) = stamp(a).zip(stamp(b))?;
            Some((a, b, n, t))
        });
        r.recomputes = recomputes.collect();
        let all = nodes.iter().map(|&(_, a, b)| (a, b));
        let all = all.chain(copies.iter().flatten().copied());
        let all = all.chain(r.recomputes.iter().map(|&(a, b, ..)| (a, b)));
        let (lo, hi) = all.fold((0.0f64, 0.0f64), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
        let base = r.began_us.max(trace.last_end_us) - lo;
        trace.last_end_us = base + hi;
        // A change anchored at a stamp never recorded (the run failed first) is put at the
        // run's end.
        let anchor = |a: Anchor| -> f64 {
            let t = match a {
                Anchor::Stamp(i) => stamp(i),
                Anchor::CopyStart(i) => copies.get(i as usize).copied().flatten().map(|c| c.0),
                Anchor::CopyEnd(i) => copies.get(i as usize).copied().flatten().map(|c| c.1),
            };
            base + t.unwrap_or(hi)
        };
        r.nodes = nodes
            .into_iter()
            .map(|(n, a, b)| (n, base + a, base + b))
            .collect();
        for (&(_, _, bytes, incoming, t), c) in p.copies.iter().zip(&copies) {
            if let Some((a, b)) = *c {
                r.copies.push((base + a, base + b, bytes, incoming, t));
            }
        }
        for x in &mut r.recomputes {
            (x.0, x.1) = (base + x.0, base + x.1);
        }
        r.memory = p
            .memory
            .iter()
            .map(|m| (anchor(m.at), m.allocated, m.reserved, m.pinned, m.pending))
            .collect();
        let node_start = |n: u32| {
            let s = p.node_stamps.get(n as usize).map_or(u32::MAX, |s| s.0);
            base + stamp(s).unwrap_or(hi)
        };
        r.evictions = p
            .evictions
            .iter()
            .map(|&(n, t)| (node_start(n), n, t))
            .collect();
        r.resident = p.resident_at_start.clone();
        r.changes = p
            .residency
            .iter()
            .map(|&(t, a, on)| (anchor(a), t, on))
            .collect();
    }
}

/// What a trace says about `graph`'s tensors and nodes.
fn names(graph: &crate::graph::Graph) -> Arc<GraphNames> {
    let tensors = graph.tensors().iter().enumerate();
    let nodes = graph.nodes().iter().enumerate();
    Arc::new(GraphNames {
        serial: graph.serial(),
        tensors: tensors
            .map(|(t, x)| (x.describe(t as u32), x.kind.name(), x.size))
            .collect(),
        nodes: nodes
            .map(|(n, x)| NodeNames {
                name: x.describe(n as u32),
                inputs: x.inputs.clone(),
                outputs: x.outputs.clone(),
                collective: x.comm.is_some(),
                absorbed: x.is_absorbed(),
            })
            .collect(),
    })
}
