"""Checks gkrt's memory snapshots with PyTorch's own tools (on the GPU machine; `run.sh snapshot`).

For every `*.pickle` in the folder given (written by benches/swap_chain with SWAP_SNAPSHOT, each
with a `.stats` file of the runtime's `allocated_bytes segment_count` beside it): the block list
must match the statistics, and `torch.cuda._memory_viz` must read it — `segsum` (which asserts
that every segment's blocks add up), `trace` (the recorded history as text) and `trace_plot` /
`segment_plot` (the HTML pages of PyTorch's memory viewer, written beside the pickle).
Exit status 1 on any mismatch or error."""

import glob
import os
import pickle
import sys


def main(folder):
    from torch.cuda import _memory_viz as viz

    pickles = sorted(glob.glob(os.path.join(folder, "*.pickle")))
    if not pickles:
        print(f"no snapshots in {folder}")
        return 1
    failed = 0
    for path in pickles:
        with open(path, "rb") as f:
            snap = pickle.load(f)
        with open(path[: -len(".pickle")] + ".stats") as f:
            allocated, segments = (int(v) for v in f.read().split())
        blocks = [b for s in snap["segments"] for b in s["blocks"]]
        active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        trace = snap["device_traces"][-1]
        actions = {}
        for e in trace:
            actions[e["action"]] = actions.get(e["action"], 0) + 1
        ok = active == allocated and len(snap["segments"]) == segments
        print(f"{os.path.basename(path)}: {len(snap['segments'])} segments (stats {segments}), "
              f"{len(blocks)} blocks, active_allocated {active} B (stats {allocated} B): "
              f"{'match' if ok else 'MISMATCH'}; {len(trace)} events {actions}")
        failed += not ok
        try:
            summary = viz.segsum(snap)
            print("  segsum: " + " | ".join(summary.splitlines()[-12:-9]))
            text = viz.trace(snap)
            print(f"  trace: {len(text.splitlines())} lines")
            base = path[: -len(".pickle")]
            with open(base + "_trace_plot.html", "w") as f:
                f.write(viz.trace_plot(snap))
            if hasattr(viz, "segment_plot"):
                with open(base + "_segment_plot.html", "w") as f:
                    f.write(viz.segment_plot(snap))
            print(f"  trace_plot / segment_plot written beside {os.path.basename(path)}")
        except Exception as e:  # noqa: BLE001 - report any failure of PyTorch's tools
            print(f"  _memory_viz FAILED: {type(e).__name__}: {e}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
