"""scripts/gpu/mgpu_summary.py (run.sh mgpu's Markdown summary) on logs written in the formats
benches/collective_bandwidth.c, examples_c/data_parallel/ and benches/ddp_compare.py print, and
scripts/gpu/mgpu_overlap.py (exposed communication) on constructed timelines."""

import importlib.util
import json
import os
import tempfile
import unittest

GPU_SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu")
SCRIPT = os.path.join(GPU_SCRIPTS, "mgpu_summary.py")


def load(path=SCRIPT, name="mgpu_summary"):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def trace(compute=(), comm=(), copies=(), runs=1, replay=None):
    """A trace as gkrt_runtime_trace_end writes it: slices (start, end) in µs on the compute (tid
    1), copy (tid 2) and communication (tid 4) tracks, and one gkrt_run metadata event per run."""
    ev = [{"ph": "M", "pid": 1, "tid": t, "name": "thread_name", "args": {"name": n}}
          for t, n in ((1, "compute stream"), (2, "copy in (host to device)"), (4, "communication"))]
    ev += [{"ph": "M", "pid": 1, "name": "gkrt_run", "args": {"graph": 1, "run": i}} for i in range(runs)]
    for tid, cat, ivs in ((1, "node", compute), (4, "collective", comm), (2, "copy", copies)):
        ev += [{"ph": "X", "pid": 1, "tid": tid, "name": f"{cat} {i}", "cat": cat, "ts": a, "dur": b - a,
                "args": {}} for i, (a, b) in enumerate(ivs)]
    if replay:
        ev.append({"ph": "X", "pid": 1, "tid": 1, "name": "graph replay", "cat": "replay", "ts": replay[0],
                   "dur": replay[1] - replay[0], "args": {}})
    ev.append({"ph": "C", "pid": 1, "name": "allocated bytes", "ts": 0, "args": {"bytes": 1}})
    return {"traceEvents": ev}


class Exposure(unittest.TestCase):
    """The share of communication no compute overlaps, on timelines whose answer is known."""

    def setUp(self):
        self.mod = load(os.path.join(GPU_SCRIPTS, "mgpu_overlap.py"), "mgpu_overlap")

    def test_partly_overlapped(self):
        # Communication [5,15] and [18,30] (22 us); compute [0,10] and [12,20] covers 5 + 3 + 2 of it.
        x = self.mod.exposure(trace(compute=[(0, 10), (12, 20)], comm=[(5, 15), (18, 30)], runs=2))
        self.assertAlmostEqual(x["communication_us"], 22.0)
        self.assertAlmostEqual(x["exposed_us"], 12.0)
        self.assertAlmostEqual(x["share"], 12.0 / 22.0)
        self.assertEqual((x["collectives"], x["runs"]), (2, 2))

    def test_overlapping_collectives_and_touching_nodes_count_once(self):
        # Two collectives overlap each other ([0,4] and [2,6]: 6 us, not 8); back-to-back nodes
        # [1,2] [2,3] cover 2 us of it; a node inside another adds nothing.
        x = self.mod.exposure(trace(compute=[(1, 2), (2, 3), (1.5, 2.5)], comm=[(0, 4), (2, 6)]))
        self.assertAlmostEqual(x["communication_us"], 6.0)
        self.assertAlmostEqual(x["exposed_us"], 4.0)

    def test_fully_hidden_and_fully_exposed(self):
        self.assertAlmostEqual(self.mod.exposure(trace(compute=[(0, 100)], comm=[(10, 20), (30, 40)]))["share"], 0.0)
        self.assertAlmostEqual(self.mod.exposure(trace(compute=[(0, 10)], comm=[(10, 20)]))["share"], 1.0)

    def test_copies_are_not_compute(self):
        x = self.mod.exposure(trace(compute=[(0, 5)], comm=[(0, 10)], copies=[(0, 10)]))
        self.assertAlmostEqual(x["exposed_us"], 5.0)

    def test_no_communication_has_no_share(self):
        x = self.mod.exposure(trace(compute=[(0, 5)]))
        self.assertIsNone(x["share"])
        self.assertIn("no communication", self.mod.describe(x))

    def test_a_replayed_graph_is_refused(self):
        with self.assertRaises(self.mod.Unmeasurable):
            self.mod.exposure(trace(comm=[(0, 1)], replay=(0, 10)))


def bench_row(name, size, n, gk_us, pl_us):
    """One row as collective_bandwidth.c's print_row writes it."""
    f = 0 if n == 1 else (2 * (n - 1) / n if name in ("all_reduce", "ar_fused") else (n - 1) / n)
    ga, pa = size / gk_us / 1e3, size / pl_us / 1e3
    gb, pb = ("-", "-") if f == 0 else (f"{ga * f:.1f}", f"{pa * f:.1f}")
    return "%-15s %11d %11.1f %11.1f %10.1f %10.1f %10s %10s %7.3f\n" % (name, size, gk_us, pl_us, ga, pa, gb, pb,
                                                                        pl_us / gk_us)


class MgpuSummary(unittest.TestCase):
    def setUp(self):
        self.mod = load()
        self.dir = tempfile.TemporaryDirectory()
        self.d = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        with open(os.path.join(self.d, name), "w") as f:
            f.write(text)

    def bench(self, n, reg, slow, ok=True):
        """A bench log where gkrt takes `slow` times plain NCCL's time at every size."""
        rows = "".join(bench_row(c, s << 20, n, s * 100 * slow, s * 100.0)
                       for s in (1, 4, 16, 64, 256) for c in ("all_reduce", "all_gather", "reduce_scatter", "ar_fused"))
        end = "collective_bandwidth: every result checked: OK\n" if ok else "collective_bandwidth: FAILED\n"
        self.write(f"bw_n{n}_reg{reg}_rank0.log", "collective_bandwidth: rank 0\ncollective bytes ...\n" + rows + end)

    def summary(self):
        out = []
        ns = self.mod.counts(self.d)
        self.mod.bandwidth_section(self.d, ns, out)
        self.mod.scaling_section(self.d, ns, out)
        self.mod.exposure_section(self.d, ns, out)
        self.mod.half_memory_section(self.d, ns, out)
        return "\n".join(out)

    def test_bus_bandwidth_goal_and_registration(self):
        self.bench(2, 1, 1.01)  # ratio 0.990: the goal met
        self.bench(2, 0, 1.10)  # ratio 0.909: not met, and registration measured faster
        text = self.summary()
        self.assertIn("all_reduce reg: lowest ratio at >= 64 MiB 0.990: goal >= 0.97 met", text)
        self.assertIn("all_gather unreg: lowest ratio at >= 64 MiB 0.909: goal >= 0.97 NOT met", text)
        self.assertIn("registration's median gain at >= 64 MiB 1.089: keep registration on here", text)
        # 64 MiB in 6400 us is 10.5 GB/s algbw: all-reduce busbw x1 on two ranks, all-gather x1/2.
        self.assertIn("| all_reduce | 64 | 6464.0 | 6400.0 | 10.4 | 10.5 | 0.990 |", text)
        self.assertIn("| all_gather | 64 | 6464.0 | 6400.0 | 5.2 | 5.2 | 0.990 |", text)
        self.assertIn("results checked: reg OK, unreg OK", text)

    def test_one_rank_says_the_goal_does_not_apply_and_prints_no_busbw(self):
        self.bench(1, 1, 1.0)
        self.bench(1, 0, 1.0, ok=False)
        text = self.summary()
        self.assertIn("one rank: no link crossed", text)
        self.assertNotIn("goal >= 0.97 met", text)
        self.assertIn("| all_reduce | 64 | 6400.0 | 6400.0 | - | - | 1.000 |", text)
        self.assertIn("results checked: reg OK, unreg NOT OK", text)
        # The in-place fused all-reduce moves nothing on one rank: no figure, no registration verdict.
        self.assertIn("| ar_fused | 64 | n/a |", text)
        self.assertNotIn("keep registration", text)

    def dp_log(self, name, n, r, ms, weights="aaaa", losses="bbbb", limit=0, peak=900.0, out=0.0, recomputed=0,
               ok=True):
        """A rank's log as examples_c/data_parallel/ prints it."""
        self.write(f"{name}_rank{r}.log",
                   f"step 1  loss 2.500000  (this rank's shard; one runtime on the combined batch: 2.5)\n"
                   f"rank {r}: step time {ms:.3f} ms (median of 20), 64 rows per rank\n"
                   f"rank {r}: memory limit {limit} MiB (0: none), peak reserved {peak:.1f} MiB, swapped out "
                   f"{out:.1f} MiB, in {out:.1f} MiB, tensors recomputed {recomputed}, evictions 0\n"
                   f"rank {r}: fingerprint weights {weights} losses {losses}\n"
                   + ("every rank's weights identical\nOK\n" if ok else "FAILED\n"))

    def trace_file(self, name, r, **kw):
        os.makedirs(os.path.join(self.d, f"{name}_trace"), exist_ok=True)
        with open(os.path.join(self.d, f"{name}_trace", f"trace_rank{r}.json"), "w") as f:
            json.dump(trace(**kw), f)

    def test_scaling_efficiency_and_ddp(self):
        for n, ms in ((1, 0.5), (2, 0.625)):
            for r in range(n):
                self.dp_log(f"dp_n{n}", n, r, ms)
        self.write("ddp.log", "ddp n=1: step time 0.250 ms (median of 200), 64 rows per rank, first loss 1.0, max "
                              "weight difference across ranks 0, peak allocated 600.0 MiB, peak reserved 640.0 MiB\n"
                              "ddp n=2: skipped: only 1 GPU(s) visible\n")
        text = self.summary()
        # 1 GPU: 64 rows / 0.5 ms = 128000 rows/s; 2 GPUs: 128 / 0.625 ms = 204800, efficiency 0.8.
        self.assertIn("| 1 | 0.500 | 128000 | 1.000 | missing | yes | yes | 0.250 | 2.000 | 0 | 2.500000 / 1.000000 |",
                      text)
        self.assertIn("| 2 | 0.625 | 204800 | 0.800 | missing | yes | yes | missing | missing | missing | 2.500000 / "
                      "missing |", text)

    def test_params_differing_across_ranks_are_said(self):
        self.dp_log("dp_n2", 2, 0, 1.0, weights="1111")
        self.dp_log("dp_n2", 2, 1, 1.0, weights="2222")
        self.assertIn("| 2 | 1.000 | 128000 | missing | missing | NO | yes |", self.summary())

    def test_exposed_communication_per_rank_and_goal(self):
        for r in range(2):
            self.dp_log("dp_n2", 2, r, 1.0)
        # Rank 0: 2 of 10 us exposed (0.2, at the goal); rank 1: 5 of 10 (0.5): the worst rank decides.
        self.trace_file("dp_n2", 0, compute=[(0, 8)], comm=[(0, 10)], runs=5)
        self.trace_file("dp_n2", 1, compute=[(0, 5)], comm=[(0, 10)], runs=5)
        text = self.summary()
        self.assertIn("| 2 | 0 | 0.010 | 0.002 | 0.200 | 1 | 5 |", text)
        self.assertIn("| 2 | 1 | 0.010 | 0.005 | 0.500 | 1 | 5 |", text)
        self.assertIn("- 2 GPUs: worst share 0.500: goal <= 0.20 NOT met", text)
        self.assertIn("| 2 | 1.000 | 128000 | missing | 0.500 | yes |", text)
        os.remove(os.path.join(self.d, "dp_n2_trace", "trace_rank1.json"))
        self.trace_file("dp_n2", 1, compute=[(0, 9)], comm=[(0, 10)], runs=5)
        self.assertIn("- 2 GPUs: worst share 0.200: goal <= 0.20 met", self.summary())

    def test_a_missing_or_replayed_trace_is_said(self):
        self.dp_log("dp_n2", 2, 0, 1.0)
        self.trace_file("dp_n2", 0, comm=[(0, 1)], replay=(0, 5))
        text = self.summary()
        self.assertIn("| 2 | 0 | not measured: a replayed graph", text)
        self.assertIn("| 2 | 1 | missing |", text)
        self.assertIn("- 2 GPUs: missing on some rank", text)

    def test_half_memory_ratio_and_identical_training(self):
        self.write("ddp.log", "ddp n=2: step time 1.000 ms (median of 20), 64 rows per rank, first loss 1.0, max "
                              "weight difference across ranks 0, peak allocated 600.0 MiB, peak reserved 640.0 MiB\n")
        for r in range(2):
            self.dp_log("dp_n2", 2, r, 10.0, weights="w1", losses=f"l{r}", peak=900.0)
            # Rank 1 trained differently under the limit: the table must say NO.
            self.dp_log("dp_half_n2", 2, r, 12.0, weights="w1" if r == 0 else "w2", losses=f"l{r}", limit=300,
                        peak=290.0, out=512.0, recomputed=6)
        text = self.summary()
        self.assertIn("| 2 | 600.0 | 640.0 | 300 | 900.0 | 290.0 | 512.0 / 512.0 | 6 | 10.000 | 12.000 | 1.200 "
                      "| NO | yes |", text)
        self.assertIn("- 2 GPUs: ratio 1.200: goal <= 1.25 met; trains identically: NO", text)
        self.dp_log("dp_half_n2", 2, 1, 14.0, weights="w1", losses="l1", limit=300)
        self.assertIn("| 1.200 | yes | yes |", self.summary())

    def test_half_memory_not_run_says_why(self):
        self.dp_log("dp_n1", 1, 0, 10.0)
        self.write("dp_half_n1.txt", "half memory: not run at n=1: no DDP peak in ddp.log (NOT a pass)\n")
        self.assertIn("| 1 | missing | missing | half memory: not run at n=1: no DDP peak in ddp.log (NOT a pass) |",
                      self.summary())

    def test_benchmarks_row(self):
        self.bench(2, 1, 1.01)
        self.write("ddp.log", "ddp n=1: step time 5.000 ms (median of 20), 64 rows per rank, first loss 1.0, max "
                              "weight difference across ranks 0, peak allocated 600.0 MiB, peak reserved 640.0 MiB\n"
                              "ddp n=2: step time 5.000 ms (median of 20), 64 rows per rank, first loss 1.0, max "
                              "weight difference across ranks 0, peak allocated 600.0 MiB, peak reserved 640.0 MiB\n")
        self.dp_log("dp_n1", 1, 0, 10.0)
        for r in range(2):
            self.dp_log("dp_n2", 2, r, 10.5)
            self.trace_file("dp_n2", r, compute=[(0, 9)], comm=[(0, 10)])
        self.dp_log("dp_half_n2", 2, 0, 12.6, limit=300)
        out = []
        self.mod.benchmarks_row(self.d, self.mod.counts(self.d), out)
        text = "\n".join(out)
        self.assertIn("2 GPUs: busbw ratio at >= 64 MiB (AR/AG/RS, registered) 0.990/0.990/0.990; step 10.500 ms "
                      "(DDP 5.000, gkrt/DDP 2.100); exposed comm 0.100; params equal yes; half memory (300 MiB) "
                      "step ratio 1.200", text)
        self.assertIn("Scaling efficiency at 2 GPUs: 0.952", text)

    def test_missing_logs_are_said_missing(self):
        self.write("dp_n4_rank0.log", "FAILED\n")
        text = self.summary()
        self.assertIn("missing: no bandwidth log", text)
        self.assertIn("| 4 | missing |", text)


if __name__ == "__main__":
    unittest.main()
