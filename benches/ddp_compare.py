"""PyTorch DistributedDataParallel beside gkrt's data-parallel example (issue 16).

The network, data and step of examples_c/data_parallel/: a_0 = x, a_k = relu(a_{k-1} @ W_k) for
the hidden layers, y = a_{L-1} @ W_L (--in D, --width H, --out O, --depth L weight layers, no
bias), loss = 1/2 * mean over rows of |y - t|^2 with t = x @ Wt for a fixed random teacher, SGD at
--lr, every rank on its own shard of rows (--per-rank rows each, the example's batch / ranks).
The inputs and initial weights come from the example's generator (the same LCG, seeds and float32
arithmetic, computed with tensors), so the initial weights are bit for bit the example's and the
first step's loss matches it. Both store each weight and gradient once and run the same three
products per layer (forward, the weight's gradient, the input's gradient) in cuBLAS sgemm
(gkrt's example calls it from host-callback nodes, examples_c/blas_nodes.h). fp32 throughout
(PyTorch's default: no TF32 in matmuls), as gkrt's.

DDP with its default buckets (bucket_cap_mb 25, the first bucket 1 MiB), the NCCL backend,
NCCL_NVLS_ENABLE=0, one process per GPU spawned by torch.multiprocessing (no torchrun). A step is
forward, backward (DDP's all-reduce overlapped with it), the SGD step and the loss read to the
host (gkrt's example reads its output to compute the loss too). Rank 0 prints per n:

  ddp n=N: step time X ms (median of K), R rows per rank, first loss L, max weight difference
  across ranks D, peak allocated A MiB, peak reserved B MiB

where D is the largest |w - rank 0's w| over every rank's parameters after the steps (0: equal)
and A, B are torch.cuda.max_memory_allocated / max_memory_reserved, the largest over the ranks:
what DDP needs for this network and batch (scripts/gpu/mgpu.sh gives gkrt half of A).

Usage: python3 benches/ddp_compare.py [--n 1 2 4 8] [--steps 100] [--per-rank 64] [--in 32]
       [--width 64] [--out 16] [--depth 2] [--lr 0.2]
Counts above the visible GPUs are skipped with a printed reason.
"""

import argparse
import inspect
import os
import sys
import tempfile
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

LCG_A, LCG_C, MASK = 1664525, 1013904223, 0xFFFFFFFF


def _mulmod(x, a):
    """x * a mod 2^32 for an int64 tensor x of values < 2^32 and an int a < 2^32, without
    overflowing int64: a split into 16-bit halves."""
    hi, lo = a >> 16, a & 0xFFFF
    return ((((x * hi) & 0xFFFF) << 16) + x * lo) & MASK


def lcg_states(n, seed):
    """The n successive states of data_parallel/net.c's fill_random for `seed`, as an int64 tensor.
    s_{i+k} = A_k s_i + C_k (mod 2^32): from k known states the next k follow in one step, so
    the sequence doubles each time."""
    import torch

    out = torch.empty(n, dtype=torch.int64)
    if n == 0:
        return out
    s = (seed * 2654435761 + 1) & MASK
    out[0] = (s * LCG_A + LCG_C) & MASK
    k, a_k, c_k = 1, LCG_A, LCG_C  # the jump of k steps
    while k < n:
        m = min(k, n - k)
        out[k:k + m] = (_mulmod(out[:m], a_k) + c_k) & MASK
        a_k, c_k = (a_k * a_k) & MASK, (a_k * c_k + c_k) & MASK
        k *= 2
    return out


def fill_random(n, seed, scale):
    """data_parallel/net.c's fill_random as a float32 tensor: scale * ((s >> 8 & 0xFFFF) / 32768 - 1),
    every operation in float32 as the C code does it."""
    import torch

    v = ((lcg_states(n, seed) >> 8) & 0xFFFF).to(torch.float32)
    return torch.tensor(scale, dtype=torch.float32) * (v / torch.tensor(32768.0, dtype=torch.float32) - 1.0)


def inv_sqrt(d):
    """1.0f / sqrtf((float)d), in float32."""
    import torch

    return (torch.tensor(1.0, dtype=torch.float32) / torch.sqrt(torch.tensor(float(d), dtype=torch.float32))).item()


def dims(a):
    return [a.in_] + [a.width] * (a.depth - 1) + [a.out]


def problem(a, batch):
    """The combined batch (x, t) and the initial weights, as data_parallel/net.c makes them."""
    ds = dims(a)
    x = fill_random(batch * ds[0], 1, 1.0).view(batch, ds[0])
    teacher = fill_random(ds[0] * ds[-1], 2, inv_sqrt(ds[0])).view(ds[0], ds[-1])
    ws = [fill_random(ds[k] * ds[k + 1], 3 + k, inv_sqrt(ds[k])).view(ds[k], ds[k + 1]) for k in range(a.depth)]
    return x, x @ teacher, ws


def worker(rank, n, a, init_file):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    kw = {"device_id": dev} if "device_id" in inspect.signature(dist.init_process_group).parameters else {}
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=n, **kw)
    x, t, ws = problem(a, n * a.per_rank)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = torch.nn.ParameterList([torch.nn.Parameter(w.clone()) for w in ws])

        def forward(self, h):
            for k, w in enumerate(self.ws):
                h = h @ w
                if k + 1 < len(self.ws):
                    h = torch.relu(h)
            return h

    model = DDP(MLP().to(dev), device_ids=[rank])  # default buckets
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    xs = x[rank * a.per_rank:(rank + 1) * a.per_rank].to(dev)
    ts = t[rank * a.per_rank:(rank + 1) * a.per_rank].to(dev)
    del x, t, ws
    times, first_loss = [], None
    for _ in range(a.steps):
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
    torch.cuda.synchronize(dev)
    peaks = torch.tensor([torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev)],
                         dtype=torch.float64, device=dev)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    # The ranks' weights must agree (DDP averages the gradients): max |w - rank 0's| over ranks.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = (flat - ref).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        times.sort()
        print(f"ddp n={n}: step time {times[len(times) // 2]:.3f} ms (median of {a.steps}), {a.per_rank} rows per "
              f"rank, first loss {first_loss:.6f}, max weight difference across ranks {diff.item():.3g}, "
              f"peak allocated {peaks[0].item() / 2**20:.1f} MiB, peak reserved {peaks[1].item() / 2**20:.1f} MiB",
              flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--per-rank", type=int, default=64)
    ap.add_argument("--in", dest="in_", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--out", type=int, default=16)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.2)
    a = ap.parse_args()
    if a.depth < 2:
        ap.error("--depth must be at least 2 (weight layers), as the example's")
    import torch
    import torch.multiprocessing as mp

    gpus = torch.cuda.device_count()
    params = sum(p * q for p, q in zip(dims(a), dims(a)[1:]))
    print(f"ddp_compare: torch {torch.__version__}, {gpus} visible GPU(s), NCCL_NVLS_ENABLE="
          f"{os.environ['NCCL_NVLS_ENABLE']}; MLP {'-'.join(map(str, dims(a)))} ({params} weights, "
          f"{params * 4 / 2**20:.1f} MiB of gradients), lr {a.lr}", flush=True)
    if gpus == 0:
        print("ddp_compare: no GPU visible: nothing measured")
        return 1
    rc = 0
    for n in a.n:
        if n > gpus:
            print(f"ddp n={n}: skipped: only {gpus} GPU(s) visible")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                mp.spawn(worker, args=(n, a, os.path.join(tmp, "init")), nprocs=n)
            except Exception as e:  # a rank failed: say so and go on with the next n
                print(f"ddp n={n}: FAILED: {e}", flush=True)
                rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
