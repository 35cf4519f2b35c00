/*
 * Per-call overhead of a gkrt collective node on the GPU (issue 15): a graph with one in-place
 * all-reduce node (f32 sum, one rank) run with gkrt_runtime_run, against a raw ncclAllReduce on
 * the same device buffer followed by cuStreamSynchronize, at sizes 4 KiB .. 64 MiB.
 *
 * Both go through ONE communicator: the program makes it with ncclCommInitRank and hands it to
 * gkrt with gkrt_comm_wrap_nccl, so the difference is gkrt's own cost (the run's bookkeeping,
 * the events ordering the communication stream, the watchdog's event) and not two
 * communicators'. The graph's tensor is bound to the program's buffer (gkrt_graph_bind_tensor),
 * so both reduce the same memory. Not the same stream: a graph's collectives run on the
 * runtime's communication stream (collective graphs run synchronously), the raw calls on a
 * stream of the program's. After the runs the buffer is checked (one rank: the sum is the
 * input), gkrt's handle is released and the program destroys its communicator itself — which
 * also checks that releasing a wrapped communicator does not destroy it.
 *
 * Prints per size: median microseconds per call for gkrt and raw, the difference and the ratio.
 *
 * A second table, "planned": the same graph on a runtime in planned mode (a second gkrt wrapper
 * of the same communicator), whose second run captures the graph — the all-reduce included —
 * as a CUDA graph and replays it from then on: the per-call overhead of a replayed collective
 * graph against the same raw calls, measured again beside it. The capture is counted from the
 * runtime's log ("captured for replay with its collectives", through gkrt_set_log_callback):
 * the table's last column, which must be 1 per size (one capture per graph).
 *
 * Build (on the GPU machine, see scripts/gpu/run.sh nccl):
 *   cc -O2 benches/collective_overhead.c -Iinclude -I$CUDA/include -Llib -lgkrt -lcuda -ldl \
 *      -o collective_overhead
 * Run: ./collective_overhead [reps]   (libnccl.so or libnccl.so.2 on the loader's path)
 * NCCL_NVLS_ENABLE=0 is set before the first NCCL call when unset.
 */
#include <stdint.h>
#include <string.h>

#include "bench_util.h"

#include "nccl_dl.h"

/* Counts the log lines that say a graph with collectives was captured for replay. */
static int captures;
static void count_captures(uint32_t level, const char *target, const char *message, void *user) {
  (void)level, (void)target, (void)user;
  if (strstr(message, "captured for replay with its collectives")) __atomic_add_fetch(&captures, 1, __ATOMIC_RELAXED);
}

/* Median microseconds per gkrt_runtime_run of a graph of `rt` with one in-place all-reduce
 * over `comm` bound to `buf`; `*captures_seen` gets the captures logged meanwhile. */
static double gkrt_per_call(gkrt_runtime *rt, gkrt_comm *comm, CUdeviceptr buf, size_t bytes, int reps,
                            double *t, int *captures_seen) {
  gkrt_graph *g;
  GK(gkrt_graph_create(rt, &g));
  gkrt_tensor x;
  GK(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_PARAMETER, "x", &x));
  GK(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_SUM, 0, GKRT_DTYPE_F32, &x, 1,
                               &x, 1, NULL));
  GK(gkrt_graph_finalize(g));
  GK(gkrt_graph_bind_tensor(g, x, (void *)(uintptr_t)buf, bytes));
  int before = __atomic_load_n(&captures, __ATOMIC_RELAXED);
  for (int i = 0; i < 10; i++) GK(gkrt_runtime_run(rt, g));
  for (int i = 0; i < reps; i++) {
    double t0 = now_ms();
    GK(gkrt_runtime_run(rt, g));
    t[i] = (now_ms() - t0) * 1e3;
  }
  *captures_seen = __atomic_load_n(&captures, __ATOMIC_RELAXED) - before;
  GK(gkrt_graph_unbind_tensor(g, x));
  GK(gkrt_graph_release(g));
  return median(t, reps);
}

/* Median microseconds per raw ncclAllReduce + cuStreamSynchronize on `buf`. */
static double raw_per_call(nccl_comm raw, CUstream stream, CUdeviceptr buf, size_t n, int reps, double *t) {
  for (int i = 0; i < 10; i++) NC(nccl_all_reduce((void *)buf, (void *)buf, n, NCCL_FLOAT32, NCCL_SUM, raw, stream));
  CU(cuStreamSynchronize(stream));
  for (int i = 0; i < reps; i++) {
    double t0 = now_ms();
    NC(nccl_all_reduce((void *)buf, (void *)buf, n, NCCL_FLOAT32, NCCL_SUM, raw, stream));
    CU(cuStreamSynchronize(stream));
    t[i] = (now_ms() - t0) * 1e3;
  }
  return median(t, reps);
}

/* One rank: every sum is the input, so the buffer still holds 1.0f everywhere. */
static void check_ones(CUdeviceptr buf, size_t bytes) {
  float first = 0, last = 0;
  CU(cuMemcpyDtoH(&first, buf, 4));
  CU(cuMemcpyDtoH(&last, buf + bytes - 4, 4));
  if (first != 1.0f || last != 1.0f) {
    fprintf(stderr, "%zu bytes: all-reduce result %g / %g, want 1\n", bytes, first, last);
    exit(1);
  }
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 200;
  if (reps < 5) reps = 5;
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  load_nccl();

  gkrt_config cfg;
  GK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_CUDA;
  cfg.log_level = 1;
  gkrt_runtime *rt;
  GK(gkrt_runtime_create(&cfg, &rt));
  /* gkrt made device 0's primary context current on this thread; NCCL and our calls use it. */
  CU(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CU(cuDeviceGet(&dev, 0));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CUstream stream;
  CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  nccl_id id;
  nccl_comm raw;
  NC(nccl_get_unique_id(&id));
  NC(nccl_comm_init_rank(&raw, 1, id, 0));
  gkrt_comm *comm;
  GK(gkrt_comm_wrap_nccl(rt, raw, 0, 1, 0, &comm));

  const size_t sizes[] = {4u << 10, 64u << 10, 1u << 20, 16u << 20, 64u << 20};
  const size_t n_sizes = sizeof sizes / sizeof *sizes;
  double *t = malloc(sizeof(double) * reps);
  CUdeviceptr bufs[sizeof sizes / sizeof *sizes];
  for (size_t s = 0; s < n_sizes; s++) {
    CU(cuMemAlloc(&bufs[s], sizes[s]));
    CU(cuMemsetD32(bufs[s], 0x3f800000u /* 1.0f */, sizes[s] / 4));
  }
  CU(cuCtxSynchronize());
  int seen;
  printf("%-10s %12s %12s %12s %8s\n", "bytes", "gkrt_us", "raw_us", "diff_us", "ratio");
  for (size_t s = 0; s < n_sizes; s++) {
    double gk = gkrt_per_call(rt, comm, bufs[s], sizes[s], reps, t, &seen);
    double rw = raw_per_call(raw, stream, bufs[s], sizes[s] / 4, reps, t);
    check_ones(bufs[s], sizes[s]);
    printf("%-10zu %12.1f %12.1f %12.1f %8.3f\n", sizes[s], gk, rw, gk - rw, gk / rw);
  }
  GK(gkrt_comm_release(comm));

  /* Planned mode: the graph is captured at its second run and replayed, collective included. */
  GK(gkrt_set_log_callback(count_captures, NULL));
  gkrt_config pcfg;
  GK(gkrt_config_init(&pcfg));
  pcfg.device = GKRT_DEVICE_CUDA;
  pcfg.memory_mode = GKRT_MEMORY_PLANNED;
  pcfg.log_level = 3; /* info: the capture's log line */
  gkrt_runtime *rtp;
  GK(gkrt_runtime_create(&pcfg, &rtp));
  GK(gkrt_comm_wrap_nccl(rtp, raw, 0, 1, 0, &comm));
  printf("planned (captured and replayed)\n");
  printf("%-10s %12s %12s %12s %8s %9s\n", "bytes", "planned_us", "raw_us", "diff_us", "ratio", "captures");
  int bad = 0;
  for (size_t s = 0; s < n_sizes; s++) {
    double gk = gkrt_per_call(rtp, comm, bufs[s], sizes[s], reps, t, &seen);
    double rw = raw_per_call(raw, stream, bufs[s], sizes[s] / 4, reps, t);
    check_ones(bufs[s], sizes[s]);
    printf("%-10zu %12.1f %12.1f %12.1f %8.3f %9d\n", sizes[s], gk, rw, gk - rw, gk / rw, seen);
    bad |= seen != 1;
  }
  GK(gkrt_set_log_callback(NULL, NULL));
  if (bad) {
    fprintf(stderr, "collective_overhead: a planned graph with a collective was not captured once\n");
    return 1;
  }
  free(t);
  for (size_t s = 0; s < n_sizes; s++) CU(cuMemFree(bufs[s]));
  GK(gkrt_comm_release(comm));
  GK(gkrt_runtime_release(rtp));
  NC(nccl_comm_destroy(raw)); /* ours: gkrt_comm_release left it alone */
  CU(cuStreamDestroy(stream));
  GK(gkrt_runtime_release(rt));
  CU(cuDevicePrimaryCtxRelease(dev));
  printf("collective_overhead: done\n");
  return 0;
}
