#!/usr/bin/env bash
# Step 1 of a GPU run, on the build machine (no GPU needed): build the release library, the C
# tests, the demo and the Rust unit-test binary, and stage them in .gpu/ (ignored by git), which
# the device tool carries to the GPU machine. Then, there: bash scripts/gpu/run.sh [what...]
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo build --release --lib
scripts/cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
scripts/cmake --build build -j 2
# The lib's unit tests include the CUDA backend's GPU tests (#[ignore]d here, run there).
unit_tests=$(cargo test --release --lib --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and m["target"]["src_path"].endswith("src/lib.rs"):
        print(m["executable"])')

rm -rf .gpu
mkdir -p .gpu/lib .gpu/tests .gpu/bin
# Two real files rather than a symlink: links do not always survive the trip.
strip --strip-debug -o .gpu/lib/libgkrt.so target/release/libgkrt.so
cp .gpu/lib/libgkrt.so .gpu/lib/libgkrt.so.0
for t in build/c_tests/*; do
  [ -f "$t" ] && [ -x "$t" ] && strip --strip-debug -o ".gpu/tests/$(basename "$t")" "$t"
done
cp build/examples_c/gkrt_demo .gpu/bin/
# The trace-to-SVG tool (run.sh trace draws the swap chain's trace with it: no Rust there).
cargo build --release --manifest-path tools/gkrt-viz/Cargo.toml --bin gkrt-viz
strip -o .gpu/bin/gkrt-viz tools/gkrt-viz/target/release/gkrt-viz
if [ -n "$unit_tests" ]; then strip --strip-debug -o .gpu/bin/gkrt_unit_tests "$unit_tests"; fi
du -sh .gpu
echo "staged: $(ls .gpu/tests | wc -l) C tests, demo, unit tests, library"
