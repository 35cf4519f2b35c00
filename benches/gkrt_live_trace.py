"""The allocation sequence a PyTorch program sends gkrt's pool, as the pool saw it: the program
runs on gkrt's allocator (as in a lockstep run of torch_workloads.py) with gkrt's memory history
recording from before its first allocation, and the history is written in the trace format of
../shared/traces/README.md, a "# step K" line after each step. The host replay reads it as it
reads any trace (GKRT_TRACES; one pass, GKRT_PASSES=0, is the program's own run): what the live
program did, not what it did on PyTorch's allocator (benches/record_traces.py).

    python3 gkrt_live_trace.py --model heldout:NAME|gpt2|resnet50 --out PATH.trace.gz
                               [--lib libgkrt.so] [--steps 15]

The header holds the pool's statistics at the end (epochs followed and left among them) and each
step's allocations and frees.
"""
import argparse
import ctypes
import gzip
import json
import os
import pickle
import tempfile

from record_traces import trace_lines
from torch_workloads import build_on_host, gkrt_stats, install_allocator, make_step


def record(torch, model, lib_path, steps):
    lib = install_allocator(torch, "gkrt", lib_path)
    rt = ctypes.c_void_p()
    assert lib.gkrt_torch_runtime(0, ctypes.byref(rt)) == 0
    # Before the first allocation, so the trace starts with an empty pool.
    lib.gkrt_runtime_record_history.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    assert lib.gkrt_runtime_record_history(rt, 1 << 22) == 0
    step = make_step(model, build_on_host(model, torch), torch)
    ends = []
    for _ in range(steps):
        step()
        torch.cuda.synchronize()
        s = gkrt_stats(lib)
        ends.append((s.alloc_count, s.free_count))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap.pickle")
        assert lib.gkrt_runtime_dump_snapshot(rt, path.encode()) == 0
        with open(path, "rb") as f:
            snap = pickle.load(f)
    lib.gkrt_runtime_release(rt)
    s = gkrt_stats(lib)
    return snap, ends, {name: getattr(s, name) for name, _ in s._fields_ if name != "rest"}


def with_steps(lines, ends):
    """`lines` with "# step K" after the event that closes step K (its allocation and free
    counts reached)."""
    out, a, f, k = [], 0, 0, 0
    for line in lines:
        out.append(line)
        if line[0] == "a":
            a += 1
        else:
            f += 1
        while k < len(ends) and a >= ends[k][0] and f >= ends[k][1]:
            out.append(f"# step {k}")
            k += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lib", default=os.environ.get("GKRT_LIB", ".gpu/lib/libgkrt.so"))
    ap.add_argument("--steps", type=int, default=15)
    a = ap.parse_args()
    import torch

    snap, ends, stats = record(torch, a.model, os.path.abspath(a.lib), a.steps)
    # The program's blocks still live at the end are freed at the end (trace_lines).
    lines, peak = trace_lines(snap)
    meta = {
        "name": os.path.basename(a.out).split(".")[0],
        "workload": f"{a.model} on gkrt's pool, {a.steps} steps from its first allocation",
        "steps": a.steps,
        "peak_live": peak,
        "events": len(lines),
        "live_at_start": 0,
        "step_ends": ends,
        "gkrt_stats": stats,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    with gzip.open(a.out, "wt") as f:
        f.write("# " + json.dumps(meta) + "\n")
        f.write("\n".join(with_steps(lines, ends)) + "\n")
    print(json.dumps({k: meta[k] for k in ("name", "events", "peak_live")}
                     | {"followed": stats["pool_epochs_followed"], "left": stats["pool_epochs_left"]}))


if __name__ == "__main__":
    main()
