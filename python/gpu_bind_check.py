"""On a GPU machine (scripts/gpu/run.sh hostint): a PyTorch program runs a gkrt graph on its own
tensors, bound by data_ptr(), on its current stream (gkrt_runtime_run_async), with no copy
through host memory, and gets the same numbers as running the same kernels itself.

The graph is y = relu(x + w) * 2 of gkrt's built-ins (add, relu, scale: exact IEEE single
operations, as PyTorch's are), in dynamic and planned mode (planned: replayed as a CUDA graph,
and rebound between two sets of tensors). Checks: bit-equal to PyTorch's own result; PyTorch's
work queued after the run on the same stream sees its output; gkrt allocated nothing for the
bound tensors (its pool's allocated bytes stay as they were after the first run, rebinding
included); and the profiler saw no host<->device copy while the graph ran."""

import struct
import sys

import torch

import gkrt

N = 1 << 20


def build(rt):
    g = rt.graph()
    x = g.tensor(4 * N, "input", "x")
    w = g.tensor(4 * N, "parameter", "w")
    s = g.tensor(4 * N, "intermediate", "s")
    r = g.tensor(4 * N, "intermediate", "r")
    y = g.tensor(4 * N, "output", "y")
    add, relu, scale = rt.builtin("add"), rt.builtin("relu"), rt.builtin("scale")
    g.add(add, [x, w], [s])
    g.add(relu, [s], [r])
    g.add(scale, [r], [y], params=struct.pack("f", 2.0))
    g.finalize()
    for k in (add, relu, scale):
        k.close()
    return g, x, w, y


def check_mode(mode, checks):
    rt = gkrt.Runtime(device="cuda", memory_mode=mode)
    g, tx, tw, ty = build(rt)
    stream = torch.cuda.current_stream()
    sets = []
    for seed in (1, 2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(N, device="cuda", generator=gen)
        w = torch.randn(N, device="cuda", generator=gen)
        y = torch.full((N,), float("nan"), device="cuda")
        sets.append((x, w, y))
    torch.cuda.synchronize()
    before = None
    copies = 0
    from torch.profiler import ProfilerActivity, profile
    for rnd in range(4):
        x, w, y = sets[rnd % 2]
        g.bind(tx, x.data_ptr(), 4 * N)
        g.bind(tw, w.data_ptr(), 4 * N)
        g.bind(ty, y.data_ptr(), 4 * N)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            rt.run_async(g, stream.cuda_stream)
            # PyTorch's own work, queued after the run on the same stream, sees its output.
            z = y * 1.0
            torch.cuda.synchronize()
        g.wait()
        copies += sum(1 for e in prof.events() if "Memcpy" in e.name and ("HtoD" in e.name or "DtoH" in e.name))
        want = torch.relu(x + w) * 2.0
        checks.append((f"{mode} round {rnd}: gkrt's output equals PyTorch's, bit for bit", torch.equal(y, want)))
        checks.append((f"{mode} round {rnd}: PyTorch's later work on the stream saw it", torch.equal(z, want)))
        if before is None:  # after the first run (a planned graph's arena is taken there)
            before = rt.stats()["allocated_bytes"]
    after = rt.stats()["allocated_bytes"]
    checks.append((f"{mode}: no pool memory for the bound tensors across rebinding "
                   f"(allocated {before} -> {after} bytes)", after == before))
    checks.append((f"{mode}: no host<->device copy while the graph ran ({copies} seen)", copies == 0))
    g.close()
    rt.close()


def main():
    checks = []
    for mode in ("dynamic", "planned"):
        check_mode(mode, checks)
    failed = 0
    for what, ok in checks:
        print(("ok    " if ok else "FAIL  ") + what)
        failed += not ok
    print(f"gpu_bind_check: {len(checks) - failed} of {len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
