#!/usr/bin/env bash
# Builds the pool benchmarks (trace_replay, pool_micro) on the GPU machine, in the repository root
# with .gpu/ staged: against .gpu/lib/libgkrt.so and the CUDA driver, and against PyTorch's c10_cuda
# (its caching allocator) when python3 has torch; without torch the PyTorch column is skipped with a
# message. Usage: bash benches/build_pool_benches.sh [OUT_DIR]   (default /tmp/gkrt-pool)
set -uo pipefail
out=${1:-/tmp/gkrt-pool}
mkdir -p "$out"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
base=(-std=c++17 -O2 -Iinclude -I"$CUDA_HOME/include")
libs=(-L.gpu/lib -lgkrt -Wl,-rpath,"$PWD/.gpu/lib" -L"$CUDA_HOME/lib64/stubs" -lcuda -lpthread)
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
build() {
  local b=$1
  if [ -n "$torch_dir" ] && [ -d "$torch_dir/include/c10" ]; then
    if g++ "${base[@]}" -DWITH_TORCH -D_GLIBCXX_USE_CXX11_ABI="$abi" -I"$torch_dir/include" \
        "benches/$b.cpp" -o "$out/$b" "${libs[@]}" -L"$torch_dir/lib" -lc10_cuda -lc10 \
        -Wl,-rpath,"$torch_dir/lib" -Wl,--allow-shlib-undefined 2>"$out/$b.torch.log"; then
      echo "$b: built with PyTorch's caching allocator ($torch_dir)"
      return
    fi
    echo "$b: building with torch failed, without it now:"; head -n 15 "$out/$b.torch.log"
    g++ "${base[@]}" -DTORCH_SKIP_REASON='"building against torch failed"' "benches/$b.cpp" -o "$out/$b" "${libs[@]}"
  else
    g++ "${base[@]}" -DTORCH_SKIP_REASON='"python3 has no torch"' "benches/$b.cpp" -o "$out/$b" "${libs[@]}"
  fi
  echo "$b: built without PyTorch"
}
build trace_replay &
build pool_micro &
wait
[ -x "$out/trace_replay" ] && [ -x "$out/pool_micro" ]
