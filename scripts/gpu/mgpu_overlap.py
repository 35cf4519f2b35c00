"""Exposed communication from a gkrt run trace (issue 16): the share of the communication time
that no compute overlaps.

Reads one rank's trace (gkrt_runtime_trace_end's Chrome trace-event JSON, as
examples_c/data_parallel/ --trace writes it). Communication is the union of the slices on the
"communication" track (collective calls, timed on the communication stream by device events);
compute is the union of the slices on the compute stream's track (nodes and recomputes). Swap
copies count as neither. Then, over every run in the trace:

    communication = |C|, exposed = |C minus K|, exposed share = exposed / communication

where C and K are the unions (a stretch where two collectives overlap each other counts once).
The compute stream's slices never contain a wait (gkrt's tracer starts a fresh slice after one),
so a node waiting for an all-reduce does not count as overlapping it. A replayed planned graph is
one slice with no nodes inside: its timeline cannot say what overlapped, and is refused.

Usage: python3 scripts/gpu/mgpu_overlap.py TRACE.json [TRACE.json ...]  (one line per file)
"""

import json
import sys

COMPUTE_TID = 1  # trace.rs Track::Compute
COMMUNICATION_TID = 4  # trace.rs Track::Communication


class Unmeasurable(Exception):
    """The trace cannot say how much communication was exposed."""


def union(intervals):
    """Sorted, disjoint (start, end) covering the same points as `intervals` (empty ones dropped)."""
    merged = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1][1] = b
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(disjoint):
    return sum(b - a for a, b in disjoint)


def intersection(xs, ys):
    """Length of the points in both of two sorted, disjoint interval lists (one sweep)."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def slices(events):
    """(compute intervals, communication intervals, runs) of a trace's events."""
    compute, comm, runs = [], [], 0
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "gkrt_run":
            runs += 1
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "replay":
            raise Unmeasurable("a replayed graph is one slice: the trace has no per-node times to overlap")
        interval = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if e.get("tid") == COMMUNICATION_TID:
            comm.append(interval)
        elif e.get("tid") == COMPUTE_TID:
            compute.append(interval)
    return compute, comm, runs


def exposure(trace):
    """{communication_us, exposed_us, share, collectives, runs} of a parsed trace. share is None
    when the trace has no communication."""
    compute, comm, runs = slices(trace["traceEvents"])
    c, k = union(comm), union(compute)
    total = length(c)
    exposed = total - intersection(c, k)
    return {
        "communication_us": total,
        "exposed_us": exposed,
        "share": exposed / total if total > 0 else None,
        "collectives": len(comm),
        "runs": runs,
    }


def exposure_of_file(path):
    with open(path) as f:
        return exposure(json.load(f))


def describe(x):
    share = "no communication" if x["share"] is None else f"exposed share {x['share']:.3f}"
    return (f"communication {x['communication_us']:.1f} us, exposed {x['exposed_us']:.1f} us, {share} "
            f"({x['collectives']} collective calls in {x['runs']} runs)")


def main(paths):
    rc = 0
    for p in paths:
        try:
            print(f"{p}: {describe(exposure_of_file(p))}")
        except (OSError, ValueError, KeyError, Unmeasurable) as e:
            print(f"{p}: not measured: {e}")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
