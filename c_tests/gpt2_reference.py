#!/usr/bin/env python3
"""int_gpt2_reference: the GPT-2 example's forward against an independent reference.

Runs gkrt_gpt2 (path in argv[1]) on the host backend with a tiny model and large initial weights
(so that the loss depends strongly on every part of the network), reads back the weights and
batch it dumped (--dump-weights, the format benches/gpt2_torch.py loads), computes the loss in
plain Python floats (doubles) from the network's textbook definition, and requires the first
step's loss to agree to 3e-7 relative (float32 rounding here is about 3e-8). Pure Python: no numpy.
"""
import math
import os
import struct
import subprocess
import sys
import tempfile

L, C, H, T, B, V = 2, 12, 3, 6, 2, 29


def run(program, dump):
    args = [program, "--layers", str(L), "--channels", str(C), "--heads", str(H), "--seq", str(T), "--batch",
            str(B), "--vocab", str(V), "--steps", "1", "--init-std", "0.4", "--seed", "3", "--dump-weights", dump]
    out = subprocess.run(args, env=dict(os.environ, GKRT_DEVICE="host"), capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        if line.startswith("step 1 loss "):
            return float(line.split()[3])
    sys.exit("no loss in the output:\n" + out.stdout + out.stderr)


def read(dump):
    data = open(dump, "rb").read()
    assert data[:8] == b"GPT2GKRT", "bad magic"
    hdr = struct.unpack_from("<7I", data, 8)
    assert hdr == (1, L, C, H, T, B, V), hdr
    sizes = [V * C, T * C] + [2 * C, 3 * C * C + 3 * C, C * C + C, 2 * C, 4 * C * C + 4 * C, 4 * C * C + C] * L
    sizes.append(2 * C)
    n = sum(sizes)
    flat = struct.unpack_from(f"<{n}f", data, 56)
    tokens = struct.unpack_from(f"<{B * T}i", data, 56 + 4 * n)
    targets = struct.unpack_from(f"<{B * T}i", data, 56 + 4 * n + 4 * B * T)
    params, off = [], 0
    for s in sizes:
        params.append(flat[off:off + s])
        off += s
    return params, tokens, targets


def layer_norm(x, p):
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    return [(v - mean) / math.sqrt(var + 1e-5) * p[i] + p[C + i] for i, v in enumerate(x)]


def linear(x, p, ic, oc):
    """x·Wᵀ + b with W [oc, ic] row-major, then b [oc]."""
    return [sum(p[o * ic + i] * x[i] for i in range(ic)) + p[oc * ic + o] for o in range(oc)]


def gelu(v):
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def loss(params, tokens, targets):
    wte, wpe, lnf = params[0], params[1], params[-1]
    D, total = C // H, 0.0
    for b in range(B):
        xs = [[wte[tokens[b * T + t] * C + c] + wpe[t * C + c] for c in range(C)] for t in range(T)]
        for l in range(L):
            ln1, qkv, proj, ln2, fc, fcproj = params[2 + 6 * l:8 + 6 * l]
            q = [linear(layer_norm(x, ln1), qkv, C, 3 * C) for x in xs]  # [q | k | v], heads inside
            ys = []
            for t in range(T):
                y = []
                for h in range(H):
                    qv = q[t][h * D:(h + 1) * D]
                    scores = [sum(qv[d] * q[s][C + h * D + d] for d in range(D)) / math.sqrt(D) for s in range(t + 1)]
                    mx = max(scores)
                    e = [math.exp(s - mx) for s in scores]
                    y += [sum(e[s] / sum(e) * q[s][2 * C + h * D + d] for s in range(t + 1)) for d in range(D)]
                ys.append(y)
            xs = [[a + c for a, c in zip(x, linear(y, proj, C, C))] for x, y in zip(xs, ys)]
            xs = [[a + c for a, c in zip(x, linear([gelu(v) for v in linear(layer_norm(x, ln2), fc, C, 4 * C)],
                                                   fcproj, 4 * C, C))] for x in xs]
        for t, x in enumerate(xs):
            h = layer_norm(x, lnf)
            logits = [sum(h[c] * wte[v * C + c] for c in range(C)) for v in range(V)]
            mx = max(logits)
            total += math.log(sum(math.exp(z - mx) for z in logits)) + mx - logits[targets[b * T + t]]
    return total / (B * T)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "weights.bin")
        got = run(sys.argv[1], dump)
        want = loss(*read(dump))
    err = abs(got - want) / abs(want)
    print(f"loss: gkrt {got:.6f}, reference {want:.6f}, relative difference {err:.2e}")
    if err > 3e-7:
        sys.exit("gkrt's GPT-2 loss differs from the reference")
    print("int_gpt2_reference: all checks passed")


if __name__ == "__main__":
    main()
