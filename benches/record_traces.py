"""Records allocation traces of PyTorch workloads that the project was not tuned on, in the format of
../shared/traces/README.md ("a ID BYTES STREAM" / "f ID", first line "# {json}"), from PyTorch's
caching allocator on the GPU machine. Models are built from their configurations with random
weights and fed random data: nothing is downloaded.

    python3 record_traces.py OUT_DIR [--only NAME,...] [--list] [--heldout] [--host]

`--heldout` records heldout_workloads.py's set instead: programs whose traces only check the
pool's rules, never choose them. `--host` records host_workloads.py's set (written for the CPU
recorder, record_host_traces.py) on the GPU: the same programs, their GPU sequence.

Per workload: warm-up steps, then PyTorch's memory history is recorded over the measured steps
(torch.cuda.memory._record_memory_history). The trace starts with the blocks already live when
recording begins (weights, optimizer state, caches: "a" lines with no matching "f" until they are
freed), then every allocation and every free the program requested, in order. Sizes are the
caching allocator's block sizes (PyTorch rounds a request up to a multiple of 512 bytes); streams
are numbered in order of appearance. Blocks still live at the end get an "f" line, so every trace
ends empty: the replay measures the allocator, not what the program kept. The metadata line holds
steps, the median step time, and PyTorch's own peak allocated and peak reserved bytes over the
measured steps (their ratio is PyTorch's fragmentation in the live run).
"""
import argparse
import gzip
import json
import math
import os
import random
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda"


# --- workloads: each returns (setup, step); step(i) runs one iteration ----------------------------


def bert_train():
    """An encoder's training step: BERT-base masked LM, batch 16, sequence length varying 128-512
    per step, bf16 autocast, AdamW."""
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig()).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(1)

    def step(i):
        n = rng.choice([128, 192, 256, 384, 512])
        ids = torch.randint(0, 30522, (16, n), device=DEV)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def vit_infer_batches():
    """An image model's inference at varying batch size (1-64), ViT-B/16 from timm, fp16."""
    import timm

    model = timm.create_model("vit_base_patch16_224", pretrained=False).to(DEV).half().eval()
    rng = random.Random(2)

    def step(i):
        b = rng.randint(1, 64)
        with torch.no_grad():
            model(torch.randn(b, 3, 224, 224, device=DEV, dtype=torch.half))

    return step


def decoder_generate():
    """A decoder generating with a growing key/value cache: a small GPT-2 (6 layers, width 512),
    batch 4, prompts of 16-64 tokens, 96 new tokens each, greedy, a fresh cache per request."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8192, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(DEV).eval()
    rng = random.Random(3)

    def step(i):
        ids = torch.randint(0, cfg.vocab_size, (4, rng.randint(16, 64)), device=DEV)
        with torch.no_grad():
            past = None
            x = ids
            for _ in range(96):
                out = model(input_ids=x, past_key_values=past, use_cache=True)
                past = out.past_key_values
                x = out.logits[:, -1:].argmax(-1)

    return step


def decoder_tiny_generate():
    """A heap under 64 MiB: a tiny decoder (2 layers, width 256) generating 64 tokens for one
    prompt of 8-32 tokens at a time, its key/value cache growing."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=4096, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(DEV).eval()
    rng = random.Random(9)

    def step(i):
        x = torch.randint(0, cfg.vocab_size, (1, rng.randint(8, 32)), device=DEV)
        with torch.no_grad():
            past = None
            for _ in range(64):
                out = model(input_ids=x, past_key_values=past, use_cache=True)
                past = out.past_key_values
                x = out.logits[:, -1:].argmax(-1)

    return step


class _UNetBlock(nn.Module):
    def __init__(s, cin, cout, tdim):
        super().__init__()
        s.n1 = nn.GroupNorm(8, cin)
        s.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        s.t = nn.Linear(tdim, cout)
        s.n2 = nn.GroupNorm(8, cout)
        s.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        s.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(s, x, t):
        h = s.c1(F.silu(s.n1(x))) + s.t(t)[:, :, None, None]
        h = s.c2(F.silu(s.n2(h)))
        return h + s.skip(x)


class _UNet(nn.Module):
    """A diffusion UNet: four resolutions, two residual blocks each, skip connections, a timestep
    embedding, self-attention at the lowest resolution."""

    def __init__(s, ch=(128, 256, 384, 512), tdim=512):
        super().__init__()
        s.tdim = tdim
        s.temb = nn.Sequential(nn.Linear(128, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        s.inp = nn.Conv2d(4, ch[0], 3, padding=1)
        s.down = nn.ModuleList()
        c = ch[0]
        for co in ch:
            s.down.append(nn.ModuleList([_UNetBlock(c, co, tdim), _UNetBlock(co, co, tdim)]))
            c = co
        s.attn = nn.MultiheadAttention(c, 8, batch_first=True)
        s.up = nn.ModuleList()
        for co in reversed(ch):
            s.up.append(nn.ModuleList([_UNetBlock(c + co, co, tdim), _UNetBlock(co, co, tdim)]))
            c = co
        s.out = nn.Conv2d(c, 4, 3, padding=1)

    def forward(s, x, t):
        half = torch.exp(-math.log(10000) * torch.arange(64, device=x.device) / 64)
        e = s.temb(torch.cat([torch.sin(t[:, None] * half), torch.cos(t[:, None] * half)], 1))
        h = s.inp(x)
        skips = []
        for i, (b1, b2) in enumerate(s.down):
            h = b2(b1(h, e), e)
            skips.append(h)
            if i < len(s.down) - 1:
                h = F.avg_pool2d(h, 2)
        B, C, H, W = h.shape
        q = h.flatten(2).transpose(1, 2)
        h = h + s.attn(q, q, q, need_weights=False)[0].transpose(1, 2).reshape(B, C, H, W)
        for i, (b1, b2) in enumerate(s.up):
            if i > 0:
                h = F.interpolate(h, scale_factor=2)
            h = b2(b1(torch.cat([h, skips.pop()], 1), e), e)
        return s.out(h)


def unet_train():
    """A diffusion UNet's training step (latents 4 x 64 x 64, batch 16, bf16 autocast, AdamW)."""
    model = _UNet().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        x = torch.randn(16, 4, 64, 64, device=DEV)
        t = torch.rand(16, device=DEV) * 1000
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x, t), torch.randn_like(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def gnn_train():
    """A graph network's training step: a 4-layer message-passing network (gather, scatter-add,
    MLP) on random graphs of 20k-60k nodes and 5-15 edges per node, a different graph every step."""
    dim = 256
    layers = nn.ModuleList(
        [nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, dim)) for _ in range(4)]
    ).to(DEV)
    head = nn.Linear(dim, 16).to(DEV)
    opt = torch.optim.Adam(list(layers.parameters()) + list(head.parameters()), lr=1e-3)
    rng = random.Random(5)

    def step(i):
        n = rng.randint(20000, 60000)
        e = n * rng.randint(5, 15)
        src = torch.randint(0, n, (e,), device=DEV)
        dst = torch.randint(0, n, (e,), device=DEV)
        h = torch.randn(n, dim, device=DEV)
        for mlp in layers:
            agg = torch.zeros_like(h).index_add_(0, dst, h[src])
            h = h + mlp(torch.cat([h, agg], 1))
        loss = F.cross_entropy(head(h), torch.randint(0, 16, (n,), device=DEV))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def moe_train():
    """A mixture-of-experts layer stack's training step: 4 layers of 16 experts, top-2 routing of
    8192 tokens, so every expert's batch changes size every step."""
    dim, hid, ne = 1024, 2048, 16
    gates = nn.ModuleList([nn.Linear(dim, ne) for _ in range(4)]).to(DEV)
    experts = nn.ModuleList(
        [
            nn.ModuleList([nn.Sequential(nn.Linear(dim, hid), nn.GELU(), nn.Linear(hid, dim)) for _ in range(ne)])
            for _ in range(4)
        ]
    ).to(DEV)
    opt = torch.optim.AdamW(list(gates.parameters()) + list(experts.parameters()), lr=1e-4)

    def step(i):
        x = torch.randn(8192, dim, device=DEV)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for g, ex in zip(gates, experts):
                w, idx = g(x).softmax(-1).topk(2, dim=-1)
                y = torch.zeros_like(x)
                for k in range(ne):
                    tok, slot = (idx == k).nonzero(as_tuple=True)
                    if tok.numel():
                        y = y.index_add(0, tok, ex[k](x[tok]) * w[tok, slot, None])
                x = x + y
            loss = x.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def mlp_small_train():
    """A small heap: a 3-layer MLP classifier's training step, batch 256, under 100 MiB live (cuBLAS's
    workspaces are most of it)."""
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(i):
        x = torch.randn(256, 784, device=DEV)
        loss = F.cross_entropy(model(x), torch.randint(0, 10, (256,), device=DEV))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def resnet_infer_sizes():
    """A convolutional network's inference at varying image size and batch: torchvision's
    ResNet-18, batch 1-32, side 160-320, channels-last fp16."""
    import torchvision

    model = torchvision.models.resnet18().to(DEV).half().eval().to(memory_format=torch.channels_last)
    rng = random.Random(8)

    def step(i):
        b, s = rng.randint(1, 32), rng.choice([160, 192, 224, 256, 288, 320])
        x = torch.randn(b, 3, s, s, device=DEV, dtype=torch.half).to(memory_format=torch.channels_last)
        with torch.no_grad():
            model(x)

    return step


WORKLOADS = {
    "bert_train": (bert_train, 4),
    "vit_infer_batches": (vit_infer_batches, 12),
    "decoder_generate": (decoder_generate, 3),
    "decoder_tiny_generate": (decoder_tiny_generate, 4),
    "unet_train": (unet_train, 3),
    "gnn_train": (gnn_train, 4),
    "moe_train": (moe_train, 3),
    "mlp_small_train": (mlp_small_train, 20),
    "resnet_infer_sizes": (resnet_infer_sizes, 12),
}


# --- recording -------------------------------------------------------------------------------------


def live_blocks():
    """(address, size, stream) of every block allocated now."""
    out = []
    for seg in torch.cuda.memory_snapshot():
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out.append((addr, b["size"], seg.get("stream", 0)))
            addr += b["size"]
    return out


def trace_lines(snap, start=()):
    """The trace's event lines ("a ID BYTES STREAM" / "f ID") from a memory snapshot taken with
    the history recorded, after the blocks `start` that were live when recording began; every
    block still live at the end is freed. Returns (lines, peak live bytes)."""
    return history_lines(snap["device_traces"][torch.cuda.current_device()], start)


def history_lines(events, start=()):
    """trace_lines of a recorded history: dicts of action ("alloc" or "free_requested"), addr,
    size and stream, in order (record_host_traces.py builds them from the CPU's profiler)."""
    streams, ids, lines, nid = {}, {}, [], 0
    live = peak = 0
    sizes = {}

    def alloc(addr, size, stream):
        nonlocal nid, live, peak
        nid += 1
        s = streams.setdefault(stream, len(streams))
        ids[addr] = nid
        sizes[nid] = size
        live += size
        peak = max(peak, live)
        lines.append("a %d %d %d" % (nid, size, s))

    def free(addr):
        nonlocal live
        k = ids.pop(addr, None)
        if k is not None:
            live -= sizes[k]
            lines.append("f %d" % k)

    for addr, size, stream in start:
        alloc(addr, size, stream)
    for e in events:
        if e["action"] == "alloc":
            if e["addr"] in ids:
                free(e["addr"])  # a block PyTorch reused before the free we saw: close it first
            alloc(e["addr"], e["size"], e.get("stream", 0))
        elif e["action"] == "free_requested":
            free(e["addr"])
    for addr in list(ids):
        free(addr)
    return lines, peak


def write_trace(path, meta, lines):
    """The trace file: the metadata line ("# {json}"), then the events, gzipped."""
    with gzip.open(path, "wt") as f:
        f.write("# " + json.dumps(meta) + "\n")
        f.write("\n".join(lines) + "\n")


def record(name, make, steps, out_dir, warmup=2):
    torch.manual_seed(0)
    step = make()
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    # No stacks (context=None): the traces use none, and capturing them made the backward of
    # a checkpointed model fail while recording (PyTorch 2.11, session 17).
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=2_000_000)
    start = live_blocks()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(warmup + i)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()

    lines, peak = trace_lines(snap, start)
    meta = {
        "name": name,
        "workload": make.__doc__.strip().replace("\n", " ").replace("    ", " "),
        "steps": steps,
        "step_ms_median": round(statistics.median(times) * 1e3, 3),
        "torch_peak_allocated": stats["allocated_bytes.all.peak"],
        "torch_peak_reserved": stats["reserved_bytes.all.peak"],
        "peak_live": peak,
        "events": len(lines),
        "live_at_start": len(start),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    write_trace(os.path.join(out_dir, name + ".trace.gz"), meta, lines)
    return meta


def record_each(pick_workloads, argv_help, record_one, columns, row, after=lambda: None):
    """The command line both recorders share: OUT_DIR, --only, --list and `argv_help`'s flags
    (`pick_workloads(args)` chooses the set from them). Records each workload named (all by
    default) into OUT_DIR with `record_one`, a table row each (`columns` its header, `row(meta)`
    its cells). A workload that fails (a missing package) gets a row saying why and does not
    stop the others; `after` runs after each."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--only", default="")
    ap.add_argument("--list", action="store_true")
    for flag, text in argv_help:
        ap.add_argument(flag, action="store_true", help=text)
    a = ap.parse_args()
    workloads = pick_workloads(a)
    if a.list:
        for k, (f, n) in workloads.items():
            print(k, "-", f.__doc__.strip().splitlines()[0])
        return
    os.makedirs(a.out_dir, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    print("| trace | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, (make, steps) in workloads.items():
        if only and name not in only:
            continue
        try:
            m = record_one(name, make, steps, a.out_dir)
        except Exception as e:  # one workload's failure (a missing package) must not stop the others
            why = "failed: %s: %s" % (type(e).__name__, str(e)[:120])
            print("| %s | %s |%s" % (name, why, " |" * (len(columns) - 1)), flush=True)
            continue
        finally:
            after()
        print("| %s | %s |" % (name, " | ".join(row(m))), flush=True)


def after_gpu_workload():
    """Whatever a workload left: the memory history off (a failed one leaves it on) and the
    cached blocks back to the device."""
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.empty_cache()


def gpu_workloads(a):
    if a.heldout:
        from heldout_workloads import HELDOUT

        return HELDOUT
    if a.host:
        import host_workloads

        host_workloads.DEV = DEV  # its programs read the device when they build and step
        return host_workloads.HOST
    return WORKLOADS


def main():
    record_each(
        gpu_workloads,
        [
            ("--heldout", "heldout_workloads.py's set instead"),
            ("--host", "host_workloads.py's set instead, on the GPU"),
        ],
        record,
        ["events", "peak live MiB", "PyTorch peak reserved / peak allocated", "step ms"],
        lambda m: [
            "%d" % m["events"],
            "%.1f" % (m["peak_live"] / 2**20),
            "%.3f" % (m["torch_peak_reserved"] / max(1, m["torch_peak_allocated"])),
            "%.1f" % m["step_ms_median"],
        ],
        after_gpu_workload,
    )


if __name__ == "__main__":
    main()
