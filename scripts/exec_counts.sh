#!/usr/bin/env bash
# The executor's syncs and event queries per step of the GPT-2 example at a third of its working
# set, on the host backend (no GPU): what GKRT_EXEC_ELIDE and GKRT_EXEC_POLL_IN_ORDER leave out,
# side by side with each off, and the losses of every mode beside the unconstrained run's (the
# same bits). Reads the last run's `syncs`, `polled` and `copy_waits` rows of GKRT_SWAP_TIMELINE
# through scripts/gpu/timeline.py. Needs the library built (cargo build [--release]); LIB picks
# its directory (default: the newer of target/release and target/debug).
#
# Usage: bash scripts/exec_counts.sh [extra gkrt_gpt2 flags]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lib=${LIB:-$root/target/release}
if [ -z "${LIB:-}" ] && [ "$root/target/debug/libgkrt.so" -nt "$lib/libgkrt.so" ]; then
  lib=$root/target/debug
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -ffp-contract=off "$root"/examples_c/gpt2/*.c -I"$root/include" -L"$lib" -lgkrt -lm -ldl -o "$tmp/gkrt_gpt2"
args=(--layers 4 --channels 64 --heads 4 --seq 32 --batch 2 --vocab 256 --steps 4 --recompute 2 "$@")
run() { # name, env...
  local name=$1
  shift
  env LD_LIBRARY_PATH="$lib" GKRT_DEVICE=host GKRT_SWAP_TIMELINE="$tmp/$name.csv" "$@" \
    "$tmp/gkrt_gpt2" "${args[@]}" --limit-frac 0.333 --log-level 1 >"$tmp/$name.log" 2>&1
  printf '%-28s losses %s\n' "$name" "$(awk '/^step/ {printf "%s ", $4}' "$tmp/$name.log")"
  python3 "$root/scripts/gpu/timeline.py" "$tmp/$name.csv" | { grep -E '^(syncs|host):' || echo "(no host rows: a library older than them?)"; } | sed 's/^/    /'
}
env LD_LIBRARY_PATH="$lib" GKRT_DEVICE=host "$tmp/gkrt_gpt2" "${args[@]}" --log-level 1 >"$tmp/none.log" 2>&1
printf '%-28s losses %s\n' unconstrained "$(awk '/^step/ {printf "%s ", $4}' "$tmp/none.log")"
run default
run elide_off GKRT_EXEC_ELIDE=0
run release_off GKRT_SWAP_RELEASE=0
run release_off_poll_off GKRT_SWAP_RELEASE=0 GKRT_EXEC_POLL_IN_ORDER=0
run all_off GKRT_SWAP_RELEASE=0 GKRT_EXEC_POLL_IN_ORDER=0 GKRT_EXEC_ELIDE=0
