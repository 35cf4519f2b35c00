"""The real workloads of ../shared/traces/README.md in PyTorch, on PyTorch's own caching allocator
or on gkrt's pool (through the pluggable-allocator entry points gkrt_torch_alloc / gkrt_torch_free):
GPT-2 small training (batch 8 x 512 tokens, bf16 autocast, AdamW) and ResNet-50 training (batch 64 x
224^2, SGD), random weights and data. Prints one JSON line: median step time over the measured
steps, and peak reserved / peak allocated bytes over the whole run.

    python3 torch_workloads.py --model gpt2|resnet50 --alloc torch|gkrt [--lib libgkrt.so]
                               [--steps 20] [--warmup 5]

One allocator per process: PyTorch cannot change allocators once it has allocated. The gkrt
allocator is installed exactly as any program would (benches/torch_site/sitecustomize.py does the
same for unchanged programs); its statistics come from gkrt_torch_runtime + gkrt_runtime_stats.
"""
import argparse
import ctypes
import json
import os
import statistics
import time


class GkrtStats(ctypes.Structure):
    # The leading fields of gkrt_stats (include/gkrt.h); the tail is room for the rest.
    _fields_ = [
        ("allocated_bytes", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("peak_allocated_bytes", ctypes.c_uint64),
        ("peak_reserved_bytes", ctypes.c_uint64),
        ("rest", ctypes.c_uint64 * 64),
    ]


def gkrt_stats(lib):
    rt = ctypes.c_void_p()
    st = lib.gkrt_torch_runtime(0, ctypes.byref(rt))
    assert st == 0, f"gkrt_torch_runtime -> {st}"
    s = GkrtStats()
    assert lib.gkrt_runtime_stats(rt, ctypes.byref(s)) == 0
    lib.gkrt_runtime_release(rt)
    return s


def build(model, torch):
    dev = "cuda"
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        m = GPT2LMHeadModel(GPT2Config()).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        x = torch.randint(0, 50257, (8, 512), device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    else:
        import torchvision

        torch.manual_seed(0)
        m = torchvision.models.resnet50().to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)
        lossf = torch.nn.CrossEntropyLoss()

        def step():
            loss = lossf(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt2", "resnet50"], required=True)
    ap.add_argument("--alloc", choices=["torch", "gkrt"], required=True)
    ap.add_argument("--lib", default=os.environ.get("GKRT_LIB", ".gpu/lib/libgkrt.so"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()

    import torch

    lib = None
    if a.alloc == "gkrt":
        path = os.path.abspath(a.lib)
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "gkrt_torch_alloc", "gkrt_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
        lib = ctypes.CDLL(path)
    step = build(a.model, torch)
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    if lib is not None:
        s = gkrt_stats(lib)
        peak_res, peak_alloc = s.peak_reserved_bytes, s.peak_allocated_bytes
    else:
        peak_res, peak_alloc = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    print(
        json.dumps(
            {
                "model": a.model,
                "alloc": a.alloc,
                "step_ms": statistics.median(times),
                "step_ms_min": min(times),
                "peak_reserved": peak_res,
                "peak_allocated": peak_alloc,
                "steps": a.steps,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
