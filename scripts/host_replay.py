#!/usr/bin/env python3
"""The pool's host replay of every trace in six configurations, and a comparison of two such runs.

    python3 scripts/host_replay.py run PREFIX [NAME=VALUE ...]
    python3 scripts/host_replay.py seeds PREFIX [FIRST-LAST] [NAME=VALUE ...]
    python3 scripts/host_replay.py compare OLD_PREFIX NEW_PREFIX

`run` builds the library's unit tests (release), then replays the traces through the pool's
virtual ranges (`replay_traces_through_the_pool`, an ignored test in
src/memory/pool/tests/replay.rs) with the modelled clock (`GKRT_REPLAY_MODEL_CLOCK=1`, 400 ns of
work an operation, an 8 µs gap: the same figures on every machine) in the six configurations
BENCHMARKS.md reports the host replay in: as they come (`base`), at a 3 µs gap (`gap3000`), with a
block held on each stream (`hold`), with the trace's opening blocks kept (`keep`), and at 5 and
100 µs per physical allocation (`us5`, `us100`). Each writes PREFIX_<config>.txt, the replay's
table rows for the virtual ranges, and the traces over their goal are printed. NAME=VALUE pairs
(GKRT_REPLAY_* knobs, or GKRT_PASSES: rounds of two passes after the first, 5 by default) go to
every configuration. GKRT_TRACES (colon-separated paths) replaces the trace list, which is
otherwise ../shared/traces, benches/traces, benches/traces_heldout, the synthetic traces of
benches/gen_traces.py (written to a temporary folder), benches/traces_host and
benches/traces_hostgpu.

`seeds` replays, as they come only, benches/gen_traces.py's workloads at each seed of FIRST-LAST
(1-24 by default; `gen_traces.py --seeds`): the same programs with other random choices, to see
how far a figure holds beyond the one seed the traces keep. It writes PREFIX_seeds.txt and prints
the traces over their goal, and how many per workload.

`compare` prints, for each configuration both prefixes ran (`seeds` among them), every trace
whose figure (peak reserved over peak live) or median later pass (physical allocations mapped,
unmapped) differs between the two runs, and the traces only one of them replayed (trace names
are file names, unique across the sets).
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [
    ("base", {}),
    ("gap3000", {"GKRT_REPLAY_GAP_NS": "3000"}),
    ("hold", {"GKRT_REPLAY_HOLD": "1"}),
    ("keep", {"GKRT_REPLAY_KEEP_START": "1"}),
    ("us5", {"GKRT_REPLAY_ALLOC_US": "5"}),
    ("us100", {"GKRT_REPLAY_ALLOC_US": "100"}),
]
# Columns of the replay's table (split on '|'): name, pool, ..., ratio, goal, ..., steady pass.
NAME, RATIO, GOAL, STEADY = 1, 5, 6, 19


def test_binary():
    """Builds the unit tests and returns the path of their executable (found in cargo's JSON
    messages, as scripts/gpu/stage.sh finds it)."""
    out = subprocess.run(["cargo", "test", "--release", "--lib", "--no-run",
                          "--message-format=json"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        m = json.loads(line)
        if (m.get("reason") == "compiler-artifact" and m.get("executable")
                and m["profile"]["test"] and m["target"]["src_path"].endswith("src/lib.rs")):
            return m["executable"]
    sys.exit("host_replay: cargo built no unit-test executable for src/lib.rs")


def default_traces(synth_dir):
    subprocess.run([sys.executable, os.path.join(ROOT, "benches", "gen_traces.py"), synth_dir],
                   check=True, stdout=subprocess.DEVNULL)
    dirs = [os.path.join(ROOT, "..", "shared", "traces"), os.path.join(ROOT, "benches", "traces"),
            os.path.join(ROOT, "benches", "traces_heldout"), synth_dir,
            os.path.join(ROOT, "benches", "traces_host"), os.path.join(ROOT, "benches", "traces_hostgpu")]
    paths = []
    for d in dirs:
        paths += sorted(glob.glob(os.path.join(d, "*.trace.gz")))
    return [os.path.realpath(p) for p in paths]


def rows(path):
    out = []
    with open(path) as f:
        for line in f:
            c = [x.strip() for x in line.split("|")]
            out.append((c[NAME], float(c[RATIO]), float(c[GOAL]), c[STEADY]))
    return out


def knobs(pairs):
    extra = {}
    for p in pairs:
        name, sep, value = p.partition("=")
        if not sep:
            sys.exit(f"host_replay: {p!r} is not NAME=VALUE")
        extra[name] = value
    return extra


def replay(binary, traces, out_path, env):
    """Replays `traces` (colon-separated paths) on the model clock with `env` over the defaults,
    writing the table's rows for the virtual ranges to `out_path`."""
    e = dict(os.environ, GKRT_TRACES=traces, GKRT_REPLAY_MODEL_CLOCK="1",
             GKRT_REPLAY_WORK_NS="400", GKRT_REPLAY_GAP_NS="8000",
             GKRT_REPLAY_VMM_ONLY="1", GKRT_PASSES="5")
    e.update(env)
    out = subprocess.run([binary, "--ignored", "replay_traces", "--nocapture",
                          "--test-threads", "1"], env=e, capture_output=True, text=True,
                         check=True).stdout
    lines = [l for l in out.splitlines() if l.startswith("| ") and "virtual" in l]
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")


def over_goal(path):
    """The rows of `path` whose figure is over their goal, as 'name figure (goal)' lines."""
    return [f"{n} {x:.4f} (goal {g:.4f})" for n, x, g, _ in rows(path) if x > g]


def run(prefix, pairs):
    extra = knobs(pairs)
    binary = test_binary()
    with tempfile.TemporaryDirectory() as synth:
        traces = os.environ.get("GKRT_TRACES") or ":".join(default_traces(synth))

        def one(config):
            tag, env = config
            replay(binary, traces, f"{prefix}_{tag}.txt", {**env, **extra})
            return tag

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            done = list(pool.map(one, CONFIGS))
    for tag in done:
        r = rows(f"{prefix}_{tag}.txt")
        over = over_goal(f"{prefix}_{tag}.txt")
        print(f"{tag}: {len(r)} traces, {len(over)} over their goal" +
              ("".join(f"\n  {o}" for o in over)))


def seeds(prefix, args):
    span = "1-24"
    if args and "=" not in args[0]:
        span, args = args[0], args[1:]
    extra = knobs(args)
    binary = test_binary()
    with tempfile.TemporaryDirectory() as d:
        made = subprocess.run([sys.executable, os.path.join(ROOT, "benches", "gen_traces.py"), d,
                               "--seeds", span], capture_output=True, text=True)
        if made.returncode != 0:
            sys.exit(f"host_replay: gen_traces.py --seeds {span}: {made.stdout}{made.stderr}")
        traces = ":".join(sorted(glob.glob(os.path.join(d, "*.trace.gz"))))
        replay(binary, traces, f"{prefix}_seeds.txt", extra)
    r = rows(f"{prefix}_seeds.txt")
    over = over_goal(f"{prefix}_seeds.txt")
    per = {}
    for o in over:
        workload = o.split()[0].rsplit("_s", 1)[0]
        per[workload] = per.get(workload, 0) + 1
    print(f"seeds {span}: {len(r)} traces, {len(over)} over their goal" +
          "".join(f"\n  {w}: {k}" for w, k in sorted(per.items())) +
          "".join(f"\n  {o}" for o in over))


def compare(old, new):
    tags = [tag for tag, _ in CONFIGS] + ["seeds"]
    tags = [t for t in tags
            if os.path.exists(f"{old}_{t}.txt") and os.path.exists(f"{new}_{t}.txt")]
    if not tags:
        sys.exit(f"host_replay: no run of {old} and {new} alike to compare")
    for tag in tags:
        a = {r[0]: r for r in rows(f"{old}_{tag}.txt")}
        b = {r[0]: r for r in rows(f"{new}_{tag}.txt")}
        both = [n for n in a if n in b]
        changed = [(n, a[n][1], b[n][1], a[n][3], b[n][3]) for n in both
                   if abs(a[n][1] - b[n][1]) > 5e-5 or a[n][3] != b[n][3]]
        print(f"== {tag}: {len(changed)} of {len(both)} changed")
        for n, x, y, s, t in changed:
            print(f"  {n:34} {x:.4f} -> {y:.4f} ({y - x:+.4f})  later pass {s} -> {t}")
        for n in a:
            if n not in b:
                print(f"  {n:34} only in {old}")
        for n in b:
            if n not in a:
                print(f"  {n:34} only in {new}: {b[n][1]:.4f}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "seeds":
        seeds(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        print(__doc__)
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
