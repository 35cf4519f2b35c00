"""Memory snapshots on the host backend: the pickle loads with Python's own `pickle`, has the
keys PyTorch's snapshots have, its blocks agree with `gkrt_stats`, and the blocks and the
history name the tensors, nodes and raw buffers they belong to."""

import ctypes
import os
import pickle
import struct
import tempfile
import unittest

import gkrt
from gkrt._lib import lib


SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id",
                "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "frames", "time_us"}


def frame_names(frames):
    return [f["name"] for f in frames]


class SnapshotTest(unittest.TestCase):
    def build(self, rt, g):
        """x -> relu 'act' -> hidden (intermediate) -> scale 'double' -> y."""
        x = g.tensor(4096, "input", "x")
        h = g.tensor(4096, "intermediate", "hidden")
        y = g.tensor(4096, "output", "y")
        with rt.builtin("relu") as relu, rt.builtin("scale") as scale:
            g.add(relu, [x], [h], name="act")
            g.add(scale, [h], [y], params=struct.pack("f", 2.0), name="double")
        g.finalize()
        g.write(x, bytes(4096))
        return x, h, y

    def check_against_stats(self, snap, stats):
        segs = snap["segments"]
        self.assertEqual(len(segs), stats["segment_count"])
        active = [b for s in segs for b in s["blocks"] if b["state"] == "active_allocated"]
        self.assertEqual(sum(b["size"] for b in active), stats["allocated_bytes"])
        self.assertEqual(sum(b["requested_size"] for b in active), stats["requested_bytes"])
        for s in segs:
            self.assertEqual(set(s), SEGMENT_KEYS)
            self.assertEqual(sum(b["size"] for b in s["blocks"]), s["total_size"])
            self.assertEqual(s["allocated_size"],
                             sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated"))
            addr = s["address"]
            for b in s["blocks"]:
                self.assertEqual(set(b), BLOCK_KEYS)
                self.assertEqual(b["address"], addr, "blocks tile their segment in order")
                addr += b["size"]
        return active

    def test_blocks_match_stats_and_name_their_owners(self):
        # A small limit keeps the runtime on plain segments; the host buffer adds one more.
        with gkrt.Runtime(device="host", memory_limit=64 << 20) as rt, rt.graph() as g:
            x, h, y = self.build(rt, g)
            rt.run(g)
            raw = rt_malloc(rt, 3000)
            try:
                snap = rt.snapshot()
                stats = rt.stats()
                self.assertEqual(set(snap), {"segments", "device_traces"})
                active = self.check_against_stats(snap, stats)
                names = [frame_names(b["frames"]) for b in active]
                # x and y persist after the run; the intermediate was freed after its reader.
                self.assertTrue(any(n[0].startswith("tensor 0 'x'") and n[1] == "written by the host"
                                    for n in names), names)
                self.assertTrue(any("'y'" in n[0] and "'double'" in n[1] for n in names), names)
                self.assertFalse(any("'hidden'" in n[0] for n in names), names)
                self.assertIn(["gkrt_malloc"], names)
                self.assertEqual(snap["device_traces"], [[]], "no history unless asked")
            finally:
                rt_free(rt, raw)

    def test_history_records_allocations_and_frees_with_names(self):
        with gkrt.Runtime(device="host", memory_limit=64 << 20) as rt, rt.graph() as g:
            rt.record_history(1000)
            self.build(rt, g)
            rt.run(g)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "snap.pickle")
                rt.dump_snapshot(path)
                with open(path, "rb") as f:
                    snap = pickle.load(f)
            self.check_against_stats(snap, rt.stats())
            (trace,) = snap["device_traces"]
            for e in trace:
                self.assertTrue(TRACE_KEYS <= set(e), e)
            actions = [e["action"] for e in trace]
            self.assertIn("segment_alloc", actions)
            hidden = [e for e in trace if e["frames"] and "'hidden'" in e["frames"][0]["name"]]
            self.assertEqual([e["action"] for e in hidden],
                             ["alloc", "free_requested", "free_completed"])
            self.assertEqual(frame_names(hidden[0]["frames"])[1][:12], "node 0 'act'")
            self.assertEqual(hidden[0]["size"], 4096)
            times = [e["time_us"] for e in trace]
            self.assertEqual(times, sorted(times))
            # A ring of 2 keeps the last two events only.
            rt.record_history(2)
            for _ in range(3):
                rt.run(g)
            self.assertEqual(len(rt.snapshot()["device_traces"][0]), 2)

    def test_swaps_are_recorded_with_their_tensors(self):
        k = 256 << 10
        # Persistent x and y plus three live intermediates exceed the 4-tensor limit: swapping.
        with gkrt.Runtime(device="host", memory_limit=4 * k) as rt, rt.graph() as g:
            rt.record_history(10000)
            x = g.tensor(k, "input", "x")
            hs, prev = [], x
            with rt.builtin("relu") as relu, rt.builtin("add") as add:
                for i in range(8):
                    h = g.tensor(k, "intermediate", f"h{i}")
                    g.add(relu, [prev], [h], name=f"relu{i}")
                    hs.append(h)
                    prev = h
                y = g.tensor(k, "output", "y")
                g.add(add, [hs[0], hs[-1]], [y], name="join")
            g.finalize()
            g.write(x, bytes(k))
            rt.run(g)
            stats = rt.stats()
            self.assertGreater(stats["swap_out_bytes"], 0)
            snap = rt.snapshot()
            self.check_against_stats(snap, stats)
            swaps = [e for e in snap["device_traces"][0] if e["action"] in ("swap_out", "swap_in")]
            outs = [e for e in swaps if e["action"] == "swap_out"]
            self.assertEqual(sum(e["size"] for e in outs), stats["swap_out_bytes"])
            self.assertEqual(len([e for e in swaps if e["action"] == "swap_in"]),
                             stats["tensors_swapped_in"])
            for e in swaps:
                self.assertRegex(e["frames"][0]["name"], r"^tensor \d+ '(x|y|h\d)'")

    def test_out_of_memory_is_recorded(self):
        with gkrt.Runtime(device="host", memory_limit=4 << 20) as rt:
            rt.record_history(16)
            with self.assertRaises(gkrt.GkrtError):
                rt_malloc(rt, 64 << 20)
            (trace,) = rt.snapshot()["device_traces"]
            ooms = [e for e in trace if e["action"] == "oom"]
            self.assertEqual(len(ooms), 1)
            self.assertEqual(ooms[0]["size"], 64 << 20)
            self.assertIn("device_free", ooms[0])

    def test_bad_arguments_are_reported(self):
        with gkrt.Runtime(device="host") as rt:
            with self.assertRaises(gkrt.GkrtError) as e:
                rt.record_history(1 << 40)
            self.assertIn("history capacity", str(e.exception))
            with self.assertRaises(gkrt.GkrtError) as e:
                rt.dump_snapshot("/nonexistent-dir/x.pickle")
            self.assertIn("/nonexistent-dir/x.pickle", str(e.exception))
            rt.record_history(0)
            self.assertEqual(rt.snapshot()["device_traces"], [[]])


def rt_malloc(rt, size):
    p = ctypes.c_void_p()
    gkrt._check(lib.gkrt_malloc(rt.handle, size, None, ctypes.byref(p)))
    return p.value


def rt_free(rt, ptr):
    gkrt._check(lib.gkrt_free(rt.handle, ptr, None))


if __name__ == "__main__":
    unittest.main()
