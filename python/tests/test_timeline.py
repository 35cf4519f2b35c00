"""scripts/gpu/timeline.py (GKRT_SWAP_TIMELINE's summary) on a constructed run: the waits between
nodes split by cause — a node the host queued late (its `host` row), a copy-in or a copy-out
ending in the gap, nothing seen — and the host's line."""

import contextlib
import importlib.util
import io
import os
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu",
                      "timeline.py")


def load():
    spec = importlib.util.spec_from_file_location("timeline", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Five nodes of 1 ms with gaps of 0.1 ms before nodes 1..4. The host queued nodes 0, 2, 3 and 4
# 0.5 ms ahead of their start and node 1 only as it started (the device waited for it); a copy-in
# ends in the gap before node 2, a copy-out in the one before node 3; nothing before node 4.
ROWS = """1,node,0,0.0,1.0
1,node,1,1.1,2.1
1,node,2,2.2,3.2
1,node,3,3.3,4.3
1,node,4,4.4,5.4
1,in,1000,1.5,2.15
1,out,1000,2.5,3.25
1,host,0,0.0,0
1,host,1,1.6,2
1,host,2,2.2,5
1,host,3,3.3,1
1,host,4,4.4,0
1,syncs,0,12,4
1,polled,0,7,0
1,copy_waits,0,9,3
1,deferred,0,2,5
"""


class TimelineTest(unittest.TestCase):
    def summary(self, text):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            with open(path, "w") as f:
                f.write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                mod = load()
                for runs in mod.read(path):
                    mod.report(1, runs[max(runs)], 6)
            return out.getvalue()

    def test_waits_are_split_by_the_host_rows_and_both_copy_directions(self):
        out = self.summary(ROWS)
        waits = next(line for line in out.splitlines() if line.startswith("rebuilds:"))
        self.assertIn("the host queued the node late 0.10 ms", waits)
        self.assertIn("a copy-in ending in the gap 0.10 ms", waits)
        self.assertIn("a copy-out ending in the gap 0.10 ms", waits)
        self.assertIn("nothing seen (launch, host) 0.10 ms", waits)
        host = next(line for line in out.splitlines() if line.startswith("host:"))
        self.assertIn("1 nodes started within", host)
        self.assertIn("first [1]", host)
        self.assertIn("syncs between launches: 8 (1.60 a node)", host)
        self.assertIn("queued 12 records and waits", out)
        self.assertIn("left out 4 as implied", out)
        self.assertIn("the executor queried 7 copy events", out)
        self.assertIn("waited 9 times for other copies and left out 3", out)
        self.assertIn("2 returns started after their step for lack of room, 5 departures", out)

    def test_a_timeline_without_host_rows_is_summarised_as_before(self):
        old = "".join(line + "\n" for line in ROWS.splitlines() if ",host," not in line
                      and ",syncs," not in line and ",polled," not in line
                      and ",copy_waits," not in line and ",deferred," not in line)
        out = self.summary(old)
        self.assertNotIn("host:", out)
        self.assertNotIn("queued the node late", out)
        self.assertIn("nothing seen (launch, host) 0.20 ms", out)


if __name__ == "__main__":
    unittest.main()
