"""The data-parallel example's timeline and memory-limit paths on the host backend (issue 16),
as scripts/gpu/mgpu.sh uses them on GPUs.

1. Exposed communication: three ranks (threads) run traced steps; every rank's trace is read by
   scripts/gpu/mgpu_overlap.py and its figure checked against a second, independent computation
   (the trace cut at every slice boundary; each elementary piece is communication, compute, both
   or neither), with the trace's own counts: one gkrt_run per traced step and the same number of
   collective calls in each.
2. Half the memory: two ranks run the same steps unconstrained and under a memory limit below
   their unconstrained peak: the limited run must swap or recompute, stay under its limit and
   train identically — every rank's fingerprint (its final weights' and its losses' bytes) equal
   to the unconstrained run's.

Usage: python3 dp_timeline_check.py PATH/TO/gkrt_data_parallel PATH/TO/scripts/gpu/mgpu_overlap.py
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

TRACE_STEPS = 3
# Four layers, gradients of 64 KiB, 256 KiB, 256 KiB, 64 KiB, 128 KiB buckets: four all-reduces
# per step, three issued while the layers below still compute.
NET = ["--in", "64", "--width", "256", "--out", "64", "--depth", "4", "--bucket-kib", "128"]
# Unconstrained this one peaks at ~26 MiB (the host backend's pool takes 2 MiB segments); its
# weights and their gradients (2.25 MiB each) plus 128 rows' activations per rank do not fit in
# 8 MiB, so the limited run must swap (it moves ~8 MiB a run).
BIG_NET = ["--in", "64", "--width", "512", "--out", "64", "--depth", "4", "--bucket-kib", "0", "--batch", "256"]
LIMIT_MIB = 8


def load(path):
    spec = importlib.util.spec_from_file_location("mgpu_overlap", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(exe, args):
    env = dict(os.environ, GKRT_DEVICE="host")
    p = subprocess.run([exe] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if p.returncode != 0 or not p.stdout.rstrip().endswith("OK"):
        sys.exit(f"FAILED: {exe} {' '.join(args)} exited {p.returncode}:\n{p.stdout[-4000:]}")
    return p.stdout


def brute_force(events):
    """(communication, exposed) µs by cutting the timeline at every slice boundary."""
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e["tid"] == 4]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e["tid"] == 1]
    cuts = sorted({t for a, b in comm + compute for t in (a, b)})
    total = exposed = 0.0
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        if any(x <= mid < y for x, y in comm):
            total += b - a
            if not any(x <= mid < y for x, y in compute):
                exposed += b - a
    return total, exposed


def check_timeline(exe, overlap):
    failures = []
    with tempfile.TemporaryDirectory() as d:
        out = run(exe, ["--ranks", "3", "--steps", "2", "--batch", "48", "--trace", d, "--trace-steps",
                        str(TRACE_STEPS)] + NET)
        for r in range(3):
            path = os.path.join(d, f"trace_rank{r}.json")
            if f"rank {r}: steps 3..{2 + TRACE_STEPS} traced: {path}" not in out:
                failures.append(f"rank {r}: the example did not say it traced steps 3..{2 + TRACE_STEPS}")
            with open(path) as f:
                events = json.load(f)["traceEvents"]
            x = overlap.exposure_of_file(path)
            total, exposed = brute_force(events)
            print(f"rank {r}: {overlap.describe(x)}; cut at every boundary: communication {total:.3f} us, "
                  f"exposed {exposed:.3f} us")
            if x["runs"] != TRACE_STEPS:
                failures.append(f"rank {r}: {x['runs']} runs in the trace, expected {TRACE_STEPS}")
            if x["collectives"] == 0 or x["collectives"] % TRACE_STEPS:
                failures.append(f"rank {r}: {x['collectives']} collective calls: not the same number in each step")
            if not total > 0 or abs(x["communication_us"] - total) > 1e-6 * total:
                failures.append(f"rank {r}: communication {x['communication_us']} us, cut at boundaries {total}")
            if abs(x["exposed_us"] - exposed) > 1e-6 * total:
                failures.append(f"rank {r}: exposed {x['exposed_us']} us, cut at boundaries {exposed}")
            if x["share"] is None or not 0.0 <= x["share"] <= 1.0:
                failures.append(f"rank {r}: share {x['share']} outside [0, 1]")
    return failures


def figures(text):
    """{rank: (fingerprint line, peak reserved MiB, swapped out MiB, recomputed)} of one run."""
    got = {}
    for m in re.finditer(r"^rank (\d+): memory limit \d+ MiB \(0: none\), peak reserved (\S+) MiB, swapped out (\S+) "
                         r"MiB, in \S+ MiB, tensors recomputed (\d+)", text, re.M):
        got[int(m.group(1))] = [float(m.group(2)), float(m.group(3)), int(m.group(4))]
    for m in re.finditer(r"^rank (\d+): fingerprint (.*)$", text, re.M):
        got.setdefault(int(m.group(1)), [None] * 3).append(m.group(2))
    return got


def check_memory_limit(exe):
    failures = []
    args = ["--ranks", "2", "--steps", "3"] + BIG_NET
    free = figures(run(exe, args))
    limited = figures(run(exe, args + ["--memory-limit", str(LIMIT_MIB)]))
    for r in (0, 1):
        f, lim = free.get(r), limited.get(r)
        if not f or not lim or len(f) != 4 or len(lim) != 4:
            failures.append(f"rank {r}: figures missing: {f} / {lim}")
            continue
        print(f"rank {r}: unconstrained peak {f[0]} MiB; at {LIMIT_MIB} MiB peak {lim[0]} MiB, swapped out {lim[1]} "
              f"MiB, recomputed {lim[2]}; fingerprints {f[3]} / {lim[3]}")
        if not f[0] > LIMIT_MIB:
            failures.append(f"rank {r}: the unconstrained peak {f[0]} MiB is not above the limit: nothing to test")
        if lim[0] > LIMIT_MIB:
            failures.append(f"rank {r}: peak reserved {lim[0]} MiB over the {LIMIT_MIB} MiB limit")
        if lim[1] == 0 and lim[2] == 0:
            failures.append(f"rank {r}: under the limit nothing was swapped or recomputed")
        if f[3] != lim[3]:
            failures.append(f"rank {r}: trained differently under the limit: {lim[3]} against {f[3]}")
    return failures


def main():
    exe, overlap = sys.argv[1], load(sys.argv[2])
    failures = check_timeline(exe, overlap) + check_memory_limit(exe)
    for f in failures:
        print("FAILED:", f)
    print("dp_timeline_check: FAILED" if failures else "dp_timeline_check: OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
