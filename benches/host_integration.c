/*
 * gkrt inside a host program, on the GPU (issue 17's "How it will be checked"):
 *
 *   eager     a chain of N kernels (out = a*in + b over 256 floats) launched one by one with
 *             gkrt_launch_kernel on a gkrt stream, against a plain cuLaunchKernel loop on a
 *             stream of the program's own: median per-launch time over REPS chains (goal: at
 *             most 1.1 times the loop's)
 *   async     a small planned graph (10 kernels) run 1,000 times with gkrt_runtime_run against
 *             1,000 gkrt_runtime_run_async on the program's stream and one gkrt_graph_wait:
 *             host time per run (and the enqueue time alone)
 *   rebind    a planned graph replayed as a CUDA graph: a steady replay, the first run after its
 *             input is bound to a new address (a capture), and runs alternating between two
 *             bound addresses (one capture each, kept: a replay each) — what a changed binding
 *             costs
 *   queue     a training-step-like graph (NODES elementwise kernels over a 64 MiB batch) fed by
 *             the device data queue (capacity 2, pinned pushes from a producer thread) against
 *             the same graph with its batch bound in device memory already: step time ratio
 *             (goal: within 2%); then the queue fed flat out by a consumer that only pops:
 *             push bandwidth against cuMemcpyHtoDAsync from pinned memory in the same run
 *             (goal: at least 0.9 of it), and the pageable path's for reference
 *
 * Build (on the GPU machine, see scripts/gpu/run.sh hostint):
 *   nvcc -ptx -arch=sm_90 benches/chain_kernel.cu -o chain_kernel.ptx
 *   cc -O2 benches/host_integration.c -Iinclude -I$CUDA/include -Llib -lgkrt -lcuda -lpthread -o host_integration
 * Run: ./host_integration chain_kernel.ptx [eager|async|rebind|queue ...]  (default: all)
 */
#include <cuda.h>
#include <gkrt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define ELEMS 256
static const axpb_params SMALL = {1.0001f, 0.5f, ELEMS};

static char *ptx_text;

static gkrt_runtime *cuda_runtime(unsigned mode) {
  gkrt_config cfg;
  GK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_CUDA;
  cfg.memory_mode = mode;
  cfg.log_level = 1;
  gkrt_runtime *rt;
  GK(gkrt_runtime_create(&cfg, &rt));
  return rt;
}

static float host_axpb(float v, const axpb_params *p, int times) {
  for (int k = 0; k < times; k++) v = p->a * v + p->b;
  return v;
}

/* nvcc may contract a*x+b into an FMA: compare with a relative tolerance. */
static int close_to(float got, float want) {
  float d = got > want ? got - want : want - got, m = want > 0 ? want : -want;
  return d <= 1e-4f * m + 1e-4f;
}

/* A chain graph: t[0] (input) -> n axpb nodes over `elems` floats -> t[n] (output). */
static gkrt_graph *chain_graph(gkrt_runtime *rt, gkrt_kernel *k, int n, unsigned elems, const axpb_params *p,
                               gkrt_tensor *in, gkrt_tensor *out) {
  gkrt_graph *g;
  GK(gkrt_graph_create(rt, &g));
  gkrt_tensor prev;
  GK(gkrt_graph_add_tensor(g, (uint64_t)elems * 4, GKRT_TENSOR_INPUT, "x", &prev));
  *in = prev;
  gkrt_launch l = {{(elems + 255) / 256, 1, 1}, {256, 1, 1}, 0, p, sizeof *p};
  for (int i = 0; i < n; i++) {
    gkrt_tensor next;
    GK(gkrt_graph_add_tensor(g, (uint64_t)elems * 4, i == n - 1 ? GKRT_TENSOR_OUTPUT : GKRT_TENSOR_INTERMEDIATE,
                             NULL, &next));
    GK(gkrt_graph_add_kernel(g, k, &prev, 1, &next, 1, NULL, 0, &l, NULL));
    prev = next;
  }
  *out = prev;
  GK(gkrt_graph_finalize(g));
  return g;
}

/* ------------------------------------------------------------------------------------------ */

static void bench_eager(int n, int reps) {
  use_primary_context();
  CUmodule mod;
  CUfunction fn;
  CU(cuModuleLoadData(&mod, ptx_text));
  CU(cuModuleGetFunction(&fn, mod, "axpb"));
  CUstream own;
  CU(cuStreamCreate(&own, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf[2];
  float x[ELEMS], got[ELEMS];
  for (int i = 0; i < ELEMS; i++) x[i] = (float)(i % 17) / 8.0f - 1.0f;
  for (int i = 0; i < 2; i++) CU(cuMemAlloc(&buf[i], ELEMS * 4));
  axpb_params p = SMALL;
  double *loop_t = malloc(reps * sizeof *loop_t), *gkrt_t = malloc(reps * sizeof *gkrt_t);

  gkrt_runtime *rt = cuda_runtime(GKRT_MEMORY_DYNAMIC);
  gkrt_kernel *k;
  GK(gkrt_kernel_from_ptx(rt, ptx_text, "axpb", &k));
  void *s;
  GK(gkrt_stream_create(rt, &s));
  gkrt_launch l = {{1, 1, 1}, {ELEMS, 1, 1}, 0, &p, sizeof p};
  gkrt_buffer b[2] = {{(void *)(uintptr_t)buf[0], ELEMS * 4}, {(void *)(uintptr_t)buf[1], ELEMS * 4}};
  /* Interleaved: drift on the machine hits both alike. */
  for (int r = -2; r < reps; r++) {
    CU(cuMemcpyHtoD(buf[0], x, sizeof x));
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
      void *args[] = {&buf[i & 1], &buf[(i + 1) & 1], &p};
      CU(cuLaunchKernel(fn, 1, 1, 1, ELEMS, 1, 1, 0, own, args, NULL));
    }
    CU(cuStreamSynchronize(own));
    double t1 = now_ms();
    if (r >= 0) loop_t[r] = (t1 - t0) * 1e3 / n;

    CU(cuMemcpyHtoD(buf[0], x, sizeof x));
    t0 = now_ms();
    for (int i = 0; i < n; i++) GK(gkrt_launch_kernel(rt, k, s, &b[i & 1], 1, &b[(i + 1) & 1], 1, NULL, 0, &l));
    GK(gkrt_stream_synchronize(rt, s));
    t1 = now_ms();
    if (r >= 0) gkrt_t[r] = (t1 - t0) * 1e3 / n;
  }
  CU(cuMemcpyDtoH(got, buf[n & 1], sizeof got));
  float want = host_axpb(x[3], &p, n);
  if (!close_to(got[3], want)) {
    fprintf(stderr, "eager chain: %g, expected %g\n", got[3], want);
    exit(1);
  }
  double lm = median(loop_t, reps), gm = median(gkrt_t, reps);
  printf("eager: chain of %d kernels, median of %d chains, per launch:\n", n, reps);
  printf("  plain cuLaunchKernel loop   %.3f us\n", lm);
  printf("  gkrt_launch_kernel          %.3f us   ratio to loop %.3f  (goal <= 1.1)\n", gm, gm / lm);
  GK(gkrt_kernel_release(k));
  GK(gkrt_runtime_release(rt));
  for (int i = 0; i < 2; i++) CU(cuMemFree(buf[i]));
  CU(cuStreamDestroy(own));
  CU(cuModuleUnload(mod));
  free(loop_t);
  free(gkrt_t);
}

/* ------------------------------------------------------------------------------------------ */

static void bench_async(int runs, int reps) {
  use_primary_context();
  CUstream own;
  CU(cuStreamCreate(&own, CU_STREAM_NON_BLOCKING));
  gkrt_runtime *rt = cuda_runtime(GKRT_MEMORY_PLANNED);
  gkrt_kernel *k;
  GK(gkrt_kernel_from_ptx(rt, ptx_text, "axpb", &k));
  gkrt_tensor in, out;
  gkrt_graph *g = chain_graph(rt, k, 10, ELEMS, &SMALL, &in, &out);
  float x[ELEMS], got[ELEMS];
  for (int i = 0; i < ELEMS; i++) x[i] = (float)i;
  GK(gkrt_graph_write_tensor(g, in, x, sizeof x));
  for (int w = 0; w < 3; w++) GK(gkrt_runtime_run(rt, g)); /* first run, capture */
  double *sync_t = malloc(reps * sizeof *sync_t), *async_t = malloc(reps * sizeof *async_t),
         *enq_t = malloc(reps * sizeof *enq_t);
  for (int r = 0; r < reps; r++) {
    double t0 = now_ms();
    for (int i = 0; i < runs; i++) GK(gkrt_runtime_run(rt, g));
    double t1 = now_ms();
    sync_t[r] = (t1 - t0) * 1e3 / runs;
    t0 = now_ms();
    for (int i = 0; i < runs; i++) GK(gkrt_runtime_run_async(rt, g, own));
    double t2 = now_ms();
    GK(gkrt_graph_wait(rt, g));
    CU(cuStreamSynchronize(own));
    t1 = now_ms();
    async_t[r] = (t1 - t0) * 1e3 / runs;
    enq_t[r] = (t2 - t0) * 1e3 / runs;
  }
  GK(gkrt_graph_read_tensor(g, out, got, sizeof got));
  if (!close_to(got[5], host_axpb(x[5], &SMALL, 10))) {
    fprintf(stderr, "async: wrong result %g\n", got[5]);
    exit(1);
  }
  double sm = median(sync_t, reps), am = median(async_t, reps), em = median(enq_t, reps);
  printf("async: planned graph of 10 kernels, %d runs, median of %d, host time per run:\n", runs, reps);
  printf("  gkrt_runtime_run (each waits)          %.3f us\n", sm);
  printf("  gkrt_runtime_run_async + one wait      %.3f us   ratio %.3f  (enqueue alone %.3f us)\n", am, am / sm,
         em);
  GK(gkrt_graph_release(g));
  GK(gkrt_kernel_release(k));
  GK(gkrt_runtime_release(rt));
  CU(cuStreamDestroy(own));
  free(sync_t);
  free(async_t);
  free(enq_t);
}

/* ------------------------------------------------------------------------------------------ */

static double timed_run(gkrt_runtime *rt, gkrt_graph *g) {
  double t0 = now_ms();
  GK(gkrt_runtime_run(rt, g));
  return (now_ms() - t0) * 1e3;
}

static void bench_rebind(int nodes, int reps) {
  use_primary_context();
  gkrt_runtime *rt = cuda_runtime(GKRT_MEMORY_PLANNED);
  gkrt_kernel *k;
  GK(gkrt_kernel_from_ptx(rt, ptx_text, "axpb", &k));
  gkrt_tensor in, out;
  gkrt_graph *g = chain_graph(rt, k, nodes, ELEMS, &SMALL, &in, &out);
  float x[ELEMS];
  for (int i = 0; i < ELEMS; i++) x[i] = (float)i;
  CUdeviceptr a, b;
  CU(cuMemAlloc(&a, sizeof x));
  CU(cuMemAlloc(&b, sizeof x));
  CU(cuMemcpyHtoD(a, x, sizeof x));
  CU(cuMemcpyHtoD(b, x, sizeof x));
  GK(gkrt_graph_bind_tensor(g, in, (void *)(uintptr_t)a, sizeof x));
  for (int w = 0; w < 3; w++) timed_run(rt, g); /* first run, capture, replay */
  double *steady = malloc(reps * sizeof *steady), *recap = malloc(reps * sizeof *recap),
         *alt = malloc(reps * sizeof *alt);
  for (int r = 0; r < reps; r++) steady[r] = timed_run(rt, g);
  /* A new address each time: every run after a rebind captures. */
  CUdeviceptr *fresh = malloc(reps * sizeof *fresh); /* all alive: every address is new */
  for (int r = 0; r < reps; r++) {
    CU(cuMemAlloc(&fresh[r], sizeof x));
    CU(cuMemcpyHtoD(fresh[r], x, sizeof x));
    GK(gkrt_graph_bind_tensor(g, in, (void *)(uintptr_t)fresh[r], sizeof x));
    recap[r] = timed_run(rt, g);
  }
  /* Two addresses in turn: one capture each, then replays. */
  GK(gkrt_graph_bind_tensor(g, in, (void *)(uintptr_t)b, sizeof x));
  timed_run(rt, g);
  for (int r = 0; r < reps; r++) {
    GK(gkrt_graph_bind_tensor(g, in, (void *)(uintptr_t)(r & 1 ? b : a), sizeof x));
    alt[r] = timed_run(rt, g);
  }
  printf("rebind: planned graph of %d kernels replayed as a CUDA graph, median of %d, per run:\n", nodes, reps);
  double s = median(steady, reps), c = median(recap, reps), al = median(alt, reps);
  printf("  steady replay                              %.1f us\n", s);
  printf("  first run after binding a new address     %.1f us   (recapture: %.1fx)\n", c, c / s);
  printf("  alternating between two bound addresses   %.1f us   (%.2fx: one kept capture per address)\n", al,
         al / s);
  GK(gkrt_graph_release(g));
  GK(gkrt_kernel_release(k));
  GK(gkrt_runtime_release(rt));
  CU(cuMemFree(a));
  CU(cuMemFree(b));
  for (int r = 0; r < reps; r++) CU(cuMemFree(fresh[r]));
  free(fresh);
  free(steady);
  free(recap);
  free(alt);
}

/* ------------------------------------------------------------------------------------------ */

typedef struct {
  gkrt_queue *q;
  void *host;
  int batches;
  int pinned;
  double seconds;
} pusher;

static void *push_all(void *arg) {
  pusher *p = arg;
  const void *bufs[1] = {p->host};
  double t0 = now_ms();
  for (int i = 0; i < p->batches; i++) GK(gkrt_queue_push(p->q, bufs, 1, (uint32_t)p->pinned, 60000));
  p->seconds = (now_ms() - t0) / 1e3;
  return NULL;
}

typedef struct {
  gkrt_runtime *rt;
  gkrt_graph *g;
  int runs;
} popper;

static void *pop_all(void *arg) {
  popper *p = arg;
  for (int i = 0; i < p->runs; i++) GK(gkrt_runtime_run(p->rt, p->g));
  return NULL;
}

static void bench_queue(int nodes, int steps) {
  const size_t elems = 16u << 20, bytes = elems * 4; /* 64 MiB batches */
  const axpb_params big = {1.0001f, 0.5f, (unsigned)elems};
  use_primary_context();
  gkrt_runtime *rt = cuda_runtime(GKRT_MEMORY_PLANNED);
  gkrt_kernel *k;
  GK(gkrt_kernel_from_ptx(rt, ptx_text, "axpb", &k));
  void *pinned;
  CU(cuMemHostAlloc(&pinned, bytes, 0));
  float *pageable = malloc(bytes);
  for (size_t i = 0; i < elems; i++) ((float *)pinned)[i] = pageable[i] = (float)(i % 5);

  /* Baseline: the batch already on the device, bound. */
  gkrt_tensor in0, out0;
  gkrt_graph *g0 = chain_graph(rt, k, nodes, (unsigned)elems, &big, &in0, &out0);
  CUdeviceptr dx;
  CU(cuMemAlloc(&dx, bytes));
  CU(cuMemcpyHtoD(dx, pinned, bytes));
  GK(gkrt_graph_bind_tensor(g0, in0, (void *)(uintptr_t)dx, bytes));
  for (int w = 0; w < 3; w++) GK(gkrt_runtime_run(rt, g0));
  double t0 = now_ms();
  for (int i = 0; i < steps; i++) GK(gkrt_runtime_run(rt, g0));
  double base_ms = (now_ms() - t0) / steps;

  /* The same graph fed by the queue: two deep, pinned pushes from a producer thread. */
  gkrt_tensor in1, out1;
  gkrt_graph *g1 = chain_graph(rt, k, nodes, (unsigned)elems, &big, &in1, &out1);
  gkrt_queue *q;
  const uint64_t size = bytes;
  GK(gkrt_queue_create(rt, "batches", 2, &size, 1, 60000, &q));
  GK(gkrt_graph_add_queue_pop(g1, q, &in1, 1));
  const int warm = 4; /* the first run, then one capture per slot */
  pusher pa = {q, pinned, warm + steps, 1, 0};
  pthread_t th;
  pthread_create(&th, NULL, push_all, &pa);
  for (int w = 0; w < warm; w++) GK(gkrt_runtime_run(rt, g1));
  t0 = now_ms();
  for (int i = 0; i < steps; i++) GK(gkrt_runtime_run(rt, g1));
  double queue_ms = (now_ms() - t0) / steps;
  pthread_join(th, NULL);
  float got, want = host_axpb(3.0f, &big, nodes);
  CUdeviceptr probe;
  CU(cuMemAlloc(&probe, bytes));
  GK(gkrt_graph_bind_tensor(g1, out1, (void *)(uintptr_t)probe, bytes)); /* next run writes here */
  {
    const void *bufs[1] = {pinned};
    GK(gkrt_queue_push(q, bufs, 1, 1, 60000));
    GK(gkrt_runtime_run(rt, g1));
    CU(cuMemcpyDtoH(&got, probe + 3 * 4, 4));
    if (!close_to(got, want)) {
      fprintf(stderr, "queue-fed graph: %g, expected %g\n", got, want);
      exit(1);
    }
  }
  gkrt_queue_stats qs;
  GK(gkrt_queue_get_stats(q, &qs));
  double copy_ms = bytes / 52e9 * 1e3;
  printf("queue: %d elementwise kernels over a 64 MiB batch (a copy takes ~%.2f ms at 52 GB/s), %d steps:\n", nodes,
         copy_ms, steps);
  printf("  batch already on the device (bound)   %.3f ms per step\n", base_ms);
  printf("  fed by the queue (2 deep, pinned)     %.3f ms per step   ratio %.4f  (goal <= 1.02)\n", queue_ms,
         queue_ms / base_ms);
  printf("  pushes %llu, pops %llu, push wait %.1f ms, pop wait %.1f ms\n", (unsigned long long)qs.pushes,
         (unsigned long long)qs.pops, qs.push_wait_ns / 1e6, qs.pop_wait_ns / 1e6);
  GK(gkrt_queue_close(q));
  GK(gkrt_graph_release(g1));
  GK(gkrt_queue_release(q));

  /* Flat out: a consumer that only pops (one small kernel reading the batch). */
  const int batches = 48;
  CUstream cs;
  CU(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
  t0 = now_ms();
  for (int i = 0; i < batches; i++) {
    CU(cuMemcpyHtoDAsync(dx, pinned, bytes, cs));
    CU(cuStreamSynchronize(cs));
  }
  double link_each = (double)bytes * batches / ((now_ms() - t0) / 1e3) / 1e9;
  t0 = now_ms();
  for (int i = 0; i < batches; i++) CU(cuMemcpyHtoDAsync(dx, pinned, bytes, cs));
  CU(cuStreamSynchronize(cs));
  double link_back = (double)bytes * batches / ((now_ms() - t0) / 1e3) / 1e9;
  double link = link_each > link_back ? link_each : link_back;
  for (int pass = 0; pass < 2; pass++) {
    gkrt_tensor in2, out2;
    gkrt_graph *g2 = chain_graph(rt, k, 1, (unsigned)elems, &SMALL, &in2, &out2); /* reads 256 floats */
    gkrt_queue *q2;
    GK(gkrt_queue_create(rt, "flat_out", 4, &size, 1, 60000, &q2));
    GK(gkrt_graph_add_queue_pop(g2, q2, &in2, 1));
    pusher pp = {q2, pass == 0 ? pinned : (void *)pageable, batches, pass == 0, 0};
    popper cp = {rt, g2, batches};
    pthread_t tp, tc;
    pthread_create(&tc, NULL, pop_all, &cp);
    pthread_create(&tp, NULL, push_all, &pp);
    pthread_join(tp, NULL);
    pthread_join(tc, NULL);
    double gbs = (double)bytes * batches / pp.seconds / 1e9;
    if (pass == 0) {
      printf("  flat out, pinned:   %.1f GB/s; cuMemcpyHtoDAsync pinned %.1f GB/s (each waited %.1f, back to back "
             "%.1f): ratio %.3f  (goal >= 0.9)\n",
             gbs, link, link_each, link_back, gbs / link);
    } else {
      printf("  flat out, pageable (through pinned staging): %.1f GB/s (ratio to pinned link %.3f)\n", gbs,
             gbs / link);
    }
    GK(gkrt_queue_close(q2));
    GK(gkrt_graph_release(g2));
    GK(gkrt_queue_release(q2));
  }
  GK(gkrt_graph_release(g0));
  GK(gkrt_kernel_release(k));
  GK(gkrt_runtime_release(rt));
  CU(cuMemFree(dx));
  CU(cuMemFree(probe));
  CU(cuStreamDestroy(cs));
  CU(cuMemFreeHost(pinned));
  free(pageable);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s chain_kernel.ptx [eager|async|rebind|queue ...]\n", argv[0]);
    return 2;
  }
  ptx_text = read_file(argv[1]);
  int all = argc == 2;
  for (int i = 2; i < argc || all; i++) {
    const char *w = all ? NULL : argv[i];
    if (all || !strcmp(w, "eager")) bench_eager(10000, 21);
    if (all || !strcmp(w, "async")) bench_async(1000, 11);
    if (all || !strcmp(w, "rebind")) bench_rebind(20, 31);
    if (all || !strcmp(w, "queue")) bench_queue(100, 40);
    if (all) break;
  }
  free(ptx_text);
  return 0;
}
