"""On a GPU machine (scripts/gpu/run.sh python): PyTorch switched to gkrt's pool by
gkrt.torch.use_gkrt_allocator() trains a small network, and gkrt.torch's statistics, under
PyTorch's key names, follow what the training holds: peaks equal gkrt_runtime_stats' and at least
the live tensors' bytes, a reset brings the peak down to the current figure."""

import sys

import torch

import gkrt
import gkrt.torch as gt


def main():
    gt.use_gkrt_allocator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device="cuda")
    losses = []
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    stats = gt.memory_stats()
    with gt.runtime() as rt:
        raw = rt.stats()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    checks = [
        ("the loss fell", losses[-1] < losses[0]),
        ("peak allocated equals gkrt_runtime_stats'",
         stats["allocated_bytes.all.peak"] == raw["peak_allocated_bytes"]),
        ("peak reserved equals gkrt_runtime_stats'",
         stats["reserved_bytes.all.peak"] == raw["peak_reserved_bytes"]),
        ("allocated covers parameters, gradients and AdamW's two moments",
         stats["allocated_bytes.all.current"] >= 4 * params),
        ("reserved >= allocated", stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]),
        ("max_memory_reserved works", gt.max_memory_reserved() == stats["reserved_bytes.all.peak"]),
    ]
    peak_before = stats["allocated_bytes.all.peak"]
    gt.reset_peak_memory_stats()
    after = gt.memory_stats()
    checks.append(("a reset brings the peak to the current figure",
                   after["allocated_bytes.all.peak"] == after["allocated_bytes.all.current"]
                   and after["allocated_bytes.all.peak"] <= peak_before))
    # A snapshot of the pool in PyTorch's format, with a history of one more step, read by
    # PyTorch's own _memory_viz.
    gt._record_memory_history(100_000)
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
    torch.cuda.synchronize()
    snap = gt.snapshot()
    now = gt.memory_stats()
    active = sum(b["size"] for s in snap["segments"] for b in s["blocks"]
                 if b["state"] == "active_allocated")
    trace = snap["device_traces"][-1]
    checks.append(("the snapshot's active blocks add up to allocated bytes",
                   active == now["allocated_bytes.all.current"]))
    checks.append(("the snapshot has the runtime's segments",
                   len(snap["segments"]) == now["segment.all.current"]))
    checks.append(("the history recorded the step's allocations",
                   any(e["action"] == "alloc" for e in trace)))
    try:
        from torch.cuda import _memory_viz as viz
        viz.segsum(snap)
        viz.trace(snap)
        viz.trace_plot(snap)
        checks.append(("torch.cuda._memory_viz reads the snapshot (segsum, trace, trace_plot)", True))
    except Exception as e:  # noqa: BLE001 - any failure of PyTorch's tools is the finding
        print(f"_memory_viz: {type(e).__name__}: {e}")
        checks.append(("torch.cuda._memory_viz reads the snapshot (segsum, trace, trace_plot)", False))
    gt._record_memory_history(0)
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print(f"gkrt.torch: peak allocated {peak_before} B, reserved peak {stats['reserved_bytes.all.peak']} B, "
          f"parameters {params} B, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
