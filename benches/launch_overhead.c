/*
 * Executor overhead on the GPU: a chain of N small kernels (out = a*in + b over 256 floats)
 * run by gkrt, against a plain loop of cuLaunchKernel over the same kernel in the same process.
 *
 *   dynamic   gkrt dynamic mode: every intermediate allocated from the pool as its node runs
 *             and freed after its reader (2 pool calls and 1 launch per node)
 *   planned   gkrt planned mode with CUDA-graph replay (captured at the second run)
 *   loop      cuLaunchKernel N times over preallocated buffers, then cuStreamSynchronize
 *
 * Each figure is the median over REPS runs of (wall time of one whole run incl. the final
 * synchronisation) / N. Results are checked against the chain computed on the host.
 *
 * Build (on the GPU machine, see scripts/gpu/run.sh):
 *   nvcc -ptx -arch=sm_90 benches/chain_kernel.cu -o chain_kernel.ptx
 *   cc -O2 benches/launch_overhead.c -Iinclude -I$CUDA/include -Llib -lgkrt -lcuda -o launch_overhead
 * Run: ./launch_overhead chain_kernel.ptx [N] [REPS]
 */
#include <cuda.h>
#include <gkrt.h>

#include "bench_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ELEMS 256

static const axpb_params PARAMS = {1.0001f, 0.5f, ELEMS};

static void host_chain(const float *in, float *out, int n) {
  memcpy(out, in, ELEMS * sizeof(float));
  for (int k = 0; k < n; k++)
    for (int i = 0; i < ELEMS; i++) out[i] = PARAMS.a * out[i] + PARAMS.b;
}

/* Runs the chain through gkrt in `mode`; returns the median per-node time in µs. */
static double bench_gkrt(const char *ptx, int n, int reps, unsigned mode, const float *x, const float *want) {
  gkrt_config cfg;
  GK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_CUDA;
  cfg.memory_mode = mode;
  gkrt_runtime *rt;
  GK(gkrt_runtime_create(&cfg, &rt));
  gkrt_kernel *k;
  GK(gkrt_kernel_from_ptx(rt, ptx, "axpb", &k));
  gkrt_graph *g;
  GK(gkrt_graph_create(rt, &g));
  gkrt_tensor *t = malloc((n + 1) * sizeof *t);
  for (int i = 0; i <= n; i++) {
    unsigned kind = i == 0 ? GKRT_TENSOR_INPUT : i == n ? GKRT_TENSOR_OUTPUT : GKRT_TENSOR_INTERMEDIATE;
    GK(gkrt_graph_add_tensor(g, ELEMS * sizeof(float), kind, NULL, &t[i]));
  }
  gkrt_launch launch = {{1, 1, 1}, {ELEMS, 1, 1}, 0, &PARAMS, sizeof PARAMS};
  for (int i = 0; i < n; i++) GK(gkrt_graph_add_kernel(g, k, &t[i], 1, &t[i + 1], 1, NULL, 0, &launch, NULL));
  GK(gkrt_graph_finalize(g));
  GK(gkrt_graph_write_tensor(g, t[0], x, ELEMS * sizeof(float)));
  double *times = malloc(reps * sizeof *times);
  for (int r = -3; r < reps; r++) { /* 3 warm-up runs: first allocations, capture */
    double t0 = (now_ms() * 1e3);
    GK(gkrt_runtime_run(rt, g));
    double t1 = (now_ms() * 1e3);
    if (r >= 0) times[r] = (t1 - t0) / n;
  }
  float got[ELEMS];
  GK(gkrt_graph_read_tensor(g, t[n], got, sizeof got));
  if (memcmp(got, want, sizeof got) != 0) {
    fprintf(stderr, "gkrt (%s) result differs from the host chain: %g vs %g\n", mode ? "planned" : "dynamic", got[0],
            want[0]);
    exit(1);
  }
  gkrt_stats st;
  GK(gkrt_runtime_stats(rt, &st));
  printf("  gkrt %-8s last run: %llu pool allocations, peak allocated %llu B\n", mode ? "planned" : "dynamic",
         (unsigned long long)st.last_run_pool_allocs, (unsigned long long)st.peak_allocated_bytes);
  double m = median(times, reps);
  GK(gkrt_graph_release(g));
  GK(gkrt_kernel_release(k));
  GK(gkrt_runtime_release(rt));
  free(t);
  free(times);
  return m;
}

static double bench_loop(const char *ptx, int n, int reps, const float *x, const float *want) {
  CUdevice dev = use_primary_context();
  CUmodule mod;
  CUfunction fn;
  CU(cuModuleLoadData(&mod, ptx));
  CU(cuModuleGetFunction(&fn, mod, "axpb"));
  CUstream stream;
  CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr *buf = malloc((n + 1) * sizeof *buf);
  for (int i = 0; i <= n; i++) CU(cuMemAlloc(&buf[i], ELEMS * sizeof(float)));
  CU(cuMemcpyHtoD(buf[0], x, ELEMS * sizeof(float)));
  axpb_params p = PARAMS;
  double *times = malloc(reps * sizeof *times);
  for (int r = -3; r < reps; r++) {
    double t0 = (now_ms() * 1e3);
    for (int i = 0; i < n; i++) {
      void *args[] = {&buf[i], &buf[i + 1], &p};
      CU(cuLaunchKernel(fn, 1, 1, 1, ELEMS, 1, 1, 0, stream, args, NULL));
    }
    CU(cuStreamSynchronize(stream));
    double t1 = (now_ms() * 1e3);
    if (r >= 0) times[r] = (t1 - t0) / n;
  }
  float got[ELEMS];
  CU(cuMemcpyDtoH(got, buf[n], sizeof got));
  if (memcmp(got, want, sizeof got) != 0) {
    fprintf(stderr, "plain loop result differs from the host chain\n");
    exit(1);
  }
  for (int i = 0; i <= n; i++) CU(cuMemFree(buf[i]));
  CU(cuStreamDestroy(stream));
  CU(cuModuleUnload(mod));
  CU(cuDevicePrimaryCtxRelease(dev));
  double m = median(times, reps);
  free(buf);
  free(times);
  return m;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s chain_kernel.ptx [N=10000] [REPS=30]\n", argv[0]);
    return 2;
  }
  char *ptx = read_file(argv[1]);
  int n = argc > 2 ? atoi(argv[2]) : 10000;
  int reps = argc > 3 ? atoi(argv[3]) : 30;
  float x[ELEMS], want[ELEMS];
  for (int i = 0; i < ELEMS; i++) x[i] = (float)(i % 17) / 8.0f - 1.0f;
  host_chain(x, want, n);
  printf("chain of %d kernels (%d floats each), median of %d runs, per node:\n", n, ELEMS, reps);
  /* Interleave so drift on a shared machine hits both sides alike. */
  double loop1 = bench_loop(ptx, n, reps, x, want);
  double dyn = bench_gkrt(ptx, n, reps, GKRT_MEMORY_DYNAMIC, x, want);
  double planned = bench_gkrt(ptx, n, reps, GKRT_MEMORY_PLANNED, x, want);
  double loop2 = bench_loop(ptx, n, reps, x, want);
  double loop = loop1 < loop2 ? loop1 : loop2;
  printf("  plain cuLaunchKernel loop   %.3f us   (runs: %.3f, %.3f)\n", loop, loop1, loop2);
  printf("  gkrt dynamic                %.3f us   ratio to loop %.3f  (goal <= 1.2)\n", dyn, dyn / loop);
  printf("  gkrt planned + graph replay %.3f us   ratio to loop %.3f  (goal <= 0.5)\n", planned, planned / loop);
  free(ptx);
  return 0;
}
