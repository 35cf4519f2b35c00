"""Markdown summary of scripts/gpu/run.sh mgpu (issue 16) from the logs in its folder.

Reads bw_n{N}_reg{1,0}_rank0.log (benches/collective_bandwidth.c), every rank's
dp_n{N}_rank{R}.log and dp_half_n{N}_rank{R}.log (examples_c/data_parallel/: step time, memory,
fingerprint), the traces dp_n{N}_trace/trace_rank{R}.json (exposed communication, through
scripts/gpu/mgpu_overlap.py), ddp.log (benches/ddp_compare.py: step, weights, peak memory) and
fault.txt; ends with the figures for BENCHMARKS.md's issue-16 row. A figure that is missing is printed as "missing", never
guessed. Usage: python3 scripts/gpu/mgpu_summary.py DIR
"""

import importlib.util
import os
import re
import sys

COLLS = ("all_reduce", "all_gather", "reduce_scatter", "ar_fused")
BIG = 64 << 20  # the issue's goal holds from 64 MiB up
GOAL = 0.97
ROW = re.compile(r"^(all_reduce|all_gather|reduce_scatter|ar_fused)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def bandwidth(d, n, reg):
    """{(collective, bytes): row dict} of one bench log, and whether it ended checked OK."""
    text = read(os.path.join(d, f"bw_n{n}_reg{reg}_rank0.log"))
    if text is None:
        return None, False
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            c, b = m.group(1), int(m.group(2))
            rows[(c, b)] = dict(gk_us=float(m.group(3)), pl_us=float(m.group(4)), gk_bus=m.group(7),
                                pl_bus=m.group(8), ratio=float(m.group(9)))
    return rows, "every result checked: OK" in text


def counts(d):
    found = set()
    for name in os.listdir(d):
        m = re.match(r"(?:bw|dp)_n(\d+)_", name)
        if m:
            found.add(int(m.group(1)))
    return sorted(found)


def fmt(x, spec=".3f"):
    return "missing" if x is None else format(x, spec)


def bandwidth_section(d, ns, out):
    out.append("## Bandwidth: gkrt collective nodes against plain NCCL (rank 0)\n")
    out.append("ratio = plain_us / gkrt_us (gkrt's bandwidth as a share of NCCL's); busbw in GB/s "
               "(nccl-tests: all-reduce algbw x 2(n-1)/n, the others x (n-1)/n; '-' on one rank). "
               "reg = NCCL_LOCAL_REGISTER=1 (pool and plain buffers registered), unreg = 0. "
               "reg gain = unreg gkrt_us / reg gkrt_us (> 1: registration is faster).\n")
    for n in ns:
        reg, reg_ok = bandwidth(d, n, 1)
        unreg, unreg_ok = bandwidth(d, n, 0)
        out.append(f"### {n} GPU{'s' if n > 1 else ''}\n")
        if reg is None and unreg is None:
            out.append("missing: no bandwidth log\n")
            continue
        out.append(f"results checked: reg {'OK' if reg_ok else 'NOT OK'}, unreg {'OK' if unreg_ok else 'NOT OK'}\n")
        out.append("| collective | MiB | gkrt us | plain us | gkrt busbw | plain busbw | ratio | unreg gkrt us "
                   "| unreg ratio | reg gain |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        keys = sorted(set(reg or {}) | set(unreg or {}), key=lambda k: (COLLS.index(k[0]), k[1]))
        for k in keys:
            r, u = (reg or {}).get(k), (unreg or {}).get(k)
            if n == 1 and k[0] == "ar_fused":
                # In place on one rank NCCL moves nothing: the graph-difference is noise.
                out.append(f"| {k[0]} | {k[1] >> 20} | n/a | {fmt(r and r['pl_us'], '.1f')} | - | - | n/a "
                           f"| n/a | n/a | n/a |")
                continue
            gain = u["gk_us"] / r["gk_us"] if r and u and r["gk_us"] > 0 else None
            out.append(f"| {k[0]} | {k[1] >> 20} | {fmt(r and r['gk_us'], '.1f')} | {fmt(r and r['pl_us'], '.1f')} "
                       f"| {r['gk_bus'] if r else 'missing'} | {r['pl_bus'] if r else 'missing'} "
                       f"| {fmt(r and r['ratio'])} | {fmt(u and u['gk_us'], '.1f')} | {fmt(u and u['ratio'])} "
                       f"| {fmt(gain)} |")
        out.append("")
        for c in COLLS[:3]:
            for label, rows in (("reg", reg), ("unreg", unreg)):
                big = [v["ratio"] for (cc, b), v in (rows or {}).items() if cc == c and b >= BIG]
                if not big:
                    out.append(f"- {c} {label}: no size >= 64 MiB measured")
                elif n == 1:
                    out.append(f"- {c} {label}: lowest ratio at >= 64 MiB {min(big):.3f} (one rank: no link "
                               f"crossed, the goal applies from 2 GPUs)")
                else:
                    out.append(f"- {c} {label}: lowest ratio at >= 64 MiB {min(big):.3f}: goal >= {GOAL} "
                               f"{'met' if min(big) >= GOAL else 'NOT met'}")
            gains = [unreg[k]["gk_us"] / reg[k]["gk_us"] for k in (reg or {}) if k[0] == c and k[1] >= BIG
                     and k in (unreg or {}) and reg[k]["gk_us"] > 0]
            if gains:
                gains.sort()
                g = gains[len(gains) // 2]
                verdict = ("no verdict on one rank" if n == 1
                           else f"keep registration {'on' if g > 1 else 'off'} here")
                out.append(f"- {c}: registration's median gain at >= 64 MiB {g:.3f}: {verdict}")
        out.append("")


def load_overlap():
    """scripts/gpu/mgpu_overlap.py, beside this file."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mgpu_overlap.py")
    spec = importlib.util.spec_from_file_location("mgpu_overlap", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


DP_STEP = re.compile(r"^rank (\d+): step time (\S+) ms \(median of \d+\), (\d+) rows per rank", re.M)
DP_MEMORY = re.compile(r"^rank (\d+): memory limit (\d+) MiB \(0: none\), peak reserved (\S+) MiB, swapped out (\S+) "
                       r"MiB, in (\S+) MiB, tensors recomputed (\d+), evictions (\d+)", re.M)
DP_FINGERPRINT = re.compile(r"^rank (\d+): fingerprint weights (\S+) losses (\S+)", re.M)
DP_FIRST_LOSS = re.compile(r"^step 1  loss (\S+)", re.M)
DDP = re.compile(r"^ddp n=(\d+): step time (\S+) ms.*?(?:first loss (\S+), max weight difference across ranks (\S+?),)?"
                 r"(?: peak allocated (\S+) MiB, peak reserved (\S+) MiB)?$", re.M)


def dp_rank(d, name, r):
    """One rank's figures from its log `{name}_rank{r}.log`, or None when the log is missing:
    step_ms, rows, ok, and where printed limit_mib, peak_mib, out_mib, in_mib, recomputed,
    evictions, weights, losses."""
    t = read(os.path.join(d, f"{name}_rank{r}.log"))
    if t is None:
        return None
    got = {"ok": t.rstrip().endswith("OK")}
    m = DP_STEP.search(t)
    if m:
        got.update(step_ms=float(m.group(2)), rows=int(m.group(3)))
    m = DP_MEMORY.search(t)
    if m:
        got.update(limit_mib=int(m.group(2)), peak_mib=float(m.group(3)), out_mib=float(m.group(4)),
                   in_mib=float(m.group(5)), recomputed=int(m.group(6)), evictions=int(m.group(7)))
    m = DP_FINGERPRINT.search(t)
    if m:
        got.update(weights=m.group(2), losses=m.group(3))
    m = DP_FIRST_LOSS.search(t)
    if m:
        got.update(first_loss=float(m.group(1)))
    return got


def dp_ranks(d, name, n):
    """[figures of rank 0..n-1] (None for a missing log)."""
    return [dp_rank(d, name, r) for r in range(n)]


def ddp_figures(d):
    """{n: {step_ms, first_loss, diff, alloc_mib, reserved_mib}} from ddp.log (None for a figure not
    printed)."""
    got = {}
    for m in DDP.finditer(read(os.path.join(d, "ddp.log")) or ""):
        num = lambda g: float(m.group(g)) if m.group(g) is not None else None  # noqa: E731
        got[int(m.group(1))] = {"step_ms": num(2), "first_loss": num(3), "diff": num(4), "alloc_mib": num(5),
                                "reserved_mib": num(6)}
    return got


def params_equal(ranks):
    """'yes' when every rank printed the same weights fingerprint, 'NO' when two differ, else
    'missing'."""
    prints = [r.get("weights") if r else None for r in ranks]
    if any(p is None for p in prints):
        return "missing"
    return "yes" if len(set(prints)) == 1 else "NO"


def exposures(d, name, n, overlap):
    """[exposure dict, or a string saying why not, per rank] from {name}_trace/trace_rank{r}.json."""
    out = []
    for r in range(n):
        path = os.path.join(d, f"{name}_trace", f"trace_rank{r}.json")
        try:
            out.append(overlap.exposure_of_file(path))
        except OSError:
            out.append("missing")
        except (ValueError, KeyError, overlap.Unmeasurable) as e:
            out.append(f"not measured: {e}")
    return out


def worst_share(xs):
    """The largest exposed share over the ranks, or None when any rank lacks one."""
    shares = [x["share"] if isinstance(x, dict) else None for x in xs]
    return None if not shares or any(s is None for s in shares) else max(shares)


EXPOSED_GOAL = 0.20
HALF_GOAL = 1.25


def scaling_section(d, ns, out, overlap=None):
    overlap = overlap or load_overlap()
    out.append("## Scaling: the data-parallel example at a fixed per-rank batch, beside PyTorch DDP\n")
    ddp = ddp_figures(d)
    rows = {n: dp_ranks(d, f"dp_n{n}", n) for n in ns}
    out.append("| GPUs | gkrt step ms | gkrt rows/s | efficiency | exposed comm (worst rank) | params equal across ranks "
               "| example OK | DDP step ms | gkrt / DDP step | DDP max weight diff | first loss gkrt / DDP (rank 0) |")
    out.append("|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|")
    one = rows.get(1, [None])[0] if 1 in rows else None
    one_tput = one["rows"] / (one["step_ms"] / 1e3) if one and "step_ms" in one else None
    for n in ns:
        r0 = rows[n][0]
        dd = ddp.get(n, {})
        share = worst_share(exposures(d, f"dp_n{n}", n, overlap))
        if not r0 or "step_ms" not in r0:
            out.append(f"| {n} | missing | | | {fmt(share)} | {params_equal(rows[n])} | | {fmt(dd.get('step_ms'))} | "
                       f"| {fmt(dd.get('diff'), '.3g')} | |")
            continue
        ms, per = r0["step_ms"], r0["rows"]
        tput = n * per / (ms / 1e3)
        eff = tput / (n * one_tput) if one_tput else None
        vs = ms / dd["step_ms"] if dd.get("step_ms") else None
        ok = all(r and r["ok"] for r in rows[n])
        out.append(f"| {n} | {ms:.3f} | {tput:.0f} | {fmt(eff)} | {fmt(share)} | {params_equal(rows[n])} "
                   f"| {'yes' if ok else 'NO'} | {fmt(dd.get('step_ms'))} | {fmt(vs)} | {fmt(dd.get('diff'), '.3g')} "
                   f"| {fmt(r0.get('first_loss'), '.6f')} / {fmt(dd.get('first_loss'), '.6f')} |")
    out.append("\nefficiency = throughput / (n x the one-GPU throughput); goal >= 0.90 at 8 GPUs. params equal: every "
               "rank's final weights fingerprint (FNV-1a of their bytes) the same — besides the example's own check "
               "(an all-reduce MIN and MAX of the weights equal to each rank's). gkrt's products are cuBLAS calls "
               "in host-callback nodes, each weight and gradient stored once, as DDP's. The first losses agree when both ran the same "
               "network from the same weights (rounding apart: the teacher's targets are summed in another order).\n")


def exposure_section(d, ns, out, overlap=None):
    overlap = overlap or load_overlap()
    out.append("## Exposed communication, from each rank's trace of the example's traced steps\n")
    out.append("exposed = communication-track time (collective calls, union) not covered by a compute-stream slice; "
               f"share = exposed / communication; goal <= {EXPOSED_GOAL:.2f} (scripts/gpu/mgpu_overlap.py).\n")
    out.append("| GPUs | rank | communication ms | exposed ms | share | collective calls | runs |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for n in ns:
        xs = exposures(d, f"dp_n{n}", n, overlap)
        for r, x in enumerate(xs):
            if isinstance(x, dict):
                out.append(f"| {n} | {r} | {x['communication_us'] / 1e3:.3f} | {x['exposed_us'] / 1e3:.3f} "
                           f"| {fmt(x['share'])} | {x['collectives']} | {x['runs']} |")
            else:
                out.append(f"| {n} | {r} | {x} | | | | |")
        worst = worst_share(xs)
        if worst is None:
            verdicts.append(f"- {n} GPU{'s' if n > 1 else ''}: missing on some rank")
        elif n == 1:
            verdicts.append(f"- 1 GPU: worst share {worst:.3f} (one rank: nothing crosses a link; the goal applies "
                            f"from 2 GPUs)")
        else:
            verdicts.append(f"- {n} GPUs: worst share {worst:.3f}: goal <= {EXPOSED_GOAL:.2f} "
                            f"{'met' if worst <= EXPOSED_GOAL else 'NOT met'}")
    out.append("")
    out.extend(verdicts)
    out.append("")


def half_memory_section(d, ns, out):
    out.append("## gkrt at half of DDP's memory\n")
    out.append("limit = DDP's peak allocated / 2 (max over its ranks); ratio = the limited run's step / the "
               f"unconstrained run's (goal <= {HALF_GOAL}); identical = every rank's fingerprint (final weights and "
               "losses) equal to its unconstrained run's. Swap figures are rank 0's, over all its steps.\n")
    ddp = ddp_figures(d)
    out.append("| GPUs | DDP peak alloc MiB | DDP peak reserved MiB | gkrt limit MiB | gkrt unconstrained peak MiB "
               "| limited peak MiB | swapped out / in MiB | recomputed | unconstrained ms | limited ms | ratio "
               "| identical | OK |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    verdicts = []
    for n in ns:
        free, half = dp_ranks(d, f"dp_n{n}", n), dp_ranks(d, f"dp_half_n{n}", n)
        dd = ddp.get(n, {})
        f0, h0 = free[0] or {}, half[0] or {}
        if not half[0]:
            why = (read(os.path.join(d, f"dp_half_n{n}.txt")) or "missing: no log").strip()
            out.append(f"| {n} | {fmt(dd.get('alloc_mib'), '.1f')} | {fmt(dd.get('reserved_mib'), '.1f')} | {why} "
                       f"| {fmt(f0.get('peak_mib'), '.1f')} | | | | {fmt(f0.get('step_ms'))} | | | | |")
            continue
        ratio = h0["step_ms"] / f0["step_ms"] if "step_ms" in h0 and f0.get("step_ms") else None
        same = [a and b and "weights" in a and (a.get("weights"), a.get("losses")) == (b.get("weights"), b.get("losses"))
                for a, b in zip(free, half)]
        identical = "yes" if all(same) else ("NO" if all(a and b for a, b in zip(free, half)) else "missing")
        ok = "yes" if all(h and h["ok"] for h in half) else "NO"
        out.append(f"| {n} | {fmt(dd.get('alloc_mib'), '.1f')} | {fmt(dd.get('reserved_mib'), '.1f')} "
                   f"| {h0.get('limit_mib', 'missing')} | {fmt(f0.get('peak_mib'), '.1f')} | {fmt(h0.get('peak_mib'), '.1f')} "
                   f"| {fmt(h0.get('out_mib'), '.1f')} / {fmt(h0.get('in_mib'), '.1f')} | {h0.get('recomputed', 'missing')} "
                   f"| {fmt(f0.get('step_ms'))} | {fmt(h0.get('step_ms'))} | {fmt(ratio)} | {identical} | {ok} |")
        if ratio is not None:
            verdicts.append(f"- {n} GPU{'s' if n > 1 else ''}: ratio {ratio:.3f}: goal <= {HALF_GOAL} "
                            f"{'met' if ratio <= HALF_GOAL else 'NOT met'}; trains identically: {identical}")
    out.append("")
    out.extend(verdicts)
    out.append("")


def benchmarks_row(d, ns, out, overlap=None):
    """One line per figure of the issue-16 row, ready to paste into BENCHMARKS.md."""
    overlap = overlap or load_overlap()
    out.append("## For BENCHMARKS.md (issue 16 row)\n")
    ddp = ddp_figures(d)
    parts = []
    for n in ns:
        reg, _ = bandwidth(d, n, 1)
        low = [min((v["ratio"] for (c, b), v in (reg or {}).items() if c == coll and b >= BIG), default=None)
               for coll in COLLS[:3]]
        r0 = dp_ranks(d, f"dp_n{n}", n)
        h0 = dp_rank(d, f"dp_half_n{n}", 0) or {}
        f0 = r0[0] or {}
        share = worst_share(exposures(d, f"dp_n{n}", n, overlap))
        vs = f0["step_ms"] / ddp[n]["step_ms"] if "step_ms" in f0 and ddp.get(n, {}).get("step_ms") else None
        half = h0["step_ms"] / f0["step_ms"] if "step_ms" in h0 and f0.get("step_ms") else None
        parts.append(f"{n} GPU{'s' if n > 1 else ''}: busbw ratio at >= 64 MiB (AR/AG/RS, registered) "
                     f"{'/'.join(fmt(x) for x in low)}; step {fmt(f0.get('step_ms'))} ms (DDP {fmt(ddp.get(n, {}).get('step_ms'))}, "
                     f"gkrt/DDP {fmt(vs)}); exposed comm {fmt(share)}; params equal {params_equal(r0)}; half memory "
                     f"({h0.get('limit_mib', 'missing')} MiB) step ratio {fmt(half)}")
    out.append("; ".join(parts) + ".")
    one = dp_rank(d, "dp_n1", 0)
    top = max(ns) if ns else None
    if top and top > 1 and one and "step_ms" in one:
        t = dp_rank(d, f"dp_n{top}", 0)
        if t and "step_ms" in t:
            out.append(f"\nScaling efficiency at {top} GPUs: {one['step_ms'] / t['step_ms']:.3f} (goal >= 0.90 at 8).")
    out.append("")


def main():
    d = sys.argv[1]
    ns = counts(d)
    out = ["# mgpu: collectives and data-parallel scaling\n"]
    gpus = read(os.path.join(d, "gpus.txt"))
    if gpus:
        out.append(gpus.strip() + "\n")
    bandwidth_section(d, ns, out)
    overlap = load_overlap()
    scaling_section(d, ns, out, overlap)
    exposure_section(d, ns, out, overlap)
    half_memory_section(d, ns, out)
    out.append("## Fault: a rank killed mid-run\n")
    out.append((read(os.path.join(d, "fault.txt")) or "missing: no fault.txt\n").rstrip() + "\n")
    benchmarks_row(d, ns, out, overlap)
    print("\n".join(out))


if __name__ == "__main__":
    main()
