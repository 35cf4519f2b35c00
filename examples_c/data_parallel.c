/*
 * gkrt data-parallel training: every rank runs the same training step of an MLP on its shard of
 * one fixed synthetic batch; the gradients are averaged across ranks by all-reduce nodes in the
 * graph (fused into buckets at finalize, as PyTorch DDP does), so every rank takes the same SGD
 * step. The program then checks what data parallelism promises:
 *
 *   1. every rank's parameters are identical, bit for bit (an all-reduce MIN and MAX of them
 *      must both equal each rank's own copy);
 *   2. they equal, within a tolerance, those of one runtime training on the combined batch with
 *      the same network and no communicator. Not bit for bit: a rank sums its shard's rows, then
 *      the all-reduce sums the ranks' partial gradients and divides by the number of ranks,
 *      while the single run sums all rows at once and divides by the batch size — the same
 *      real numbers, rounded in another order. The tolerance (DP_TOL relative to the largest
 *      weight, 1e-5 x 0.2 here) is far above that rounding (1.5e-8 after 5 steps at 2 and 4
 *      ranks) and far below a real mistake (summing the gradients instead of averaging: 4e-2).
 *
 * It prints the loss per step and "OK" last; any failed check exits non-zero.
 *
 *   gkrt_data_parallel --ranks N                       N ranks as threads of this process (host
 *                                                      backend: runtimes of one process are the ranks)
 *   gkrt_data_parallel --rank R --nranks N --id-file PATH
 *                                                      one rank per process, on device R (CUDA:
 *                                                      NCCL). Rank 0 writes the 128-byte unique id
 *                                                      to PATH (a path no earlier job left behind);
 *                                                      the others wait for it and read it.
 *   --steps K (default 5), --batch B (rows of the combined batch, default 32; N must divide it)
 *   --in D --width H --out O --depth L (defaults 32, 64, 16, 2): L weight layers D→H→…→H→O
 *   --lr X (default 0.2)
 *   --bucket-kib K (default 16): all-reduce buckets of K KiB; 0: the library's defaults, which
 *                  are PyTorch DDP's (first bucket 1 MiB, later ones 25 MiB)
 *   --trace DIR --trace-steps T: after the K timed steps, T more steps traced (gkrt's run
 *                  traces), rank R's written to DIR/trace_rankR.json. scripts/gpu/mgpu_overlap.py
 *                  reads from them the communication left exposed (not overlapped by compute).
 *   --memory-limit MIB: the ranks' runtimes' memory limit (0, the default: none); a graph
 *                  over it swaps (and recomputes the ReLUs, declared recomputable). The
 *                  reference runs unconstrained.
 *   --reference 0: skip check 2 (the single runtime on the combined batch costs n steps' work per
 *                  step; scripts/gpu/mgpu.sh skips it where a fingerprint comparison stands in).
 *
 * Per rank it prints its median step time, its memory figures and a fingerprint (FNV-1a of its
 * final weights' bytes and of its losses' bytes): two runs that trained identically print the
 * same fingerprint, which is how scripts/gpu/mgpu.sh compares a memory-limited run with the
 * unconstrained one.
 *
 * GKRT_DEVICE (host|cuda|auto) picks the backend; rank R uses device R (so --ranks N on CUDA
 * needs N GPUs: NCCL refuses two ranks on one).
 *
 * The network: a_0 = x, a_k = relu(a_{k-1}·W_k) for the hidden layers, y = a_{L-1}·W_L (no bias),
 * loss = ½·mean over rows of |y − t|², t = x·Wt for a fixed random "teacher" Wt; W_k is row-major
 * [in × out]. The matrix products and the SGD step (an axpy) are host-callback nodes
 * (blas_nodes.h): cuBLAS on the node's stream on CUDA, CPU loops on the host backend (so CI runs
 * the same graph). The backward
 * products take their transposes as flags (dW_k = a_{k-1}ᵀ·dz_k, da_{k-1} = dz_k·W_kᵀ), so
 * every weight and every gradient exists once. Before training each rank checks the product
 * kernel against plain C in those three forms. The SGD step updates the parameters in place on
 * the device, last layer first, so the updates of layers already reduced run while the first
 * layer's gradient is still being all-reduced.
 */
#include <gkrt.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blas_nodes.h"

enum { DP_MAX_RANKS = 64, DP_MAX_DEPTH = 16, DP_MAX_STEPS = 1000 };
#define DP_TOL 1e-5
/* Floats per chunk of the ranks-identical check (at most): its graph holds three chunks. */
#define DP_CHECK_CHUNK ((size_t)4 << 20)

static int check(gkrt_status st, const char *what) {
  if (st == GKRT_STATUS_OK) return 0;
  char msg[512];
  gkrt_last_error_message(msg, sizeof msg);
  fprintf(stderr, "%s failed: %s: %s\n", what, gkrt_status_name(st), msg);
  return 1;
}
#define TRY(call)                       \
  do {                                  \
    if (check((call), #call)) return 1; \
  } while (0)

/* The network's shape: layer k (0-based) maps dims[k] to dims[k+1]. The weights live in one flat
 * array, layer by layer, W_k row-major [dims[k] × dims[k+1]]. */
typedef struct net {
  uint32_t depth;
  size_t dims[DP_MAX_DEPTH + 1];
  size_t off[DP_MAX_DEPTH]; /* offset of W_k */
  size_t params;            /* floats */
  float lr;
} net;

static size_t layer_floats(const net *nw, uint32_t k) { return nw->dims[k] * nw->dims[k + 1]; }

static void net_make(net *nw, uint32_t depth, size_t in, size_t width, size_t out, float lr) {
  nw->depth = depth;
  nw->lr = lr;
  for (uint32_t k = 0; k <= depth; k++) nw->dims[k] = k == 0 ? in : k == depth ? out : width;
  nw->params = 0;
  for (uint32_t k = 0; k < depth; k++) {
    nw->off[k] = nw->params;
    nw->params += layer_floats(nw, k);
  }
}

/* Deterministic values in [-1, 1) (the fixed seed of the synthetic batch). */
static void fill_random(float *v, size_t n, uint32_t seed, float scale) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = scale * ((float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f);
  }
}

/* The combined batch and the initial weights, the same for every rank and the reference. */
typedef struct problem {
  const net *nw;
  size_t batch;
  float *x, *t; /* [batch, D], [batch, O] */
  float *w;     /* initial weights (nw->params floats) */
} problem;

static int problem_make(problem *p, const net *nw, size_t batch) {
  const size_t D = nw->dims[0], O = nw->dims[nw->depth];
  p->nw = nw;
  p->batch = batch;
  p->x = malloc(batch * D * sizeof(float));
  p->t = malloc(batch * O * sizeof(float));
  p->w = malloc(nw->params * sizeof(float));
  float *teacher = malloc(D * O * sizeof(float)), *acc = malloc(O * sizeof(float));
  if (!p->x || !p->t || !p->w || !teacher || !acc) {
    fprintf(stderr, "out of host memory\n");
    free(teacher);
    free(acc);
    return 1;
  }
  fill_random(p->x, batch * D, 1, 1.0f);
  fill_random(teacher, D * O, 2, 1.0f / sqrtf((float)D));
  /* t = x·Wt, each sum over d in order (row by row, so the inner loop runs along Wt's rows). */
  for (size_t i = 0; i < batch; i++) {
    for (size_t o = 0; o < O; o++) acc[o] = 0.0f;
    for (size_t d = 0; d < D; d++) {
      const float xv = p->x[i * D + d];
      for (size_t o = 0; o < O; o++) acc[o] += xv * teacher[d * O + o];
    }
    memcpy(p->t + i * O, acc, O * sizeof(float));
  }
  free(teacher);
  free(acc);
  for (uint32_t k = 0; k < nw->depth; k++)
    fill_random(p->w + nw->off[k], layer_floats(nw, k), 3 + k, 1.0f / sqrtf((float)nw->dims[k]));
  return 0;
}

static void problem_free(problem *p) {
  free(p->x);
  free(p->t);
  free(p->w);
}

/* One rank's training step as a graph. */
typedef struct step_graph {
  gkrt_graph *graph;
  size_t rows;        /* this rank's shard */
  gkrt_tensor x, nt;  /* inputs: the shard and −t */
  gkrt_tensor w[DP_MAX_DEPTH], y;
} step_graph;

static int node(gkrt_graph *g, gkrt_kernel *k, const gkrt_tensor *in, size_t nin, gkrt_tensor out,
                const void *params, size_t params_size, uint32_t *index) {
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, params, params_size};
  TRY(gkrt_graph_add_kernel(g, k, in, nin, &out, 1, NULL, 0, &launch, index));
  return 0;
}

/* c[m×n] = op(a)·op(b) (blas_nodes.h: a is [k×m] with ta, b is [n×k] with tb). */
static int gemm_node(gkrt_graph *g, gkrt_kernel *blas, gkrt_tensor a, gkrt_tensor b, gkrt_tensor c, size_t m,
                     size_t n, size_t k, int ta, int tb) {
  TRY(gemm_add(g, blas, a, b, c, (uint32_t)m, (uint32_t)n, (uint32_t)k, ta, tb, NULL));
  return 0;
}

static int tensor(gkrt_graph *g, size_t floats, gkrt_tensor_kind kind, const char *name, gkrt_tensor *out) {
  TRY(gkrt_graph_add_tensor(g, floats * sizeof(float), kind, name, out));
  return 0;
}

/* relu(z) into a, declared recomputable: under a memory limit the swap plan may rebuild a
 * instead of copying it out and back. */
static int relu_node(gkrt_graph *g, gkrt_kernel *relu, gkrt_tensor z, gkrt_tensor a) {
  uint32_t index;
  if (node(g, relu, &z, 1, a, NULL, 0, &index)) return 1;
  TRY(gkrt_graph_set_node_recomputable(g, index, 1));
  return 0;
}

typedef struct kernels {
  gkrt_kernel *add, *relu, *relu_grad, *scale, *blas;
} kernels;

static void kernels_release(kernels *K) {
  gkrt_kernel *ks[] = {K->add, K->relu, K->relu_grad, K->scale, K->blas};
  for (int i = 0; i < 5; i++)
    if (ks[i] && gkrt_kernel_release(ks[i]) != GKRT_STATUS_OK) fprintf(stderr, "kernel release failed\n");
  memset(K, 0, sizeof *K);
}

/* The built-ins for the element-wise nodes and the BLAS kernel (products and the SGD step: cuBLAS
 * or the CPU loops). */
static int kernels_make(gkrt_runtime *rt, kernels *K) {
  memset(K, 0, sizeof *K);
  int bad = check(gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, &K->add), "add kernel") ||
            check(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &K->relu), "relu kernel") ||
            check(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU_GRAD, &K->relu_grad), "relu_grad kernel") ||
            check(gkrt_kernel_builtin(rt, GKRT_BUILTIN_SCALE, &K->scale), "scale kernel") || blas_kernel(rt, &K->blas);
  if (bad) kernels_release(K);
  return bad;
}

/* Forward: the hidden layers' pre-activations z = a_in·W and activations a = relu(z), then y (an
 * output). */
static int forward(gkrt_graph *g, const kernels *K, const net *nw, step_graph *s, gkrt_tensor *z, gkrt_tensor *a) {
  gkrt_tensor in = s->x;
  for (uint32_t k = 0; k < nw->depth; k++) {
    const int last = k + 1 == nw->depth;
    if (gemm_node(g, K->blas, in, s->w[k], last ? s->y : z[k], s->rows, nw->dims[k + 1], nw->dims[k], 0, 0)) return 1;
    if (last) break;
    if (relu_node(g, K->relu, z[k], a[k])) return 1;
    in = a[k];
  }
  return 0;
}

/* Builds the step for `rows` rows. With `comm`, each weight gradient is all-reduced (average) in
 * place right after it is computed, last layer first, as DDP does; finalize fuses consecutive
 * all-reduces into buckets. Without, it is the single-runtime reference. */
static int step_build_graph(gkrt_graph *g, const kernels *K, gkrt_comm *comm, const net *nw, size_t rows,
                            uint32_t bucket_kib, step_graph *s) {
  s->graph = g;
  s->rows = rows;
  const uint32_t L = nw->depth;
  const size_t b = rows, D = nw->dims[0], O = nw->dims[L];
  const gkrt_tensor_kind I = GKRT_TENSOR_INTERMEDIATE;
  int e = 0;
  e |= tensor(g, b * D, GKRT_TENSOR_INPUT, "x", &s->x) | tensor(g, b * O, GKRT_TENSOR_INPUT, "minus_t", &s->nt);
  e |= tensor(g, b * O, GKRT_TENSOR_OUTPUT, "y", &s->y);
  char name[48];
  /* Per layer: the weight and its gradient; per hidden layer: z, a and their gradients dz, da. */
  gkrt_tensor z[DP_MAX_DEPTH], a[DP_MAX_DEPTH], dz[DP_MAX_DEPTH], da[DP_MAX_DEPTH];
  gkrt_tensor grad[DP_MAX_DEPTH];
  for (uint32_t k = 0; k < L && !e; k++) {
    const size_t n = layer_floats(nw, k), h = b * nw->dims[k + 1];
    const struct {
      const char *fmt;
      size_t floats;
      gkrt_tensor_kind kind;
      gkrt_tensor *t;
    } ts[] = {{"W%u", n, GKRT_TENSOR_PARAMETER, &s->w[k]}, {"grad_W%u", n, I, &grad[k]}, {"z%u", h, I, &z[k]},
              {"a%u", h, I, &a[k]}, {"dz%u", h, I, &dz[k]}, {"da%u", h, I, &da[k]}};
    /* The last layer has no z, a (y is its output) and its dz is dy (below). */
    const size_t count = k + 1 == L ? 2 : sizeof ts / sizeof ts[0];
    for (size_t i = 0; i < count && !e; i++) {
      snprintf(name, sizeof name, ts[i].fmt, k + 1);
      e |= tensor(g, ts[i].floats, ts[i].kind, name, ts[i].t);
    }
  }
  gkrt_tensor err, dy;
  e |= tensor(g, b * O, I, "err", &err) | tensor(g, b * O, I, "dy", &dy);
  if (e || forward(g, K, nw, s, z, a)) return 1;

  /* dLoss/dy = (y − t) / rows: this rank's mean. Averaging the ranks' means is the batch mean. */
  const float inv_rows = 1.0f / (float)rows;
  gkrt_tensor in_err[2] = {s->y, s->nt};
  e |= node(g, K->add, in_err, 2, err, NULL, 0, NULL);
  e |= node(g, K->scale, &err, 1, dy, &inv_rows, sizeof inv_rows, NULL);
  if (e) return 1;

  /* Backward, last layer first: each layer's gradient all-reduced as soon as it exists, while
   * the layers below compute. */
  for (uint32_t kk = L; kk-- > 0;) {
    const size_t di = nw->dims[kk], dout = nw->dims[kk + 1];
    const gkrt_tensor d = kk + 1 == L ? dy : dz[kk], ain = kk == 0 ? s->x : a[kk - 1];
    /* dW = a_inᵀ·dz (di × dout; a_in is [b × di]). */
    if (gemm_node(g, K->blas, ain, d, grad[kk], di, dout, b, 1, 0)) return 1;
    if (comm)
      TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_AVG, 0, GKRT_DTYPE_F32,
                                    &grad[kk], 1, &grad[kk], 1, NULL));
    if (kk == 0) break;
    /* da_{k-1} = dz·Wᵀ (b × di; W is [di × dout]); dz_{k-1} = relu'(z_{k-1})·da. */
    gkrt_tensor in_g[2] = {da[kk - 1], z[kk - 1]};
    e |= gemm_node(g, K->blas, d, s->w[kk], da[kk - 1], b, di, dout, 0, 1);
    e |= node(g, K->relu_grad, in_g, 2, dz[kk - 1], NULL, 0, NULL);
    if (e) return 1;
  }

  /* SGD in place, W += (−lr)·grad (one axpy node a layer: a single pass over W, as PyTorch's
   * SGD), last layer first: the first layer's update, which waits for the last all-reduce, comes
   * last, so the others run while that all-reduce is in flight. */
  for (uint32_t kk = L; kk-- > 0;)
    TRY(axpy_add(g, K->blas, grad[kk], s->w[kk], (uint32_t)layer_floats(nw, kk), -nw->lr, NULL));
  /* The default small network: 16 KiB buckets (as the library's defaults, DDP's 1 MiB first
   * bucket, would) fuse its two gradients (4 + 8 KiB) into one call, issued at grad_W1's node (the
   * info log: "1 all-reduce nodes fused"). Larger networks pass --bucket-kib 0 (DDP's sizes) or
   * their own. */
  if (comm && bucket_kib)
    TRY(gkrt_graph_set_collective_buckets(g, (uint64_t)bucket_kib << 10, (uint64_t)bucket_kib << 10));
  TRY(gkrt_graph_finalize(g));
  return 0;
}

/* step_build_graph on a new graph of `rt` with this runtime's kernels (released here: the graph
 * keeps what its nodes use). On failure the graph, if made, is in s->graph for the caller. */
static int step_build(gkrt_runtime *rt, gkrt_comm *comm, const net *nw, size_t rows, uint32_t bucket_kib,
                      step_graph *s) {
  kernels K;
  if (kernels_make(rt, &K)) return 1;
  gkrt_graph *g;
  int bad = check(gkrt_graph_create(rt, &g), "graph create");
  if (!bad) bad = step_build_graph(g, &K, comm, nw, rows, bucket_kib, s);
  kernels_release(&K);
  return bad;
}

/* The product kernel against plain C on small odd sizes, in the three forms the step uses (a·b,
 * aᵀ·b, a·bᵀ), so a mistake in the flags or the operand order shows here rather than as a
 * network that trains wrongly on every rank alike. On CUDA it checks the cuBLAS call. Relative
 * tolerance 1e-5 (sums of 7 products; exact on the host loop, which adds in the same order). */
static int gemm_selftest(gkrt_runtime *rt) {
  enum { M = 5, N = 3, K = 7 };
  float A[M * K], B[K * N], At[K * M], Bt[N * K], want[M * N], got[3][M * N];
  fill_random(A, M * K, 11, 1.0f);
  fill_random(B, K * N, 12, 1.0f);
  for (int i = 0; i < M; i++)
    for (int q = 0; q < K; q++) At[q * M + i] = A[i * K + q];
  for (int q = 0; q < K; q++)
    for (int j = 0; j < N; j++) Bt[j * K + q] = B[q * N + j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int q = 0; q < K; q++) acc = acc + A[i * K + q] * B[q * N + j];
      want[i * N + j] = acc;
    }
  kernels ks;
  if (kernels_make(rt, &ks)) return 1;
  gkrt_graph *g = NULL;
  gkrt_tensor a, b, at, bt, c[3];
  int bad = check(gkrt_graph_create(rt, &g), "self-test graph");
  bad = bad || tensor(g, M * K, GKRT_TENSOR_INPUT, "A", &a) || tensor(g, K * N, GKRT_TENSOR_INPUT, "B", &b) ||
        tensor(g, K * M, GKRT_TENSOR_INPUT, "At", &at) || tensor(g, N * K, GKRT_TENSOR_INPUT, "Bt", &bt) ||
        tensor(g, M * N, GKRT_TENSOR_OUTPUT, "AB", &c[0]) || tensor(g, M * N, GKRT_TENSOR_OUTPUT, "AtB", &c[1]) ||
        tensor(g, M * N, GKRT_TENSOR_OUTPUT, "ABt", &c[2]);
  bad = bad || gemm_node(g, ks.blas, a, b, c[0], M, N, K, 0, 0) || gemm_node(g, ks.blas, at, b, c[1], M, N, K, 1, 0) ||
        gemm_node(g, ks.blas, a, bt, c[2], M, N, K, 0, 1);
  bad = bad || check(gkrt_graph_finalize(g), "self-test finalize") ||
        check(gkrt_graph_write_tensor(g, a, A, sizeof A), "write A") ||
        check(gkrt_graph_write_tensor(g, b, B, sizeof B), "write B") ||
        check(gkrt_graph_write_tensor(g, at, At, sizeof At), "write At") ||
        check(gkrt_graph_write_tensor(g, bt, Bt, sizeof Bt), "write Bt") ||
        check(gkrt_runtime_run(rt, g), "self-test run");
  for (int v = 0; v < 3 && !bad; v++) bad = check(gkrt_graph_read_tensor(g, c[v], got[v], sizeof got[v]), "read C");
  const char *form[3] = {"a*b", "aT*b", "a*bT"};
  for (int v = 0; v < 3 && !bad; v++)
    for (int i = 0; i < M * N; i++)
      if (!(fabsf(got[v][i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])))) {
        fprintf(stderr, "gemm self-test: %s element %d is %.9g, plain C %.9g\n", form[v], i, got[v][i], want[i]);
        bad = 1;
        break;
      }
  if (g && check(gkrt_graph_release(g), "self-test release")) bad = 1;
  kernels_release(&ks);
  return bad;
}

/* Writes the shard (rows first..first+rows of the batch) and the initial weights. */
static int step_load(step_graph *s, const problem *p, size_t first) {
  const net *nw = p->nw;
  const size_t n = s->rows, D = nw->dims[0], O = nw->dims[nw->depth];
  float *nt = malloc(n * O * sizeof(float));
  if (!nt) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }
  for (size_t i = 0; i < n * O; i++) nt[i] = -p->t[first * O + i];
  int bad = check(gkrt_graph_write_tensor(s->graph, s->x, p->x + first * D, n * D * sizeof(float)), "write x");
  bad |= check(gkrt_graph_write_tensor(s->graph, s->nt, nt, n * O * sizeof(float)), "write -t");
  for (uint32_t k = 0; k < nw->depth && !bad; k++)
    bad |= check(gkrt_graph_write_tensor(s->graph, s->w[k], p->w + nw->off[k], layer_floats(nw, k) * sizeof(float)),
                 "write weight");
  free(nt);
  return bad;
}

/* Runs one step: loss (½·mean |y − t|² over the shard, before the update) into *loss; `y` has
 * room for the shard's outputs. */
static int step_run(gkrt_runtime *rt, step_graph *s, const problem *p, size_t first, float *y, double *loss) {
  const size_t O = p->nw->dims[p->nw->depth];
  TRY(gkrt_runtime_run(rt, s->graph));
  TRY(gkrt_graph_read_tensor(s->graph, s->y, y, s->rows * O * sizeof(float)));
  double sum = 0;
  for (size_t i = 0; i < s->rows * O; i++) {
    double d = (double)y[i] - p->t[first * O + i];
    sum += d * d;
  }
  *loss = 0.5 * sum / (double)s->rows;
  return 0;
}

/* The weights after the steps, from the parameter tensors into `w` (nw->params floats). */
static int step_weights(step_graph *s, const net *nw, float *w) {
  for (uint32_t k = 0; k < nw->depth; k++)
    TRY(gkrt_graph_read_tensor(s->graph, s->w[k], w + nw->off[k], layer_floats(nw, k) * sizeof(float)));
  return 0;
}

/* Every rank's weights bit for bit equal: an all-reduce MIN and MAX of them equals each own
 * copy. In chunks of at most DP_CHECK_CHUNK floats and an eighth of the memory limit (its three
 * tensors then fit under it, with room for the pool's rounding); every rank has the same limit,
 * so they run the same chunks. */
static int ranks_identical(gkrt_runtime *rt, gkrt_comm *comm, const float *w, size_t floats, size_t limit_mib,
                           uint32_t rank) {
  size_t chunk = floats < DP_CHECK_CHUNK ? floats : DP_CHECK_CHUNK;
  if (limit_mib && chunk > (limit_mib << 20) / 8 / sizeof(float)) chunk = (limit_mib << 20) / 8 / sizeof(float);
  const uint64_t bytes = chunk * sizeof(float);
  gkrt_graph *g;
  TRY(gkrt_graph_create(rt, &g));
  gkrt_tensor in, lo, hi;
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_INPUT, "weights", &in));
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_OUTPUT, "min", &lo));
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_OUTPUT, "max", &hi));
  TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_MIN, 0, GKRT_DTYPE_F32, &in, 1, &lo, 1,
                                NULL));
  TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_MAX, 0, GKRT_DTYPE_F32, &in, 1, &hi, 1,
                                NULL));
  TRY(gkrt_graph_finalize(g));
  float *buf = calloc(chunk, sizeof(float)), *mins = malloc(bytes), *maxs = malloc(bytes);
  int bad = !buf || !mins || !maxs;
  size_t differ = 0;
  /* Every rank runs the same number of chunks (the same `floats`); the last one is padded with
   * zeros on every rank alike. */
  for (size_t at = 0; at < floats && !bad; at += chunk) {
    const size_t n = floats - at < chunk ? floats - at : chunk;
    memset(buf, 0, bytes);
    memcpy(buf, w + at, n * sizeof(float));
    bad |= check(gkrt_graph_write_tensor(g, in, buf, bytes), "write weights");
    bad |= bad || check(gkrt_runtime_run(rt, g), "run the identity check");
    bad |= bad || check(gkrt_graph_read_tensor(g, lo, mins, bytes), "read min");
    bad |= bad || check(gkrt_graph_read_tensor(g, hi, maxs, bytes), "read max");
    if (!bad) differ += memcmp(mins, buf, bytes) != 0 || memcmp(maxs, buf, bytes) != 0;
  }
  if (!bad && differ) {
    fprintf(stderr, "rank %u: the ranks' weights are not identical (%zu chunks differ)\n", rank, differ);
    bad = 1;
  }
  free(buf);
  free(mins);
  free(maxs);
  TRY(gkrt_graph_release(g));
  return bad;
}

/* Largest |a − b| over the weights, and the largest |b|. */
static void compare(const float *a, const float *b, size_t n, double *max_diff, double *max_abs) {
  *max_diff = 0;
  *max_abs = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > *max_diff || d != d) *max_diff = d; /* a NaN is never "close" */
    if (fabs(b[i]) > *max_abs) *max_abs = fabs(b[i]);
  }
}

/* FNV-1a, 64 bits, of `bytes` bytes: the run's fingerprint. */
static uint64_t fnv1a(const void *data, size_t bytes) {
  const unsigned char *p = data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

typedef struct options {
  uint32_t ranks, rank, nranks, steps, trace_steps, bucket_kib;
  int rank_given, skip_reference;
  size_t batch, memory_limit_mib;
  const char *id_file, *trace_dir;
  net nw;
} options;

/* The single-runtime reference on the combined batch: its weights after every step and its
 * loss per step. */
static int reference(const options *o, const problem *p, float *w, double *losses) {
  gkrt_config cfg;
  TRY(gkrt_config_init(&cfg));
  cfg.device_ordinal = o->ranks ? 0 : o->rank; /* this process's GPU */
  gkrt_runtime *rt;
  TRY(gkrt_runtime_create(&cfg, &rt));
  step_graph s;
  float *y = malloc(p->batch * o->nw.dims[o->nw.depth] * sizeof(float));
  if (!y || step_build(rt, NULL, &o->nw, p->batch, 0, &s) || step_load(&s, p, 0)) return 1;
  for (uint32_t k = 0; k < o->steps + o->trace_steps; k++)
    if (step_run(rt, &s, p, 0, y, &losses[k])) return 1;
  free(y);
  if (step_weights(&s, &o->nw, w)) return 1;
  TRY(gkrt_graph_release(s.graph));
  TRY(gkrt_runtime_release(rt));
  return 0;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts `v`; its median (the upper middle one for an even count: a step time, no averaging). */
static double median_ms(double *v, uint32_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* One rank. */
typedef struct rank_job {
  const options *o;
  const problem *p;
  gkrt_unique_id id;
  uint32_t rank, nranks;
  float *w;       /* out: weights after every step */
  double *losses; /* out: shard loss per step */
  double step_ms; /* out: median wall time of a timed step (run, output read, loss) */
  gkrt_stats stats; /* out: the runtime's figures after the steps */
  int failed;
} rank_job;

/* The timed steps, then the traced ones (their trace written to the trace folder). */
static int rank_steps(gkrt_runtime *rt, rank_job *j, step_graph *s, size_t first) {
  const options *o = j->o;
  float *y = malloc(s->rows * o->nw.dims[o->nw.depth] * sizeof(float));
  double *ms = calloc(o->steps, sizeof(double));
  int bad = !y || !ms;
  for (uint32_t k = 0; k < o->steps && !bad; k++) {
    double t0 = now_ms();
    bad = step_run(rt, s, j->p, first, y, &j->losses[k]);
    ms[k] = now_ms() - t0;
  }
  if (!bad) j->step_ms = median_ms(ms, o->steps);
  if (!bad && o->trace_steps && !(bad = check(gkrt_runtime_trace_begin(rt), "trace begin"))) {
    for (uint32_t k = 0; k < o->trace_steps && !bad; k++)
      bad = step_run(rt, s, j->p, first, y, &j->losses[o->steps + k]);
    char path[4096];
    snprintf(path, sizeof path, "%s/trace_rank%u.json", o->trace_dir, j->rank);
    /* Ended even after a failed step, so the runtime is left untraced. */
    bad |= check(gkrt_runtime_trace_end(rt, path), "trace end");
  }
  free(y);
  free(ms);
  return bad;
}

static int rank_body(rank_job *j) {
  const options *o = j->o;
  gkrt_config cfg;
  TRY(gkrt_config_init(&cfg));
  cfg.device_ordinal = j->rank; /* device = rank (the host backend has one device and ignores it) */
  cfg.memory_limit = (uint64_t)o->memory_limit_mib << 20;
  if (j->rank == 0) cfg.log_level = 3; /* info: the backend picked, and how many all-reduces were fused */
  gkrt_runtime *rt;
  TRY(gkrt_runtime_create(&cfg, &rt));
  gkrt_device_kind dev;
  TRY(gkrt_runtime_device(rt, &dev));
  if (!o->ranks && j->nranks > 1 && dev == GKRT_DEVICE_HOST) {
    /* Its ranks meet in a registry of this process: another process's would wait forever. */
    fprintf(stderr, "rank %u: the host backend's ranks are threads of one process: use --ranks N, or "
                    "GKRT_DEVICE=cuda for one process per GPU\n", j->rank);
    TRY(gkrt_runtime_release(rt));
    return 1;
  }
  gkrt_comm *comm;
  TRY(gkrt_comm_init_rank(rt, &j->id, j->rank, j->nranks, 0, &comm));
  const size_t rows = j->p->batch / j->nranks, first = j->rank * rows;
  step_graph s = {0};
  int bad = gemm_selftest(rt);
  if (bad) fprintf(stderr, "rank %u: the product kernel disagrees with plain C\n", j->rank);
  else if (j->rank == 0)
    printf("rank 0: products: %s, checked against plain C\n",
           dev == GKRT_DEVICE_CUDA ? "cuBLAS sgemm and saxpy in host-callback nodes" : "CPU loops in host-callback nodes");
  if (!bad) bad = step_build(rt, comm, &o->nw, rows, o->bucket_kib, &s) || step_load(&s, j->p, first);
  if (!bad) bad = rank_steps(rt, j, &s, first);
  if (!bad) bad = step_weights(&s, &o->nw, j->w);
  if (!bad) bad = check(gkrt_runtime_stats(rt, &j->stats), "stats");
  /* The step's memory goes back before the identity check's graph needs its own. */
  if (s.graph && check(gkrt_graph_release(s.graph), "release the step")) bad = 1;
  if (!bad) bad = ranks_identical(rt, comm, j->w, o->nw.params, o->memory_limit_mib, j->rank);
  /* A rank that failed aborts, so the others' collectives fail instead of waiting for it. */
  if (bad && gkrt_comm_abort(comm) != GKRT_STATUS_OK) fprintf(stderr, "rank %u: abort failed\n", j->rank);
  TRY(gkrt_comm_release(comm));
  TRY(gkrt_runtime_release(rt));
  return bad;
}

static void *rank_thread(void *arg) {
  rank_job *j = arg;
  j->failed = rank_body(j);
  return NULL;
}

static int usage(const char *why) {
  fprintf(stderr,
          "%s\nusage: gkrt_data_parallel --ranks N | --rank R --nranks N --id-file PATH  [--steps K] [--batch B]\n"
          "  [--in D] [--width H] [--out O] [--depth L] [--lr X] [--bucket-kib K] [--trace DIR --trace-steps T]\n"
          "  [--memory-limit MIB] [--reference 0|1]\n",
          why);
  return 2;
}

static int parse(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->steps = 5;
  o->batch = 32;
  o->bucket_kib = 16;
  unsigned long in = 32, width = 64, out = 16, depth = 2;
  float lr = 0.2f;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) return usage("every flag takes a value");
    const char *f = argv[i], *v = argv[++i];
    char *end;
    if (!strcmp(f, "--lr")) {
      lr = strtof(v, &end);
      if (!*v || *end || !(lr > 0.0f) || lr > 100.0f) return usage("--lr must be a number in (0, 100]");
      continue;
    }
    unsigned long n = strtoul(v, &end, 10);
    int numeric = *v && !*end && *v != '-';
    if (!strcmp(f, "--id-file")) o->id_file = v;
    else if (!strcmp(f, "--trace")) o->trace_dir = v;
    else if (!numeric) return usage("flag values must be whole numbers");
    else if (!strcmp(f, "--ranks")) o->ranks = (uint32_t)n;
    else if (!strcmp(f, "--rank")) o->rank = (uint32_t)n, o->rank_given = 1;
    else if (!strcmp(f, "--nranks")) o->nranks = (uint32_t)n;
    else if (!strcmp(f, "--steps")) o->steps = (uint32_t)n;
    else if (!strcmp(f, "--trace-steps")) o->trace_steps = (uint32_t)n;
    else if (!strcmp(f, "--batch")) o->batch = n;
    else if (!strcmp(f, "--in")) in = n;
    else if (!strcmp(f, "--width")) width = n;
    else if (!strcmp(f, "--out")) out = n;
    else if (!strcmp(f, "--depth")) depth = n;
    else if (!strcmp(f, "--bucket-kib")) o->bucket_kib = n > (1ul << 22) ? UINT32_MAX : (uint32_t)n;
    else if (!strcmp(f, "--memory-limit")) o->memory_limit_mib = n;
    else if (!strcmp(f, "--reference")) {
      if (n > 1) return usage("--reference must be 0 or 1");
      o->skip_reference = n == 0;
    }
    else return usage("unknown flag");
  }
  uint32_t n = o->ranks ? o->ranks : o->nranks;
  if (o->ranks && (o->rank_given || o->nranks || o->id_file)) return usage("--ranks (threads) or --rank/--nranks/--id-file, not both");
  if (!o->ranks && (!o->nranks || !o->id_file || o->rank >= o->nranks))
    return usage("give --ranks N, or --rank R --nranks N --id-file PATH with R < N");
  if (n > DP_MAX_RANKS) return usage("at most 64 ranks");
  if (o->steps == 0 || o->steps + o->trace_steps > DP_MAX_STEPS) return usage("--steps must be 1.., steps + trace steps at most 1000");
  if (!o->trace_dir != !o->trace_steps) return usage("--trace DIR and --trace-steps T (T >= 1) go together");
  if (depth < 2 || depth > DP_MAX_DEPTH) return usage("--depth must be 2..16 (weight layers)");
  /* Matmul dimensions are 32-bit, and every tensor stays below 2^40 bytes. */
  if (!in || !width || !out || in > 65536 || width > 65536 || out > 65536) return usage("--in, --width and --out must be 1..65536");
  /* cuBLAS counts a layer's floats (the SGD step's axpy) in an int. */
  if (in * width > INT32_MAX || width * width > INT32_MAX || width * out > INT32_MAX)
    return usage("a layer (--in x --width, --width x --width, --width x --out) must have under 2^31 weights");
  if (o->batch == 0 || o->batch > (1ul << 20) || o->batch % n) return usage("--batch must be 1..2^20 and a multiple of the ranks");
  if (o->bucket_kib > (1u << 22)) return usage("--bucket-kib must be at most 4194304 (4 GiB)");
  if (o->memory_limit_mib > (1ul << 24)) return usage("--memory-limit is in MiB, at most 2^24");
  net_make(&o->nw, (uint32_t)depth, in, width, out, lr);
  return 0;
}

/* Rank 0 writes the id to PATH (through a temporary file renamed into place, so a reader never
 * sees half of it); the others poll for it, for up to two minutes. */
static int share_id(const options *o, gkrt_unique_id *id) {
  if (o->rank == 0) {
    gkrt_config cfg;
    TRY(gkrt_config_init(&cfg));
    gkrt_runtime *rt;
    TRY(gkrt_runtime_create(&cfg, &rt));
    TRY(gkrt_comm_get_unique_id(rt, id));
    TRY(gkrt_runtime_release(rt));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->id_file);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, o->id_file) != 0) {
      fprintf(stderr, "cannot write the id to %s: %s\n", o->id_file, strerror(errno));
      return 1;
    }
    return 0;
  }
  for (int tries = 0; tries < 1200; tries++) {
    FILE *f = fopen(o->id_file, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return 0;
    }
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  fprintf(stderr, "rank %u: no id in %s after two minutes\n", o->rank, o->id_file);
  return 1;
}

/* Per rank: step time, memory, fingerprint; then whether its weights are close to the
 * reference's (`ref_w`, NULL when it did not run) and equal to the first local rank's. Returns
 * non-zero on a failed check. */
static int report(const options *o, const rank_job *jobs, uint32_t local, uint32_t n, const float *ref_w) {
  const uint32_t total = o->steps + o->trace_steps;
  int bad = 0;
  for (uint32_t r = 0; r < local; r++) {
    const rank_job *j = &jobs[r];
    printf("rank %u: step time %.3f ms (median of %u), %zu rows per rank\n", j->rank, j->step_ms, o->steps,
           o->batch / n);
    printf("rank %u: memory limit %zu MiB (0: none), peak reserved %.1f MiB, swapped out %.1f MiB, in %.1f MiB, "
           "tensors recomputed %llu, evictions %llu\n",
           j->rank, o->memory_limit_mib, j->stats.peak_reserved_bytes / 1048576.0, j->stats.swap_out_bytes / 1048576.0,
           j->stats.swap_in_bytes / 1048576.0, (unsigned long long)j->stats.tensors_recomputed,
           (unsigned long long)j->stats.evictions);
    printf("rank %u: fingerprint weights %016llx losses %016llx\n", j->rank,
           (unsigned long long)fnv1a(j->w, o->nw.params * sizeof(float)),
           (unsigned long long)fnv1a(j->losses, total * sizeof(double)));
    if (o->trace_steps)
      printf("rank %u: steps %u..%u traced: %s/trace_rank%u.json\n", j->rank, o->steps + 1, total, o->trace_dir,
             j->rank);
  }
  for (uint32_t r = 0; r < local && ref_w; r++) {
    double max_diff, max_abs;
    compare(jobs[r].w, ref_w, o->nw.params, &max_diff, &max_abs);
    int close = max_diff <= DP_TOL * max_abs;
    printf("rank %u: weights vs the single runtime: max |diff| %.3g (tolerance %.3g = %.0e x max |w| %.3g) -> %s\n",
           jobs[r].rank, max_diff, DP_TOL * max_abs, DP_TOL, max_abs, close ? "close" : "TOO FAR");
    bad |= !close;
  }
  for (uint32_t r = 0; r < local; r++) {
    /* ranks_identical already checked this across processes; threads can also compare directly. */
    if (memcmp(jobs[r].w, jobs[0].w, o->nw.params * sizeof(float)) != 0) {
      printf("rank %u: weights differ from rank %u's\n", jobs[r].rank, jobs[0].rank);
      bad = 1;
    }
  }
  return bad;
}

int main(int argc, char **argv) {
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc;
  const uint32_t n = o.ranks ? o.ranks : o.nranks, total = o.steps + o.trace_steps;
  const net *nw = &o.nw;
  problem p;
  if (problem_make(&p, nw, o.batch)) return 1;
  float *ref_w = calloc(nw->params, sizeof(float));
  double ref_loss[DP_MAX_STEPS];
  /* This process's ranks: all of them as threads, or the one given. */
  const uint32_t local = o.ranks ? o.ranks : 1;
  rank_job jobs[DP_MAX_RANKS];
  int bad = !ref_w;
  for (uint32_t r = 0; r < local && !bad; r++) {
    jobs[r] = (rank_job){&o, &p, {{0}}, o.ranks ? r : o.rank, n, calloc(nw->params, sizeof(float)),
                         calloc(total, sizeof(double)), 0, {0}, 0};
    bad |= !jobs[r].w || !jobs[r].losses;
  }
  if (bad) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }
  char shape[256];
  int len = snprintf(shape, sizeof shape, "%zu", nw->dims[0]);
  for (uint32_t k = 1; k <= nw->depth && len > 0 && (size_t)len < sizeof shape; k++)
    len += snprintf(shape + len, sizeof shape - (size_t)len, "-%zu", nw->dims[k]);
  printf("gkrt %s: data-parallel MLP %s (%zu weights, %.1f MiB of gradients all-reduced per step), "
         "batch %zu over %u ranks (%s), %u steps\n",
         gkrt_version(), shape, nw->params, nw->params * 4.0 / 1048576.0, o.batch, n,
         o.ranks ? "threads of one process" : "one process each", total);

  gkrt_unique_id id;
  if (o.ranks) {
    gkrt_config cfg;
    gkrt_runtime *rt;
    if (check(gkrt_config_init(&cfg), "config") || check(gkrt_runtime_create(&cfg, &rt), "runtime") ||
        check(gkrt_comm_get_unique_id(rt, &id), "unique id") || check(gkrt_runtime_release(rt), "release"))
      return 1;
  } else if (share_id(&o, &id)) {
    return 1;
  }
  pthread_t threads[DP_MAX_RANKS];
  for (uint32_t r = 0; r < local; r++) {
    jobs[r].id = id;
    if (pthread_create(&threads[r], NULL, rank_thread, &jobs[r]) != 0) {
      fprintf(stderr, "cannot start a thread\n");
      return 1;
    }
  }
  for (uint32_t r = 0; r < local; r++) {
    pthread_join(threads[r], NULL);
    bad |= jobs[r].failed;
  }
  if (bad) {
    fprintf(stderr, "FAILED: a rank's training step failed\n");
    return 1;
  }
  if (!o.skip_reference && reference(&o, &p, ref_w, ref_loss)) {
    fprintf(stderr, "FAILED: the single-runtime reference failed\n");
    return 1;
  }

  for (uint32_t k = 0; k < total; k++) {
    /* Threads: every shard's loss is here, and their mean is the batch's. A process sees its own. */
    double loss = 0;
    for (uint32_t r = 0; r < local; r++) loss += jobs[r].losses[k] / local;
    if (o.skip_reference)
      printf("step %u  loss %.6f  (%s)\n", k + 1, loss, o.ranks ? "mean over the ranks" : "this rank's shard");
    else
      printf("step %u  loss %.6f  (%s; one runtime on the combined batch: %.6f)\n", k + 1, loss,
             o.ranks ? "mean over the ranks" : "this rank's shard", ref_loss[k]);
  }
  bad = report(&o, jobs, local, n, o.skip_reference ? NULL : ref_w);
  for (uint32_t r = 0; r < local; r++) {
    free(jobs[r].w);
    free(jobs[r].losses);
  }
  free(ref_w);
  problem_free(&p);
  if (bad) {
    printf("FAILED\n");
    return 1;
  }
  printf("every rank's weights identical bit for bit; %s\nOK\n",
         o.skip_reference ? "the single-runtime reference not run (--reference 0)"
                          : "equal to the single runtime's within tolerance");
  return 0;
}
