//! A gkrt trace (Chrome trace-event JSON from `gkrt_runtime_trace_end`) read into what the
//! picture needs: the graphs' tensors, the slices on each stream's track, the memory counters,
//! and each tensor's intervals on the device.

use serde_json::Value;

/// A stream's track, as gkrt numbers them (the trace's `tid`).
pub const TRACKS: [(u64, &str); 4] = [
    (1, "compute stream"),
    (2, "copy in"),
    (3, "copy out"),
    (4, "communication"),
];

#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub kind: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceKind {
    Node,
    Copy,
    Recompute,
    Other,
}

#[derive(Clone, Debug)]
pub struct Slice {
    pub track: u64,
    pub name: String,
    pub kind: SliceKind,
    /// ms from the trace's start.
    pub start: f64,
    pub end: f64,
    pub graph: u64,
    /// Node slices: tensors read and written; copies and recomputes: the tensor moved or rebuilt.
    pub inputs: Vec<u64>,
    pub outputs: Vec<u64>,
}

/// One traced run (the trace's "gkrt_run" metadata): the host call's interval, the tensors on
/// the device at its start and every change of residency after, in the order the runtime made
/// them.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub graph: u64,
    /// ms on the trace's clock.
    pub began: f64,
    pub ended: f64,
    pub resident: Vec<u64>,
    /// (ms, tensor index in its graph, on the device from then on / no more)
    pub changes: Vec<(f64, u64, bool)>,
}

/// One stretch of a tensor on the device.
#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    /// Index into `Trace::tensors`.
    pub tensor: usize,
    pub start: f64,
    pub end: f64,
}

/// Ends tensor `k`'s open stretch on the device (`since[k]`, when open) at `at`.
fn close(out: &mut Vec<Live>, since: &mut [Option<f64>], k: usize, at: f64) {
    if let Some(s) = since[k].take() {
        out.push(Live {
            tensor: k,
            start: s,
            end: at.max(s),
        });
    }
}

/// How much of a run's host call its compute-stream slices account for (ms).
#[derive(Clone, Debug, PartialEq)]
pub struct Coverage {
    /// The run's host interval.
    pub wall: f64,
    /// The union of its compute slices, clipped to that interval.
    pub covered: f64,
    pub slices: usize,
    /// Slices not within the interval.
    pub outside: usize,
}

#[derive(Debug, Default)]
pub struct Trace {
    /// Every graph's tensors: (graph serial, tensor index) → index here.
    pub tensors: Vec<Tensor>,
    graph_of: Vec<(u64, u64, usize)>,
    pub slices: Vec<Slice>,
    /// "allocated bytes" samples (ms, bytes).
    pub allocated: Vec<(f64, u64)>,
    pub reserved: Vec<(f64, u64)>,
    /// "pending free bytes": blocks freed behind a copy out, reusable once it ends.
    pub pending: Vec<(f64, u64)>,
    /// The runs, in the order traced (traces made before they were recorded have none).
    pub runs: Vec<Run>,
    /// Instants: (ms, name).
    pub instants: Vec<(f64, String)>,
}

fn ints(v: Option<&Value>) -> Vec<u64> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

impl Trace {
    /// Reads a trace; an error names what was wrong with it.
    pub fn parse(json: &str) -> Result<Trace, String> {
        let root: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
        let events = root
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or("no \"traceEvents\" array: not a trace-event file")?;
        let mut t = Trace::default();
        for e in events {
            let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
            let name = e
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let ts = e.get("ts").and_then(Value::as_f64).unwrap_or(0.0) / 1e3;
            let args = e.get("args");
            let arg = |k: &str| args.and_then(|a| a.get(k));
            match ph {
                "M" if name == "gkrt_tensors" => {
                    let graph = arg("graph").and_then(Value::as_u64).unwrap_or(0);
                    let list = arg("tensors")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    for (i, x) in list.iter().enumerate() {
                        t.graph_of.push((graph, i as u64, t.tensors.len()));
                        t.tensors.push(Tensor {
                            name: x
                                .get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("?")
                                .to_string(),
                            kind: x
                                .get("kind")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            bytes: x.get("bytes").and_then(Value::as_u64).unwrap_or(0),
                        });
                    }
                }
                "M" if name == "gkrt_run" => {
                    let ms = |k: &str| arg(k).and_then(Value::as_f64).unwrap_or(0.0) / 1e3;
                    let changes = arg("changes").and_then(Value::as_array);
                    let change = |c: &Value| {
                        let c = c.as_array()?;
                        let at = c.first()?.as_f64()? / 1e3;
                        Some((at, c.get(1)?.as_u64()?, c.get(2)?.as_u64()? != 0))
                    };
                    t.runs.push(Run {
                        graph: arg("graph").and_then(Value::as_u64).unwrap_or(0),
                        began: ms("began"),
                        ended: ms("ended"),
                        resident: ints(arg("resident")),
                        changes: changes
                            .map(|v| v.iter().filter_map(change).collect())
                            .unwrap_or_default(),
                    });
                }
                "X" => {
                    let kind = match e.get("cat").and_then(Value::as_str) {
                        Some("node") => SliceKind::Node,
                        Some("copy") => SliceKind::Copy,
                        Some("recompute") => SliceKind::Recompute,
                        _ => SliceKind::Other,
                    };
                    let dur = e.get("dur").and_then(Value::as_f64).unwrap_or(0.0) / 1e3;
                    let (inputs, outputs) = match kind {
                        SliceKind::Node => (ints(arg("inputs")), ints(arg("outputs"))),
                        _ => (
                            vec![],
                            arg("tensor").and_then(Value::as_u64).into_iter().collect(),
                        ),
                    };
                    t.slices.push(Slice {
                        track: e.get("tid").and_then(Value::as_u64).unwrap_or(1),
                        name,
                        kind,
                        start: ts,
                        end: ts + dur,
                        graph: arg("graph").and_then(Value::as_u64).unwrap_or(0),
                        inputs,
                        outputs,
                    });
                }
                "C" => {
                    let bytes = arg("bytes").and_then(Value::as_u64).unwrap_or(0);
                    match name.as_str() {
                        "allocated bytes" => t.allocated.push((ts, bytes)),
                        "reserved bytes" => t.reserved.push((ts, bytes)),
                        "pending free bytes" => t.pending.push((ts, bytes)),
                        _ => {}
                    }
                }
                "i" => t.instants.push((ts, name)),
                _ => {}
            }
        }
        t.slices.sort_by(|a, b| a.start.total_cmp(&b.start));
        if t.slices.is_empty() {
            return Err("the trace has no slices (no run was traced)".into());
        }
        Ok(t)
    }

    /// Index in `tensors` of tensor `index` of graph `graph`.
    pub fn tensor(&self, graph: u64, index: u64) -> Option<usize> {
        self.graph_of
            .iter()
            .find(|&&(g, i, _)| g == graph && i == index)
            .map(|&(_, _, k)| k)
    }

    /// (first, last) ms of any slice.
    pub fn span(&self) -> (f64, f64) {
        let lo = self
            .slices
            .iter()
            .map(|s| s.start)
            .fold(f64::INFINITY, f64::min);
        let hi = self
            .slices
            .iter()
            .map(|s| s.end)
            .fold(f64::NEG_INFINITY, f64::max);
        (lo, hi.max(lo + 1e-6))
    }

    /// When each tensor was on the device: from the runs' residency records when the trace has
    /// them (`live_recorded`), else modelled from the slices (`live_from_slices`).
    pub fn live(&self) -> Vec<Live> {
        if self.runs.is_empty() {
            self.live_from_slices()
        } else {
            self.live_recorded()
        }
    }

    /// The device residency the runtime recorded: a tensor is on the device from its
    /// allocation (or its copy in's start, or its recompute) until its free (or its copy out's
    /// end); what is on the device when a run starts stays there from the previous run's end
    /// (or from the run's start); what is there when the last run ends, to the trace's end.
    pub fn live_recorded(&self) -> Vec<Live> {
        let (_, trace_end) = self.span();
        let end = self.runs.iter().map(|r| r.ended).fold(trace_end, f64::max);
        let mut since: Vec<Option<f64>> = vec![None; self.tensors.len()];
        let mut out = Vec::new();
        for r in &self.runs {
            let resident: Vec<usize> = r
                .resident
                .iter()
                .filter_map(|&i| self.tensor(r.graph, i))
                .collect();
            // Tensors of this graph the last run left on the device and this one does not find
            // there (moved between runs, e.g. read back by the host) leave at its start.
            for (g, _, k) in self.graph_of.iter().copied() {
                if g == r.graph && since[k].is_some() && !resident.contains(&k) {
                    close(&mut out, &mut since, k, r.began);
                }
            }
            for &k in &resident {
                since[k].get_or_insert(r.began);
            }
            for &(at, i, on) in &r.changes {
                let Some(k) = self.tensor(r.graph, i) else {
                    continue;
                };
                if on {
                    since[k].get_or_insert(at);
                } else {
                    close(&mut out, &mut since, k, at);
                }
            }
        }
        for k in 0..self.tensors.len() {
            close(&mut out, &mut since, k, end);
        }
        out
    }

    /// The sum of the bytes stacked at `at` (intervals that started at or before it and end
    /// after it: a change at `at` has happened).
    pub fn stacked_at(&self, live: &[Live], at: f64) -> u64 {
        live.iter()
            .filter(|l| l.start <= at && at < l.end)
            .map(|l| self.tensors[l.tensor].bytes)
            .sum()
    }

    /// The compute stream's accounting of each run: the union of its compute-track slices
    /// (nodes, recomputes, replays) inside the run's host interval, and whether every one of
    /// them lies within it (to `slack` ms).
    pub fn compute_coverage(&self, slack: f64) -> Vec<Coverage> {
        let mut out = Vec::new();
        for (i, r) in self.runs.iter().enumerate() {
            let next = self.runs.get(i + 1).map_or(f64::INFINITY, |n| n.began);
            let mut spans: Vec<(f64, f64)> = self
                .slices
                .iter()
                .filter(|s| s.track == 1 && s.graph == r.graph)
                .filter(|s| s.start >= r.began - slack && s.start < next)
                .map(|s| (s.start, s.end))
                .collect();
            spans.sort_by(|a, b| a.0.total_cmp(&b.0));
            let outside = spans
                .iter()
                .filter(|&&(a, b)| a < r.began - slack || b > r.ended + slack)
                .count();
            let (mut covered, mut reach) = (0.0, f64::NEG_INFINITY);
            for &(a, b) in &spans {
                let a = a.max(reach).max(r.began);
                let b = b.min(r.ended);
                if b > a {
                    covered += b - a;
                }
                reach = reach.max(b);
            }
            out.push(Coverage {
                wall: r.ended - r.began,
                covered,
                slices: spans.len(),
                outside,
            });
        }
        out
    }

    /// When each tensor was on the device, from the slices: a tensor arrives when a node writes
    /// it, a copy brings it in or a recompute rebuilds it, and leaves when a copy takes it out
    /// (at the copy's end); an intermediate also leaves after its last use before it is written
    /// again (the runtime frees it after its last reader), a tensor rebuilt by a recompute after
    /// its last use before the recompute (it was dropped then), a persistent tensor stays until
    /// it leaves or the trace ends. A model of the executor: the counter "allocated bytes" is
    /// the measured figure.
    pub fn live_from_slices(&self) -> Vec<Live> {
        let (_, end) = self.span();
        let n = self.tensors.len();
        let mut since: Vec<Option<f64>> = vec![None; n];
        let mut last_use = vec![0.0f64; n];
        let mut out = Vec::new();
        // A copy out frees its tensor when it ends, and nodes that start while it runs may still
        // read the tensor: its end is an event of its own, taken in time order with the starts
        // (a close at the copy's start would be reopened by such a reader).
        let mut order: Vec<(f64, bool, usize)> = Vec::with_capacity(self.slices.len());
        for (i, s) in self.slices.iter().enumerate() {
            let copy_out = s.kind == SliceKind::Copy && s.track == 3;
            order.push(if copy_out {
                (s.end, false, i)
            } else {
                (s.start, true, i)
            });
        }
        // Ends before starts at one time: a reader starting as a copy out ends needs a copy in.
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(_, _, i) in &order {
            let s = &self.slices[i];
            let ids = |v: &Vec<u64>| -> Vec<usize> {
                v.iter().filter_map(|&i| self.tensor(s.graph, i)).collect()
            };
            match s.kind {
                SliceKind::Node => {
                    for k in ids(&s.outputs) {
                        let written_again = self.tensors[k].kind == "intermediate"
                            && since[k].is_some()
                            && !s.inputs.iter().any(|&i| self.tensor(s.graph, i) == Some(k));
                        if written_again {
                            close(&mut out, &mut since, k, last_use[k]);
                        }
                        since[k].get_or_insert(s.start);
                    }
                    for k in ids(&s.inputs).into_iter().chain(ids(&s.outputs)) {
                        since[k].get_or_insert(s.start);
                        last_use[k] = s.end;
                    }
                }
                SliceKind::Copy if s.track == 3 => {
                    for k in ids(&s.outputs) {
                        close(&mut out, &mut since, k, s.end);
                    }
                }
                SliceKind::Copy | SliceKind::Recompute => {
                    for k in ids(&s.outputs) {
                        if s.kind == SliceKind::Recompute {
                            // Rebuilt: it was dropped (without a copy) after its last use.
                            close(&mut out, &mut since, k, last_use[k]);
                        }
                        since[k].get_or_insert(s.start);
                        last_use[k] = last_use[k].max(s.end);
                    }
                }
                SliceKind::Other => {}
            }
        }
        for (k, (tensor, &used)) in self.tensors.iter().zip(&last_use).enumerate() {
            let at = if tensor.kind == "intermediate" {
                used
            } else {
                end
            };
            close(&mut out, &mut since, k, at);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors 0 (intermediate), 1 (output) of graph 7; node slices at ms [0,1] and [2,3], a
    /// swap out of 1 at [3,4] and a recompute of 0 at [5,6] read by a node at [6,7].
    const TRACE: &str = r#"{"traceEvents":[
      {"ph":"M","name":"gkrt_tensors","args":{"graph":7,"tensors":[
        {"name":"tensor 0 'a'","kind":"intermediate","bytes":256},
        {"name":"tensor 1 'b'","kind":"output","bytes":512}]}},
      {"ph":"X","tid":1,"cat":"node","name":"n0","ts":0,"dur":1000,"args":{"graph":7,"inputs":[],"outputs":[0]}},
      {"ph":"X","tid":1,"cat":"node","name":"n1","ts":2000,"dur":1000,"args":{"graph":7,"inputs":[0],"outputs":[1]}},
      {"ph":"X","tid":3,"cat":"copy","name":"swap out","ts":3000,"dur":1000,"args":{"graph":7,"tensor":1,"bytes":512}},
      {"ph":"X","tid":1,"cat":"recompute","name":"r","ts":5000,"dur":1000,"args":{"graph":7,"tensor":0,"bytes":256}},
      {"ph":"X","tid":1,"cat":"node","name":"n2","ts":6000,"dur":1000,"args":{"graph":7,"inputs":[0],"outputs":[]}},
      {"ph":"C","name":"allocated bytes","ts":1000,"args":{"bytes":256}},
      {"ph":"i","tid":1,"name":"out of memory","ts":7000,"args":{}}]}"#;

    #[test]
    fn intervals_follow_writes_uses_copies_and_recomputes() {
        let t = Trace::parse(TRACE).unwrap();
        assert_eq!(t.tensors.len(), 2);
        assert_eq!(t.tensor(7, 1), Some(1));
        assert_eq!(t.tensor(8, 1), None);
        assert_eq!(t.allocated, vec![(1.0, 256)]);
        assert_eq!(t.instants, vec![(7.0, "out of memory".to_string())]);
        let mut live = t.live();
        live.sort_by(|a, b| a.start.total_cmp(&b.start));
        let got: Vec<(usize, f64, f64)> = live.iter().map(|l| (l.tensor, l.start, l.end)).collect();
        // `a`: written at 0, last read at 3, dropped, rebuilt at 5, last read at 7.
        // `b`: written at 2, leaves when its copy out ends at 4.
        assert_eq!(got, vec![(0, 0.0, 3.0), (1, 2.0, 4.0), (0, 5.0, 7.0)]);
    }

    /// A node that starts while its input is being copied out still reads it on the device: the
    /// tensor leaves once, when the copy ends (it used to be reopened by that reader and kept to
    /// the end of the trace, drawing more memory than the limit).
    #[test]
    fn a_reader_during_a_copy_out_does_not_bring_the_tensor_back() {
        let json = TRACE.replace(
            r#"{"ph":"X","tid":1,"cat":"recompute""#,
            r#"{"ph":"X","tid":1,"cat":"node","name":"n1b","ts":3500,"dur":200,"args":{"graph":7,"inputs":[1],"outputs":[]}},
      {"ph":"X","tid":1,"cat":"recompute""#,
        );
        let t = Trace::parse(&json).unwrap();
        let b: Vec<(f64, f64)> = t
            .live()
            .iter()
            .filter(|l| l.tensor == 1)
            .map(|l| (l.start, l.end))
            .collect();
        assert_eq!(b, vec![(2.0, 4.0)]);
    }
}
