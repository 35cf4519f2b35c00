#!/usr/bin/env bash
# Step 2 of a GPU run, on the GPU machine, in the repository root with .gpu/ staged by
# scripts/gpu/stage.sh. Runs what is named (default: tests demo bench) with the CUDA backend
# and writes logs under $OUT (or ./gpu-out). Needs: the NVIDIA driver, nvcc and a C compiler.
#   tests   every C test with GKRT_DEVICE=cuda, the Rust GPU tests, and the no-device check
#   demo    the demo on the GPU and on the host backend
#   bench   benches/launch_overhead (10,000-kernel chain: gkrt dynamic / planned+replay vs a loop)
#   swap    benches/swap_chain (bf16 Linear+ReLU training step at 1x, 2x, 3x its memory limit);
#           SWAP_TIMELINE=1 also times every swapping run with events and summarises where the
#           links and the compute stream idle (scripts/gpu/timeline.py)
#   pool    the pool against PyTorch and cuMemAllocAsync (needs the traces copied into .gpu/pool/
#           and torch in python3; BENCHMARKS.md section 3)
#   workloads  GPT-2 / ResNet-50 training in PyTorch on each allocator, in lockstep (section 3)
#   python  gkrt.torch: PyTorch on gkrt's pool, its statistics under PyTorch's names (python/gpu_torch_check.py)
#   trace   traces of runs: benches/swap_chain with SWAP_TRACE (per swapping configuration, steps
#           alternating untraced / traced: the medians and traced/untraced, goal <= 1.02), the
#           last traced step's Chrome trace in $OUT/traces/*.json (open in ui.perfetto.dev) and
#           its picture by .gpu/bin/gkrt-viz in $OUT/traces/*.svg (the README's picture)
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
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
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
    .gpu/bin/gkrt_unit_tests --ignored --test-threads=1 device::cuda >"$OUT/rust_gpu_tests.log" 2>&1
    echo "Rust GPU tests: $(grep -E '^test result' "$OUT/rust_gpu_tests.log" || echo 'no result line')"
    grep -E 'FAILED|panicked' "$OUT/rust_gpu_tests.log" | head -20
    # The test that faults the context on purpose runs alone, in its own process.
    GKRT_CUDA_POISON_TEST=1 .gpu/bin/gkrt_unit_tests --ignored --exact device::cuda::tests::gpu_alone_kernel_fault_surfaces_at_sync \
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
    # SWAP_TIMELINE=1: every swapping run is timed with events and summarised (a diagnostic:
    # the events add a little to each step).
    local tl="$OUT/swap_timeline_${args##* }_recompute$recompute.csv"
    [ "${SWAP_TIMELINE:-0}" = 1 ] && export GKRT_SWAP_TIMELINE="$tl"
    SWAP_RECOMPUTE=$recompute LD_LIBRARY_PATH="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" "$b/swap_chain" $args 2>&1 |
      grep -v '^\[gkrt INFO\] gkrt runtime' | tee -a "$OUT/bench_swap.log"
    unset GKRT_SWAP_TIMELINE
    [ -f "$tl" ] && python3 scripts/gpu/timeline.py "$tl" | tee -a "$OUT/bench_swap.log"
  done
}

# The pool against PyTorch's caching allocator and cuMemAllocAsync (BENCHMARKS.md, section 3): builds
# the benches, replays the shared traces (staged in .gpu/pool/) and the synthetic ones, runs the
# micro-benchmarks and the C test of gkrt_malloc on CUDA. Tables go to stdout and $OUT/pool_*.
run_pool() {
  local b=/tmp/gkrt-pool
  bash benches/build_pool_benches.sh "$b" 2>&1 | tee "$OUT/pool_build.log" || return
  GKRT_DEVICE=cuda timeout 120 .gpu/tests/api_raw_alloc 2>&1 | tail -n 3
  python3 benches/gen_traces.py "$b/traces" >/dev/null
  timeout 300 "$b/trace_replay" --passes 30 .gpu/pool/*.trace.gz "$b"/traces/*.trace.gz 2>&1 | tee "$OUT/pool_replay.md"
  timeout 120 "$b/pool_micro" 2>&1 | tee "$OUT/pool_micro.md"
}

# GPT-2 and ResNet-50 training steps in PyTorch on PyTorch's allocator and on gkrt's, in lockstep
# (benches/torch_workloads.py: two resident processes taking turns step by step, both pinned to the
# same two CPUs; GPT-2's step is bound by the host), and PyTorch against itself as the control that
# shows the method's own spread. WORKLOAD_PAIRS (default 8) pairs of processes for GPT-2.
run_workloads() {
  local w=(python3 benches/torch_workloads.py --lib .gpu/lib/libgkrt.so --cpus 4,5 --steps 40 --warmup 5)
  local n=${WORKLOAD_PAIRS:-8}
  export PYTHONUNBUFFERED=1
  "${w[@]}" --model gpt2 --lockstep "$n" --profile 2>>"$OUT/workloads.err" >"$OUT/workload_gpt2.jsonl"
  "${w[@]}" --model gpt2 --lockstep $(((n + 1) / 2)) --against torch 2>>"$OUT/workloads.err" >"$OUT/workload_gpt2_control.jsonl"
  "${w[@]}" --model resnet50 --lockstep 2 2>>"$OUT/workloads.err" >"$OUT/workload_resnet50.jsonl"
  python3 benches/torch_workloads.py --report "$OUT"/workload_gpt2.jsonl "$OUT"/workload_gpt2_control.jsonl \
    "$OUT"/workload_resnet50.jsonl | tee "$OUT/workloads.md"
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
      --skip gpu_neg_ --skip gpu_alone_ --skip gpu_hot_path >"$dir/memcheck.rust_gpu_tests.log" 2>&1
    echo "sanitize memcheck, Rust GPU tests: exit $?, $(grep -aoE 'ERROR SUMMARY: [0-9]+ errors?' "$dir/memcheck.rust_gpu_tests.log" | tail -n 1); $(grep -aE '^test result' "$dir/memcheck.rust_gpu_tests.log" || echo 'no result line')"
  fi
  return $status
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
  SWAP_TRACE="$OUT/traces" LD_LIBRARY_PATH="$CUDA_HOME/lib64:$LD_LIBRARY_PATH" "$b/swap_chain" 8192 8192 16 5 2>&1 |
    grep -v '^\[gkrt INFO\] gkrt runtime' | tee "$OUT/trace_swap.log"
  for j in "$OUT"/traces/*.json; do
    [ -f "$j" ] && .gpu/bin/gkrt-viz "$j" "${j%.json}.svg" && echo "drawn: ${j%.json}.svg ($(wc -c <"${j%.json}.svg") bytes)"
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
    swap) run_swap ;;
    workloads) run_workloads ;;
    sanitize) run_sanitize || sanitize_failed=1 ;;
    python) run_python ;;
    snapshot) run_snapshot ;;
    trace) run_trace ;;
    *) echo "unknown: $w (tests, demo, bench, swap, pool, workloads, sanitize, python, snapshot, trace)" ;;
  esac
done
exit "${sanitize_failed:-0}"
