//! Traces of runs in Chrome's trace-event JSON (Perfetto and chrome://tracing open it).
//!
//! Owns: the events collected between `gkrt_runtime_trace_begin` and `gkrt_runtime_trace_end`,
//! and their JSON. One process, one thread ("track") per stream: compute, copy in, copy out,
//! and communication (`Track::Communication`: collective calls). Slices ("X") are nodes,
//! collective calls, swap copies and recomputes; counters ("C") the
//! pool's allocated and reserved bytes and the pinned pool's reserved bytes; instants ("i")
//! fallback evictions and out-of-memory failures. Times are µs since the trace began. What
//! a run contributes is made from its profile by `graph/trace_run.rs`.

use std::fmt::Write;
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

/// An argument of an event.
#[derive(Clone, Debug)]
pub enum Arg {
    Int(u64),
    Text(String),
    Ints(Vec<u64>),
}

/// The events of one trace.
#[derive(Debug)]
pub struct Trace {
    start: Instant,
    /// JSON objects, each followed by ",\n".
    events: String,
    /// Where the last run's device times ended (µs): the next run starts no earlier.
    pub(crate) last_end_us: f64,
    pub(crate) runs: u64,
    /// Graphs whose tensors were described already (`describe_graph`).
    graphs: Vec<u32>,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            start: Instant::now(),
            events: String::new(),
            last_end_us: 0.0,
            runs: 0,
            graphs: Vec::new(),
        }
    }
}

impl Trace {
    /// µs since the trace began.
    pub fn now_us(&self) -> f64 {
        self.start.elapsed().as_nanos() as f64 / 1e3
    }

    pub fn slice(
        &mut self,
        track: Track,
        name: &str,
        cat: &str,
        ts: f64,
        dur: f64,
        args: &[(&str, Arg)],
    ) {
        self.event("X", track, name, cat, ts, Some(dur.max(0.0)), args);
    }

    pub fn instant(&mut self, track: Track, name: &str, cat: &str, ts: f64, args: &[(&str, Arg)]) {
        self.event("i", track, name, cat, ts, None, args);
    }

    /// A sample of counter track `name` (its value from `ts` on).
    pub fn counter(&mut self, name: &str, ts: f64, value: u64) {
        let _ = writeln!(
            self.events,
            "{{\"ph\":\"C\",\"pid\":1,\"name\":{},\"ts\":{ts:.3},\"args\":{{\"bytes\":{value}}}}},",
            quote(name)
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        ph: &str,
        track: Track,
        name: &str,
        cat: &str,
        ts: f64,
        dur: Option<f64>,
        args: &[(&str, Arg)],
    ) {
        let e = &mut self.events;
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
                Arg::Ints(v) => {
                    e.push('[');
                    for (j, n) in v.iter().enumerate() {
                        let _ = write!(e, "{}{n}", if j > 0 { "," } else { "" });
                    }
                    e.push(']');
                }
            }
        }
        e.push_str("}},\n");
    }

    /// Once per graph: a metadata event "gkrt_tensors" naming its tensors, their kinds and bytes (slices
    /// refer to tensors by index; `gkrt-viz` stacks memory by tensor with these).
    pub fn describe_graph(
        &mut self,
        serial: u32,
        tensors: impl Iterator<Item = (String, &'static str, u64)>,
    ) {
        if self.graphs.contains(&serial) {
            return;
        }
        self.graphs.push(serial);
        let _ = write!(
            self.events,
            "{{\"ph\":\"M\",\"pid\":1,\"name\":\"gkrt_tensors\",\"args\":{{\"graph\":{serial},\"tensors\":["
        );
        for (i, (name, kind, bytes)) in tensors.enumerate() {
            let sep = if i > 0 { "," } else { "" };
            let _ = write!(
                self.events,
                "{sep}{{\"name\":{},\"kind\":\"{kind}\",\"bytes\":{bytes}}}",
                quote(&name)
            );
        }
        self.events.push_str("]}},\n");
    }

    /// The whole trace as JSON (`{"traceEvents": [...], ...}`), tracks named.
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
        out.push_str(&self.events);
        // The last element has no trailing comma: end with the trace's own summary.
        let _ = write!(
            out,
            "{{\"ph\":\"M\",\"pid\":1,\"name\":\"gkrt_runs\",\"args\":{{\"runs\":{}}}}}\n]}}\n",
            self.runs
        );
        out
    }
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
        let mut t = Trace::default();
        t.slice(
            Track::Compute,
            "node 0 'a\"b'\n",
            "node",
            1.0,
            2.5,
            &[("bytes", Arg::Int(7))],
        );
        t.counter("allocated bytes", 1.0, 4096);
        t.instant(
            Track::CopyOut,
            "evict",
            "eviction",
            2.0,
            &[("tensor", Arg::Text("x\\y".into()))],
        );
        let j = t.to_json();
        assert!(j.contains(r#""name":"node 0 'a\"b'\n""#), "{j}");
        assert!(j.contains(r#""dur":2.500"#));
        assert!(j.contains(r#""args":{"bytes":4096}"#));
        assert!(j.contains(r#""tensor":"x\\y""#));
        assert!(j.find("\"ph\":\"X\"").unwrap() < j.find("\"ph\":\"i\"").unwrap());
        assert!(j.trim_end().ends_with("]}"));
    }
}
