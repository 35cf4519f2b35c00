#!/usr/bin/env bash
# Step 2 of a GPU run, on the GPU machine, in the repository root with .gpu/ staged by
# scripts/gpu/stage.sh. Runs what is named (default: tests demo bench) with the CUDA backend
# and writes logs under $OUT (or ./gpu-out; RUN_ARCHIVE=1: packed into $OUT/run.tgz, below).
# Needs: the NVIDIA driver, nvcc and a C compiler.
#   tests   every C test with GKRT_DEVICE=cuda, the Rust GPU tests, and the no-device check
#   demo    the demo on the GPU and on the host backend
#   bench   benches/launch_overhead (10,000-kernel chain: gkrt dynamic / planned+replay vs a loop)
#   swap    benches/swap_chain (bf16 Linear+ReLU training step at 1x, 2x, 3x its memory limit);
#           SWAP_TIMELINE=1 also times every run with events (the unconstrained ones too, so the
#           bound carries the same events) and summarises where the links and the compute stream
#           idle, and each swapping plan's predicted step beside the measured (scripts/gpu/timeline.py)
#   pool    the pool against PyTorch and cuMemAllocAsync (needs the traces copied into .gpu/pool/
#           and torch in python3; BENCHMARKS.md section 3); POOL_ONLY=gkrt,torch,async,aliases
#           puts the default beside its page-alias variants (GKRT_POOL_ALIASES=1, 2 and 3) alone;
#           POOL_TRACES="GLOB ..." replays those traces only (e.g. '$OUT/hostgpu_traces/*.trace.gz')
#   poolab  the pool's replay with this library and a baseline's (POOL_BASE_LIB, default .gpu/lib_base:
#           a staged libgkrt.so, e.g. main's), new / baseline / new again in one call, PyTorch and
#           cuMemAllocAsync beside each (scripts/gpu/poolab.sh; $OUT/pool_replay_{new,base,new2}.md);
#           POOL_AB_ROUNDS=N interleaves N rounds of them instead, POOL_AB_TRACES picks the traces
#   gpt2ab  examples_c/gpt2 in dynamic mode under a limit it does not need, with this library and a
#           baseline's (GPT2AB_BASE_LIB, default .gpu/lib_base) in turn, GPT2AB_PAIRS (2) pairs in one
#           call: step time, peak reserved over the working set, runs placed by an epoch plan
#           (scripts/gpu/gpt2ab.sh; $OUT/gpt2ab.md)
#   heldout records benches/heldout_workloads.py's traces (PyTorch programs that only check the
#           pool's rules, never choose them) into $OUT/heldout_traces/; the pool mode, when given
#           after it, replays those too (benches/traces_heldout/ keeps the committed ones)
#   workloads  GPT-2 / ResNet-50 training in PyTorch on each allocator, in lockstep (section 3);
#           first each run's whole allocation sequence recorded to $OUT/workload_traces/ (the
#           pool mode, when given after it, replays those too); WORKLOAD_GPT2_VARIANTS="SPEC ..."
#           adds a GPT-2 lockstep per gkrt configuration (e.g. gkrt:GKRT_POOL_RECYCLE_TIME_PERMILLE=1000)
#   hostgpu records benches/host_workloads.py's programs (written for the CPU recorder) on the GPU
#           into $OUT/hostgpu_traces/ (HOSTGPU_ONLY=a,b for some): their GPU sequence; the pool
#           mode, when given after it, replays those too
#   heldlock  each held-out program (benches/heldout_workloads.py; HELDLOCK_SET=host: those of
#           benches/host_workloads.py, on the GPU) in PyTorch on each allocator, in
#           lockstep as in workloads: HELDLOCK_PAIRS (1) pairs of processes, HELDLOCK_STEPS (12)
#           steps after HELDLOCK_WARMUP (3), HELDLOCK_ONLY=a,b for some, HELDLOCK_TIMEOUT (180) s
#           a program; $OUT/heldlock/NAME.jsonl
#           and one table, $OUT/heldlock.md (step ratio gkrt / PyTorch, peak reserved of each)
#   livetrace  what a PyTorch program on gkrt's pool asks of it (benches/gkrt_live_trace.py: gkrt's
#           memory history in the trace format, "# step K" after each step, the pool's statistics in
#           the header), LIVETRACE_MODELS (gpt2 and every held-out program; heldout:NAME, gpt2,
#           resnet50) for LIVETRACE_STEPS (15) steps each, into $OUT/live_traces/; the host replay
#           reads them with GKRT_PASSES=0
#   python  gkrt.torch: PyTorch on gkrt's pool, its statistics under PyTorch's names (python/gpu_torch_check.py)
#   vmm     benches/vmm_cost.c: what cuMemCreate, cuMemMap + cuMemSetAccess, cuMemUnmap and
#           cuMemRelease cost by physical allocation size, and a move's remap ($OUT/vmm_cost.md)
#   hostint gkrt inside a host program (benches/host_integration.c): eager launches against a
#           cuLaunchKernel loop, asynchronous against synchronous runs, the cost of rebinding a
#           replayed graph, a queue-fed step against one with its batch on the device and the
#           queue's push bandwidth against the pinned link; then python/gpu_bind_check.py (a
#           PyTorch program running a gkrt graph on its tensors by data_ptr(), on its stream)
#   gpt2    examples_c/gpt2 (GPT-2 training written against gkrt) beside benches/gpt2_torch.py at two
#           sizes (GPT2_SMALL, GPT2_MEDIUM: gkrt_gpt2 size flags): gkrt with no limit and at 1/2 and 1/3
#           of its working set; PyTorch plain (its loss curve against gkrt's, same initial weights),
#           fused attention, checkpointing, save_on_cpu, both. One table at the end, step times
#           also as ratios to gkrt's unlimited step ($OUT/gpt2/summary.md); logs in $OUT/gpt2/.
#           GPT2_STEPS (6) steps per run; GPT2_RECOMPUTE (1) is gkrt_gpt2's --recompute for the
#           limited runs (2: products too). First the program's default small model on the host
#           backend (the reference) and on CUDA, loss per step side by side ($OUT/gpt2/reference.txt).
#           GPT2_DTYPE=bf16: all of it in mixed precision (gkrt_gpt2 --dtype bf16 beside gpt2_torch.py
#           --dtype bf16, the same f32 master weights), into $OUT/gpt2_bf16/ (f32 figures untouched).
#   gpt2depth  the largest of GPT2_DEPTHS (6,12,18,24,36,48,64,96) that gkrt (--recompute
#           GPT2_RECOMPUTE, default 2) and each PyTorch variant (plain, checkpointing, save_on_cpu,
#           both) train within GPT2_LIMIT (8GiB) at GPT2_DEPTH_WIDTH (the small size's flags less
#           --layers), GPT2_STEPS (3) steps each, the last step's time; GPT2_DTYPE as above;
#           $OUT/gpt2depth/summary.md
#   gpt2swap  issue 23's 1/3 figure: gkrt_gpt2's small size unconstrained, then at --limit-frac 0.333
#           with --recompute 1 and 2 (products too: chained recomputation needs them), GPT2_STEPS
#           (8) steps each, every run's timeline summarised (scripts/gpu/timeline.py); logs and
#           ratios (limited step / unconstrained step) in $OUT/gpt2swap/ (GPT2_DTYPE=bf16: in bf16,
#           into $OUT/gpt2swap_bf16/); each limited run's 'swap plan' log lines (budget, the plan
#           chosen and its estimated step) and SWAPSTATS line (fallback evictions, pool waits for
#           the device, copy waits per step, over every step: the tuning steps' page maps too) and
#           SWAPSTATS_STEADY line (the same per step after the third, the tuned plan's first: its
#           steady steps, where a plan whose dry run maps nothing should show page_maps=0.0 and
#           pool_device_waits=0.0) are shown.
#           The ratios come from untimed runs; each configuration then runs again timed (the
#           unconstrained one 3 steps into timeline_none.csv, each limited one 4 steps into
#           timeline_rN.csv: events at every node may lengthen a step — session 10's timed small run
#           had a median 7 us between nodes —), and each limited summary ends with the same nodes' time against the
#           unconstrained run's ("here the same nodes take +X ms").
#           GPT2SWAP_SIZES="small medium" adds the medium size (--recompute 2; its files start medium_).
#           GPT2SWAP_BUDGETS="1000 850" also runs --recompute 2 with GKRT_SWAP_BUDGET_PERMILLE at each
#           value other than 1000 (the plan fitted to that share of what the limit leaves, the rest
#           headroom for the pool): files and ratio lines get _bNNN. GPT2SWAP_PENDING=1 also runs
#           --recompute 2 with GKRT_POOL_PENDING_BEST_FIT=1 (a block pending on a copy-out that fits
#           closer than any free one is taken, as the plan's dry run places it): files get _p1.
#           GPT2SWAP_PLACEMENTS=1 also runs --recompute 2 with GKRT_SWAP_PLACEMENTS=1 (every block
#           takes the range the plan's dry run placed it in, instead of the pool placing it: the
#           side-by-side of issue 23's execution fidelity; off by default): files get _pl. Compare
#           the SWAPSTATS lines (page_maps, pool_device_waits per step: 0 and 0 expected with
#           placements in the steady state) and timeline.py's "pool:" and "measured / predicted";
#           a run whose blocks found their placement taken logs "placed where ... elsewhere".
#           GPT2SWAP_NOREFINE=1 also runs --recompute 2 with GKRT_SWAP_REFINE=0 (the tuned plan as
#           the timed runs chose it, not refined on the model: the refinement's A/B): files get _nr.
#           The 'swap plan refined in X ms' log line gives the refinement's time and estimates.
#           GPT2SWAP_GREEDY=1 also runs --recompute 2 with GKRT_SWAP_REFINE_SEARCH=0 (the greedy
#           refinement of before session 16 instead of the search: the search's A/B): files get _gr.
#           GPT2SWAP_NOPRUNE=1 also runs --recompute 2 with GKRT_SWAP_PRUNE_LINKS=0 (the planner
#           before session 13, which rebuilt each layer's attention scores a second time for
#           nothing): files get _np.
#           The runs release copy-outs' blocks at the model's copy ends (GKRT_SWAP_RELEASE, on by
#           default since session 12: the plan fitted with each copy-out's block pending until the
#           model's copy end, the pool placing every block where its dry run did); the 'GKRT_SWAP_RELEASE:'
#           log lines give the candidates fitted and the blocks given back, and the steady step's
#           'pool:' line in timeline.py's summary is absent when it mapped 0 pages and waited 0 times.
#           GPT2SWAP_NORELEASE=1 also runs --recompute 2 with GKRT_SWAP_RELEASE=0 (the plan fitted
#           with blocks free at once, the behaviour before): files get _r0.
#           GPT2SWAP_NOELIDE=1 also runs --recompute 2 with GKRT_EXEC_ELIDE=0 (every compute-stream
#           marker record and wait, each wait timed by its own pair of events, as before session 13):
#           files get _e0. timeline.py's 'host:' line (the host's time per launch, the nodes the
#           device started as soon as the host queued them, the syncs between launches) and
#           'syncs:' line (records and waits queued on the compute stream, and left out) compare
#           the two; its waits name 'the host queued the node late' and 'a copy-out ending in the
#           gap' (a release schedule's wait) apart from 'nothing seen'.
#           GPT2SWAP_RELEASEDEFAULT=1 also runs --recompute 2 with GKRT_SWAP_RELEASE_ANY_FIT=0,
#           GKRT_SWAP_PIN_SMALL=0 and GKRT_SWAP_TUNE_EMPTY=0: session 13's planner (when the default policy's plan does not fit
#           with copy-outs' blocks pending, every plan falls back to the fit with blocks free at
#           once; the default keeps the other policies' plans that fit so, which pinning needs):
#           files get _ra0. The 'GKRT_SWAP_RELEASE:' log lines say which happened ('the default
#           policy's plan does not fit ...; N other policies' plans do').
#           GPT2SWAP_NOPIN=1 also runs --recompute 2 with GKRT_SWAP_PIN_SMALL=0 (the persistent tensors
#           of at most a pool page evicted and brought back like the others, as before session 14;
#           the default keeps them on the device, and small at 1/3 then chooses a plan without
#           slack that keeps the embedding): files get _pn0. Compare the 'swap plan tuned' lines
#           (policy, estimated step) and the steady step's 'pool:' line.
#           GPT2SWAP_NOEMPTY=1 also runs --recompute 2 with GKRT_SWAP_TUNE_EMPTY=0 (the release
#           schedule's refit fitted around the blocks the first runs left, as before: small at 1/3
#           then took a plan at 0.74 of the limit with 8 ms of compute waits; the default sends the
#           graph's tensors home and gives the free pages back first, the 'GKRT_SWAP_TUNE_EMPTY:'
#           log line): files get _te0.
#           GPT2SWAP_NOHOLD=1 also runs --recompute 2 with GKRT_SWAP_RELEASE_HOLD_MARKERS=0 (the
#           pool learning from its marker events which free pages the device has passed while a
#           run follows its release schedule, as before session 15: it then moved idle pages where
#           the dry run waited for the device, and small at 1/3's steady runs mapped pages before
#           the logits' gradient that the dry run did not): files get _hm0. Compare SWAPSTATS'
#           page_maps and pool_device_waits and the timeline's 'pool:' line (absent: 0 and 0).
#           GPT2SWAP_NOCLEAN=1 also runs --recompute 2 with GKRT_SWAP_RELEASE_CLEAN_START=0 (the
#           release schedule's fits start the tuned plan's first run as a steady one, as before
#           session 15, where the executor's starts with the kept tensors clean from the host: its
#           first run then left another layout than the dry run's): files get _cs0.
#           GPT2SWAP_NOPOLL=1 also runs --recompute 2 with GKRT_SWAP_RELEASE=0 and
#           GKRT_EXEC_POLL_IN_ORDER=0 (the pool polling every pending copy-out's event before every
#           allocation, as before session 13): files get _q0; set GPT2SWAP_NORELEASE=1 too for
#           the same plan fit polled in order (_r0), its side by side.
#           A swapping graph picks its plan after two timed runs (the warm node times): the
#           timed run's steps 3 and 4 carry the prediction.
#           Limited runs log at level 3: the 'swap plan tuned' line gives the chosen policy and the
#           timeline model's estimated step (with its rebuilds and waits, and the pool dry run's page
#           maps), and timeline.py prints it beside the measured step ("measured / predicted"), the
#           nodes where the measured run fell behind the model most, the rebuilds' time and the
#           waits between nodes by cause (pool page moves, copy-ins, nothing seen)
#   trace   traces of runs: first benches/trace_cost (the tracer's own cost per node on a chain of
#           256 tiny nodes, CUDA then host: "tracing adds N ns per node"), then benches/swap_chain
#           with SWAP_TRACE (per configuration, steps alternating untraced / traced: the medians
#           and traced/untraced, goal <= 1.02), the last traced step's Chrome trace in
#           $OUT/traces/*.json (open in ui.perfetto.dev) and its picture by .gpu/bin/gkrt-viz in
#           $OUT/traces/*.svg (the README's picture); gkrt-viz prints per trace "compute slices
#           cover F of the measured call (U of W ms ...)" (slice union / the run's host interval,
#           inside the step swap_chain measured for that trace: "of a step measured X ms") and the
#           stacked memory's peak against the allocated bytes' peak (it must not exceed it)
#   snapshot  memory snapshots: benches/history_cost (ns per recorded history event, goal <= 100),
#           then benches/swap_chain with SWAP_SNAPSHOT (each swapping configuration's snapshot,
#           history on, in $OUT/snapshots/) checked and drawn by torch.cuda._memory_viz
#           (python/gpu_snapshot_check.py: block list against gkrt_stats, segsum, trace, HTML plots)
#   sanitize  every C test and the demo under compute-sanitizer with GKRT_DEVICE=cuda, once per
#           tool (memcheck, racecheck, synccheck, initcheck; SANITIZE_TOOLS picks), SANITIZE_JOBS
#           (4) programs at a time: each must report "ERROR SUMMARY: 0 errors" and pass. neg_*
#           tests fail CUDA calls on purpose (device code that cannot load): they run and their
#           errors are listed, but not counted. leak_cycles runs SANITIZE_LEAK_CYCLES (12) of its
#           60 cycles (every module load is instrumented). One line per tool: programs run,
#           programs with errors, total errors; logs in $OUT/sanitize/. Exit status 1 when any
#           counted program had an error, failed or timed out (SANITIZE_TIMEOUT, 300 s each).
#           SANITIZE_RUST=1 also runs the Rust GPU tests under memcheck, less gpu_neg_* and
#           gpu_alone_* (which fail on purpose) and gpu_hot_path_overhead (a timing loop).
#   nccl    NCCL on the CUDA backend (issue 15): first api_comm and int_collectives with no
#           libnccl.so on the loader's path (they must print "NCCL missing", the UNSUPPORTED
#           status naming the names searched; not possible when the system's own path has a
#           libnccl.so — said so), then with libnccl (found in python's nvidia-nccl package,
#           torch's site-packages, or /usr/lib; a libnccl.so link to libnccl.so.2 is made in
#           /tmp/gkrt-nccl and put on LD_LIBRARY_PATH, since cudarc does not try the name
#           libnccl.so.2): every collective on one rank (two when a second GPU opens), two ranks on
#           GPU 0 refused within the timeout, int_collective_swap (one rank's data-parallel step
#           at half its working set: swaps, bit-identical to the unlimited run); the Rust gpu_nccl_* tests (one rank's all-reduce
#           with every operator, a join alone timing out, abort, a collective held past its
#           timeout failing the stream's sync, a planned graph with an all-reduce captured and
#           replayed: gpu_nccl_planned_graph_captures_its_all_reduce); then
#           benches/collective_overhead.c (a graph's all-reduce node against raw ncclAllReduce
#           through one communicator, 4 KiB..64 MiB: gkrt_us, raw_us, diff_us, ratio; then the
#           "planned (captured and replayed)" table: planned_us of the replayed graph against raw,
#           and captures, which must be 1 per size). NCCL_NVLS_ENABLE=0 is exported. Logs
#           $OUT/nccl*.log.
#   dp      examples_c/data_parallel/ (built here): 4 threads on the host backend, then on CUDA
#           with NCCL 1, 2 and all GPUs' processes (--rank R --nranks N --id-file, device = rank),
#           and 2 threads on 2 GPUs. Each must exit 0, its last line "OK" (ranks bit-identical,
#           within tolerance of one runtime on the whole batch); rank 0's loss per step and max
#           |diff| are printed. Logs in $OUT/dp/.
#   mgpu    issue 16 on every count of visible GPUs in 1 2 4 8, one process per GPU (rank = device),
#           NCCL_NVLS_ENABLE=0: benches/collective_bandwidth.c (all-reduce, all-gather,
#           reduce-scatter and a fused all-reduce as gkrt nodes against plain NCCL through the same
#           communicator, 1 MiB..MGPU_MAX_MIB (1024), busbw and ratio = plain_us / gkrt_us) with
#           NCCL_LOCAL_REGISTER=1 and =0; the dp example on a 1024-4096-4096-4096-1024 MLP at
#           MGPU_PER_RANK (256) rows per rank (scaling efficiency; exposed communication from each
#           rank's trace; the same at half of DDP's peak memory: step ratio, identical training)
#           beside benches/ddp_compare.py (PyTorch DDP, the same network and weights); a rank
#           killed mid-run (all GPUs; skipped, and said not run, with one). MGPU_PARTS="bw dp
#           fault" picks parts. scripts/gpu/mgpu.sh has the details; logs and summary.md (ending
#           with the figures for BENCHMARKS.md) in $OUT/mgpu/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# RUN_ARCHIVE=1: every mode writes into a temporary folder, packed into $OUT/run.tgz when the
# script exits (the device tool brings back at most 8 files from $OUT; the pool, hostgpu and
# heldlock modes alone write more).
if [ -n "${RUN_ARCHIVE:-}" ]; then
  ARCHIVE_TO=$OUT
  OUT=$(mktemp -d)
  trap 'tar czf "$ARCHIVE_TO/run.tgz" -C "$OUT" . && rm -rf "$OUT"' EXIT
fi
# GKRT_GPU_LIB: another staged library folder to run the benches against (a side-by-side
# comparison with an earlier commit's library, staged there by hand).
export LD_LIBRARY_PATH="${GKRT_GPU_LIB:-$PWD/.gpu/lib}:${LD_LIBRARY_PATH:-}"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(tests demo bench)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

run_tests() {
  local pass=0 fail=0 failed=()
  for t in .gpu/tests/*; do
    echo "=== $(basename "$t")" >>"$OUT/tests.log"
    if GKRT_DEVICE=cuda timeout 300 "$t" >>"$OUT/tests.log" 2>&1; then
      pass=$((pass + 1))
    else
      fail=$((fail + 1)); failed+=("$(basename "$t")")
    fi
  done
  echo "C tests on CUDA: $pass passed, $fail failed ${failed[*]:-}"
  for f in "${failed[@]:-}"; do [ -n "$f" ] && sed -n "/^=== $f\$/,/^=== /p" "$OUT/tests.log" | tail -n 20; done
  if [ -x .gpu/bin/gkrt_unit_tests ]; then
    # gpu_nccl_* need libnccl on the loader's path: the nccl mode runs them.
    .gpu/bin/gkrt_unit_tests --ignored --test-threads=1 device::cuda --skip gpu_nccl_ >"$OUT/rust_gpu_tests.log" 2>&1
    # Above the device layer: rebinding a replayed graph (runtime/graph/binding.rs).
    .gpu/bin/gkrt_unit_tests --ignored --test-threads=1 runtime::graph::binding::gpu_tests >>"$OUT/rust_gpu_tests.log" 2>&1
    echo "Rust GPU tests: $(grep -E '^test result' "$OUT/rust_gpu_tests.log" | tr '\n' ' ' || echo 'no result line')"
    grep -E 'FAILED|panicked' "$OUT/rust_gpu_tests.log" | head -20
    # The test that faults the context on purpose runs alone, in its own process.
    GKRT_CUDA_POISON_TEST=1 .gpu/bin/gkrt_unit_tests --ignored --exact device::cuda::tests::fault::gpu_alone_kernel_fault_surfaces_at_sync \
      >>"$OUT/rust_gpu_tests.log" 2>&1
    echo "kernel fault surfaces at synchronisation: $(grep -E '^test .*gpu_alone_kernel_fault_surfaces_at_sync' "$OUT/rust_gpu_tests.log" | tail -n 1)"
  fi
  # A program that asks for CUDA where no device is visible gets a clear error, not a crash.
  local msg
  msg=$(CUDA_VISIBLE_DEVICES= GKRT_DEVICE=cuda .gpu/bin/gkrt_demo 2>&1)
  echo "no visible device, GKRT_DEVICE=cuda: exit $? — $(grep -m1 -i 'failed' <<<"$msg")"
}

run_demo() {
  GKRT_DEVICE=cuda .gpu/bin/gkrt_demo 2>&1 | tee "$OUT/demo.log"
  local host
  host=$(GKRT_DEVICE=host .gpu/bin/gkrt_demo 2>&1)
  if diff <(grep -E '^(y|g)\[' "$OUT/demo.log") <(grep -E '^(y|g)\[' <<<"$host") >/dev/null; then
    echo "demo: CUDA and host backends print the same results"
  else
    echo "demo: CUDA and host results DIFFER"
  fi
}

run_bench() {
  local b=/tmp/gkrt-bench
  mkdir -p "$b"
  "$CUDA_HOME/bin/nvcc" -ptx -arch=sm_90 benches/chain_kernel.cu -o "$b/chain_kernel.ptx" || return
  cc -O2 benches/launch_overhead.c -Iinclude -I"$CUDA_HOME/include" -L.gpu/lib -lgkrt \
    -L"$CUDA_HOME/lib64/stubs" -lcuda -lm -o "$b/launch_overhead" || return
  "$b/launch_overhead" "$b/chain_kernel.ptx" 10000 30 2>&1 | tee "$OUT/bench_launch_overhead.log"
}

run_swap() {
  local b=/tmp/gkrt-bench
  mkdir -p "$b"
  cc -O2 benches/swap_chain.c -Iinclude -I"$CUDA_HOME/include" -L.gpu/lib -lgkrt -L"$CUDA_HOME/lib64" -lcublas \
    -L"$CUDA_HOME/lib64/stubs" -lcuda -o "$b/swap_chain" || return
  # The training step twice: its ReLUs declared recomputable (the default) and not
  # (SWAP_RECOMPUTE=0: every swapped tensor copied), then the forward chain.
  for args in "${SWAP_ARGS:-8192 8192 16 5 train}" "copy-only ${SWAP_ARGS:-8192 8192 16 5 train}" \
      "${SWAP_FWD_ARGS:-8192 16384 16 5 forward}"; do
    local recompute=1
    if [ "${args%% *}" = copy-only ]; then recompute=0; args=${args#copy-only }; fi
    # SWAP_TIMELINE=1: every run (dynamic mode) is timed with events and summarised (a
    # diagnostic: the events add a little to each step, the bound's too).
    local tl="$OUT/swap_timeline_${args##* }_recompute$recompute.csv"
    [ "${SWAP_TIMELINE:-0}" = 1 ] && export GKRT_SWAP_TIMELINE="$tl"
    SWAP_RECOMPUTE=$recompute LD_LIBRARY_PATH="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" "$b/swap_chain" $args 2>&1 |
      grep -v '^\[gkrt INFO\] gkrt runtime' | tee -a "$OUT/bench_swap.log"
    unset GKRT_SWAP_TIMELINE
    [ -f "$tl" ] && python3 scripts/gpu/timeline.py "$tl" | tee -a "$OUT/bench_swap.log"
  done
}

# The pool against PyTorch's caching allocator and cuMemAllocAsync (BENCHMARKS.md, section 3): builds
# the benches, replays the shared traces (staged in .gpu/pool/), the recorded ones in benches/traces/
# and the synthetic ones (one table, each trace on allocators of its own), runs the
# micro-benchmarks and the C test of gkrt_malloc on CUDA. Tables go to stdout and $OUT/pool_*.
run_pool() {
  local b=/tmp/gkrt-pool
  bash benches/build_pool_benches.sh "$b" 2>&1 | tee "$OUT/pool_build.log" || return
  GKRT_DEVICE=cuda timeout 120 .gpu/tests/api_raw_alloc 2>&1 | tail -n 3
  python3 benches/gen_traces.py "$b/traces" >/dev/null
  # Every trace in one table, each on allocators of its own: the shared ones (staged in
  # .gpu/pool/), the project's recorded ones (benches/traces/, traces_heldout/, traces_host/,
  # traces_hostgpu/) and the synthetic ones. POOL_ONLY narrows the allocators (trace_replay --only;
  # default: all, with the variants, on a card of 100 GB or more). A trace's allocators are all
  # alive side by side: every variant's copy of the shared traces (5–6 GB live each) does not fit
  # an 80 GB card, so there the variants are left out unless POOL_ONLY names them (session 45:
  # gkrt_malloc ran out of memory at 3.7 GB reserved).
  local mib only=${POOL_ONLY:-}
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  if [ -z "$only" ] && [ "${mib:-0}" -gt 0 ] && [ "$mib" -lt 100000 ]; then
    only=gkrt,entry,async,torch
    echo "# $mib MiB on the card: allocators $only only (POOL_ONLY to choose)"
  fi
  local traces
  traces=$(shopt -s nullglob; echo .gpu/pool/*.trace.gz benches/traces/*.trace.gz "$b"/traces/*.trace.gz \
    "$OUT"/workload_traces/*.trace.gz benches/traces_heldout/*.trace.gz "$OUT"/heldout_traces/*.trace.gz \
    benches/traces_host/*.trace.gz benches/traces_hostgpu/*.trace.gz "$OUT"/hostgpu_traces/*.trace.gz)
  # POOL_TRACES (globs, space-separated, evaluated here so they may name $OUT): those traces only.
  [ -z "${POOL_TRACES:-}" ] || traces=$(shopt -s nullglob; eval echo "$POOL_TRACES")
  [ -n "$(ls .gpu/pool/*.trace.gz 2>/dev/null)" ] || echo "# no shared traces staged in .gpu/pool/ (copy ../shared/traces/*.trace.gz there)"
  # shellcheck disable=SC2086  # trace paths have no spaces
  timeout 560 "$b/trace_replay" --passes "${POOL_PASSES:-30}" ${only:+--only "$only"} \
    $traces 2>&1 | tee "$OUT/pool_replay.md"
  timeout 120 "$b/pool_micro" 2>&1 | tee "$OUT/pool_micro.md"
}

# The held-out programs' traces (benches/heldout_workloads.py), recorded afresh on this machine.
run_heldout() {
  mkdir -p "$OUT/heldout_traces"
  timeout 500 python3 benches/record_traces.py "$OUT/heldout_traces" --heldout ${HELDOUT_ONLY:+--only "$HELDOUT_ONLY"} \
    2>"$OUT/heldout.err" | tee "$OUT/heldout.md"
}

# The host programs' traces (benches/host_workloads.py) recorded on this machine's GPU: the same
# programs as benches/traces_host/, with the GPU's kernels, workspaces and block sizes.
run_hostgpu() {
  mkdir -p "$OUT/hostgpu_traces"
  timeout 560 python3 benches/record_traces.py "$OUT/hostgpu_traces" --host ${HOSTGPU_ONLY:+--only "$HOSTGPU_ONLY"} \
    2>"$OUT/hostgpu.err" | tee "$OUT/hostgpu.md"
}

# GPT-2 and ResNet-50 training steps in PyTorch on PyTorch's allocator and on gkrt's, in lockstep
# (benches/torch_workloads.py: two resident processes taking turns step by step, both pinned to the
# same two CPUs; GPT-2's step is bound by the host), and PyTorch against itself as the control that
# shows the method's own spread. WORKLOAD_PAIRS (default 8) pairs of processes for GPT-2.
run_workloads() {
  local w=(python3 benches/torch_workloads.py --lib .gpu/lib/libgkrt.so --cpus 4,5 --steps 40 --warmup 5)
  local n=${WORKLOAD_PAIRS:-8}
  export PYTHONUNBUFFERED=1
  # First the whole run's allocation sequence of each workload, on PyTorch's allocator from
  # model.to(cuda) on (the lockstep's peaks are set in its first steps): $OUT/workload_traces/,
  # replayed by the pool mode when it runs after this one in the same call.
  mkdir -p "$OUT/workload_traces"
  for m in gpt2 resnet50; do
    python3 benches/torch_workloads.py --model "$m" --steps 5 --warmup 5 \
      --record-trace "$OUT/workload_traces/${m}_run_train.trace.gz" 2>>"$OUT/workloads.err" \
      | tee -a "$OUT/workload_traces/summary.jsonl"
  done
  "${w[@]}" --model gpt2 --lockstep "$n" --profile 2>>"$OUT/workloads.err" >"$OUT/workload_gpt2.jsonl"
  "${w[@]}" --model gpt2 --lockstep $(((n + 1) / 2)) --against torch 2>>"$OUT/workloads.err" >"$OUT/workload_gpt2_control.jsonl"
  "${w[@]}" --model resnet50 --lockstep 2 2>>"$OUT/workloads.err" >"$OUT/workload_resnet50.jsonl"
  # WORKLOAD_GPT2_VARIANTS: more gkrt configurations against PyTorch, WORKLOAD_VARIANT_PAIRS
  # (default 4: both orders twice) pairs each (torch_workloads.py's allocator specs, e.g.
  # gkrt:GKRT_POOL_RECYCLE_TIME_PERMILLE=1000).
  local extra=() i=0 v
  for v in ${WORKLOAD_GPT2_VARIANTS:-}; do
    i=$((i + 1))
    "${w[@]}" --model gpt2 --lockstep "${WORKLOAD_VARIANT_PAIRS:-4}" --against "$v" 2>>"$OUT/workloads.err" \
      >"$OUT/workload_gpt2_variant$i.jsonl"
    extra+=("$OUT/workload_gpt2_variant$i.jsonl")
  done
  python3 benches/torch_workloads.py --report "$OUT"/workload_gpt2.jsonl "$OUT"/workload_gpt2_control.jsonl \
    "$OUT"/workload_resnet50.jsonl "${extra[@]}" | tee "$OUT/workloads.md"
}

# The compute-sanitizer of the toolkit (or COMPUTE_SANITIZER, or the one on PATH).
find_compute_sanitizer() {
  local c
  for c in "${COMPUTE_SANITIZER:-}" "$CUDA_HOME/bin/compute-sanitizer" \
      "$CUDA_HOME/compute-sanitizer/compute-sanitizer" "$(command -v compute-sanitizer 2>/dev/null)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

# The held-out (or host) programs on each allocator in lockstep (the lockstep goal on programs the
# pool was not tuned on). One program failing (its error is in heldlock.err) does not stop the others.
run_heldlock() {
  local names n set=${HELDLOCK_SET:-heldout} dict
  case $set in
    heldout) dict="from heldout_workloads import HELDOUT as P" ;;
    host) dict="from host_workloads import HOST as P" ;;
    *) echo "heldlock: HELDLOCK_SET=$set is not heldout or host" >&2; return 1 ;;
  esac
  names=${HELDLOCK_ONLY:-$(cd benches && python3 -c "$dict; print(','.join(P))")}
  mkdir -p "$OUT/heldlock"
  export PYTHONUNBUFFERED=1
  # A child stuck in one step prints its stacks into heldlock.err and ends before the program's
  # timeout kills the parent alone (benches/torch_workloads.py, LockstepChild).
  export LOCKSTEP_COMMAND_LIMIT=${LOCKSTEP_COMMAND_LIMIT:-$(( ${HELDLOCK_TIMEOUT:-180} / 2 ))}
  for n in ${names//,/ }; do
    echo "heldlock: $set:$n" >>"$OUT/heldlock.err"
    timeout "${HELDLOCK_TIMEOUT:-180}" python3 benches/torch_workloads.py --lib .gpu/lib/libgkrt.so --cpus 4,5 \
      --model "$set:$n" --lockstep "${HELDLOCK_PAIRS:-1}" --steps "${HELDLOCK_STEPS:-12}" \
      --warmup "${HELDLOCK_WARMUP:-3}" >"$OUT/heldlock/$n.jsonl" 2>>"$OUT/heldlock.err" \
      || echo "heldlock: $n exited with $?" >>"$OUT/heldlock.err"
  done
  python3 benches/torch_workloads.py --report "$OUT"/heldlock/*.jsonl | tee "$OUT/heldlock.md"
}

# What PyTorch programs ask of gkrt's pool, as its memory history saw it (for the host replay).
run_livetrace() {
  local models m
  models=${LIVETRACE_MODELS:-gpt2,$(cd benches && python3 -c 'from heldout_workloads import HELDOUT; print(",".join("heldout:" + n for n in HELDOUT))')}
  mkdir -p "$OUT/live_traces"
  for m in ${models//,/ }; do
    (cd benches && timeout "${LIVETRACE_TIMEOUT:-180}" python3 gkrt_live_trace.py --lib ../.gpu/lib/libgkrt.so \
      --model "$m" --steps "${LIVETRACE_STEPS:-15}" --out "$OUT/live_traces/${m#*:}.trace.gz") \
      >>"$OUT/live_traces.jsonl" 2>>"$OUT/live_traces.err" || echo "livetrace: $m exited with $?" >>"$OUT/live_traces.err"
  done
  cat "$OUT/live_traces.jsonl"
}

# One program under one tool: writes "<exit status> <errors, or - without a summary line>
# <seconds>" to $3.result beside the log $3.log.
sanitize_one() {
  local cs=$1 tool=$2 base=$3 prog=$4 start=$SECONDS rc n
  local args=(--tool "$tool" --error-exitcode 99 --print-limit 100)
  [ "$tool" = memcheck ] && args+=(--leak-check no)
  GKRT_DEVICE=cuda GKRT_TEST_LEAK_CYCLES="${SANITIZE_LEAK_CYCLES:-12}" GKRT_TEST_WATCHDOG_S=240 \
    timeout "${SANITIZE_TIMEOUT:-300}" "$cs" "${args[@]}" "$prog" >"$base.log" 2>&1
  rc=$?
  n=$(grep -aoE 'ERROR SUMMARY: [0-9]+ error' "$base.log" | tail -n 1 | grep -oE '[0-9]+')
  # racecheck sums up as "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
  [ -z "$n" ] && n=$(grep -aoE 'RACECHECK SUMMARY: .*\(([0-9]+) errors?' "$base.log" | tail -n 1 | grep -oE '\(([0-9]+)' | tr -d '(')
  # A program that makes no CUDA call at all (the header tests) has nothing to check.
  if [ -z "$n" ] && grep -aq 'terminated before first instrumented API call' "$base.log"; then
    n=0; rc=0
  fi
  echo "$rc ${n:--} $((SECONDS - start))" >"$base.result"
}

# Programs whose CUDA calls fail on purpose, whose sanitizer errors are listed, not counted: neg_*
# (device code that does not load) and api_limits (asks the device for more than it has, through
# a runtime without a memory limit, so the driver's own cuMemAlloc says out of memory).
on_purpose() {
  [[ $1 == neg_* || $1 == api_limits ]]
}

run_sanitize() {
  local cs
  if ! cs=$(find_compute_sanitizer); then
    echo "sanitize: no compute-sanitizer (looked in \$CUDA_HOME/bin, \$CUDA_HOME/compute-sanitizer, PATH; set COMPUTE_SANITIZER)"
    return 1
  fi
  echo "sanitize: $("$cs" --version | grep -m1 -iE 'version' || echo "$cs")"
  local dir="$OUT/sanitize" progs=() p
  rm -rf "$dir"; mkdir -p "$dir"
  for p in .gpu/tests/* .gpu/bin/gkrt_demo; do [ -f "$p" ] && [ -x "$p" ] && progs+=("$p"); done
  local tools=(${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}) jobs=${SANITIZE_JOBS:-4} tool
  local status=0 t0=$SECONDS
  for tool in "${tools[@]}"; do
    for p in "${progs[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
      sanitize_one "$cs" "$tool" "$dir/$tool.$(basename "$p")" "$p" &
    done
    wait
    local run=0 with=0 total=0 failed=() on_purpose=() rc n secs name
    for p in "${progs[@]}"; do
      name=$(basename "$p")
      rc=lost n=- secs=0
      [ -f "$dir/$tool.$name.result" ] && read -r rc n secs <"$dir/$tool.$name.result"
      if on_purpose "$name"; then
        on_purpose+=("$name:${n}")
        [ "$rc" = 0 ] || [ "$rc" = 99 ] || failed+=("$name(exit $rc)")
        continue
      fi
      run=$((run + 1))
      if [ "$n" = - ]; then
        failed+=("$name(exit $rc, no ERROR SUMMARY$([ "$rc" = 124 ] && echo ", timed out after ${secs}s"))")
        continue
      fi
      if [ "$n" -gt 0 ]; then with=$((with + 1)); total=$((total + n)); fi
      if [ "$rc" != 0 ] && [ "$rc" != 99 ]; then failed+=("$name(exit $rc)"); fi
    done
    echo "sanitize $tool: $run programs run, $with with errors, $total errors" \
      "(neg_* and api_limits, errors on purpose, not counted: ${on_purpose[*]:-none})${failed[*]:+; FAILED: ${failed[*]}}"
    if [ "$with" -gt 0 ]; then
      for p in "${progs[@]}"; do
        name=$(basename "$p")
        on_purpose "$name" && continue
        n=-
        [ -f "$dir/$tool.$name.result" ] && read -r rc n secs <"$dir/$tool.$name.result"
        [ "$n" != - ] && [ "$n" -gt 0 ] && echo "  $name: $n errors, first: $(grep -aE '^========= [A-Z]' "$dir/$tool.$name.log" |
          grep -av -m1 -E 'COMPUTE-SANITIZER|ERROR SUMMARY' | cut -c1-160)"
      done
    fi
    if [ "$with" -gt 0 ] || [ ${#failed[@]} -gt 0 ]; then status=1; fi
  done
  echo "sanitize: ${#tools[@]} tools x ${#progs[@]} programs in $((SECONDS - t0)) s (leak_cycles: ${SANITIZE_LEAK_CYCLES:-12} cycles)"
  if [ "${SANITIZE_RUST:-0}" = 1 ] && [ -x .gpu/bin/gkrt_unit_tests ]; then
    timeout 600 "$cs" --tool memcheck --error-exitcode 99 --print-limit 100 --leak-check no \
      .gpu/bin/gkrt_unit_tests --ignored --test-threads=1 device::cuda \
      --skip gpu_neg_ --skip gpu_alone_ --skip gpu_hot_path --skip gpu_pool_with_aliases >"$dir/memcheck.rust_gpu_tests.log" 2>&1
    echo "sanitize memcheck, Rust GPU tests: exit $?, $(grep -aoE 'ERROR SUMMARY: [0-9]+ errors?' "$dir/memcheck.rust_gpu_tests.log" | tail -n 1); $(grep -aE '^test result' "$dir/memcheck.rust_gpu_tests.log" || echo 'no result line')"
  fi
  return $status
}

# What CUDA's virtual-memory calls cost by allocation size: benches/vmm_cost.c.
run_vmm() {
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  cc -O2 -Iinclude -I"$cuda/include" benches/vmm_cost.c -L"$cuda/lib64/stubs" -lcuda -o /tmp/vmm_cost || return
  timeout 300 /tmp/vmm_cost "${VMM_REPS:-64}" 2>&1 | tee "$OUT/vmm_cost.md"
}

# gkrt inside a host program: benches/host_integration.c, then the PyTorch binding check.
run_hostint() {
  local b=/tmp/gkrt-bench
  mkdir -p "$b"
  "$CUDA_HOME/bin/nvcc" -ptx -arch=sm_90 benches/chain_kernel.cu -o "$b/chain_kernel.ptx" || return
  cc -O2 benches/host_integration.c -Iinclude -I"$CUDA_HOME/include" -L.gpu/lib -lgkrt \
    -L"$CUDA_HOME/lib64/stubs" -lcuda -lpthread -o "$b/host_integration" || return
  "$b/host_integration" "$b/chain_kernel.ptx" ${HOSTINT_WHAT:-} 2>&1 | tee "$OUT/bench_host_integration.log"
  PYTHONPATH="$PWD/python" GKRT_LIBRARY="${GKRT_GPU_LIB:-$PWD/.gpu/lib}/libgkrt.so" \
    timeout 300 python3 python/gpu_bind_check.py 2>&1 | tee "$OUT/python_bind.log"
}

# The folder of a libnccl.so.2 (python's nvidia-nccl / torch's copy, or the system's).
find_nccl() {
  local d
  d=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then echo "$d"; return 0; fi
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/cuda/lib64; do
    for c in "$d/nvidia/nccl/lib" "$d"; do
      if [ -e "$c/libnccl.so.2" ]; then echo "$c"; return 0; fi
    done
  done
  return 1
}

# Puts libnccl on the loader's path as libnccl.so (the name cudarc looks for) and sets $lib to
# its folder.
use_nccl() {
  if ! lib=$(find_nccl); then
    echo "nccl: no libnccl.so.2 found (python nvidia-nccl, site-packages, /usr/lib)"; return 1
  fi
  mkdir -p /tmp/gkrt-nccl
  ln -sf "$lib/libnccl.so.2" /tmp/gkrt-nccl/libnccl.so
  export LD_LIBRARY_PATH="/tmp/gkrt-nccl:$lib:$LD_LIBRARY_PATH"
}

# The data-parallel example (the "dp" mode above): each run must exit 0 with "OK" last.
run_dp() {
  local b=/tmp/gkrt-dp o="$OUT/dp" ok=1 n r rc
  mkdir -p "$b" "$o"
  cc -O2 -ffp-contract=off examples_c/data_parallel/*.c -Iinclude -L.gpu/lib -lgkrt -lm -lpthread -ldl \
    -o "$b/gkrt_data_parallel" || return 1
  use_nccl || return 1
  GKRT_DEVICE=host timeout 300 "$b/gkrt_data_parallel" --ranks 4 >"$o/host_threads4.log" 2>&1
  rc=$?; echo "dp: host backend, 4 threads: exit $rc, last line: $(tail -n 1 "$o/host_threads4.log")"
  [ $rc -eq 0 ] || ok=0
  local gpus
  gpus=$(nvidia-smi -L | wc -l)
  # Its products call cuBLAS, opened with dlopen: CUDA's lib64 last, after the NCCL found above.
  local cublas_path="$LD_LIBRARY_PATH:$CUDA_HOME/lib64"
  export NCCL_NVLS_ENABLE=0
  for n in $(printf '%s\n' 1 2 "$gpus" | sort -nu); do
    [ "$n" -le "$gpus" ] || continue
    rm -f "$b/id$n"
    local pids=()
    for ((r = 0; r < n; r++)); do
      LD_LIBRARY_PATH="$cublas_path" GKRT_DEVICE=cuda timeout 300 "$b/gkrt_data_parallel" --rank $r --nranks $n --id-file "$b/id$n" \
        >"$o/cuda_procs${n}_rank$r.log" 2>&1 &
      pids+=($!)
    done
    for ((r = 0; r < n; r++)); do
      wait "${pids[$r]}"; rc=$?
      echo "dp: CUDA, $n processes, rank $r: exit $rc, last line: $(tail -n 1 "$o/cuda_procs${n}_rank$r.log")"
      [ $rc -eq 0 ] || ok=0
    done
    grep -E '^(step|rank)' "$o/cuda_procs${n}_rank0.log"
  done
  if [ "$gpus" -ge 2 ]; then
    LD_LIBRARY_PATH="$cublas_path" GKRT_DEVICE=cuda timeout 300 "$b/gkrt_data_parallel" --ranks 2 >"$o/cuda_threads2.log" 2>&1
    rc=$?; echo "dp: CUDA, 2 threads: exit $rc, last line: $(tail -n 1 "$o/cuda_threads2.log")"
    [ $rc -eq 0 ] || ok=0
  fi
  [ $ok -eq 1 ]
}

# NCCL communicators and collectives on the GPU (the "nccl" mode above).
run_nccl() {
  export NCCL_NVLS_ENABLE=0
  local log="$OUT/nccl.log" t ok=1
  : >"$log"
  echo "--- without libnccl" | tee -a "$log"
  local on_path=""
  for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/libnccl.so" ] && on_path="$d"; done
  if ldconfig -p 2>/dev/null | grep -qE 'libnccl\.so( |$)' || [ -n "$on_path" ]; then
    echo "nccl: no-NCCL check not possible: the system's library path has a libnccl.so" | tee -a "$log"
  else
    for t in api_comm int_collectives; do
      out=$(GKRT_DEVICE=cuda timeout 120 ".gpu/tests/$t" 2>&1); rc=$?
      echo "$out" >>"$log"
      if [ $rc -eq 0 ] && grep -q "NCCL missing" <<<"$out"; then
        echo "nccl: $t without libnccl: OK ($(grep -m1 'NCCL missing' <<<"$out" | cut -c1-200)...)"
      else
        echo "nccl: $t without libnccl: FAILED (exit $rc)"; ok=0
      fi
    done
  fi
  local lib
  use_nccl || return 1
  echo "--- with $lib/libnccl.so.2" | tee -a "$log"
  for t in api_comm int_collectives int_collective_swap; do
    out=$(GKRT_DEVICE=cuda timeout 300 ".gpu/tests/$t" 2>&1); rc=$?
    echo "$out" >>"$log"
    grep -E "^(api_comm|int_collectives|int_collective_swap): " <<<"$out" | grep -v 'NCCL missing' | cut -c1-300
    if [ $rc -ne 0 ] || grep -q "NCCL missing" <<<"$out"; then
      echo "nccl: $t with libnccl: FAILED (exit $rc)"; ok=0
      tail -n 20 <<<"$out"
    else
      echo "nccl: $t with libnccl: OK"
    fi
  done
  if [ -x .gpu/bin/gkrt_unit_tests ]; then
    timeout 300 .gpu/bin/gkrt_unit_tests --ignored --test-threads=1 gpu_nccl_ >"$OUT/nccl_rust_tests.log" 2>&1
    echo "nccl: Rust GPU tests: $(grep -E '^test result' "$OUT/nccl_rust_tests.log" || echo 'no result line (timed out?)')"
    grep -E '^test .*(ok|FAILED)$' "$OUT/nccl_rust_tests.log"
    grep -qE '^test result: ok' "$OUT/nccl_rust_tests.log" || ok=0
  fi
  local b=/tmp/gkrt-bench
  mkdir -p "$b"
  cc -O2 benches/collective_overhead.c -Iinclude -I"$CUDA_HOME/include" -L.gpu/lib -lgkrt \
    -L"$CUDA_HOME/lib64/stubs" -lcuda -ldl -o "$b/collective_overhead" || return 1
  timeout 300 "$b/collective_overhead" ${NCCL_BENCH_REPS:-200} 2>&1 | tee "$OUT/nccl_bench.log"
  [ $ok -eq 1 ]
}

# GPT-2 training (examples_c/gpt2/) with gkrt beside the same network in PyTorch (the "gpt2" mode above).
run_gpt2() {
  local b=/tmp/gkrt-gpt2 o="$OUT/gpt2" dt=${GPT2_DTYPE:-f32}
  [ "$dt" = f32 ] || o="$OUT/gpt2_$dt"
  mkdir -p "$b" "$o"
  cc -O2 -ffp-contract=off examples_c/gpt2/*.c -Iinclude -L.gpu/lib -lgkrt -lm -ldl -o "$b/gkrt_gpt2" || return
  # gkrt_gpt2 opens libcublas with dlopen.
  local ld="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" steps=${GPT2_STEPS:-6}
  local width="--channels 768 --heads 12 --seq 512 --batch 8 --vocab 50304"
  local -A size=([small]="${GPT2_SMALL:---layers 12 $width}"
    [medium]="${GPT2_MEDIUM:---layers 24 --channels 1024 --heads 16 --seq 512 --batch 8 --vocab 50304}")
  # The host backend is the reference: the program's default small model, the same weights and
  # batch, on both backends; the loss per step side by side ($o/reference.txt).
  echo "--- gpt2 $dt: host backend (the reference) against CUDA, the default small model"
  GKRT_DEVICE=host timeout 180 "$b/gkrt_gpt2" --steps 10 --lr 1e-3 --dtype "$dt" >"$o/reference_host.log" 2>&1
  LD_LIBRARY_PATH=$ld GKRT_DEVICE=cuda timeout 180 "$b/gkrt_gpt2" --steps 10 --lr 1e-3 --dtype "$dt" \
    >"$o/reference_cuda.log" 2>&1
  python3 -c 'import re, sys
l = [[float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", open(f).read(), re.M)] for f in sys.argv[1:]]
for i, (h, c) in enumerate(zip(*l)): print(f"step {i + 1}: host {h:.6f} cuda {c:.6f} diff {abs(h - c):.2e}")
print("max relative loss difference, CUDA against the host backend: %.2e over %d steps" %
      (max([abs(h - c) / abs(h) for h, c in zip(*l)] or [float("nan")]), min(map(len, l))))' \
    "$o/reference_host.log" "$o/reference_cuda.log" | tee "$o/reference.txt" | tail -n 1
  for name in small medium; do
    echo "--- gpt2 $name: ${size[$name]}"
    LD_LIBRARY_PATH=$ld GKRT_DEVICE=cuda timeout 180 "$b/gkrt_gpt2" ${size[$name]} --steps "$steps" --recompute 1 --lr 1e-3 \
      --dtype "$dt" --dump-weights "$b/$name.bin" >"$o/${name}_gkrt.log" 2>&1
    tail -n 1 "$o/${name}_gkrt.log"
    for frac in 0.5 0.333; do
      LD_LIBRARY_PATH=$ld GKRT_DEVICE=cuda timeout 180 "$b/gkrt_gpt2" ${size[$name]} --steps "$steps" --lr 1e-3 \
        --dtype "$dt" --recompute "${GPT2_RECOMPUTE:-1}" --limit-frac "$frac" >"$o/${name}_gkrt_limit$frac.log" 2>&1
      tail -n 1 "$o/${name}_gkrt_limit$frac.log"
    done
    timeout 300 python3 benches/gpt2_torch.py --weights "$b/$name.bin" --steps "$steps" --dtype "$dt" \
      --gkrt-log "$o/${name}_gkrt.log" >"$o/${name}_torch.log" 2>&1
    grep -E '^loss step|Error' "$o/${name}_torch.log" | tail -n 12
  done
  python3 benches/gpt2_torch.py --report "$o"/small_*.log "$o"/medium_*.log | tee "$o/summary.md"
}

# The largest GPT-2 depth gkrt and each PyTorch variant train within one memory limit (the
# "gpt2depth" mode above; its own mode because with the sizes it outruns one device call).
run_gpt2depth() {
  local b=/tmp/gkrt-gpt2 o="$OUT/gpt2depth" dt=${GPT2_DTYPE:-f32}
  [ "$dt" = f32 ] || o="$OUT/gpt2depth_$dt"
  mkdir -p "$b" "$o"
  cc -O2 -ffp-contract=off examples_c/gpt2/*.c -Iinclude -L.gpu/lib -lgkrt -lm -ldl -o "$b/gkrt_gpt2" || return
  local ld="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" steps=${GPT2_STEPS:-3}
  local limit=${GPT2_LIMIT:-8GiB} depths=${GPT2_DEPTHS:-6,12,18,24,36,48,64,96}
  local width=${GPT2_DEPTH_WIDTH:---channels 768 --heads 12 --seq 512 --batch 8 --vocab 50304}
  echo "--- largest depth within $limit (depths $depths, $width)"
  for d in ${depths//,/ }; do
    LD_LIBRARY_PATH=$ld GKRT_DEVICE=cuda timeout 180 "$b/gkrt_gpt2" --layers "$d" $width --steps "$steps" \
      --recompute "${GPT2_RECOMPUTE:-2}" --dtype "$dt" --limit "$limit" >>"$o/depth_gkrt.log" 2>&1 ||
      { echo "gkrt: depth $d failed"; break; }
    tail -n 1 "$o/depth_gkrt.log"
  done
  timeout 300 python3 benches/gpt2_torch.py $width --limit "$limit" --depths "$depths" --steps "$steps" --dtype "$dt" \
    --variants plain,ckpt,offload,both >"$o/depth_torch.log" 2>&1
  python3 benches/gpt2_torch.py --report "$o"/depth_*.log | tee "$o/summary.md"
}

# gkrt_gpt2's small size at a third of its working set against its unconstrained step;
# GPT2SWAP_SIZES="small medium" adds the medium size (24 x 1024, --recompute 2 only, no timeline).
run_gpt2swap() {
  local b=/tmp/gkrt-gpt2 o="$OUT/gpt2swap" dt=${GPT2_DTYPE:-f32}
  [ "$dt" = f32 ] || o="$OUT/gpt2swap_$dt"
  mkdir -p "$b" "$o"
  cc -O2 -ffp-contract=off examples_c/gpt2/*.c -Iinclude -L.gpu/lib -lgkrt -lm -ldl -o "$b/gkrt_gpt2" || return
  local ld="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" steps=${GPT2_STEPS:-8}
  local common="--seq 512 --batch 8 --vocab 50304 --lr 1e-3 --steps $steps --dtype $dt"
  local -A size=([small]="--layers 12 --channels 768 --heads 12 $common"
    [medium]="--layers 24 --channels 1024 --heads 16 $common")
  local step_of='s/.* step_ms=\([0-9.]*\) .*/\1/p'
  local name
  for name in ${GPT2SWAP_SIZES:-small}; do
    # The small size keeps its earlier file names (none.log, third_r1.log, ...).
    # GPT2SWAP_LEVELS: the recompute levels run at a third (default: 1 and 2 on small, 2 else).
    local pre="" levels=${GPT2SWAP_LEVELS:-"1 2"}
    [ "$name" = small ] || pre="${name}_" levels=${GPT2SWAP_LEVELS:-2}
    LD_LIBRARY_PATH=$ld GKRT_DEVICE=cuda timeout 300 "$b/gkrt_gpt2" ${size[$name]} --recompute 1 >"$o/${pre}none.log" 2>&1
    grep RESULT "$o/${pre}none.log"
    # The unconstrained baseline's own timeline (a separate run: timing every node with events
    # would change the step the ratio divides by), for the limited runs' node times.
    local base_tl="$o/${pre}timeline_none.csv"
    rm -f "$base_tl"
    LD_LIBRARY_PATH=$ld GKRT_DEVICE=cuda GKRT_SWAP_TIMELINE="$base_tl" timeout 300 "$b/gkrt_gpt2" \
      ${size[$name]/--steps $steps/--steps 3} --recompute 1 >"$o/${pre}none_timed.log" 2>&1
    local base
    base=$(grep RESULT "$o/${pre}none.log" | sed -n "$step_of")
    local r
    local runs="$levels" pm
    for pm in ${GPT2SWAP_BUDGETS:-}; do
      [ "$pm" = 1000 ] || runs="$runs 2_b$pm"
    done
    [ "${GPT2SWAP_PENDING:-0}" = 1 ] && runs="$runs 2_p1"
    [ "${GPT2SWAP_PLACEMENTS:-0}" = 1 ] && runs="$runs 2_pl"
    [ "${GPT2SWAP_NOREFINE:-0}" = 1 ] && runs="$runs 2_nr"
    [ "${GPT2SWAP_GREEDY:-0}" = 1 ] && runs="$runs 2_gr"
    [ "${GPT2SWAP_NORELEASE:-0}" = 1 ] && runs="$runs 2_r0"
    [ "${GPT2SWAP_NOPRUNE:-0}" = 1 ] && runs="$runs 2_np"
    [ "${GPT2SWAP_NOELIDE:-0}" = 1 ] && runs="$runs 2_e0"
    [ "${GPT2SWAP_NOPOLL:-0}" = 1 ] && runs="$runs 2_q0"
    [ "${GPT2SWAP_RELEASEDEFAULT:-0}" = 1 ] && runs="$runs 2_ra0"
    [ "${GPT2SWAP_NOPIN:-0}" = 1 ] && runs="$runs 2_pn0"
    [ "${GPT2SWAP_NOEMPTY:-0}" = 1 ] && runs="$runs 2_te0"
    [ "${GPT2SWAP_NOHOLD:-0}" = 1 ] && runs="$runs 2_hm0"
    [ "${GPT2SWAP_NOCLEAN:-0}" = 1 ] && runs="$runs 2_cs0"
    for r in $runs; do
      local tl="$o/${pre}timeline_r$r.csv" budget=1000 pending=0 placements=0 refine=1 search=1 release=1 prune=1 elide=1 poll=1 anyfit=1 pin=1 empty=1 hold=1 clean=1
      case $r in *_b*) budget=${r#*_b} ;; *_p1) pending=1 ;; *_pl) placements=1 release=0 ;; *_nr) refine=0 ;; *_gr) search=0 ;; *_r0) release=0 ;;
        *_np) prune=0 ;; *_e0) elide=0 ;; *_q0) release=0 poll=0 ;; *_ra0) anyfit=0 pin=0 empty=0 ;; *_pn0) pin=0 ;; *_te0) empty=0 ;; *_hm0) hold=0 ;; *_cs0) clean=0 ;; esac
      rm -f "$tl"
      # The ratio's run is not timed (events at every node would lengthen its step against an
      # untimed baseline); a second run of 4 steps writes the timeline.
      local run_it=(env LD_LIBRARY_PATH="$ld" GKRT_DEVICE=cuda GKRT_SWAP_BUDGET_PERMILLE=$budget
        GKRT_POOL_PENDING_BEST_FIT=$pending GKRT_SWAP_PLACEMENTS=$placements GKRT_SWAP_REFINE=$refine
        GKRT_SWAP_REFINE_SEARCH=$search GKRT_SWAP_RELEASE=$release GKRT_SWAP_PRUNE_LINKS=$prune GKRT_EXEC_ELIDE=$elide GKRT_EXEC_POLL_IN_ORDER=$poll
        GKRT_SWAP_RELEASE_ANY_FIT=$anyfit GKRT_SWAP_PIN_SMALL=$pin GKRT_SWAP_TUNE_EMPTY=$empty
        GKRT_SWAP_RELEASE_HOLD_MARKERS=$hold GKRT_SWAP_RELEASE_CLEAN_START=$clean)
      "${run_it[@]}" timeout 300 "$b/gkrt_gpt2" ${size[$name]} --recompute "${r%%_*}" --limit-frac 0.333 \
        --log-level 3 >"$o/${pre}third_r$r.log" 2>&1
      "${run_it[@]}" GKRT_SWAP_TIMELINE="$tl" timeout 300 "$b/gkrt_gpt2" ${size[$name]/--steps $steps/--steps 4} \
        --recompute "${r%%_*}" --limit-frac 0.333 --log-level 3 >"$o/${pre}third_r${r}_timed.log" 2>&1
      grep -E 'RESULT|SWAPSTATS|swap plan|placed where|GKRT_SWAP_RELEASE|GKRT_SWAP_TUNE_EMPTY' "$o/${pre}third_r$r.log"
      local step
      step=$(grep RESULT "$o/${pre}third_r$r.log" | sed -n "$step_of")
      [ -n "$base" ] && [ -n "$step" ] && python3 -c "print('$name recompute ${r%%_*} budget $budget/1000 pending best fit $pending placements $placements refine $refine search $search release $release prune $prune elide $elide poll $poll anyfit $anyfit pin $pin empty $empty hold $hold clean $clean: 1/3 step $step ms / unconstrained $base ms = %.3f' % ($step / $base))" |
        tee -a "$o/ratios.txt"
      local bopt=()
      [ -f "$base_tl" ] && bopt=(--base "$base_tl")
      [ -f "$tl" ] && python3 scripts/gpu/timeline.py "$tl" "${bopt[@]}" >"${tl%.csv}.txt" 2>&1 && tail -8 "${tl%.csv}.txt"
    done
  done
}

# The Python package's PyTorch part: PyTorch on gkrt's pool through gkrt.torch, its statistics
# under PyTorch's names (python/gpu_torch_check.py).
run_python() {
  PYTHONPATH="$PWD/python" GKRT_LIBRARY="${GKRT_GPU_LIB:-$PWD/.gpu/lib}/libgkrt.so" \
    timeout 300 python3 python/gpu_torch_check.py 2>&1 | tee "$OUT/python_torch.log"
}

# Traces of runs (issue 18): the overhead of tracing on the swap chain's step, the traces and
# their SVGs.
run_trace() {
  local b=/tmp/gkrt-bench
  mkdir -p "$b" "$OUT/traces"
  cc -O2 benches/swap_chain.c -Iinclude -I"$CUDA_HOME/include" -L.gpu/lib -lgkrt -L"$CUDA_HOME/lib64" -lcublas \
    -L"$CUDA_HOME/lib64/stubs" -lcuda -o "$b/swap_chain" || return
  cc -O2 benches/trace_cost.c -Iinclude -L.gpu/lib -lgkrt -o "$b/trace_cost" || return
  for dev in cuda host; do
    GKRT_DEVICE=$dev "$b/trace_cost" 256 20 9 2>&1 | tee -a "$OUT/trace_cost.log"
  done
  SWAP_TRACE="$OUT/traces" LD_LIBRARY_PATH="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" "$b/swap_chain" 8192 8192 16 5 2>&1 |
    grep -v '^\[gkrt INFO\] gkrt runtime' | tee "$OUT/trace_swap.log"
  for j in "$OUT"/traces/*.json; do
    [ -f "$j" ] && echo "$(basename "$j"):" && .gpu/bin/gkrt-viz "$j" "${j%.json}.svg" &&
      echo "drawn: ${j%.json}.svg ($(wc -c <"${j%.json}.svg") bytes)"
  done 2>&1 | tee -a "$OUT/trace_swap.log"
}

# Memory snapshots (issue 18): the cost of recording history, then the swap chain's snapshots
# read by PyTorch's _memory_viz.
run_snapshot() {
  local b=/tmp/gkrt-bench
  mkdir -p "$b" "$OUT/snapshots"
  cc -O2 benches/history_cost.c -Iinclude -L.gpu/lib -lgkrt -o "$b/history_cost" || return
  GKRT_DEVICE=cuda "$b/history_cost" 200000 9 2>&1 | tee "$OUT/history_cost.log"
  GKRT_DEVICE=host "$b/history_cost" 200000 9 2>&1 | tee -a "$OUT/history_cost.log"
  cc -O2 benches/swap_chain.c -Iinclude -I"$CUDA_HOME/include" -L.gpu/lib -lgkrt -L"$CUDA_HOME/lib64" -lcublas \
    -L"$CUDA_HOME/lib64/stubs" -lcuda -o "$b/swap_chain" || return
  SWAP_SNAPSHOT="$OUT/snapshots" LD_LIBRARY_PATH="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" "$b/swap_chain" 8192 8192 16 3 2>&1 |
    grep -v '^\[gkrt INFO\] gkrt runtime' | tee "$OUT/snapshot_swap.log"
  PYTHONPATH="$PWD/python" timeout 600 python3 python/gpu_snapshot_check.py "$OUT/snapshots" 2>&1 |
    tee "$OUT/snapshot_check.log"
}

for w in "${what[@]}"; do
  case "$w" in
    tests) run_tests ;;
    demo) run_demo ;;
    bench) run_bench ;;
    pool) run_pool ;;
    poolab) source scripts/gpu/poolab.sh && run_poolab ;;
    gpt2ab) source scripts/gpu/gpt2ab.sh && run_gpt2ab ;;
    swap) run_swap ;;
    workloads) run_workloads ;;
    heldout) run_heldout ;;
    hostgpu) run_hostgpu ;;
    heldlock) run_heldlock ;;
    livetrace) run_livetrace ;;
    sanitize) run_sanitize || sanitize_failed=1 ;;
    python) run_python ;;
    vmm) run_vmm ;;
    hostint) run_hostint ;;
    gpt2) run_gpt2 ;;
    gpt2swap) run_gpt2swap ;;
    gpt2depth) run_gpt2depth ;;
    snapshot) run_snapshot ;;
    trace) run_trace ;;
    nccl) run_nccl ;;
    dp) run_dp ;;
    mgpu) source scripts/gpu/mgpu.sh && run_mgpu ;;
    *) echo "unknown: $w (tests, demo, bench, swap, pool, poolab, gpt2ab, workloads, heldout, hostgpu, heldlock, livetrace, sanitize, python, hostint, gpt2, gpt2swap, gpt2depth, snapshot, trace, nccl, dp, mgpu)" ;;
  esac
done
exit "${sanitize_failed:-0}"
