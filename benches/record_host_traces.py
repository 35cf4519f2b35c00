"""Records allocation traces of PyTorch workloads on a machine without a GPU, in the format of
../shared/traces/README.md, for the host replay of the pool (src/memory/pool/tests/replay.rs).
The workloads are host_workloads.py's; the traces (benches/traces_host/) check the pool's rules
on programs it was not tuned on, never choose them.

    python3 record_host_traces.py OUT_DIR [--only NAME,...] [--list]

Needs PyTorch, torchvision, transformers and timm (CPU builds do). Per workload: warm-up steps,
then the measured steps under PyTorch's profiler with its memory events on: every allocation and
free of the CPU's tensor allocator, in order, with its address and size. The trace starts with
the blocks live when recording begins (the tensors the garbage collector knows of — weights,
optimizer state — in the order it lists them, which is the same in every run, unlike their
addresses; then any block freed during the steps that was allocated before them). Sizes are rounded up to 512 bytes, as PyTorch's caching
allocator rounds a GPU request. Every block still live at the end is freed, so every trace ends
empty.

What differs from a GPU recording: the CPU's kernels choose their own scratch buffers and saved
tensors (oneDNN convolutions, the CPU's attention), so the sequence is the program's on the CPU,
not the one it would make on the GPU; there is one stream; and a step's time is the CPU's under
the profiler.
"""
import gc
import json
import os
import statistics
import tempfile
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from host_workloads import HOST
from record_traces import history_lines, record_each, write_trace

BLOCK = 512


def block_size(n):
    """The block a request of n bytes takes in PyTorch's caching allocator (a multiple of 512)."""
    return (n + BLOCK - 1) // BLOCK * BLOCK


def live_storages():
    """{address: bytes} of the storage of every tensor the garbage collector tracks."""
    out = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for o in tensors:
        if o.device.type == "cpu" and not o.is_meta:
            try:
                s = o.untyped_storage()
                addr, n = s.data_ptr(), s.nbytes()
            except (RuntimeError, NotImplementedError):
                continue  # storage-less layouts, and a compiler's fake tensors (no data)
            if n > 0:
                out[addr] = n
    return out


def memory_events(prof):
    """The profiler's CPU memory events as (address, bytes) in order; bytes < 0 frees."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    evs = data["traceEvents"] if isinstance(data, dict) else data
    mem = [
        e["args"]
        for e in evs
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0 and e["args"]["Bytes"]
    ]
    mem.sort(key=lambda a: a["Ev Idx"])
    return [(a["Addr"], a["Bytes"]) for a in mem]


def history(mem, start):
    """The recorded history as history_lines takes it, and the blocks live at its start: those of
    `start` ({address: bytes}, in its order) and any freed before the history allocated them."""
    live, known, events = set(), dict(start), []
    for addr, n in mem:
        if n > 0:
            live.add(addr)
            events.append({"action": "alloc", "addr": addr, "size": block_size(n), "stream": 0})
        else:
            if addr not in live and addr not in known:
                known[addr] = -n  # allocated before recording began, unseen by the collector
            live.discard(addr)
            events.append({"action": "free_requested", "addr": addr})
    first = [(a, block_size(n), 0) for a, n in known.items()]
    return events, first


def record(name, make, steps, out_dir, warmup=2):
    torch.manual_seed(0)
    step = make()
    for i in range(warmup):
        step(i)
    gc.collect()
    start = live_storages()
    times = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i in range(steps):
            t0 = time.perf_counter()
            step(warmup + i)
            times.append(time.perf_counter() - t0)
    events, first = history(memory_events(prof), start)
    lines, peak = history_lines(events, first)
    meta = {
        "name": name,
        "workload": " ".join(make.__doc__.split()),
        "steps": steps,
        "step_ms_median": round(statistics.median(times) * 1e3, 3),
        "peak_live": peak,
        "events": len(lines),
        "live_at_start": len(first),
        "torch": torch.__version__,
        "recorded_on": "cpu: PyTorch's profiler memory events, sizes rounded up to 512 bytes",
    }
    write_trace(os.path.join(out_dir, name + ".trace.gz"), meta, lines)
    return meta


def main():
    record_each(
        lambda a: HOST,
        [],
        record,
        ["events", "live at start", "peak live MiB", "step ms (CPU, profiled)"],
        lambda m: [
            "%d" % m["events"],
            "%d" % m["live_at_start"],
            "%.1f" % (m["peak_live"] / 2**20),
            "%.1f" % m["step_ms_median"],
        ],
    )


if __name__ == "__main__":
    main()
