//! Traces of runs in Chrome's trace-event JSON (Perfetto and chrome://tracing open it).
//!
//! Owns: the runs recorded between `gkrt_runtime_trace_begin` and `gkrt_runtime_trace_end`
//! (`RunRecord`: numbers only, made when each run ends), and their JSON, made only when the
//! trace is written — nothing is named or formatted while runs are traced. One process, one thread ("track") per stream: compute, copy in, copy out,
//! and communication (`Track::Communication`: collective calls). Slices ("X") are nodes,
//! collective calls, swap copies and recomputes; counters ("C") the
//! pool's allocated, reserved and pending-free bytes and the pinned pool's reserved bytes;
//! instants ("i") fallback evictions and out-of-memory failures; metadata ("M") each graph's
//! tensors ("gkrt_tensors") and each run's host interval and residency changes ("gkrt_run",
//! what `gkrt-viz` stacks). Times are µs since the trace began. What a run contributes is made
//! from its profile by `graph/trace_run.rs`.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Instant;

/// A stream's track (the trace's thread id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    Compute = 1,
    CopyIn = 2,
    CopyOut = 3,
    /// Collectives' stream, once there are collectives (issue 15).
    Communication = 4,
}

impl Track {
    const ALL: [Track; 4] = [
        Track::Compute,
        Track::CopyIn,
        Track::CopyOut,
        Track::Communication,
    ];

    fn name(self) -> &'static str {
        match self {
            Track::Compute => "compute stream",
            Track::CopyIn => "copy in (host to device)",
            Track::CopyOut => "copy out (device to host)",
            Track::Communication => "communication",
        }
    }
}

/// What a trace says about one graph, made once per graph (at its first traced run) and shared
/// by every trace after: tensors and nodes by index, with their names as messages give them.
#[derive(Debug)]
pub struct GraphNames {
    pub serial: u32,
    /// (description, kind, bytes)
    pub tensors: Vec<(String, &'static str, u64)>,
    pub nodes: Vec<NodeNames>,
}

#[derive(Debug)]
pub struct NodeNames {
    pub name: String,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
    /// Timed on the communication stream.
    pub collective: bool,
    /// Absorbed into a later collective's bucket: no slice of its own.
    pub absorbed: bool,
}

/// One run, in numbers only (times in µs on the trace's clock): made when the run ends from
/// its profile's events, turned into JSON when the trace is written.
#[derive(Debug, Default)]
pub struct RunRecord {
    /// Index into the trace's graphs.
    pub graph: usize,
    pub run: u64,
    /// The host's call: from before the run was queued to after its streams were synchronised.
    pub began_us: f64,
    pub ended_us: f64,
    /// A replayed CUDA graph: one slice (start, end), no events inside.
    pub replay: Option<(f64, f64)>,
    /// (node, start, end)
    pub nodes: Vec<(u32, f64, f64)>,
    /// (start, end, bytes, host to device, tensor)
    pub copies: Vec<(f64, f64, u64, bool, u32)>,
    /// (start, end, node run again, tensor rebuilt)
    pub recomputes: Vec<(f64, f64, u32, u32)>,
    /// (at, allocated, reserved, pinned reserved, pending free) bytes
    pub memory: Vec<(f64, u64, u64, u64, u64)>,
    /// (at, node made room for, tensor evicted)
    pub evictions: Vec<(f64, u32, u32)>,
    /// Tensors on the device at the run's start (from `began_us`).
    pub resident: Vec<u32>,
    /// (at, tensor, on the device from then on / no more)
    pub changes: Vec<(f64, u32, bool)>,
    /// A failed run: (instant's name, message, at).
    pub failure: Option<(&'static str, String, f64)>,
}

/// The runs of one trace.
#[derive(Debug)]
pub struct Trace {
    start: Instant,
    graphs: Vec<Arc<GraphNames>>,
    runs: Vec<RunRecord>,
    /// Where the last run's device times ended (µs): the next run starts no earlier.
    pub(crate) last_end_us: f64,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            start: Instant::now(),
            graphs: Vec::new(),
            runs: Vec::new(),
            last_end_us: 0.0,
        }
    }
}

impl Trace {
    /// µs since the trace began.
    pub fn now_us(&self) -> f64 {
        self.start.elapsed().as_nanos() as f64 / 1e3
    }

    /// The index of `names` among the trace's graphs (added on first use).
    pub fn graph(&mut self, names: &Arc<GraphNames>) -> usize {
        match self.graphs.iter().position(|g| Arc::ptr_eq(g, names)) {
            Some(i) => i,
            None => {
                self.graphs.push(Arc::clone(names));
                self.graphs.len() - 1
            }
        }
    }

    pub fn add_run(&mut self, run: RunRecord) {
        self.runs.push(run);
    }

    /// The whole trace as JSON (`{"traceEvents": [...], ...}`), tracks named: every name,
    /// argument and number is formatted here, not while runs are traced.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        out.push_str(
            "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"gkrt\"}},\n",
        );
        for t in Track::ALL {
            let _ = writeln!(
                out,
                "{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}},",
                t as u32,
                quote(t.name())
            );
            let _ = writeln!(
                out,
                "{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_sort_index\",\"args\":{{\"sort_index\":{}}}}},",
                t as u32, t as u32
            );
        }
        for g in &self.graphs {
            describe_graph(&mut out, g);
        }
        for r in &self.runs {
            write_run(&mut out, r, &self.graphs[r.graph]);
        }
        // The last element has no trailing comma: end with the trace's own summary.
        let _ = write!(
            out,
            "{{\"ph\":\"M\",\"pid\":1,\"name\":\"gkrt_runs\",\"args\":{{\"runs\":{}}}}}\n]}}\n",
            self.runs.len()
        );
        out
    }
}

/// A metadata event "gkrt_tensors" naming a graph's tensors, their kinds and bytes (slices
/// refer to tensors by index; `gkrt-viz` stacks memory by tensor with these).
fn describe_graph(out: &mut String, g: &GraphNames) {
    let _ = write!(
        out,
        "{{\"ph\":\"M\",\"pid\":1,\"name\":\"gkrt_tensors\",\"args\":{{\"graph\":{},\"tensors\":[",
        g.serial
    );
    for (i, (name, kind, bytes)) in g.tensors.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        let _ = write!(
            out,
            "{sep}{{\"name\":{},\"kind\":\"{kind}\",\"bytes\":{bytes}}}",
            quote(name)
        );
    }
    out.push_str("]}},\n");
}

/// A run's events: its metadata "gkrt_run" (the host call's interval, the tensors on the
/// device at its start and every change of residency after, for `gkrt-viz`'s stacked memory),
/// slices, counters and instants.
fn write_run(out: &mut String, r: &RunRecord, g: &GraphNames) {
    let serial = g.serial as u64;
    let _ = write!(
        out,
        "{{\"ph\":\"M\",\"pid\":1,\"name\":\"gkrt_run\",\"args\":{{\"graph\":{serial},\"run\":{},\"began\":{:.3},\"ended\":{:.3},\"resident\":",
        r.run, r.began_us, r.ended_us
    );
    ints(out, r.resident.iter().map(|&t| t as u64));
    out.push_str(",\"changes\":[");
    for (i, &(at, t, on)) in r.changes.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        let _ = write!(out, "{sep}[{at:.3},{t},{}]", on as u8);
    }
    out.push_str("]}},\n");
    let size = |t: u32| g.tensors.get(t as usize).map_or(0, |x| x.2);
    let tensor_name = |t: u32| g.tensors.get(t as usize).map_or("", |x| x.0.as_str());
    if let Some((a, b)) = r.replay {
        let args = [("graph", Arg::Int(serial)), ("run", Arg::Int(r.run))];
        slice(
            out,
            Track::Compute,
            "graph replay",
            "replay",
            a,
            b - a,
            &args,
        );
    }
    for &(n, a, b) in &r.nodes {
        let Some(node) = g.nodes.get(n as usize) else {
            continue;
        };
        if node.absorbed {
            continue;
        }
        // Collectives were timed on the communication stream.
        let (track, category) = match node.collective {
            true => (Track::Communication, "collective"),
            false => (Track::Compute, "node"),
        };
        let bytes = |ts: &[u32]| ts.iter().map(|&t| size(t)).sum::<u64>();
        let ids = |ts: &[u32]| Arg::Ints(ts.iter().map(|&t| t as u64).collect());
        let args = [
            ("graph", Arg::Int(serial)),
            ("node", Arg::Int(n as u64)),
            ("input_bytes", Arg::Int(bytes(&node.inputs))),
            ("output_bytes", Arg::Int(bytes(&node.outputs))),
            ("inputs", ids(&node.inputs)),
            ("outputs", ids(&node.outputs)),
        ];
        slice(out, track, &node.name, category, a, b - a, &args);
    }
    for &(a, b, bytes, incoming, t) in &r.copies {
        let (track, verb) = match incoming {
            true => (Track::CopyIn, "swap in"),
            false => (Track::CopyOut, "swap out"),
        };
        let args = [
            ("graph", Arg::Int(serial)),
            ("bytes", Arg::Int(bytes)),
            ("tensor", Arg::Int(t as u64)),
        ];
        let name = format!("{verb}: {}", tensor_name(t));
        slice(out, track, &name, "copy", a, b - a, &args);
    }
    for &(a, b, n, t) in &r.recomputes {
        let node = g.nodes.get(n as usize).map_or("", |x| x.name.as_str());
        let args = [
            ("graph", Arg::Int(serial)),
            ("tensor", Arg::Int(t as u64)),
            ("bytes", Arg::Int(size(t))),
        ];
        let name = format!("recompute: {node}");
        slice(out, Track::Compute, &name, "recompute", a, b - a, &args);
    }
    for &(at, allocated, reserved, pinned, pending) in &r.memory {
        counter(out, "allocated bytes", at, allocated);
        counter(out, "reserved bytes", at, reserved);
        counter(out, "pinned bytes", at, pinned);
        counter(out, "pending free bytes", at, pending);
    }
    for &(at, n, t) in &r.evictions {
        let args = [("node", Arg::Int(n as u64)), ("bytes", Arg::Int(size(t)))];
        let name = format!("fallback eviction: {}", tensor_name(t));
        instant(out, Track::Compute, &name, "eviction", at, &args);
    }
    if let Some((name, message, at)) = &r.failure {
        let at = *at;
        let args = [("message", Arg::Text(message.clone()))];
        instant(out, Track::Compute, name, "failure", at, &args);
    }
}

/// An argument of an event.
#[derive(Clone, Debug)]
enum Arg {
    Int(u64),
    Text(String),
    Ints(Vec<u64>),
}

fn slice(
    out: &mut String,
    track: Track,
    name: &str,
    cat: &str,
    ts: f64,
    dur: f64,
    args: &[(&str, Arg)],
) {
    event(out, "X", track, name, cat, ts, Some(dur.max(0.0)), args);
}

fn instant(out: &mut String, track: Track, name: &str, cat: &str, ts: f64, args: &[(&str, Arg)]) {
    event(out, "i", track, name, cat, ts, None, args);
}

/// A sample of counter track `name` (its value from `ts` on).
fn counter(out: &mut String, name: &str, ts: f64, value: u64) {
    let _ = writeln!(
        out,
        "{{\"ph\":\"C\",\"pid\":1,\"name\":{},\"ts\":{ts:.3},\"args\":{{\"bytes\":{value}}}}},",
        quote(name)
    );
}

fn ints(e: &mut String, v: impl Iterator<Item = u64>) {
    e.push('[');
    for (j, n) in v.enumerate() {
        let _ = write!(e, "{}{n}", if j > 0 { "," } else { "" });
    }
    e.push(']');
}

#[allow(clippy::too_many_arguments)]
fn event(
    e: &mut String,
    ph: &str,
    track: Track,
    name: &str,
    cat: &str,
    ts: f64,
    dur: Option<f64>,
    args: &[(&str, Arg)],
) {
    let _ = write!(
        e,
        "{{\"ph\":\"{ph}\",\"pid\":1,\"tid\":{},\"name\":{},\"cat\":{},\"ts\":{ts:.3}",
        track as u32,
        quote(name),
        quote(cat)
    );
    if let Some(d) = dur {
        let _ = write!(e, ",\"dur\":{d:.3}");
    }
    if ph == "i" {
        e.push_str(",\"s\":\"t\"");
    }
    e.push_str(",\"args\":{");
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            e.push(',');
        }
        e.push_str(&quote(k));
        e.push(':');
        match v {
            Arg::Int(n) => {
                let _ = write!(e, "{n}");
            }
            Arg::Text(t) => e.push_str(&quote(t)),
            Arg::Ints(v) => ints(e, v.iter().copied()),
        }
    }
    e.push_str("}},\n");
}

/// `s` as a JSON string.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\r' => q.push_str("\\r"),
            '\t' => q.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(q, "\\u{:04x}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_and_events_kept_in_order() {
        let names = Arc::new(GraphNames {
            serial: 3,
            tensors: vec![("x\\y".into(), "intermediate", 4096)],
            nodes: vec![NodeNames {
                name: "node 0 'a\"b'\n".into(),
                inputs: vec![],
                outputs: vec![0],
                collective: false,
                absorbed: false,
            }],
        });
        let mut t = Trace::default();
        let graph = t.graph(&names);
        assert_eq!(t.graph(&names), graph, "a graph is described once");
        t.add_run(RunRecord {
            graph,
            began_us: 0.5,
            ended_us: 4.0,
            nodes: vec![(0, 1.0, 3.5)],
            memory: vec![(1.0, 4096, 8192, 0, 0)],
            evictions: vec![(2.0, 0, 0)],
            resident: vec![0],
            changes: vec![(3.5, 0, false)],
            ..Default::default()
        });
        let j = t.to_json();
        assert!(j.contains(r#""name":"node 0 'a\"b'\n""#), "{j}");
        assert!(j.contains(r#""dur":2.500"#));
        assert!(j.contains(r#""args":{"bytes":4096}"#));
        assert!(j.contains(r#""name":"fallback eviction: x\\y""#), "{j}");
        assert!(
            j.contains(r#""resident":[0],"changes":[[3.500,0,0]]"#),
            "{j}"
        );
        assert_eq!(j.matches("gkrt_tensors").count(), 1);
        assert!(j.find("\"ph\":\"X\"").unwrap() < j.find("\"ph\":\"i\"").unwrap());
        assert!(j.trim_end().ends_with("]}"));
    }
}
