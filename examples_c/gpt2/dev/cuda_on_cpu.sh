#!/usr/bin/env bash
# Runs the GPT-2 example's CUDA kernels on the CPU against its CPU kernels (cuda_on_cpu.cpp says
# how): a check of the kernels' indexing, masks and reductions on a machine without a GPU. Manual
# (several minutes: one OS thread per CUDA thread); needs g++ with C++20 and a built libgkrt
# (cargo build --release). From the repository root: bash examples_c/gpt2/dev/cuda_on_cpu.sh [f32|bf16]
# (both element types when none is named).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
g=examples_c/gpt2
for f in model ops_host ops_cuda blas_cuda; do cc -O1 -c -Iinclude "$g/$f.c" -o "$out/$f.o"; done
printf '#include <stdio.h>\nconst char *gpt2_cuda_source(void);\nint main(void) { fputs(gpt2_cuda_source(), stdout); return 0; }\n' >"$out/dump.c"
cc "$out/dump.c" "$out"/ops_cuda.o "$out"/ops_host.o "$out"/blas_cuda.o -Ltarget/release -lgkrt -ldl -lm -Wl,-rpath,"$PWD/target/release" -o "$out/dump"
"$out/dump" >"$out/kernels.cu"
for t in ${1:-f32 bf16}; do
  case $t in f32) bf=0 ;; bf16) bf=1 ;; *) echo "f32 or bf16, not $t" >&2; exit 2 ;; esac
  g++ -std=c++20 -O1 -w -Iinclude -I"$g" -DGPT2_ACT_BF16=$bf -DGPT2_KERNELS_FILE="\"$out/kernels.cu\"" \
    "$g/dev/cuda_on_cpu.cpp" "$out"/model.o "$out"/ops_host.o "$out"/ops_cuda.o "$out"/blas_cuda.o \
    -Ltarget/release -lgkrt -ldl -pthread -Wl,-rpath,"$PWD/target/release" -o "$out/cuda_on_cpu_$t"
  "$out/cuda_on_cpu_$t"
done
