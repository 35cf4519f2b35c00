# shellcheck shell=bash
# Sourced by scripts/gpu/run.sh for its 'gpt2ab' mode: examples_c/gpt2 (GPT-2 training written
# against gkrt) in dynamic mode under a memory limit it does not need, with this build's library
# and a baseline's (GPT2AB_BASE_LIB, default .gpu/lib_base: a staged libgkrt.so, e.g. main's) in
# turn — new, base, new, base, ... GPT2AB_PAIRS (2) pairs of processes in one call, so the step
# times compare inside one call. GPT2AB_SIZE: gkrt_gpt2's size flags (default GPT-2 small at
# sequence 512, batch 8, as the gpt2 mode's small size); GPT2AB_LIMIT: its memory limit (default
# --limit-frac 1.25: a limit, so the runtime's streams grow by virtual ranges, which they do only
# under one, and above the working set, so nothing swaps); GPT2AB_STEPS (12) steps each, the
# median after the first two.
# Output: each run's log in $OUT/gpt2ab/, and $OUT/gpt2ab.md: per run the median step, the peak
# reserved over the working set (persistent bytes plus the transient peak) and the runs the pool
# placed by the plan of the run before (RESULT's epochs_followed; 0 from a library without it).
run_gpt2ab() {
  local b=/tmp/gkrt-gpt2ab o="$OUT/gpt2ab" base=${GPT2AB_BASE_LIB:-.gpu/lib_base}
  if [ ! -f "$base/libgkrt.so" ]; then
    echo "gpt2ab: no $base/libgkrt.so (stage the baseline's library there)"
    return 1
  fi
  mkdir -p "$b/new" "$b/base" "$o"
  cc -O2 -ffp-contract=off examples_c/gpt2/*.c -Iinclude -L.gpu/lib -lgkrt -lm -ldl -o "$b/gkrt_gpt2" || return
  cp .gpu/lib/libgkrt.so "$b/new/libgkrt.so.0" && cp "$base/libgkrt.so" "$b/base/libgkrt.so.0"
  local size=${GPT2AB_SIZE:---layers 12 --channels 768 --heads 12 --seq 512 --batch 8 --vocab 50304}
  local limit=${GPT2AB_LIMIT:---limit-frac 1.25}
  local pairs=${GPT2AB_PAIRS:-2} steps=${GPT2AB_STEPS:-12} p lib
  for p in $(seq 1 "$pairs"); do
    for lib in new base; do
      # shellcheck disable=SC2086  # the size and limit flags are words
      LD_LIBRARY_PATH="$b/$lib:$CUDA_HOME/lib64:$LD_LIBRARY_PATH" GKRT_DEVICE=cuda timeout 300 \
        "$b/gkrt_gpt2" $size $limit --steps "$steps" >"$o/${lib}_$p.log" 2>&1
      echo "gpt2ab: $lib $p: $(grep RESULT "$o/${lib}_$p.log" || tail -n 2 "$o/${lib}_$p.log")"
    done
  done
  python3 - "$o" "$pairs" >"$OUT/gpt2ab.md" <<'PY'
import re, sys
o, pairs = sys.argv[1], int(sys.argv[2])
def result(name):
    for line in open(f"{o}/{name}.log"):
        if line.startswith("RESULT "):
            return dict(kv.split("=", 1) for kv in line.split()[1:])
    return None
print("| pair | library | step ms (median) | peak reserved | ÷ working set | epochs followed | step new ÷ base |")
print("|---|---|---|---|---|---|---|")
for p in range(1, pairs + 1):
    r = {lib: result(f"{lib}_{p}") for lib in ("new", "base")}
    for lib in ("new", "base"):
        x = r[lib]
        if x is None:
            print(f"| {p} | {lib} | failed | | | | |")
            continue
        ratio = ""
        if lib == "new" and r["base"]:
            ratio = "%.3f" % (float(x["step_ms"]) / float(r["base"]["step_ms"]))
        print(f"| {p} | {lib} | {float(x['step_ms']):.2f} | {int(x['peak_reserved'])} | "
              f"{int(x['peak_reserved']) / int(x['working_set']):.4f} | {x.get('epochs_followed', '0')} | {ratio} |")
PY
  cat "$OUT/gpt2ab.md"
}
