/*
 * Swapping on the GPU: a training step of a chain of bf16 Linear+ReLU layers (forward and
 * backward; matrix products through cuBLAS in host-callback nodes, ReLU and its gradient as
 * CUDA-source kernels compiled by gkrt), run with the memory limit at the step's working set
 * (1x: no swapping), half of it (2x) and a third (3x).
 *
 * For each it reports the step time, the bytes gkrt moved each way, the link bound
 *   max(no-swap step time, bytes out / pinned D2H bandwidth, bytes in / pinned H2D bandwidth)
 * with the bandwidths measured in this process (1 GiB pinned copies), the ratio step / bound,
 * the average rate each way over the step, and whether the outputs are bit-identical to the
 * no-swap run.
 *
 * Build (on the GPU machine, see scripts/gpu/run.sh):
 *   cc -O2 benches/swap_chain.c -Iinclude -I$CUDA/include -Llib -lgkrt -lcublas -lcuda -o swap_chain
 * Run: ./swap_chain [hidden=8192] [tokens=8192] [layers=16] [steps=5] [train|forward]
 *   forward: the forward chain alone (inference-like: only the weights need to move)
 * The ReLU nodes are declared recomputable (gkrt_graph_set_node_recomputable), so a plan may
 * run a ReLU again instead of copying its output out and back; SWAP_RECOMPUTE=0 leaves them
 * undeclared (every swapped tensor is copied).
 */
#include <cublas_v2.h>
#include <cuda.h>
#include <gkrt.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>





/* C[m×n] = op(A)·op(B), row-major bf16, fp32 accumulation; A is m×k (k×m if trans_a), B is
 * k×n (n×k if trans_b). Passed to the callback as the node's parameter blob. */
typedef struct {
  int m, n, k, trans_a, trans_b;
} gemm_desc;

static int32_t gemm_callback(const gkrt_callback_args *args, void *user) {
  cublasHandle_t h = (cublasHandle_t)user;
  const gemm_desc *d = (const gemm_desc *)args->params;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->params_size != sizeof *d) return 1;
  if (cublasSetStream(h, (cudaStream_t)args->stream) != CUBLAS_STATUS_SUCCESS) return 2;
  const float one = 1.0f, zero = 0.0f;
  /* Row-major C = op(A)op(B) is column-major C^T = op(B)^T op(A)^T. */
  cublasStatus_t st = cublasGemmEx(h, d->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, d->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   d->n, d->m, d->k, &one, args->inputs[1].ptr, CUDA_R_16BF, d->trans_b ? d->k : d->n,
                                   args->inputs[0].ptr, CUDA_R_16BF, d->trans_a ? d->m : d->k, &zero,
                                   args->outputs[0].ptr, CUDA_R_16BF, d->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? 0 : 3;
}

/* bf16 handled as raw bits: relu zeroes negatives (and -0). */
static const char *ACT_SRC =
    "struct P { unsigned long long n; };\n"
    "extern \"C\" __global__ void relu_bf16(const unsigned short *x, unsigned short *y, P p) {\n"
    "  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < p.n;\n"
    "       i += (unsigned long long)gridDim.x * blockDim.x) { unsigned short v = x[i]; y[i] = (v & 0x8000) ? 0 : v; }\n"
    "}\n"
    "extern \"C\" __global__ void relu_grad_bf16(const unsigned short *g, const unsigned short *z, unsigned short *y, P p) {\n"
    "  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < p.n;\n"
    "       i += (unsigned long long)gridDim.x * blockDim.x) {\n"
    "    unsigned short v = z[i]; y[i] = ((v & 0x8000) || v == 0) ? 0 : g[i]; }\n"
    "}\n";

typedef struct {
  gkrt_runtime *rt;
  gkrt_graph *g;
  gkrt_kernel *gemm, *relu, *relu_grad;
  gkrt_tensor x0, dy, *w, *dw, out;
  int layers;
  uint64_t act_bytes, w_bytes;
} chain;

static void add_gemm(chain *c, gkrt_tensor a, gkrt_tensor b, gkrt_tensor out, gemm_desc d) {
  gkrt_tensor in[2] = {a, b};
  gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &d, sizeof d};
  GK(gkrt_graph_add_kernel(c->g, c->gemm, in, 2, &out, 1, NULL, 0, &l, NULL));
}

static int recompute = 1;

static void add_act(chain *c, gkrt_kernel *k, const gkrt_tensor *in, size_t nin, gkrt_tensor out, uint64_t elems) {
  struct {
    unsigned long long n;
  } p = {elems};
  gkrt_launch l = {{132 * 8, 1, 1}, {256, 1, 1}, 0, &p, sizeof p};
  uint32_t node;
  GK(gkrt_graph_add_kernel(c->g, k, in, nin, &out, 1, NULL, 0, &l, &node));
  /* ReLU is a pure function of its input: rebuilding its output costs one element-wise pass. */
  if (recompute && k == c->relu) GK(gkrt_graph_set_node_recomputable(c->g, node, 1));
}

/* Builds forward (Z_i = X_i W_i, X_{i+1} = relu(Z_i)) and backward (dZ_i = relu'(dX_{i+1}, Z_i),
 * dW_i = X_i^T dZ_i, dX_i = dZ_i W_i^T). Inputs X_0, dY; parameters W_i; outputs dW_i, X_L. */
static int forward_only = 0;

static void build(chain *c, cublasHandle_t blas, uint64_t limit, int h, int t, int layers) {
  gkrt_config cfg;
  GK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_CUDA;
  cfg.memory_limit = limit;
  cfg.log_level = 3;
  GK(gkrt_runtime_create(&cfg, &c->rt));
  GK(gkrt_kernel_from_callback(c->rt, gemm_callback, blas, &c->gemm));
  GK(gkrt_kernel_from_source(c->rt, ACT_SRC, "relu_bf16", NULL, 0, &c->relu));
  GK(gkrt_kernel_from_source(c->rt, ACT_SRC, "relu_grad_bf16", NULL, 0, &c->relu_grad));
  GK(gkrt_graph_create(c->rt, &c->g));
  c->layers = layers;
  c->act_bytes = (uint64_t)t * h * 2;
  c->w_bytes = (uint64_t)h * h * 2;
  uint64_t elems = (uint64_t)t * h;
  gkrt_tensor *x = malloc((layers + 1) * sizeof *x), *z = malloc(layers * sizeof *z);
  c->w = malloc(layers * sizeof *c->w);
  c->dw = malloc(layers * sizeof *c->dw);
  GK(gkrt_graph_add_tensor(c->g, c->act_bytes, GKRT_TENSOR_INPUT, "x0", &c->x0));
  if (!forward_only) GK(gkrt_graph_add_tensor(c->g, c->act_bytes, GKRT_TENSOR_INPUT, "dy", &c->dy));
  x[0] = c->x0;
  for (int i = 0; i < layers; i++) {
    char name[32];
    snprintf(name, sizeof name, "w%d", i);
    GK(gkrt_graph_add_tensor(c->g, c->w_bytes, GKRT_TENSOR_PARAMETER, name, &c->w[i]));
    snprintf(name, sizeof name, "dw%d", i);
    if (!forward_only) GK(gkrt_graph_add_tensor(c->g, c->w_bytes, GKRT_TENSOR_OUTPUT, name, &c->dw[i]));
    snprintf(name, sizeof name, "z%d", i);
    GK(gkrt_graph_add_tensor(c->g, c->act_bytes, GKRT_TENSOR_INTERMEDIATE, name, &z[i]));
    snprintf(name, sizeof name, "x%d", i + 1);
    GK(gkrt_graph_add_tensor(c->g, c->act_bytes, i + 1 == layers ? GKRT_TENSOR_OUTPUT : GKRT_TENSOR_INTERMEDIATE,
                             name, &x[i + 1]));
    add_gemm(c, x[i], c->w[i], z[i], (gemm_desc){t, h, h, 0, 0});
    add_act(c, c->relu, &z[i], 1, x[i + 1], elems);
  }
  c->out = x[layers];
  gkrt_tensor dx = c->dy;
  for (int i = layers - 1; i >= 0 && !forward_only; i--) {
    char name[32];
    gkrt_tensor dz;
    snprintf(name, sizeof name, "dz%d", i);
    GK(gkrt_graph_add_tensor(c->g, c->act_bytes, GKRT_TENSOR_INTERMEDIATE, name, &dz));
    gkrt_tensor in[2] = {dx, z[i]};
    add_act(c, c->relu_grad, in, 2, dz, elems);
    add_gemm(c, x[i], dz, c->dw[i], (gemm_desc){h, h, t, 1, 0}); /* dW = X^T dZ */
    if (i > 0) {
      snprintf(name, sizeof name, "dx%d", i);
      GK(gkrt_graph_add_tensor(c->g, c->act_bytes, GKRT_TENSOR_INTERMEDIATE, name, &dx));
      add_gemm(c, dz, c->w[i], dx, (gemm_desc){t, h, h, 0, 1}); /* dX = dZ W^T */
    }
  }
  GK(gkrt_graph_finalize(c->g));
  free(x);
  free(z);
}

static void fill_bf16(uint16_t *v, size_t n, uint32_t seed, float scale) {
  uint32_t s = seed * 2654435761u + 7;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    float f = ((float)((s >> 9) & 0xFFFF) / 32768.0f - 1.0f) * scale;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    v[i] = (uint16_t)(bits >> 16);
  }
}

static void destroy(chain *c) {
  GK(gkrt_graph_release(c->g));
  GK(gkrt_kernel_release(c->gemm));
  GK(gkrt_kernel_release(c->relu));
  GK(gkrt_kernel_release(c->relu_grad));
  GK(gkrt_runtime_release(c->rt));
  free(c->w);
  free(c->dw);
}

/* Pinned bandwidth each way, 1 GiB copies, in this process: one direction at a time (h2d, d2h)
 * and both at once on two streams (h2d_both, d2h_both: what a step that copies both ways at
 * the same time can get). */
static void measure_link(double *h2d, double *d2h, double *h2d_both, double *d2h_both) {
  CUdevice dev = use_primary_context();
  size_t n = (size_t)1 << 30;
  void *host, *host2;
  CUdeviceptr d, d2;
  CUstream s, s2;
  CU(cuMemHostAlloc(&host, n, 0));
  CU(cuMemHostAlloc(&host2, n, 0));
  CU(cuMemAlloc(&d, n));
  CU(cuMemAlloc(&d2, n));
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  memset(host, 1, n);
  memset(host2, 2, n);
  double best_in = 0, best_out = 0;
  for (int r = 0; r < 4; r++) {
    double t0 = now_ms();
    CU(cuMemcpyHtoDAsync(d, host, n, s));
    CU(cuStreamSynchronize(s));
    double t1 = now_ms();
    CU(cuMemcpyDtoHAsync(host, d, n, s));
    CU(cuStreamSynchronize(s));
    double t2 = now_ms();
    if (n / (t1 - t0) / 1e6 > best_in) best_in = n / (t1 - t0) / 1e6;
    if (n / (t2 - t1) / 1e6 > best_out) best_out = n / (t2 - t1) / 1e6;
  }
  *h2d = best_in;
  *d2h = best_out;
  CUevent e[4];
  for (int i = 0; i < 4; i++) CU(cuEventCreate(&e[i], CU_EVENT_DEFAULT));
  double both_in = 0, both_out = 0;
  for (int r = 0; r < 4; r++) {
    CU(cuEventRecord(e[0], s));
    CU(cuMemcpyHtoDAsync(d, host, n, s));
    CU(cuEventRecord(e[1], s));
    CU(cuEventRecord(e[2], s2));
    CU(cuMemcpyDtoHAsync(host2, d2, n, s2));
    CU(cuEventRecord(e[3], s2));
    CU(cuCtxSynchronize());
    float in_ms, out_ms;
    CU(cuEventElapsedTime(&in_ms, e[0], e[1]));
    CU(cuEventElapsedTime(&out_ms, e[2], e[3]));
    if (n / (in_ms * 1e6) > both_in) both_in = n / (in_ms * 1e6);
    if (n / (out_ms * 1e6) > both_out) both_out = n / (out_ms * 1e6);
  }
  *h2d_both = both_in;
  *d2h_both = both_out;
  for (int i = 0; i < 4; i++) CU(cuEventDestroy(e[i]));
  CU(cuStreamDestroy(s));
  CU(cuStreamDestroy(s2));
  CU(cuMemFree(d));
  CU(cuMemFree(d2));
  CU(cuMemFreeHost(host));
  CU(cuMemFreeHost(host2));
  CU(cuDevicePrimaryCtxRelease(dev));
}

typedef struct {
  double step_ms;
  uint64_t out_bytes, in_bytes, evictions, peak_reserved, recomputed;
  double wait_ms;
  uint16_t *result; /* dW_0 and X_L, for the bit-exact comparison */
} outcome;

static outcome run_config(cublasHandle_t blas, uint64_t limit, int h, int t, int layers, int steps, uint64_t *peak_out,
                          const uint16_t *x0, const uint16_t *dy, uint16_t **ws) {
  chain c;
  build(&c, blas, limit, h, t, layers);
  gkrt_graph_info info;
  GK(gkrt_graph_get_info(c.g, &info));
  if (peak_out) *peak_out = info.persistent_bytes + info.peak_transient_bytes;
  GK(gkrt_graph_write_tensor(c.g, c.x0, x0, c.act_bytes));
  if (!forward_only) GK(gkrt_graph_write_tensor(c.g, c.dy, dy, c.act_bytes));
  for (int i = 0; i < layers; i++) GK(gkrt_graph_write_tensor(c.g, c.w[i], ws[i], c.w_bytes));
  GK(gkrt_runtime_run(c.rt, c.g)); /* warm-up: pinned memory, cuBLAS heuristics, NVRTC */
  /* A swapping graph chooses its plan after two timed runs (the warmer of each node's times):
   * the second is warm-up too, so no timed step includes the choice. */
  GK(gkrt_runtime_run(c.rt, c.g));
  /* SWAP_SNAPSHOT=DIR: the timed steps of each swapping configuration record the pool's history,
   * and a memory snapshot (PyTorch's pickle) is written after them to DIR/swap_<f>x.pickle, with
   * the runtime's statistics beside it (.stats: allocated_bytes segment_count) for the check. */
  const char *snap_dir = getenv("SWAP_SNAPSHOT");
  if (snap_dir && limit) GK(gkrt_runtime_record_history(c.rt, 1u << 20));
  gkrt_stats s0, s1;
  GK(gkrt_runtime_stats(c.rt, &s0));
  double *times = malloc(steps * sizeof *times);
  for (int i = 0; i < steps; i++) {
    double a = now_ms();
    GK(gkrt_runtime_run(c.rt, c.g));
    times[i] = now_ms() - a;
  }
  GK(gkrt_runtime_stats(c.rt, &s1));
  if (snap_dir && limit) {
    char path[4096];
    snprintf(path, sizeof path, "%s/swap_limit_%llu.pickle", snap_dir, (unsigned long long)limit);
    GK(gkrt_runtime_dump_snapshot(c.rt, path));
    snprintf(path, sizeof path, "%s/swap_limit_%llu.stats", snap_dir, (unsigned long long)limit);
    FILE *sf = fopen(path, "w");
    if (sf) {
      fprintf(sf, "%llu %llu\n", (unsigned long long)s1.allocated_bytes, (unsigned long long)s1.segment_count);
      fclose(sf);
    }
  }
  /* SWAP_TRACE=DIR: the cost of tracing (goal: a traced step within 2% of an untraced one).
   * Steps alternate untraced / traced (gkrt_runtime_trace_begin .. _end around the step), 2 *
   * steps of each; the medians and their ratio are printed, and the last traced step's trace is
   * left in DIR/swap_limit_<limit>.json (ending a trace writes the file: outside the timing). */
  const char *trace_dir = getenv("SWAP_TRACE");
  if (trace_dir) {
    int n = 2 * steps;
    double *off = malloc(n * sizeof *off), *on = malloc(n * sizeof *on);
    char path[4096];
    snprintf(path, sizeof path, "%s/swap_limit_%llu.json", trace_dir, (unsigned long long)limit);
    for (int i = 0; i < n; i++) {
      double a = now_ms();
      GK(gkrt_runtime_run(c.rt, c.g));
      off[i] = now_ms() - a;
      GK(gkrt_runtime_trace_begin(c.rt));
      a = now_ms();
      GK(gkrt_runtime_run(c.rt, c.g));
      on[i] = now_ms() - a;
      GK(gkrt_runtime_trace_end(c.rt, path));
    }
    double last_on = on[n - 1]; /* the step whose trace is left in the file */
    double m_off = median(off, n), m_on = median(on, n);
    printf("trace overhead at limit %.2f GiB: step untraced %.3f ms, traced %.3f ms (medians of %d alternating), "
           "traced/untraced %.4f (goal <= 1.02); trace in %s (of a step measured %.3f ms)\n",
           limit / 1073741824.0, m_off, m_on, n, m_on / m_off, path, last_on);
    free(off);
    free(on);
  }
  qsort(times, steps, sizeof *times, cmp_double);
  outcome o = {.step_ms = times[steps / 2],
               .out_bytes = (s1.swap_out_bytes - s0.swap_out_bytes) / steps,
               .in_bytes = (s1.swap_in_bytes - s0.swap_in_bytes) / steps,
               .evictions = (s1.evictions - s0.evictions) / steps,
               .peak_reserved = s1.peak_reserved_bytes,
               .recomputed = (s1.tensors_recomputed - s0.tensors_recomputed) / steps,
               /* 0 unless the waits are timed (GKRT_EXEC_TIME_STALLS=1). */
               .wait_ms = (double)(s1.copy_wait_ns - s0.copy_wait_ns) / steps / 1e6,
               .result = malloc(c.w_bytes + c.act_bytes)};
  if (forward_only)
    memset(o.result, 0, c.w_bytes);
  else
    GK(gkrt_graph_read_tensor(c.g, c.dw[0], o.result, c.w_bytes));
  GK(gkrt_graph_read_tensor(c.g, c.out, (char *)o.result + c.w_bytes, c.act_bytes));
  free(times);
  destroy(&c);
  return o;
}

int main(int argc, char **argv) {
  int h = argc > 1 ? atoi(argv[1]) : 8192;
  int t = argc > 2 ? atoi(argv[2]) : 8192;
  int layers = argc > 3 ? atoi(argv[3]) : 16;
  int steps = argc > 4 ? atoi(argv[4]) : 5;
  forward_only = argc > 5 && strcmp(argv[5], "forward") == 0;
  const char *rc = getenv("SWAP_RECOMPUTE");
  recompute = !(rc && strcmp(rc, "0") == 0);
  double bw_in, bw_out, both_in, both_out;
  measure_link(&bw_in, &bw_out, &both_in, &both_out);
  printf("pinned link in this process: host->device %.1f GB/s, device->host %.1f GB/s; both at once: %.1f / %.1f GB/s\n",
         bw_in, bw_out, both_in, both_out);
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  size_t act = (size_t)t * h, wn = (size_t)h * h;
  uint16_t *x0 = malloc(act * 2), *dy = malloc(act * 2), **ws = malloc(layers * sizeof *ws);
  fill_bf16(x0, act, 1, 1.0f);
  fill_bf16(dy, act, 2, 1.0f);
  for (int i = 0; i < layers; i++) {
    ws[i] = malloc(wn * 2);
    fill_bf16(ws[i], wn, 10 + i, 1.0f / 64);
  }
  uint64_t peak = 0;
  outcome base = run_config(blas, 0, h, t, layers, steps, &peak, x0, dy, ws);
  printf("chain (%s): hidden %d, tokens %d, %d layers, bf16; working set %.2f GiB; %d timed steps, median; "
         "ReLU %s\n",
         forward_only ? "forward only" : "forward + backward", h, t, layers, peak / 1073741824.0, steps,
         recompute ? "declared recomputable" : "not declared recomputable (SWAP_RECOMPUTE=0)");
  /* bound: each direction at its one-way rate (the definition); bound2: at the rates of
   * both directions copying at once (what a step moving both ways concurrently can reach). */
  printf("%-7s %9s %8s %8s %8s %8s %10s %9s %11s %11s %8s %8s %s\n", "budget", "limit GiB", "step ms", "out GiB",
         "in GiB", "bound ms", "step/bound", "bound2 ms", "step/bound2", "step/noswap", "out GB/s", "in GB/s", "outputs");
  size_t cmp = wn * 2 + act * 2;
  /* 0: no limit (the no-swap reference); then the working set at 1x, 2x and 3x the limit. */
  for (int f = 0; f <= 3; f++) {
    uint64_t limit = f == 0 ? 0 : peak / f;
    outcome o = f == 0 ? base : run_config(blas, limit, h, t, layers, steps, NULL, x0, dy, ws);
    double link_out = o.out_bytes / 1e6 / bw_out, link_in = o.in_bytes / 1e6 / bw_in;
    double bound = base.step_ms;
    if (link_out > bound) bound = link_out;
    if (link_in > bound) bound = link_in;
    double bound2 = base.step_ms;
    if (o.out_bytes / 1e6 / both_out > bound2) bound2 = o.out_bytes / 1e6 / both_out;
    if (o.in_bytes / 1e6 / both_in > bound2) bound2 = o.in_bytes / 1e6 / both_in;
    int same = memcmp(o.result, base.result, cmp) == 0;
    char label[16];
    snprintf(label, sizeof label, f == 0 ? "none" : "%dx", f);
    printf("%-7s %9.2f %8.2f %8.2f %8.2f %8.2f %10.3f %9.2f %11.3f %11.3f %8.1f %8.1f %s   (evictions %llu, compute "
           "waited %.2f ms, peak reserved %.2f GiB, tensors recomputed %llu)\n",
           label, limit / 1073741824.0, o.step_ms, o.out_bytes / 1073741824.0, o.in_bytes / 1073741824.0, bound,
           o.step_ms / bound, bound2, o.step_ms / bound2, o.step_ms / base.step_ms, o.out_bytes / 1e6 / o.step_ms, o.in_bytes / 1e6 / o.step_ms,
           same ? "bit-identical" : "DIFFER", (unsigned long long)o.evictions, o.wait_ms,
           o.peak_reserved / 1073741824.0, (unsigned long long)o.recomputed);
    if (f != 0) free(o.result);
  }
  return 0;
}
