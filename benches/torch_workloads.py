"""The real workloads of ../shared/traces/README.md in PyTorch, on PyTorch's own caching allocator
or on gkrt's pool (through the pluggable-allocator entry points gkrt_torch_alloc / gkrt_torch_free):
GPT-2 small training (batch 8 x 512 tokens, bf16 autocast, AdamW) and ResNet-50 training (batch 64 x
224^2, SGD), random weights and data.

One run (one allocator, one process): prints one JSON line with the median step time over the
measured steps, the device time of a step (CUDA events around it), the host time to queue it, the
thread's CPU time, and the peak reserved / peak allocated bytes over the whole run.

    python3 torch_workloads.py --model gpt2|resnet50 --alloc torch|gkrt [--lib libgkrt.so]
                               [--steps 40] [--warmup 5]

Lockstep (--lockstep N, the comparison BENCHMARKS.md reports): N pairs of processes, each pair one
per allocator, both resident on the GPU and taking turns one step each (each step synchronised
before the other process starts its own), the order within a turn alternating. Adjacent steps see
the same machine, so a wander of its pace (GPT-2's step is bound by the host CPU, whose pace here
moves by tens of percent within seconds) falls on both. Prints each process's figures and a
summary: per turn the ratio gkrt / torch of the two steps; per pair of processes the median of
those; and over the pairs the median and a distribution-free 95% interval. A child whose build or
any one command takes over LOCKSTEP_COMMAND_LIMIT seconds (120) prints its threads' Python stacks to
stderr and ends, and the run fails saying so.

    python3 torch_workloads.py --model gpt2 --lockstep 8 [--steps 100] [--warmup 5]

--model heldout:NAME runs a program of benches/heldout_workloads.py instead (built in each child
after its allocator is installed, seeded as record_traces.py seeds it, step(i) called with i = 0,
1, ...: both sides run the same shapes turn by turn); `run.sh heldlock` runs every one of them.
--model host:NAME runs one of benches/host_workloads.py's the same way, on the GPU
(`HELDLOCK_SET=host run.sh heldlock`).
Each process's figures include every timed step (steps_ms, steps_device_ms), for how a run changes
over its steps, and on gkrt each step's page maps, unmaps and device waits (steps_page_map_count,
...): which steps the pool moved pages in.

The allocation sequence of a run (--record-trace PATH.trace.gz): the same program on PyTorch's
allocator, recorded from before the model moves to the GPU, for replay by benches/trace_replay
and the pool's host replay (the lockstep's peak is set in its first steps).

Paired runs (--pairs N): N rounds of one run per allocator in its own process, one after the
other, the order alternating. Far noisier than lockstep: each run sees the machine at another time.

Children are forked from this process after torch and the model code are imported and the model is
built on the host, but before CUDA is touched: they start alike and the costly imports are paid once
(--pairs --spawn: a fresh interpreter per run instead).

One allocator per process: PyTorch cannot change allocators once it has allocated. The gkrt
allocator is installed exactly as any program would (benches/torch_site/sitecustomize.py does the
same for unchanged programs); its statistics come from gkrt_torch_runtime + gkrt_runtime_stats_sized.
"""
import argparse
import ctypes
import faulthandler
import itertools
import json
import math
import os
import statistics
import sys
import time


class GkrtStats(ctypes.Structure):
    # gkrt_stats (include/gkrt.h), field for field (struct_size first); the tail is room for fields
    # added later.
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "struct_size allocated_bytes reserved_bytes peak_allocated_bytes peak_reserved_bytes requested_bytes "
            "alloc_count free_count failed_alloc_count segment_count segment_alloc_count "
            "segment_free_count memory_limit runs nodes_launched last_run_pool_allocs swap_out_bytes "
            "swap_in_bytes tensors_swapped_out tensors_swapped_in evictions copy_wait_ns "
            "pinned_reserved_bytes pinned_peak_reserved_bytes page_map_count page_unmap_count "
            "pool_device_waits tensors_recomputed pool_epochs_followed pool_epochs_left"
        ).split()
    ] + [("rest", ctypes.c_uint64 * 32)]


def gkrt_stats(lib):
    rt = ctypes.c_void_p()
    st = lib.gkrt_torch_runtime(0, ctypes.byref(rt))
    assert st == 0, f"gkrt_torch_runtime -> {st}"
    s = GkrtStats()
    # The sized call: gkrt_runtime_stats fills version 1 of the struct only, which ends before
    # pool_epochs_followed (those read 0 through it, session 26's runs 17-18 included).
    assert lib.gkrt_runtime_stats_sized(rt, ctypes.byref(s), ctypes.c_size_t(ctypes.sizeof(s))) == 0
    lib.gkrt_runtime_release(rt)
    return s


# The pool's counts kept per timed step (`Trainer.finish`: steps_page_map_count, ...).
PER_STEP = ("page_map_count", "page_unmap_count", "pool_device_waits")

PROGRAM_SETS = ("heldout:", "host:")


def program_name(model):
    """The program a `--model heldout:NAME` (benches/heldout_workloads.py) or `--model host:NAME`
    (benches/host_workloads.py, run on the GPU) names, or None for gpt2 / resnet50."""
    for prefix in PROGRAM_SETS:
        if model.startswith(prefix):
            return model[len(prefix):]
    return None


def program_set(model):
    """The dictionary of programs `model`'s prefix names: name -> (builder, steps)."""
    if model.startswith("host:"):
        import host_workloads

        host_workloads.DEV = "cuda"  # written for the CPU; its programs read DEV as they build
        return host_workloads.HOST
    from heldout_workloads import HELDOUT

    return HELDOUT


def build_on_host(model, torch):
    """The model with its random weights, on the host (no CUDA yet). A held-out or host program
    builds itself on the GPU, so nothing here (`make_step` builds it, after the allocator is in
    place)."""
    if program_name(model):
        return None
    torch.manual_seed(0)
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config())
    import torchvision

    return torchvision.models.resnet50()


def make_step(model, m, torch):
    """Moves the model to the GPU and returns one training step. A held-out or host program is
    built here, seeded as benches/record_traces.py seeds it, and its step(i) called with i = 0,
    1, ...: both sides of a lockstep run the same sequence of shapes, turn by turn."""
    name = program_name(model)
    if name:
        torch.manual_seed(0)
        step_i, count = program_set(model)[name][0](), itertools.count()
        return lambda: step_i(next(count))
    dev = "cuda"
    m = m.to(dev)
    torch.manual_seed(1)
    if model == "gpt2":
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        x = torch.randint(0, 50257, (8, 512), device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    else:
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)
        lossf = torch.nn.CrossEntropyLoss()

        def step():
            loss = lossf(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def install_allocator(torch, spec, gkrt_lib):
    """Makes `spec` PyTorch's CUDA allocator (before anything touches CUDA); returns gkrt's
    library when the allocator is gkrt's. Specs: `torch` (PyTorch's own caching allocator),
    `gkrt` (the entry points of --lib), `gkrt:NAME=VALUE,...` (the same with gkrt's environment
    variables set first, e.g. gkrt:GKRT_POOL_VMM=0), `so:PATH:ALLOC:FREE` (any pluggable
    allocator, such as benches/exact_size_allocator.c)."""
    if spec == "torch":
        return None
    if spec == "gkrt" or spec.startswith("gkrt:"):
        for kv in filter(None, spec[5:].split(",")):
            name, _, value = kv.partition("=")
            os.environ[name] = value
        path, alloc, free = os.path.abspath(gkrt_lib), "gkrt_torch_alloc", "gkrt_torch_free"
    elif spec.startswith("so:"):
        path, alloc, free = spec[3:].rsplit(":", 2)
        path = os.path.abspath(path)
    else:
        raise SystemExit(f"unknown allocator '{spec}' (torch, gkrt, gkrt:ENV=V,..., so:PATH:ALLOC:FREE)")
    torch.cuda.memory.change_current_allocator(torch.cuda.memory.CUDAPluggableAllocator(path, alloc, free))
    if alloc != "gkrt_torch_alloc":
        return None
    lib = ctypes.CDLL(path)
    # The host programs hand tensors between streams with record_stream, which a pluggable
    # allocator never hears of: on gkrt's pool they tell gkrt too.
    import host_workloads

    host_workloads.record_stream = gkrt_record_stream(path)
    return lib


def gkrt_record_stream(path):
    """`Tensor.record_stream` that gkrt's pool hears as well: PyTorch's own, then
    `gkrt.torch.record_stream` (the Python package, on the library at `path`: the one PyTorch
    loaded as its allocator, so the same process-wide runtime)."""
    os.environ["GKRT_LIBRARY"] = path
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import gkrt.torch

    def record(t, stream):
        t.record_stream(stream)
        gkrt.torch.record_stream(t, stream)

    return record


class Trainer:
    """One allocator's side of a comparison: installs the allocator (before anything touches
    CUDA), moves the model over, and times steps one at a time."""

    def __init__(self, torch, model, host_model, alloc, lib_path):
        self.torch, self.model, self.alloc = torch, model, alloc
        # No more CPU threads than the cores this process may run on (--cpus), set here, in the
        # process that runs the steps, before its first CPU operation. PyTorch's default, one a
        # core of the machine, put 16 threads on 2 pinned cores, where every parallel CPU
        # operation waits for all of them: 40 s into a lockstep run, offload_adam_train's child
        # was still in its host Adam, its main thread at 12.9 s of CPU (97-109 ms a step with 2
        # threads). Set in the parent, they were threads a forked child does not have.
        cores = len(os.sched_getaffinity(0))
        if cores < torch.get_num_threads():
            torch.set_num_threads(cores)
        self.lib = install_allocator(torch, alloc, lib_path)
        self.step = make_step(model, host_model, torch)
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.timed_from = None
        self.per_step = []

    def start_timing(self):
        if self.lib is not None:
            self.timed_from = gkrt_stats(self.lib)

    def timed_step(self):
        """(wall, device, queue, thread CPU, process CPU) of one step, in ms. Device: between the
        step's first and last queued work; queue: host time to queue it (about the whole step
        when the host is the bound); CPU: this thread's, and all threads', CPU time over the
        step (the autograd engine runs the backward pass on a thread of its own)."""
        torch = self.torch
        torch.cuda.synchronize()
        before = gkrt_stats(self.lib) if self.lib is not None else None
        c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
        self.start.record()
        self.step()
        self.end.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2, c2, p2 = time.perf_counter(), time.thread_time(), time.process_time()
        ms = lambda a, b: (b - a) * 1e3  # noqa: E731
        if before is not None:
            # What the pool did in this step (read outside the timed span): which steps map.
            after = gkrt_stats(self.lib)
            self.per_step.append([getattr(after, k) - getattr(before, k) for k in PER_STEP])
        return ms(t0, t2), self.start.elapsed_time(self.end), ms(t0, t1), ms(c0, c2), ms(p0, p2)

    def profile(self, steps=3):
        """Device time of the kernels and copies of a step (CUDA profiler, summed; ms): what
        the step costs the GPU apart from any gap, to tell a slower device from a slower host."""
        from torch.profiler import ProfilerActivity, profile

        torch = self.torch
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                self.step()
            torch.cuda.synchronize()
        busy_us = sum(e.self_device_time_total for e in prof.key_averages())
        return busy_us / steps / 1e3

    def finish(self, times):
        wall, device, queue, cpu, process_cpu = zip(*times)
        out = {
            "model": self.model,
            "alloc": self.alloc,
            "step_ms": statistics.median(wall),
            "step_ms_min": min(wall),
            "step_ms_p90": sorted(wall)[int(0.9 * (len(wall) - 1))],
            "device_ms": statistics.median(device),
            "queue_ms": statistics.median(queue),
            "cpu_ms": statistics.median(cpu),
            "process_cpu_ms": statistics.median(process_cpu),
            "steps": len(times),
            # Every timed step in order (ms): how a run's steps change over it (warming up,
            # page moves that stop), which the medians above do not show.
            "steps_ms": [round(w, 3) for w in wall],
            "steps_device_ms": [round(d, 3) for d in device],
        }
        # gkrt: per timed step, its page maps, unmaps and waits for the device.
        for i, k in enumerate(PER_STEP):
            if self.per_step:
                out["steps_" + k] = [row[i] for row in self.per_step[-len(times):]]
        if self.lib is not None:
            s = gkrt_stats(self.lib)
            out["peak_reserved"], out["peak_allocated"] = s.peak_reserved_bytes, s.peak_allocated_bytes
            # Page moves and waits for the device, over the whole run and over the timed steps.
            # And the pool's epoch plans followed and left (memory/pool/epochs.rs).
            for k in ("page_map_count", "page_unmap_count", "pool_device_waits", "pool_epochs_followed", "pool_epochs_left"):
                out[k] = getattr(s, k)
                out["timed_" + k] = getattr(s, k) - getattr(self.timed_from, k)
        elif self.alloc == "torch":
            out["peak_reserved"] = self.torch.cuda.max_memory_reserved()
            out["peak_allocated"] = self.torch.cuda.max_memory_allocated()
        else:  # another pluggable allocator: PyTorch keeps no statistics for it
            out["peak_reserved"] = out["peak_allocated"] = 0
        return out


def measure(torch, model, host_model, alloc, lib_path, steps, warmup):
    """One run: installs the allocator, trains, returns the figures."""
    t = Trainer(torch, model, host_model, alloc, lib_path)
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            t.start_timing()
        r = t.timed_step()
        if i >= warmup:
            times.append(r)
    return t.finish(times)


class LockstepChild:
    """A forked child that holds one Trainer and runs one step per command from the parent, so
    two of them (one per allocator) can take turns step by step on the same GPU."""

    def __init__(self, make):
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(from_parent)
            os.close(to_parent)
            cmd, reply = os.fdopen(to_child, "r"), os.fdopen(from_child, "w")
            code = 0
            # Building, or any one command, taking longer than LOCKSTEP_COMMAND_LIMIT seconds
            # (120) prints every thread's Python stack to stderr and ends the child: the parent
            # then fails with "no answer". Before, a step that never returned left the run waiting
            # until an outer timeout killed the parent alone, with nothing to say where the child
            # stood. The clock does not run while the child waits for the other's step.
            limit = float(os.environ.get("LOCKSTEP_COMMAND_LIMIT", "120"))
            try:
                faulthandler.dump_traceback_later(limit, exit=True)
                trainer, times = make(), []
                reply.write("ready\n")
                reply.flush()
                faulthandler.cancel_dump_traceback_later()
                for line in cmd:
                    faulthandler.dump_traceback_later(limit, exit=True)
                    c = line.strip()
                    if c == "step":
                        r = trainer.timed_step()
                        reply.write(json.dumps(r) + "\n")
                    elif c == "keep":
                        times.append(json.loads(cmd.readline()))
                        faulthandler.cancel_dump_traceback_later()
                        continue
                    elif c == "profile":
                        reply.write(json.dumps(trainer.profile()) + "\n")
                    elif c == "start":
                        trainer.start_timing()
                        reply.write("ok\n")
                    elif c == "finish":
                        reply.write(json.dumps(trainer.finish(times)) + "\n")
                        reply.flush()
                        break
                    reply.flush()
                    faulthandler.cancel_dump_traceback_later()
            except BaseException as e:
                reply.write(json.dumps({"error": repr(e)}) + "\n")
                reply.flush()
                code = 1
            os._exit(code)
        os.close(to_child)
        os.close(from_child)
        self.cmd, self.reply = os.fdopen(from_parent, "w"), os.fdopen(to_parent, "r")

    def ask(self, *lines):
        for line in lines:
            self.cmd.write(line + "\n")
        self.cmd.flush()
        answer = self.reply.readline()
        if not answer or answer.startswith('{"error"'):
            raise SystemExit(f"lockstep child {self.pid} failed: {answer.strip() or 'no answer'}")
        return answer

    def close(self):
        self.cmd.close()
        os.waitpid(self.pid, 0)


def lockstep(torch, a, host_model, pair):
    """The two allocators (a.base, a.against) resident in two children, taking turns one step
    each, the order within a turn alternating: a step on one allocator and the next on the other
    see the same machine. Returns the children's figures and the per-turn ratios other / base of
    wall step times and of host CPU times (all threads)."""
    sides = {"base": a.base, "other": a.against}
    kids = {}
    # Which side starts (and takes the GPU) first alternates too: per process the pace differs
    # by a few percent (an allocator against itself shows it), whatever the allocator.
    for side in ("base", "other") if pair % 2 == 0 else ("other", "base"):
        spec = sides[side]
        kids[side] = LockstepChild(lambda: Trainer(torch, a.model, host_model, spec, a.lib))
        kids[side].ask()  # "ready": built and on the GPU
    ratios, cpu_ratios = [], []
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            for k in kids.values():
                k.ask("start")
        order = ("base", "other") if (i + pair) % 2 == 0 else ("other", "base")
        got = {side: json.loads(kids[side].ask("step")) for side in order}
        if i >= a.warmup:
            for side in order:
                kids[side].cmd.write("keep\n" + json.dumps(got[side]) + "\n")
                kids[side].cmd.flush()
            ratios.append(got["other"][0] / got["base"][0])
            cpu_ratios.append(got["other"][4] / got["base"][4])
    busy = {side: json.loads(kids[side].ask("profile")) for side in ("base", "other")} if a.profile else {}
    runs = []
    for side in ("base", "other"):
        r = json.loads(kids[side].ask("finish"))
        if side in busy:
            r["kernel_ms"] = busy[side]
        r["side"] = side
        runs.append(r)
    for k in kids.values():
        k.close()
    return runs, ratios, cpu_ratios


def record_run(torch, model, host_model, path, steps, warmup):
    """The whole run's allocation sequence on PyTorch's allocator, in the trace format of
    ../shared/traces/README.md (benches/record_traces.py writes it): recorded from before the
    model moves to the GPU through warmup + steps steps, so the start-up and first steps that set
    a lockstep run's peak are in it (the shared gpt2_train trace holds only steady steps). The
    program is the same on every allocator, so trace_replay replays what the gkrt side asked for."""
    import record_traces

    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    step = make_step(model, host_model, torch)
    times = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    lines, peak = record_traces.trace_lines(snap)
    meta = {
        "name": os.path.basename(path).split(".")[0],
        "workload": f"benches/torch_workloads.py --model {model}: the whole run from model.to(cuda), "
                    f"{warmup} + {steps} steps",
        "steps": warmup + steps,
        "step_ms_median": round(statistics.median(times) * 1e3, 3),
        "torch_peak_allocated": torch.cuda.max_memory_allocated(),
        "torch_peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_live": peak,
        "events": len(lines),
        "live_at_start": 0,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    record_traces.write_trace(path, meta, lines)
    return meta


def alloc_micro(torch, spec, lib_path):
    """ns per torch.empty + release pair through PyTorch, on an idle device and on one busy with
    a long kernel: the allocator's cost as a PyTorch program pays it (pluggable path included)."""
    install_allocator(torch, spec, lib_path)
    out = {"alloc": spec}
    torch.cuda.synchronize()
    for busy in (False, True):
        for size in (512, 4096, 1 << 20, 64 << 20):
            n = 20000
            if busy:
                torch.cuda._sleep(2_000_000_000)  # about a second of device time
            t0 = time.perf_counter()
            for _ in range(n):
                x = torch.empty(size, dtype=torch.uint8, device="cuda")
                del x
            out[f"{'busy' if busy else 'idle'}_{size}"] = round((time.perf_counter() - t0) / n * 1e9, 1)
            torch.cuda.synchronize()
    return out


def run_in_child(fn):
    """fn() in a forked child; its JSON-able result comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            data = json.dumps(fn()).encode()
        except BaseException as e:  # report, never fall back into the parent's loop
            data = json.dumps({"error": repr(e)}).encode()
            code = 1
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    result = json.loads(data) if data else {"error": f"child exited with status {status}"}
    if "error" in result:
        raise SystemExit(f"run failed: {result['error']}")
    return result


def run_fresh(a, alloc):
    """One run in a new interpreter (--spawn): slower to start, shares nothing with this one."""
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--model", a.model, "--alloc", alloc,
           "--lib", a.lib, "--steps", str(a.steps), "--warmup", str(a.warmup)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"run failed: {' '.join(cmd)} exited with {out.returncode}")
    return json.loads(lines[-1])


def median_ci95(xs):
    """Distribution-free interval of the median, at least 95%: the order statistics k and n-1-k
    (from 0), k the largest with P(Binomial(n, 1/2) <= k) <= 2.5% (needs n >= 6)."""
    xs = sorted(xs)
    n = len(xs)
    if n < 6:
        return None
    cdf, k = 0.0, -1
    for j in range(n + 1):
        cdf += math.comb(n, j) / 2**n
        if cdf > 0.025:
            break
        k = j
    k = max(k, 0)
    return xs[k], xs[n - 1 - k]


# Two-sided 97.5% quantiles of Student's t, for the geometric mean's interval.
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
        12: 2.18, 15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04, 40: 2.02, 60: 2.00}


def t975(df):
    return T975[max(k for k in T975 if k <= df)]


def summarise(runs, model):
    """Over rounds (a run on each side): the ratio other / base of the runs' median steps."""
    rounds = {}
    for r in runs:
        rounds.setdefault(r["round"], {})[r["side"]] = r
    ratios = [v["other"]["step_ms"] / v["base"]["step_ms"] for v in rounds.values() if len(v) == 2]
    logs = [math.log(x) for x in ratios]
    n = len(ratios)
    s = {"summary": model, "rounds": n, "ratios": [round(x, 4) for x in ratios]}
    for side in ("base", "other"):
        mine = [r for r in runs if r["side"] == side]
        s[side] = {
            "alloc": mine[0]["alloc"],
            "median_step_ms": statistics.median(r["step_ms"] for r in mine),
            "median_device_ms": statistics.median(r["device_ms"] for r in mine),
            "median_queue_ms": statistics.median(r["queue_ms"] for r in mine),
            "median_cpu_ms": statistics.median(r["cpu_ms"] for r in mine),
            "peak_reserved": max(r["peak_reserved"] for r in mine),
            "peak_allocated": max(r["peak_allocated"] for r in mine),
        }
    s["median_ratio"] = statistics.median(ratios)
    ci = median_ci95(ratios)
    if ci:
        s["median_ratio_ci95"] = ci
    if n >= 2:
        m, sd = statistics.mean(logs), statistics.stdev(logs)
        half = t975(n - 1) * sd / math.sqrt(n)
        s["geomean_ratio"] = math.exp(m)
        s["geomean_ratio_ci95"] = (math.exp(m - half), math.exp(m + half))
    s["other_faster_rounds"] = sum(x < 1 for x in ratios)
    return s


def summarise_lockstep(runs, turns, cpu_turns, per_pair, model):
    """Per turn, gkrt's step over torch's adjacent one. Turns within a pair of processes are
    not independent draws (the machine's pace wanders slowly), so the interval that counts is
    the one over the pairs of processes; the one over all turns is shown beside it."""
    s = summarise(runs, model)
    s["mode"] = "lockstep"
    s["turns"] = len(turns)
    s["turn_median_ratio"] = statistics.median(turns)
    s["turn_median_ratio_ci95"] = median_ci95(turns)
    s["turn_median_process_cpu_ratio"] = statistics.median(cpu_turns)
    s["pair_median_ratios"] = [round(x, 4) for x in per_pair]
    return s


def turns_by_page_maps(runs):
    """Lockstep runs of gkrt (the other side): the median turn ratio over the timed steps in which
    its pool mapped pages and over the others, with their counts ("—" without the counts)."""
    moved, still = [], []
    base = [r for r in runs if r["side"] == "base"]
    other = [r for r in runs if r["side"] == "other"]
    for b, o in zip(base, other):
        maps = o.get("steps_page_map_count")
        if not maps or len(maps) != len(o["steps_ms"]) or len(b["steps_ms"]) != len(maps):
            continue
        for t, g, m in zip(b["steps_ms"], o["steps_ms"], maps):
            (moved if m > 0 else still).append(g / t)
    if not moved and not still:
        return "—"
    med = lambda v: f"{statistics.median(v):.3f} ({len(v)})" if v else "— (0)"  # noqa: E731
    return f"{med(moved)} / {med(still)}"


def total_ratio(runs):
    """The other side's time over all its timed steps, over the base's: what a run of the
    program takes. Where the shapes change from step to step, each side's median step may fall
    on a different shape (deeplab_train_sizes: 1.087 by the medians, 1.041 by the turns' median,
    in one pair; BENCHMARKS.md, session 46), and the turns' median leaves out the few slow
    turns that pay for a page move or a plan."""
    side = lambda s: sum(sum(r["steps_ms"]) for r in runs if r["side"] == s)  # noqa: E731
    base = side("base")
    return f"{side('other') / base:.3f}" if base > 0 else "—"


def report(paths):
    """A markdown table from saved --lockstep / --pairs outputs: per file its processes and its
    summary line."""
    print("| workload | allocator vs base | pair ratios (median steps) | median [95%] | turns: median [95%] "
          "| turns with page maps / without (count) | all steps' time "
          "| median step ms base / other | kernels ms base / other | peak reserved GB base / other |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        runs, summ = [], None
        for line in open(path):
            if line.startswith("{"):
                d = json.loads(line)
                if "summary" in d:
                    summ = d
                else:
                    runs.append(d)
        if not summ:
            print(f"| {path}: no summary line (the run did not finish) |")
            continue
        b, o = summ["base"], summ["other"]
        ci = summ.get("median_ratio_ci95")
        cis = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "(fewer than 6 pairs)"
        tci = summ.get("turn_median_ratio_ci95") or (0, 0)
        kern = {side: [r["kernel_ms"] for r in runs if r["side"] == side and "kernel_ms" in r]
                for side in ("base", "other")}
        ks = " / ".join(f"{statistics.median(v):.2f}" if v else "—" for v in kern.values())
        # The peaks are the maxima over the pairs; where the pairs differ, their lowest beside.
        lows = {side: min((r["peak_reserved"] for r in runs if r["side"] == side), default=0)
                for side in ("base", "other")}
        peaks = " / ".join(
            f"{x['peak_reserved'] / 1e9:.3f}" + (f" (lowest {lows[side] / 1e9:.3f})" if lows[side] != x["peak_reserved"] else "")
            for side, x in (("base", b), ("other", o)))
        print(f"| {summ['summary']} | {o['alloc']} vs {b['alloc']} | {', '.join(f'{x:.3f}' for x in summ['ratios'])} "
              f"| {summ['median_ratio']:.3f} {cis} | {summ.get('turn_median_ratio', 0):.3f} [{tci[0]:.3f}, {tci[1]:.3f}] "
              f"| {turns_by_page_maps(runs)} | {total_ratio(runs)} "
              f"| {b['median_step_ms']:.2f} / {o['median_step_ms']:.2f} | {ks} "
              f"| {peaks} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="gpt2, resnet50, heldout:NAME (benches/heldout_workloads.py) "
                    "or host:NAME (benches/host_workloads.py, on the GPU)")
    ap.add_argument("--report", nargs="+", metavar="JSONL", help="print the table of saved --lockstep outputs")
    ap.add_argument("--alloc", help="one run on this allocator (torch, gkrt, ...: see install_allocator)")
    ap.add_argument("--base", default="torch", help="--lockstep / --pairs: the allocator compared against")
    ap.add_argument("--against", default="gkrt", help="--lockstep / --pairs: the allocator measured")
    ap.add_argument("--pairs", type=int, default=0, help="rounds of one run per allocator")
    ap.add_argument("--cpus", help="pin every run to these CPUs (e.g. 2,3): both sides on the same cores")
    ap.add_argument("--profile", action="store_true", help="--lockstep: also sum the kernels' device time")
    ap.add_argument("--micro", action="store_true", help="torch.empty pairs on --base and --against")
    ap.add_argument("--spawn", action="store_true", help="--pairs: fresh processes, not forks")
    ap.add_argument("--lockstep", type=int, default=0, help="pairs of resident processes taking turns")
    ap.add_argument("--record-trace", metavar="PATH",
                    help="record the whole run's allocations on PyTorch's allocator (trace format, gzipped)")
    ap.add_argument("--lib", default=os.environ.get("GKRT_LIB", ".gpu/lib/libgkrt.so"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if sum(bool(x) for x in (a.alloc, a.pairs, a.lockstep, a.micro, a.report, a.record_trace)) != 1:
        ap.error("give one of --alloc (one run), --pairs N, --lockstep N, --micro, --record-trace or --report")

    if a.report:
        report(a.report)
        return
    if not a.model:
        ap.error("--model is required")
    name = program_name(a.model)
    if a.model not in ("gpt2", "resnet50") and not name:
        ap.error(f"--model {a.model}: not gpt2, resnet50, heldout:NAME or host:NAME")
    if name:
        programs = program_set(a.model)
        if name not in programs:
            ap.error(f"--model {a.model}: no such program ({', '.join(programs)})")
        if a.record_trace:
            ap.error("--record-trace: these programs are recorded by benches/record_traces.py --heldout / --host")
    if a.cpus:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})  # children inherit it
    import torch

    if a.micro:
        for spec in (a.base, a.against):
            print(json.dumps(run_in_child(lambda: alloc_micro(torch, spec, a.lib))), flush=True)
        return

    host_model = build_on_host(a.model, torch)
    if a.record_trace:
        path = os.path.abspath(a.record_trace)
        print(json.dumps(run_in_child(lambda: record_run(torch, a.model, host_model, path, a.steps, a.warmup))),
              flush=True)
        return
    if a.alloc:
        print(json.dumps(measure(torch, a.model, host_model, a.alloc, a.lib, a.steps, a.warmup)), flush=True)
        return
    if a.lockstep:
        runs, turns, cpu_turns, per_pair = [], [], [], []
        for pair in range(a.lockstep):
            got, ratios, cpu_ratios = lockstep(torch, a, host_model, pair)
            for r in got:
                r["round"] = pair
                runs.append(r)
                print(json.dumps(r), flush=True)
            turns += ratios
            cpu_turns += cpu_ratios
            per_pair.append(statistics.median(ratios))
        print(json.dumps(summarise_lockstep(runs, turns, cpu_turns, per_pair, a.model)), flush=True)
        return
    runs = []
    for i in range(a.pairs):
        for side in ("base", "other") if i % 2 == 0 else ("other", "base"):
            alloc = a.base if side == "base" else a.against
            if a.spawn:
                r = run_fresh(a, alloc)
            else:
                r = run_in_child(lambda: measure(torch, a.model, host_model, alloc, a.lib, a.steps, a.warmup))
            r["round"], r["side"] = i, side
            runs.append(r)
            print(json.dumps(r), flush=True)
    print(json.dumps(summarise(runs, a.model)), flush=True)


if __name__ == "__main__":
    main()
