#!/usr/bin/env python3
"""Summarises the measured swap timelines that GKRT_SWAP_TIMELINE=FILE makes gkrt append (one CSV
line per node and per copy of every run of a swapping graph, or of a dynamic-mode one: run,
node|in|out, node index or copy bytes, start ms, end ms, from the run's first node start).

The CSV's other kinds (see RuntimeGraph::write_timeline): `re` rebuilds (node run again, start,
end), `pool` (node, pages the pool mapped and its waits for the device before that node's launch),
and once the plan was tuned the timeline model's prediction for it: `pred_step`, `pred` (per node
modelled start and end), `pred_pool` (the pool's dry run; with a release schedule its steady runs),
`pred_pool_first` (the release schedule's dry run's first run), `host` (node, the host's ms from the
run's start when it queued the node's launch, the compute-stream syncs queued since the previous
launch), `syncs` (the run's compute-stream syncs queued and left out as implied,
GKRT_EXEC_ELIDE), `polled` (copy events the executor queried, GKRT_EXEC_POLL_IN_ORDER),
`copy_waits` (the copy streams' waits for other copies, queued and left out) and `deferred`
(returns started late for lack of room, the run's departures from its program). For those it
also prints: rebuilds' busy time, the waits between nodes split by
what filled or explains them (a rebuild, pool page moves before the node, the host queueing the
node late — it started within HOST_LATE_MS of being queued, by the host rows —, a copy-in ending
in the gap, a copy-out ending in the gap — a release schedule's wait —, nothing seen), the host's
time per node and the syncs between nodes, the pool's maps and waits measured
against the dry run's, and the predicted step beside the measured one with the nodes where the
measured timeline fell behind the prediction the most (the model's largest errors).

--base BASE: the timeline of the same graph unconstrained (its last run); prints how much longer
the nodes took here than there in all, and the nodes slowed most (a node cost the model takes from
the swapping graph's first two runs, the lesser of each node's times, which the copies beside it
may have slowed).

Usage: python3 scripts/gpu/timeline.py FILE [--gaps N] [--base BASE]

A new graph starts where the run number goes back to 1. For each graph it takes the last run (warm,
on the tuned plan) and prints: the step span, compute busy time and the largest waits between
nodes, and for each direction of the link the bytes, the busy time (union of copies), its idle
time inside the step and the largest idle stretches, and per-copy bandwidth. Then every run's pool
maps and waits, and the tuned plan's runs against its dry run's, node by node ("departs").
"""
import sys
from collections import defaultdict

# A node the device started within this long of the host queueing it waited for the host
# (the device's start less the host's queueing time, less the smallest such offset of the run).
HOST_LATE_MS = 0.03


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def idle_stretches(busy, lo, hi):
    gaps, t = [], lo
    for a, b in busy:
        if a > t:
            gaps.append((t, a))
        t = max(t, b)
    if hi > t:
        gaps.append((t, hi))
    return gaps


def node_at(nodes, t):
    """Index of the node running (or last started) at time t."""
    best = None
    for i, a, _ in nodes:
        if a <= t:
            best = i
    return best


def report(graph, rows, top):
    nodes = [(int(k), a, b) for kind, k, a, b in rows if kind == "node"]
    copies = {d: [(int(k), a, b) for kind, k, a, b in rows if kind == d] for d in ("in", "out")}
    if not nodes:
        return
    start = min(a for _, a, _ in nodes)
    end = max(b for _, _, b in nodes)
    compute = sum(b - a for _, a, b in nodes)
    print(f"## graph {graph}: {len(nodes)} nodes, step {end - start:.2f} ms, compute busy {compute:.2f} ms")
    waits = sorted(((nodes[j][1] - nodes[j - 1][2], nodes[j][0]) for j in range(1, len(nodes))), reverse=True)
    total_wait = sum(w for w, _ in waits if w > 0)
    print(f"waits between nodes: {total_wait:.2f} ms in all; largest: "
          + ", ".join(f"{w:.2f} ms before node {i}" for w, i in waits[:top]))
    for d, cs in copies.items():
        if not cs:
            continue
        nbytes = sum(k for k, _, _ in cs)
        busy = union([[a, b] for _, a, b in cs])
        busy_ms = sum(b - a for a, b in busy)
        lo, hi = min(start, min(a for _, a, _ in cs)), max(end, max(b for _, _, b in cs))
        idle = sorted(((b - a, a) for a, b in idle_stretches(busy, lo, hi)), reverse=True)
        rates = sorted(k / ((b - a) * 1e6) for k, a, b in cs if b > a)
        print(f"{d}: {len(cs)} copies, {nbytes / 2**30:.2f} GiB, busy {busy_ms:.2f} ms "
              f"({nbytes / (busy_ms * 1e6):.1f} GB/s while busy), span {lo:.2f}..{hi:.2f} ms, "
              f"idle {sum(w for w, _ in idle):.2f} ms; per copy GB/s min {rates[0]:.1f} "
              f"median {rates[len(rates) // 2]:.1f}")
        print("  largest idle: " + ", ".join(
            f"{w:.2f} ms at {t:.2f} (node {node_at(nodes, t)})" for w, t in idle[:top]))
    gaps_by_cause(nodes, rows, copies, top)
    host_summary(nodes, rows)
    prediction(nodes, rows, top)


def host_lead(nodes, rows):
    """Per node with a host row: how long before the device started it the host had queued it
    (ms; the smallest device-start less host-time offset of the run taken as the launch latency)."""
    host = {int(k): a for kind, k, a, _ in rows if kind == "host"}
    start = {n: a for n, a, _ in nodes}
    both = [n for n in host if n in start]
    if not both:
        return {}
    offset = min(start[n] - host[n] for n in both)
    return {n: start[n] - host[n] - offset for n in both}


def gaps_by_cause(nodes, rows, copies, top):
    """The waits between consecutive nodes, less the rebuilds run in them, by cause."""
    rebuilds = [(a, b) for kind, _, a, b in rows if kind == "re"]
    pool = defaultdict(lambda: [0, 0])
    for kind, k, a, b in rows:
        if kind == "pool":
            pool[int(k)][0] += int(a)
            pool[int(k)][1] += int(b)
    lead = host_lead(nodes, rows)
    causes = defaultdict(float)
    rebuilt = 0.0
    for j in range(1, len(nodes)):
        lo, hi, n = nodes[j - 1][2], nodes[j][1], nodes[j][0]
        if hi <= lo:
            continue
        inside = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in rebuilds)
        rebuilt += inside
        rest = hi - lo - inside
        ends_in = lambda cs: any(lo - 0.02 <= b <= hi + 0.02 for _, _, b in cs)
        if n in pool:
            causes["pool page moves before the node"] += rest
        elif n in lead and lead[n] < HOST_LATE_MS:
            causes["the host queued the node late"] += rest
        elif ends_in(copies["in"]):
            causes["a copy-in ending in the gap"] += rest
        elif ends_in(copies["out"]):
            causes["a copy-out ending in the gap"] += rest
        else:
            causes["nothing seen (launch, host)"] += rest
    busy = sum(b - a for a, b in rebuilds)
    # The model charges a rebuild its node's own time (from the first run).
    own = {n: b - a for n, a, b in nodes}
    charged = sum(own.get(int(k), 0.0) for kind, k, _, _ in rows if kind == "re")
    print(f"rebuilds: {len(rebuilds)}, busy {busy:.2f} ms against {charged:.2f} ms of their nodes' own "
          f"times ({rebuilt:.2f} ms of it between nodes); the rest of the waits: "
          + ", ".join(f"{c} {ms:.2f} ms" for c, ms in causes.items()))
    if pool:
        maps, waits = sum(v[0] for v in pool.values()), sum(v[1] for v in pool.values())
        big = sorted(pool.items(), key=lambda kv: -kv[1][0])[:top]
        print(f"pool: {maps} pages mapped, {waits} waits for the device; most before nodes "
              + ", ".join(f"{n} ({m} maps, {w} waits)" for n, (m, w) in big))


def host_summary(nodes, rows):
    """The host's time between launches, how often it was late, the syncs between nodes."""
    host = sorted((a, int(k), int(b)) for kind, k, a, b in rows if kind == "host")
    if len(host) < 2:
        return
    per = sorted(host[i][0] - host[i - 1][0] for i in range(1, len(host)))
    lead = host_lead(nodes, rows)
    late = sorted(n for n, d in lead.items() if d < HOST_LATE_MS)
    syncs = [s for _, _, s in host]
    print(f"host: queued {len(host)} nodes in {host[-1][0] - host[0][0]:.2f} ms; per node median "
          f"{per[len(per) // 2] * 1e3:.1f} us, p90 {per[int(0.9 * (len(per) - 1))] * 1e3:.1f} us, "
          f"max {per[-1] * 1e3:.1f} us; {len(late)} nodes started within {HOST_LATE_MS} ms of being "
          f"queued (the device waited for the host)"
          + (f", first {late[:8]}" if late else "")
          + f"; compute-stream syncs between launches: {sum(syncs)} ({sum(syncs) / len(syncs):.2f} a node)")
    total = [(int(a), int(b)) for kind, _, a, b in rows if kind == "syncs"]
    polled = [int(a) for kind, _, a, _ in rows if kind == "polled"]
    copy_waits = [(int(a), int(b)) for kind, _, a, b in rows if kind == "copy_waits"]
    deferred = [(int(a), int(b)) for kind, _, a, b in rows if kind == "deferred"]
    if total:
        print(f"syncs: the run queued {total[0][0]} records and waits on the compute stream and left "
              f"out {total[0][1]} as implied (GKRT_EXEC_ELIDE)"
              + (f"; the executor queried {polled[0]} copy events (GKRT_EXEC_POLL_IN_ORDER; 0: a "
                 f"release schedule, or the pool polled)" if polled else "")
              + (f"; the copy streams waited {copy_waits[0][0]} times for other copies and left out "
                 f"{copy_waits[0][1]} such waits" if copy_waits else "")
              + (f"; {deferred[0][0]} returns started after their step for lack of room, "
                 f"{deferred[0][1]} departures from the program in all" if deferred else ""))


def prediction(nodes, rows, top):
    """The model's predicted run beside the measured one."""
    step = [(a, b) for kind, _, a, b in rows if kind == "pred_step"]
    if not step:
        return
    pred = {int(k): (a, b) for kind, k, a, b in rows if kind == "pred" }
    pool = [(int(k), int(a), int(b)) for kind, k, a, b in rows if kind == "pred_pool"]
    start = min(a for _, a, _ in nodes)
    # As the model's step: until the last node or the last copy home, whichever ends later.
    end = max(b for kind, _, _, b in rows if kind in ("node", "in", "out", "re"))
    print(f"predicted step {step[0][0]:.2f} ms (compute waits {step[0][1]:.2f}) against measured "
          f"{end - start:.2f} ms: measured / predicted {(end - start) / step[0][0]:.3f}; the dry run "
          f"maps {sum(m for _, m, _ in pool)} pages, waits {sum(w for _, _, w in pool)} times")
    # Drift: how far the measured start is behind the predicted one; its jumps are where the
    # model is wrong (a wait it did not foresee, a node slower than its first-run time).
    drift, prev = [], 0.0
    for n, a, _ in sorted(nodes, key=lambda x: x[1]):
        if n in pred:
            d = (a - start) - pred[n][0]
            drift.append((d - prev, n, d))
            prev = d
    if drift:
        jumps = sorted(drift, reverse=True)[:top]
        print("measured behind the prediction: " + ", ".join(
            f"+{j:.2f} ms before node {n}" for j, n, _ in jumps))
        marks = [drift[int(f * (len(drift) - 1))] for f in (0.25, 0.5, 0.75, 1.0)]
        print("drift at a quarter, half, three quarters, the end: " + ", ".join(
            f"{d:.2f} ms (node {n})" for _, n, d in marks))


def pool_by_run(runs, top):
    """Every run's page maps and device waits, and with a release schedule the tuned plan's runs
    against its pending-aware dry run's node by node: its first run against the dry run's first,
    the later ones against the dry run's steady runs (which the fit asks to map and wait 0)."""
    def moves(rows, kind):
        return {int(k): (int(a), int(b)) for kd, k, a, b in rows if kd == kind}
    def total(m):
        return f"{sum(a for a, _ in m.values())} maps, {sum(b for _, b in m.values())} waits"
    print("pool by run: " + "; ".join(f"run {r}: {total(moves(runs[r], 'pool'))}" for r in sorted(runs)))
    tuned = [r for r in sorted(runs) if any(kd == "pred_pool_first" or kd == "pred_step"
                                           for kd, _, _, _ in runs[r])]
    if not tuned:
        return
    first_dry = moves(runs[tuned[-1]], "pred_pool_first")
    steady_dry = moves(runs[tuned[-1]], "pred_pool")
    if not first_dry:
        # (Timelines before session 15 have no pred_pool_first rows; nor does a plan without a
        # release schedule.)
        return
    print(f"the pending-aware dry run: first run {total(first_dry)}; steady runs {total(steady_dry)}")
    for i, r in enumerate(tuned):
        dry = first_dry if i == 0 else {}
        real = moves(runs[r], "pool")
        off = sorted((n for n in set(real) | set(dry) if real.get(n) != dry.get(n)),
                     key=lambda n: -abs(real.get(n, (0, 0))[0] - dry.get(n, (0, 0))[0]))
        what = "its first run" if i == 0 else "a steady run"
        def at(n):
            (m, w), (dm, dw) = real.get(n, (0, 0)), dry.get(n, (0, 0))
            return f"node {n} ({m} maps {w} waits, the dry run {dm} and {dw})"
        if off:
            print(f"run {r} ({what} of the tuned plan) departs from the dry run at {len(off)} nodes; "
                  "most at " + ", ".join(at(n) for n in off[:top]))
        else:
            print(f"run {r} ({what} of the tuned plan) maps and waits where the dry run does")


def read(path):
    """Per graph (a new one where the run number goes back), per run, its rows."""
    graphs, prev = [], None
    with open(path) as f:
        for line in f:
            run, kind, k, a, b = line.strip().split(",")
            run = int(run)
            if prev is None or run < prev:
                graphs.append(defaultdict(list))
            graphs[-1][run].append((kind, k, float(a), float(b)))
            prev = run
    return graphs


def against_base(rows, base, top):
    """Node times here against the unconstrained run's."""
    mine = {int(k): b - a for kind, k, a, b in rows if kind == "node"}
    theirs = {int(k): b - a for kind, k, a, b in base if kind == "node"}
    nodes = [(int(k), a, b) for kind, k, a, b in base if kind == "node"]
    span = max(b for _, _, b in nodes) - min(a for _, a, _ in nodes)
    common = sorted(set(mine) & set(theirs))
    diff = sorted(((mine[n] - theirs[n], n) for n in common), reverse=True)
    print(f"unconstrained: step {span:.2f} ms, nodes busy {sum(theirs.values()):.2f} ms; here the same "
          f"nodes take {sum(d for d, _ in diff):+.2f} ms in all; slowed most: "
          + ", ".join(f"node {n} {d:+.2f} ms" for d, n in diff[:top]))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--gaps") + 1]) if "--gaps" in sys.argv else 6
    base = None
    if "--base" in sys.argv:
        b = read(sys.argv[sys.argv.index("--base") + 1])
        base = b[-1][max(b[-1])] if b else None
    for g, runs in enumerate(read(sys.argv[1]), 1):
        rows = runs[max(runs)]
        report(g, rows, top)
        pool_by_run(runs, top)
        if base:
            against_base(rows, base, top)


if __name__ == "__main__":
    main()
