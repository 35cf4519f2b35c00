"""Traces of runs on the host backend: the file is valid JSON in Chrome's trace-event format, with
a slice per node per run on the compute track, swap copies on the copy tracks with their bytes,
recomputes, memory counters, and an instant for an out-of-memory failure."""

import json
import os
import struct
import tempfile
import unittest

import gkrt


K = 256 << 10


def chain(rt, g, recomputable=False):
    """fill -> h0 -> relu -> h1, h_i = h_{i-1} + h_{i-2} up to h7, y = join(h0, h7): h0 lives
    across the chain (swapped, or with its fill declared recomputable, rebuilt, under a limit of
    three tensors)."""
    with rt.builtin("fill") as fill, rt.builtin("relu") as relu, rt.builtin("add") as add:
        h0 = g.tensor(K, "intermediate", "h0")
        n = g.add(fill, [], [h0], params=struct.pack("f", 1.5), name="fill0")
        if recomputable:
            g.set_recomputable(n)
        h1 = g.tensor(K, "intermediate", "h1")
        g.add(relu, [h0], [h1], name="relu1")
        hs = [h0, h1]
        for i in range(2, 8):
            # Three tensors live at each of these nodes: h0 must leave the device meanwhile.
            h = g.tensor(K, "intermediate", f"h{i}")
            g.add(add, [hs[-1], hs[-2]], [h], name=f"add{i}")
            hs.append(h)
        y = g.tensor(K, "output", "y")
        g.add(add, [hs[0], hs[-1]], [y], name="join")
    g.finalize()
    return y


def traced(rt, body):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        rt.trace_begin()
        body()
        rt.trace_end(path)
        with open(path) as f:
            return json.load(f)


class TraceTest(unittest.TestCase):
    def test_slices_per_node_and_run_and_memory_counters(self):
        with gkrt.Runtime(device="host", memory_limit=64 << 20) as rt, rt.graph() as g:
            chain(rt, g)
            trace = traced(rt, lambda: [rt.run(g) for _ in range(3)])
            events = trace["traceEvents"]
            threads = {e["tid"]: e["args"]["name"] for e in events
                       if e["ph"] == "M" and e["name"] == "thread_name"}
            self.assertEqual(set(threads.values()),
                             {"compute stream", "copy in (host to device)",
                              "copy out (device to host)", "communication"})
            nodes = [e for e in events if e["ph"] == "X" and e["cat"] == "node"]
            self.assertEqual(len(nodes), 3 * 9)
            self.assertTrue(all(threads[e["tid"]] == "compute stream" for e in nodes))
            names = [e["name"] for e in nodes[:9]]
            self.assertEqual(names[0][:14], "node 0 'fill0'")
            self.assertEqual(names[8][:13], "node 8 'join'")
            self.assertEqual(nodes[8]["args"]["input_bytes"], 2 * K)
            self.assertEqual(nodes[8]["args"]["output_bytes"], K)
            for e in nodes:
                self.assertGreaterEqual(e["dur"], 0)
            # Runs follow each other; nodes of a run in order on one stream.
            starts = [e["ts"] for e in nodes]
            self.assertEqual(starts, sorted(starts))
            (tensors,) = [e["args"] for e in events if e["name"] == "gkrt_tensors"]
            self.assertEqual(len(tensors["tensors"]), 9)
            self.assertEqual(tensors["tensors"][8]["bytes"], K)
            self.assertTrue(tensors["tensors"][8]["name"].startswith("tensor 8 'y'"))
            self.assertEqual(nodes[8]["args"]["inputs"], [0, 7])
            self.assertEqual(nodes[8]["args"]["outputs"], [8])
            self.assertEqual(nodes[8]["args"]["graph"], tensors["graph"])
            counters = {}
            for e in events:
                if e["ph"] == "C":
                    counters.setdefault(e["name"], []).append(e["args"]["bytes"])
            self.assertEqual(set(counters), {"allocated bytes", "reserved bytes", "pinned bytes",
                                             "pending free bytes"})
            # Sampled where they change (before a node, at a run's end): at least once a run,
            # at most at every node and every run's end.
            self.assertGreaterEqual(len(counters["allocated bytes"]), 3)
            self.assertLessEqual(len(counters["allocated bytes"]), 3 * 10)
            # Each run's host interval and its residency records.
            runs = [e["args"] for e in events if e["ph"] == "M" and e["name"] == "gkrt_run"]
            self.assertEqual(len(runs), 3)
            for r, first in zip(runs, nodes[::9]):
                self.assertLessEqual(r["began"], first["ts"])
                self.assertGreater(len(r["changes"]), 0)
            # Three tensors are live at the add nodes.
            self.assertGreaterEqual(max(counters["allocated bytes"]), 3 * K)
            self.assertTrue(all(a <= r for a, r in zip(counters["allocated bytes"],
                                                       counters["reserved bytes"])))

    def test_swaps_and_recomputes_are_slices_with_bytes(self):
        for recomputable in (False, True):
            # The swap plan is chosen by the first run's timings: on a loaded machine a runtime
            # may copy the fill's output instead of recomputing it; a new runtime tunes again.
            for _ in range(8):
                with gkrt.Runtime(device="host", memory_limit=3 * K) as rt, rt.graph() as g:
                    chain(rt, g, recomputable)
                    trace = traced(rt, lambda: rt.run(g))
                    stats = rt.stats()
                if not recomputable or stats["tensors_recomputed"] > 0:
                    break
            events = trace["traceEvents"]
            copies = [e for e in events if e["ph"] == "X" and e["cat"] == "copy"]
            outs = [e for e in copies if e["name"].startswith("swap out")]
            ins = [e for e in copies if e["name"].startswith("swap in")]
            self.assertEqual(sum(e["args"]["bytes"] for e in outs), stats["swap_out_bytes"])
            self.assertEqual(sum(e["args"]["bytes"] for e in ins), stats["swap_in_bytes"])
            self.assertTrue(all(e["tid"] == 3 for e in outs) and all(e["tid"] == 2 for e in ins))
            recomputes = [e for e in events if e["ph"] == "X" and e["cat"] == "recompute"]
            self.assertEqual(len(recomputes), stats["tensors_recomputed"])
            if recomputable:
                self.assertGreater(len(recomputes), 0)
                self.assertTrue(recomputes[0]["name"].startswith("recompute: node 0 'fill0'"))
                self.assertEqual(recomputes[0]["args"]["bytes"], K)
            else:
                self.assertGreater(len(outs), 0)

    def test_out_of_memory_is_an_instant_and_bad_calls_are_reported(self):
        with gkrt.Runtime(device="host", memory_limit=K, log_level=1) as rt, rt.graph() as g:
            x = g.tensor(K // 2, "input", "x")
            y = g.tensor(2 * K, "output", "too_big")
            with rt.builtin("fill") as fill:
                g.add(fill, [], [y], params=struct.pack("f", 1.0), name="fill_big")
            g.finalize()
            g.write(x, bytes(K // 2))

            def fail():
                with self.assertRaises(gkrt.GkrtError):
                    rt.run(g)

            trace = traced(rt, fail)
            instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
            self.assertEqual([e["name"] for e in instants], ["out of memory"])
            self.assertIn("fill_big", instants[0]["args"]["message"])
            with self.assertRaises(gkrt.GkrtError) as e:
                rt.trace_end("/tmp/never-written.json")
            self.assertIn("no trace", str(e.exception))
            rt.trace_begin()
            with self.assertRaises(gkrt.GkrtError) as e:
                rt.trace_end("/nonexistent-dir/t.json")
            self.assertIn("/nonexistent-dir/t.json", str(e.exception))


if __name__ == "__main__":
    unittest.main()
