# shellcheck shell=bash
# Sourced by scripts/gpu/run.sh for its 'poolab' mode: the pool's trace replay with this build's
# library and a baseline's, side by side in one call — new, baseline, new again — each a whole
# benches/trace_replay over every trace with PyTorch's caching allocator and cuMemAllocAsync in the
# same process (the per-operation ratios move by up to 0.1 between calls, so only a comparison
# inside one call says whether a change made the pool faster). The baseline's libgkrt.so is staged
# by hand in POOL_BASE_LIB (default .gpu/lib_base, e.g. main's library, stripped as stage.sh does).
# POOL_PASSES (default 10) and POOL_ONLY (default "gkrt async torch") as for the pool mode.
# Output: $OUT/pool_replay_{new,base,new2}.md. Each replay is cut at POOL_AB_TIMEOUT s (170: three
# of them and the build fit one 600 s device call). POOL_AB_ENV="K=V ..." makes the middle run this
# build's library with those variables set instead of the baseline's (a knob's A/B in one call;
# its file is then pool_replay_env.md).
# POOL_AB_ROUNDS=N instead interleaves N rounds of base, new and, with POOL_AB_ENV, this build with
# those variables — each its own replay, files pool_replay_{base,new,env}_R.md — so that the
# machine's drift touches every library alike (a few traces: POOL_AB_TRACES="PATH ...", paths from
# the repository root, /tmp/gkrt-pool/traces/NAME.trace.gz for the synthetic ones).
run_poolab() {
  local b=/tmp/gkrt-pool base=${POOL_BASE_LIB:-.gpu/lib_base} run traces mid=base r
  [ -n "${POOL_AB_ENV:-}" ] && [ -z "${POOL_AB_ROUNDS:-}" ] && mid=env
  if [ "$mid" = base ] && [ ! -f "$base/libgkrt.so" ]; then
    echo "poolab: no $base/libgkrt.so (stage the baseline's library there)"
    return 1
  fi
  bash benches/build_pool_benches.sh "$b" 2>&1 | tee "$OUT/pool_build.log" || return
  python3 benches/gen_traces.py "$b/traces" >/dev/null
  traces=$(shopt -s nullglob; echo .gpu/pool/*.trace.gz benches/traces/*.trace.gz "$b"/traces/*.trace.gz \
    benches/traces_heldout/*.trace.gz benches/traces_host/*.trace.gz)
  traces=${POOL_AB_TRACES:-$traces}
  # trace_replay loads .gpu/lib/libgkrt.so (its rpath): the library under test is swapped in there.
  rm -rf .gpu/lib_new && cp -a .gpu/lib .gpu/lib_new
  if [ -n "${POOL_AB_ROUNDS:-}" ]; then
    local runs="base new"
    [ -n "${POOL_AB_ENV:-}" ] && runs="$runs env"
    for r in $(seq "$POOL_AB_ROUNDS"); do
      for run in $runs; do poolab_replay "$run" "${run}_$r" "$base" "$b" "$traces"; done
    done
  else
    for run in new $mid new2; do poolab_replay "$run" "$run" "$base" "$b" "$traces"; done
  fi
  cp .gpu/lib_new/libgkrt.so .gpu/lib/libgkrt.so && cp .gpu/lib_new/libgkrt.so .gpu/lib/libgkrt.so.0
}

# One replay: RUN (base: the baseline's library; env: this build with POOL_AB_ENV; else this
# build) into $OUT/pool_replay_TAG.md.
poolab_replay() {
  local run=$1 tag=$2 base=$3 b=$4 traces=$5 from=.gpu/lib_new
  [ "$run" = base ] && from=$base
  cp "$from/libgkrt.so" .gpu/lib/libgkrt.so && cp "$from/libgkrt.so" .gpu/lib/libgkrt.so.0
  local vars=()
  # shellcheck disable=SC2206  # K=V words, split on purpose
  [ "$run" = env ] && vars=($POOL_AB_ENV) && echo "poolab: env run with ${vars[*]}"
  # shellcheck disable=SC2086  # trace paths have no spaces
  env "${vars[@]}" timeout "${POOL_AB_TIMEOUT:-170}" "$b/trace_replay" --passes "${POOL_PASSES:-10}" \
    --only "${POOL_ONLY:-gkrt async torch}" $traces >"$OUT/pool_replay_$tag.md" 2>&1
  echo "poolab: $tag ($from): $(grep -c '^| ' "$OUT/pool_replay_$tag.md") table rows in $OUT/pool_replay_$tag.md"
}
