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
    # gkrt_stats (include/gkrt.h), field for field; the tail is room for fields added later.
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "allocated_bytes reserved_bytes peak_allocated_bytes peak_reserved_bytes requested_bytes "
            "alloc_count free_count failed_alloc_count segment_count segment_alloc_count "
            "segment_free_count memory_limit runs nodes_launched last_run_pool_allocs swap_out_bytes "
            "swap_in_bytes tensors_swapped_out tensors_swapped_in evictions copy_wait_ns "
            "pinned_reserved_bytes pinned_peak_reserved_bytes page_map_count page_unmap_count "
            "pool_device_waits"
        ).split()
    ] + [("rest", ctypes.c_uint64 * 32)]


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
    timed_from = None
    for i in range(a.warmup + a.steps):
        if i == a.warmup and lib is not None:
            timed_from = gkrt_stats(lib)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    pool = {}
    if lib is not None:
        s = gkrt_stats(lib)
        peak_res, peak_alloc = s.peak_reserved_bytes, s.peak_allocated_bytes
        # Page moves and waits for the device, over the whole run and over the timed steps.
        for k in ("page_map_count", "page_unmap_count", "pool_device_waits"):
            pool[k] = getattr(s, k)
            pool["timed_" + k] = getattr(s, k) - getattr(timed_from, k)
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
                **pool,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
