#!/usr/bin/env python3
"""The GPT-2 training step of examples_c/gpt2/ in PyTorch, for the H200 comparison (run.sh gpt2).

The network is written with the same operations as the gkrt program: Linear layers (x·Wᵀ + b),
layer norm, explicit attention (Q·Kᵀ · scale, causal mask, softmax, P·V), tanh GELU, residuals,
logits against the tied token embedding, mean cross-entropy, AdamW. f32, TF32 off (cuBLAS in full
f32, as gkrt's sgemm calls).

--dtype bf16: the mixed precision of gkrt_gpt2 --dtype bf16, written explicitly (no autocast): the
model's parameters are bf16 copies of f32 master weights, so activations and gradients are bf16;
the logits go to the loss as f32 (cross-entropy in f32, as gkrt's); after backward the bf16
gradients are widened into the master weights' .grad, AdamW (f32 state) updates the masters, and
the bf16 copies are rounded from them (round to nearest even, as gkrt). PyTorch's bf16 kernels
compute in f32 and round where they store, as gkrt's do; they may round at a few more points
(the attention scale after Q·Kᵀ, a residual added after the layer-norm gradient), so the curves
agree within bf16 tolerance, not to f32's.

Variants (--variants, comma-separated):
  plain     the network as written
  fused     attention through F.scaled_dot_product_attention (what kernels alone are worth)
  ckpt      activation checkpointing of every block (torch.utils.checkpoint, non-reentrant)
  offload   torch.autograd.graph.save_on_cpu(pin_memory=True) around the forward
  both      checkpointing inside save_on_cpu

  gpt2_torch.py --weights FILE     load config, hyperparameters, weights and batch written by
                                   gkrt_gpt2 --dump-weights (else random, from --layers ...)
  gpt2_torch.py --dtype bf16       mixed precision as above (default f32)
  gpt2_torch.py --gkrt-log FILE    compare the plain variant's loss curve with gkrt_gpt2's output
  gpt2_torch.py --limit BYTES      cap PyTorch's allocator (set_per_process_memory_fraction)
  gpt2_torch.py --depths 12,24,..  for each variant, the largest of these depths that fits
  gpt2_torch.py --report FILES     the summary table of run.sh gpt2 from its logs

Each measurement prints one line "TORCH {json}": variant, sizes, step_ms (median after two
warm-up steps), peak_allocated and peak_reserved (torch.cuda.max_memory_*), ok (False on OOM).
"""
import argparse
import json
import math
import re
import struct
import sys
import time


def parse_bytes(s):
    m = re.fullmatch(r"([0-9.]+)\s*([KMG]?)i?B?", s.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s}")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


def read_dump(path):
    """gkrt_gpt2 --dump-weights: "GPT2GKRT", u32 version, layers, channels, heads, seq, batch, vocab,
    f32 lr, beta1, beta2, eps, weight_decay, the weights (f32), tokens and targets (i32)."""
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"GPT2GKRT":
        sys.exit(f"{path}: not a gkrt_gpt2 weight dump")
    version, L, C, H, T, B, V = struct.unpack_from("<7I", data, 8)
    if version != 1:
        sys.exit(f"{path}: dump version {version}, expected 1")
    lr, b1, b2, eps, wd = struct.unpack_from("<5f", data, 36)
    cfg = dict(layers=L, channels=C, heads=H, seq=T, batch=B, vocab=V)
    hp = dict(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    n = param_count(cfg)
    off = 56
    weights = np.frombuffer(data, dtype="<f4", count=n, offset=off)
    off += 4 * n
    tokens = np.frombuffer(data, dtype="<i4", count=B * T, offset=off)
    targets = np.frombuffer(data, dtype="<i4", count=B * T, offset=off + 4 * B * T)
    return cfg, hp, weights, tokens, targets


def layout(cfg):
    """(name, count) per parameter tensor, in the order of examples_c/gpt2/model.h."""
    L, C, T, V = cfg["layers"], cfg["channels"], cfg["seq"], cfg["vocab"]
    out = [("wte", V * C), ("wpe", T * C)]
    for l in range(L):
        out += [(f"h{l}.ln1", 2 * C), (f"h{l}.qkv", 3 * C * C + 3 * C), (f"h{l}.proj", C * C + C),
                (f"h{l}.ln2", 2 * C), (f"h{l}.fc", 4 * C * C + 4 * C), (f"h{l}.fcproj", 4 * C * C + C)]
    return out + [("lnf", 2 * C)]


def param_count(cfg):
    return sum(n for _, n in layout(cfg))


def build(torch, cfg, variant):
    nn, F = torch.nn, torch.nn.functional
    from torch.utils.checkpoint import checkpoint

    C, H, T = cfg["channels"], cfg["heads"], cfg["seq"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.fc = nn.Linear(C, 4 * C)
            self.fcproj = nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)

        def attention(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
            if variant == "fused":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
                att = att.masked_fill(self.mask, float("-inf")).softmax(dim=-1)
                y = att @ v
            return self.proj(y.transpose(1, 2).reshape(B, T, C))

        def body(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

        def forward(self, x):
            if variant in ("ckpt", "both"):
                return checkpoint(self.body, x, use_reentrant=False)
            return self.body(x)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab"], C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.lnf = nn.LayerNorm(C)

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe.weight
            for blk in self.h:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.t()
            # The loss in f32 whatever the model's type (.float() is a no-op on f32 logits).
            return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))

    return GPT()


def load_weights(torch, model, cfg, flat):
    C = cfg["channels"]
    t = torch.from_numpy(flat.copy())
    off = 0
    with torch.no_grad():
        for name, n in layout(cfg):
            chunk = t[off:off + n]
            off += n
            if name in ("wte", "wpe"):
                getattr(model, name).weight.copy_(chunk.view_as(getattr(model, name).weight))
                continue
            mod = model.lnf if name == "lnf" else getattr(model.h[int(name[1:name.index(".")])], name.split(".")[1])
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.copy_(chunk[:C])
                mod.bias.copy_(chunk[C:])
            else:
                w = mod.weight.numel()
                mod.weight.copy_(chunk[:w].view_as(mod.weight))
                mod.bias.copy_(chunk[w:])


def init_weights(torch, model, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * cfg["layers"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln" in name or name.startswith("lnf"):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                sd = proj_std if name.endswith("proj.weight") else std
                p.copy_(torch.randn(p.shape, generator=g) * sd)


class MasterWeights:
    """bf16 training with f32 master weights. The f32 weights the model holds now (loaded or
    initial) become one flat f32 master tensor, which the optimizer updates; the model's
    parameters become views of one flat bf16 copy of it (rounded to nearest even), so widening
    the gradients and refreshing the copy are one kernel each rather than a loop over ~150
    tensors (gkrt does both inside its AdamW nodes)."""

    def __init__(self, torch, model):
        self.torch = torch
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            self.master = [torch.nn.Parameter(flat)]
            self.copy = flat.to(torch.bfloat16)
            model.to(torch.bfloat16)  # buffers; the parameters are replaced next
            off = 0
            for p in model.parameters():
                n = p.numel()
                p.data = self.copy[off:off + n].view_as(p)
                off += n
        self.params = list(model.parameters())

    def after_backward(self):
        """The bf16 gradients, widened, become the master's."""
        with self.torch.no_grad():
            self.master[0].grad = self.torch.cat([p.grad.reshape(-1) for p in self.params]).float()
            for p in self.params:
                p.grad = None

    def after_step(self):
        """The bf16 copy rounded from the updated master."""
        with self.torch.no_grad():
            self.copy.copy_(self.master[0])


def measure(torch, cfg, hp, variant, steps, weights=None, tokens=None, targets=None, seed=1, dtype="f32"):
    """Trains `steps` steps; returns the record (ok False on out-of-memory)."""
    import gc

    dev = torch.device("cuda")
    rec = dict(variant=variant, **cfg, dtype=dtype, ok=False, losses=[])
    model = opt = loss = mixed = None
    try:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = build(torch, cfg, variant)
        if weights is not None:
            load_weights(torch, model, cfg, weights)
        else:
            init_weights(torch, model, cfg, seed)
        model.to(dev)
        B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
        if tokens is None:
            g = torch.Generator().manual_seed(seed)
            seq = torch.randint(0, V, (B, T + 1), generator=g)
            tok, tgt = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        else:
            tok = torch.from_numpy(tokens.astype("int64")).view(B, T)
            tgt = torch.from_numpy(targets.astype("int64")).view(B, T)
        tok, tgt = tok.to(dev), tgt.to(dev)
        mixed = MasterWeights(torch, model) if dtype == "bf16" else None
        opt = torch.optim.AdamW(mixed.master if mixed else model.parameters(), lr=hp["lr"],
                                betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"], weight_decay=hp["weight_decay"])
        times = []
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if variant in ("offload", "both"):
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    loss = model(tok, tgt)
            else:
                loss = model(tok, tgt)
            loss.backward()
            if mixed:
                mixed.after_backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if mixed:
                mixed.after_step()
            rec["losses"].append(loss.item())  # synchronises
            times.append((time.perf_counter() - t0) * 1e3)
        skip = min(2, steps - 1)
        rest = sorted(times[skip:])
        rec.update(ok=True, step_ms=rest[len(rest) // 2], peak_allocated=torch.cuda.max_memory_allocated(),
                   peak_reserved=torch.cuda.max_memory_reserved())
    except torch.OutOfMemoryError:
        rec.update(peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved())
    finally:
        # Drop everything this run holds (the last loss keeps its graph) before the next run.
        model = opt = loss = tok = tgt = mixed = None
        gc.collect()
        torch.cuda.empty_cache()
    return rec


def gkrt_losses(path):
    out = []
    with open(path) as f:
        for line in f:
            m = re.match(r"step (\d+) loss ([-0-9.eE+naif]+)", line)
            if m:
                out.append(float(m.group(2)))
    return out


def emit(rec):
    print("TORCH " + json.dumps(rec), flush=True)


def run(args):
    import torch

    # Full f32 products, as gkrt's cublasSgemm calls (no TF32).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    weights = tokens = targets = None
    if args.weights:
        cfg, hp, weights, tokens, targets = read_dump(args.weights)
    else:
        cfg = dict(layers=args.layers, channels=args.channels, heads=args.heads, seq=args.seq, batch=args.batch,
                   vocab=args.vocab)
        hp = dict(lr=args.lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)
    if args.limit:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.limit / total))
    variants = args.variants.split(",")
    if args.depths:
        # The largest depth of the list each variant trains within the limit (depths ascending; a
        # variant stops at its first failure).
        for v in variants:
            best = None
            for d in (int(x) for x in args.depths.split(",")):
                rec = measure(torch, dict(cfg, layers=d), hp, v, args.steps, seed=args.seed, dtype=args.dtype)
                rec.pop("losses")
                rec["limit"] = args.limit
                emit(dict(rec, kind="depth_try"))
                if not rec["ok"]:
                    break
                best = rec
            emit(dict(best or dict(variant=v, ok=False, layers=0), kind="depth_best", limit=args.limit))
        return
    for v in variants:
        rec = measure(torch, cfg, hp, v, args.steps, weights, tokens, targets, args.seed, args.dtype)
        rec["limit"] = args.limit
        if v == "plain" and args.gkrt_log:
            ref = gkrt_losses(args.gkrt_log)
            n = min(len(ref), len(rec["losses"]))
            diffs = [abs(a - b) for a, b in zip(ref[:n], rec["losses"][:n])]
            rec["gkrt_losses"] = ref[:n]
            rec["max_loss_diff"] = max(diffs) if diffs else None
            for i in range(n):
                print(f"loss step {i + 1}: gkrt {ref[i]:.6f} torch {rec['losses'][i]:.6f} diff {diffs[i]:.2e}")
        emit(rec)


def report(paths):
    """One table from run.sh gpt2's logs (gkrt's RESULT lines, PyTorch's TORCH lines), then the
    largest depth each trained within the depth sweep's limit."""
    rows, depth, dtypes = [], {}, set()
    for p in paths:
        tag = re.sub(r".*/|\.log$", "", p)
        group = tag.split("_")[0]  # small, medium, depth
        with open(p) as f:
            for line in f:
                if line.startswith("RESULT "):
                    r = dict(kv.split("=", 1) for kv in line.split()[1:])
                    dtypes.add(r.get("dtype", "f32"))
                    rows.append(dict(tag=tag, group=group, system="gkrt", layers=r["layers"], C=r["channels"],
                                     limit=int(r["limit"]), ms=float(r["step_ms"]), reserved=int(r["peak_reserved"]),
                                     allocated=int(r["peak_allocated"]), ws=int(r["working_set"]),
                                     note="swapped %.1f GB out, %s rebuilt" % (int(r["swap_out"]) / 1e9,
                                                                                r["recomputed"])))
                    if group == "depth":
                        best = depth.get("gkrt")
                        if best is None or int(r["layers"]) > int(best[0]):
                            depth["gkrt"] = (r["layers"], float(r["step_ms"]))
                elif line.startswith("TORCH "):
                    r = json.loads(line[6:])
                    dtypes.add(r.get("dtype", "f32"))
                    if r.get("kind") == "depth_best":
                        depth["torch " + r["variant"]] = (r.get("layers") if r.get("ok") else 0, r.get("step_ms"))
                        continue
                    note = "" if r.get("ok") else "OUT OF MEMORY"
                    if r.get("max_loss_diff") is not None:
                        note = "loss curve: max diff from gkrt's %.2e" % r["max_loss_diff"]
                    rows.append(dict(tag=tag, group=group, system="torch " + r["variant"], layers=r.get("layers"),
                                     C=r.get("channels", ""), limit=r.get("limit") or 0,
                                     ms=r.get("step_ms") if r.get("ok") else None,
                                     reserved=r.get("peak_reserved", 0), allocated=r.get("peak_allocated", 0), ws=0,
                                     note=note))
    # gkrt's unconstrained step of each size: the baseline of the ratio column.
    base = {r["group"]: r["ms"] for r in rows if r["system"] == "gkrt" and not r["limit"] and r["group"] != "depth"}
    gib = lambda b: "%.2f" % (int(b) / 2**30) if b else "-"
    if dtypes != {"f32"}:
        print("Element type: " + ", ".join(sorted(dtypes)) + "\n")
    print("| run | system | layers | C | limit GiB | step ms | / gkrt no limit | peak reserved GiB "
          "| peak allocated GiB | working set GiB | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "%.3f" % (r["ms"] / base[r["group"]]) if r["ms"] and base.get(r["group"]) else "-"
        print(f"| {r['tag']} | {r['system']} | {r['layers']} | {r['C']} | {gib(r['limit'])} | "
              f"{'%.1f' % r['ms'] if r['ms'] else '-'} | {ratio} | {gib(r['reserved'])} | {gib(r['allocated'])} | "
              f"{gib(r['ws'])} | {r['note']} |")
    if depth:
        print("\nLargest depth trained within the depth sweep's limit (its step time):")
        for k, (layers, ms) in depth.items():
            print(f"  {k}: {layers} layers" + (f", {ms:.1f} ms" if ms else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights")
    ap.add_argument("--gkrt-log")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--variants", default="plain,fused,ckpt,offload,both")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--limit", type=parse_bytes, default=0)
    ap.add_argument("--depths")
    ap.add_argument("--report", nargs="+")
    args = ap.parse_args()
    if args.report:
        report(args.report)
    else:
        run(args)


if __name__ == "__main__":
    main()
