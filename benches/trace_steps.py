#!/usr/bin/env python3
"""The step structure of an allocation trace, and what a clairvoyant placer reaches on it.

    python3 benches/trace_steps.py benches/traces/gnn_train.trace.gz [...]

For each trace (format: benches/traces/README.md): the steps, found as the live bytes rising
from the baseline (the blocks live when recording started) by at least a fifth of the way to the
peak and coming back within 2% of it; per step its allocation count, a hash of its sequence of
sizes (equal hashes: the step repeats exactly), a hash of its blocks' lifetimes in allocations by
their position in the step (equal hashes: the same lifetimes, even with other sizes) and its peak
of live bytes; then the footprint of an offline placement that knows every lifetime (largest
block first, each at the best-fitting gap among the blocks live at the same time) over the peak
live bytes, as is and rounded up to 2 MiB granules: a reference for what placement that knows lifetimes (a plan recorded from an
earlier step) can reach without moving pages. It is a heuristic, not a bound (the pool beats it on
decoder_generate). With `GKRT_REPLAY_PEAKS` (src/memory/pool/tests/replay.rs), which prints the
event at which the pool's peak of reserved bytes grows, it tells whether that peak falls in the
first occurrence of a step's sequence of sizes, where no plan learned from earlier steps applies.
"""

import gzip
import hashlib
import json
import sys

GRANULE = 2 << 20


def load(path):
    meta, events = {}, []
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.startswith("#"):
                meta = json.loads(line[1:])
                continue
            w = line.split()
            if w:
                events.append((w[0], w[1], int(w[2]) if w[0] == "a" else 0))
    return meta, events


def lifetimes(events):
    start, end, size = {}, {}, {}
    for i, (op, key, nbytes) in enumerate(events):
        if op == "a":
            start[key], size[key] = i, nbytes
        else:
            end[key] = i
    for key in start:
        end.setdefault(key, len(events))
    return start, end, size


def steps(events, size, first):
    live, curve = 0, []
    for op, key, _ in events:
        live += size[key] if op == "a" else -size[key]
        curve.append(live)
    base = curve[first - 1] if first > 0 else 0
    rise = max(curve) - base
    bounds, up = [first], False
    for i in range(first, len(events)):
        if curve[i] > base + rise / 5:
            up = True
        if up and curve[i] <= base + rise / 50:
            bounds.append(i + 1)
            up = False
    return curve, list(zip(bounds, bounds[1:]))


def clairvoyant(start, end, size):
    """Largest first, each at the smallest gap that fits among the blocks whose lifetimes overlap."""
    placed, top = [], 0
    for key in sorted(start, key=lambda k: (-size[k], start[k])):
        s0, e0, n = start[key], end[key], size[key]
        taken = sorted((o, o + z) for a, b, o, z in placed if a < e0 and s0 < b)
        best, prev = None, 0
        for o, oe in taken:
            if o - prev >= n and (best is None or o - prev < best[1]):
                best = (prev, o - prev)
            prev = max(prev, oe)
        off = best[0] if best else prev
        placed.append((s0, e0, off, n))
        top = max(top, off + n)
    return top


def main(paths):
    for path in paths:
        meta, events = load(path)
        start, end, size = lifetimes(events)
        curve, found = steps(events, size, meta.get("live_at_start", 0))
        peak = max(curve)
        at = curve.index(peak)
        print(f"{meta.get('name', path)}: {len(found)} steps found ({meta.get('steps', '?')} declared), "
              f"peak live {peak / 2**20:.1f} MiB at event {at}")
        # Allocations made before each event, to count lifetimes in allocations.
        made, n = [], 0
        for op, _, _ in events:
            made.append(n)
            n += op == "a"
        for a, b in found:
            keys = [events[i][1] for i in range(a, b) if events[i][0] == "a"]
            digest = hashlib.md5(str([size[k] for k in keys]).encode()).hexdigest()[:8]
            # Each block's lifetime in allocations by its position in the step (-1: it outlives
            # the step): equal hashes, the same lifetimes even where the sizes differ.
            lives = [made[end[k]] - made[start[k]] if end[k] < b else -1 for k in keys]
            life_digest = hashlib.md5(str(lives).encode()).hexdigest()[:8]
            mark = "  <- peak live" if a <= at < b else ""
            print(f"  events {a}-{b}: {len(keys)} allocations, sizes {digest}, "
                  f"lifetimes {life_digest}, peak {max(curve[a:b]) / 2**20:.1f} MiB{mark}")
        top = clairvoyant(start, end, size)
        rounded = -(-top // GRANULE) * GRANULE
        print(f"  clairvoyant placement: {top / peak:.4f} of peak live ({rounded / peak:.4f} in granules)")


if __name__ == "__main__":
    main(sys.argv[1:])
