"""scripts/gpu/mgpu_summary.py (run.sh mgpu's Markdown summary) on logs written in the formats
benches/collective_bandwidth.c, examples_c/data_parallel.c and benches/ddp_compare.py print."""

import importlib.util
import os
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu", "mgpu_summary.py")


def load():
    spec = importlib.util.spec_from_file_location("mgpu_summary", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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

    def test_scaling_efficiency_and_ddp(self):
        for n, ms in ((1, 0.5), (2, 0.625)):
            self.write(f"dp_n{n}_rank0.log", f"step 1 ...\nrank 0: step time {ms:.3f} ms (median of 200), 64 rows per "
                                             f"rank\nevery rank's weights identical\nOK\n")
        self.write("ddp.log", "ddp n=1: step time 0.250 ms (median of 200), 64 rows per rank\n"
                              "ddp n=2: skipped: only 1 GPU(s) visible\n")
        text = self.summary()
        # 1 GPU: 64 rows / 0.5 ms = 128000 rows/s; 2 GPUs: 128 / 0.625 ms = 204800, efficiency 0.8.
        self.assertIn("| 1 | 0.500 | 128000 | 1.000 | yes | 0.250 | 2.000 |", text)
        self.assertIn("| 2 | 0.625 | 204800 | 0.800 | yes | missing | missing |", text)

    def test_missing_logs_are_said_missing(self):
        self.write("dp_n4_rank0.log", "FAILED\n")
        text = self.summary()
        self.assertIn("missing: no bandwidth log", text)
        self.assertIn("| 4 | missing |", text)


if __name__ == "__main__":
    unittest.main()
