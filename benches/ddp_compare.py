"""PyTorch DistributedDataParallel beside gkrt's data-parallel example (issue 16).

The network, data and step of examples_c/data_parallel.c: y = relu(x @ W1) @ W2 (32-64-16, no
bias), loss = 1/2 * mean over rows of |y - t|^2 with t = x @ Wt for a fixed random teacher, SGD
at lr 0.2, every rank on its own shard of rows (--per-rank rows each, the example's batch / ranks).
The inputs and initial weights come from the example's generator (the same LCG and seeds), so
the first step's loss matches the example's. gkrt's graph also keeps every weight transposed
(twice the matmuls); PyTorch needs no such copy — a difference in gkrt's disfavour, said here.

DDP with its default buckets (bucket_cap_mb 25, the first bucket 1 MiB), the NCCL backend,
NCCL_NVLS_ENABLE=0, one process per GPU spawned by torch.multiprocessing (no torchrun). A step is
forward, backward (DDP's all-reduce overlapped with it), the SGD step and the loss read to the
host (gkrt's example reads its output to compute the loss too). Rank 0 prints per n:

  ddp n=N: step time X ms (median of K), R rows per rank, first loss L

Usage: python3 benches/ddp_compare.py [--n 1 2 4 8] [--steps 100] [--per-rank 64]
Counts above the visible GPUs are skipped with a printed reason.
"""

import argparse
import inspect
import os
import sys
import tempfile
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

D, H, O = 32, 64, 16
LR = 0.2


def fill_random(n, seed, scale):
    """The example's fill_random: deterministic values in [-1, 1) times scale."""
    s = (seed * 2654435761 + 1) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out.append(scale * (((s >> 8) & 0xFFFF) / 32768.0 - 1.0))
    return out


def problem(batch):
    """The combined batch (x, t) and the initial W1, W2, as data_parallel.c makes them."""
    import torch

    x = torch.tensor(fill_random(batch * D, 1, 1.0), dtype=torch.float32).view(batch, D)
    teacher = torch.tensor(fill_random(D * O, 2, 1.0 / D**0.5), dtype=torch.float32).view(D, O)
    w1 = torch.tensor(fill_random(D * H, 3, 1.0 / D**0.5), dtype=torch.float32).view(D, H)
    w2 = torch.tensor(fill_random(H * O, 4, 1.0 / H**0.5), dtype=torch.float32).view(H, O)
    return x, x @ teacher, w1, w2


def worker(rank, n, steps, per_rank, init_file, x, t, w1, w2):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    kw = {"device_id": dev} if "device_id" in inspect.signature(dist.init_process_group).parameters else {}
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=n, **kw)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = torch.nn.Parameter(w1.clone())
            self.w2 = torch.nn.Parameter(w2.clone())

        def forward(self, xs):
            return torch.relu(xs @ self.w1) @ self.w2

    model = DDP(MLP().to(dev), device_ids=[rank])  # default buckets
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xs = x[rank * per_rank:(rank + 1) * per_rank].to(dev)
    ts = t[rank * per_rank:(rank + 1) * per_rank].to(dev)
    times, first_loss = [], None
    for _ in range(steps):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = 0.5 * ((model(xs) - ts) ** 2).sum(dim=1).mean()
        loss.backward()
        opt.step()
        value = loss.item()  # synchronises, as the example's loss read does
        times.append((time.perf_counter() - t0) * 1e3)
        if first_loss is None:
            first_loss = value
    # The ranks' weights must agree (DDP averages the gradients): max |w - rank 0's| over ranks.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = (flat - ref).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        times.sort()
        print(f"ddp n={n}: step time {times[len(times) // 2]:.3f} ms (median of {steps}), {per_rank} rows per rank, "
              f"first loss {first_loss:.6f}, max weight difference across ranks {diff.item():.3g}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--per-rank", type=int, default=64)
    a = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    gpus = torch.cuda.device_count()
    print(f"ddp_compare: torch {torch.__version__}, {gpus} visible GPU(s), NCCL_NVLS_ENABLE="
          f"{os.environ['NCCL_NVLS_ENABLE']}", flush=True)
    if gpus == 0:
        print("ddp_compare: no GPU visible: nothing measured")
        return 1
    rc = 0
    for n in a.n:
        if n > gpus:
            print(f"ddp n={n}: skipped: only {gpus} GPU(s) visible")
            continue
        x, t, w1, w2 = problem(n * a.per_rank)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                mp.spawn(worker, args=(n, a.steps, a.per_rank, os.path.join(tmp, "init"), x, t, w1, w2), nprocs=n)
            except Exception as e:  # a rank failed: say so and go on with the next n
                print(f"ddp n={n}: FAILED: {e}", flush=True)
                rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
