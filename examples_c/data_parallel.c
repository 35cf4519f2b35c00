/*
 * gkrt data-parallel training: every rank runs the same training step of a small MLP on its
 * shard of one fixed synthetic batch; the gradients are averaged across ranks by all-reduce nodes
 * in the graph (fused into buckets at finalize, as PyTorch DDP does), so every rank takes the same
 * SGD step. The program then checks what data parallelism promises:
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
 *
 * GKRT_DEVICE (host|cuda|auto) picks the backend; rank R uses device R (so --ranks N on CUDA
 * needs N GPUs: NCCL refuses two ranks on one).
 *
 * The network: y = relu(x·W1)·W2, loss = ½·mean over rows of |y − t|², t = x·Wt for a fixed
 * random "teacher" Wt. gkrt's built-ins have no transpose, and the weight gradients need the
 * transposed activations (dW2 = a1ᵀ·dy, dW1 = xᵀ·dz1) and weights (da1 = dy·W2ᵀ), so the graph
 * keeps every weight in both layouts (W and Wᵀ) and runs forward and backward in both. Each
 * transposed product sums the same products in the same order, so Wᵀ stays the exact transpose
 * of W — checked too. The host supplies x and t in both layouts.
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

enum { DP_D = 32, DP_H = 64, DP_O = 16, DP_MAX_RANKS = 64 };
#define DP_LR 0.2f
#define DP_TOL 1e-5

/* The four weights in the order the program keeps them everywhere. */
enum { W1, W1T, W2, W2T, NW };
static const size_t w_rows[NW] = {DP_D, DP_H, DP_H, DP_O}, w_cols[NW] = {DP_H, DP_D, DP_O, DP_H};
static const char *w_names[NW] = {"W1", "W1T", "W2", "W2T"};
#define DP_PARAMS (2 * (DP_D * DP_H + DP_H * DP_O))

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

/* Deterministic values in [-1, 1) (the fixed seed of the synthetic batch). */
static void fill_random(float *v, size_t n, uint32_t seed, float scale) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = scale * ((float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f);
  }
}

static void transpose(const float *a, float *at, size_t rows, size_t cols) {
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) at[j * rows + i] = a[i * cols + j];
}

/* The combined batch and the initial weights, the same for every rank and the reference. */
typedef struct problem {
  size_t batch;
  float *x, *t;          /* [batch, D], [batch, O] */
  float *w[NW];          /* initial weights, both layouts */
} problem;

static int problem_make(problem *p, size_t batch) {
  p->batch = batch;
  p->x = malloc(batch * DP_D * sizeof(float));
  p->t = malloc(batch * DP_O * sizeof(float));
  float *teacher = malloc(DP_D * DP_O * sizeof(float));
  for (int k = 0; k < NW; k++) p->w[k] = malloc(w_rows[k] * w_cols[k] * sizeof(float));
  if (!p->x || !p->t || !teacher || !p->w[W1] || !p->w[W1T] || !p->w[W2] || !p->w[W2T]) {
    fprintf(stderr, "out of host memory\n");
    free(teacher);
    return 1;
  }
  fill_random(p->x, batch * DP_D, 1, 1.0f);
  fill_random(teacher, DP_D * DP_O, 2, 1.0f / sqrtf(DP_D));
  for (size_t i = 0; i < batch; i++)
    for (size_t o = 0; o < DP_O; o++) {
      float acc = 0.0f;
      for (size_t d = 0; d < DP_D; d++) acc += p->x[i * DP_D + d] * teacher[d * DP_O + o];
      p->t[i * DP_O + o] = acc;
    }
  free(teacher);
  fill_random(p->w[W1], DP_D * DP_H, 3, 1.0f / sqrtf(DP_D));
  fill_random(p->w[W2], DP_H * DP_O, 4, 1.0f / sqrtf(DP_H));
  transpose(p->w[W1], p->w[W1T], DP_D, DP_H);
  transpose(p->w[W2], p->w[W2T], DP_H, DP_O);
  return 0;
}

static void problem_free(problem *p) {
  free(p->x);
  free(p->t);
  for (int k = 0; k < NW; k++) free(p->w[k]);
}

/* One rank's training step as a graph. */
typedef struct step_graph {
  gkrt_graph *graph;
  size_t rows; /* this rank's shard */
  gkrt_tensor x, xt, nt, ntt; /* inputs: the shard and −t, both layouts */
  gkrt_tensor w[NW], w_next[NW], y;
} step_graph;

static int node(gkrt_graph *g, gkrt_kernel *k, const gkrt_tensor *in, size_t nin, gkrt_tensor out,
                const void *params, size_t params_size) {
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, params, params_size};
  TRY(gkrt_graph_add_kernel(g, k, in, nin, &out, 1, NULL, 0, &launch, NULL));
  return 0;
}

static int matmul_node(gkrt_graph *g, gkrt_kernel *mm, gkrt_tensor a, gkrt_tensor b, gkrt_tensor c, uint32_t m,
                       uint32_t n, uint32_t k) {
  const uint32_t mnk[3] = {m, n, k};
  gkrt_tensor in[2] = {a, b};
  return node(g, mm, in, 2, c, mnk, sizeof mnk);
}

static int tensor(gkrt_graph *g, size_t floats, gkrt_tensor_kind kind, const char *name, gkrt_tensor *out) {
  TRY(gkrt_graph_add_tensor(g, floats * sizeof(float), kind, name, out));
  return 0;
}

/* Builds the step for `rows` rows. With `comm`, each weight gradient is all-reduced (average) in
 * place right after it is computed, backward order first, as DDP does; finalize fuses the
 * consecutive all-reduces into buckets. Without, it is the single-runtime reference. */
static int step_build(gkrt_runtime *rt, gkrt_comm *comm, size_t rows, step_graph *s) {
  gkrt_kernel *add, *relu, *relu_grad, *scale, *mm;
  TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, &add));
  TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &relu));
  TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU_GRAD, &relu_grad));
  TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_SCALE, &scale));
  TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_MATMUL, &mm));
  gkrt_graph *g;
  TRY(gkrt_graph_create(rt, &g));
  s->graph = g;
  s->rows = rows;
  const uint32_t b = (uint32_t)rows, D = DP_D, H = DP_H, O = DP_O;
  int e = 0;
  e |= tensor(g, rows * D, GKRT_TENSOR_INPUT, "x", &s->x);
  e |= tensor(g, D * rows, GKRT_TENSOR_INPUT, "xT", &s->xt);
  e |= tensor(g, rows * O, GKRT_TENSOR_INPUT, "minus_t", &s->nt);
  e |= tensor(g, O * rows, GKRT_TENSOR_INPUT, "minus_tT", &s->ntt);
  char name[32];
  for (int k = 0; k < NW; k++) {
    e |= tensor(g, w_rows[k] * w_cols[k], GKRT_TENSOR_PARAMETER, w_names[k], &s->w[k]);
    snprintf(name, sizeof name, "%s_next", w_names[k]);
    e |= tensor(g, w_rows[k] * w_cols[k], GKRT_TENSOR_OUTPUT, name, &s->w_next[k]);
  }
  e |= tensor(g, rows * O, GKRT_TENSOR_OUTPUT, "y", &s->y);
  gkrt_tensor z1, a1, z1t, a1t, yt, err, dy, errt, dyt, da1, dz1, da1t, dz1t, grad[NW], stepv[NW];
  const gkrt_tensor_kind I = GKRT_TENSOR_INTERMEDIATE;
  e |= tensor(g, rows * H, I, "z1", &z1) | tensor(g, rows * H, I, "a1", &a1);
  e |= tensor(g, H * rows, I, "z1T", &z1t) | tensor(g, H * rows, I, "a1T", &a1t);
  e |= tensor(g, O * rows, I, "yT", &yt);
  e |= tensor(g, rows * O, I, "err", &err) | tensor(g, rows * O, I, "dy", &dy);
  e |= tensor(g, O * rows, I, "errT", &errt) | tensor(g, O * rows, I, "dyT", &dyt);
  e |= tensor(g, rows * H, I, "da1", &da1) | tensor(g, rows * H, I, "dz1", &dz1);
  e |= tensor(g, H * rows, I, "da1T", &da1t) | tensor(g, H * rows, I, "dz1T", &dz1t);
  for (int k = 0; k < NW; k++) {
    snprintf(name, sizeof name, "grad_%s", w_names[k]);
    e |= tensor(g, w_rows[k] * w_cols[k], I, name, &grad[k]);
    snprintf(name, sizeof name, "step_%s", w_names[k]);
    e |= tensor(g, w_rows[k] * w_cols[k], I, name, &stepv[k]);
  }
  if (e) return 1;

  /* Forward, both layouts. */
  e |= matmul_node(g, mm, s->x, s->w[W1], z1, b, H, D) | node(g, relu, &z1, 1, a1, NULL, 0);
  e |= matmul_node(g, mm, s->w[W1T], s->xt, z1t, H, b, D) | node(g, relu, &z1t, 1, a1t, NULL, 0);
  e |= matmul_node(g, mm, a1, s->w[W2], s->y, b, O, H);
  e |= matmul_node(g, mm, s->w[W2T], a1t, yt, O, b, H);
  /* dLoss/dy = (y − t) / rows: this rank's mean. Averaging the ranks' means is the batch mean. */
  const float inv_rows = 1.0f / (float)rows;
  gkrt_tensor in_err[2] = {s->y, s->nt}, in_errt[2] = {yt, s->ntt};
  e |= node(g, add, in_err, 2, err, NULL, 0) | node(g, scale, &err, 1, dy, &inv_rows, sizeof inv_rows);
  e |= node(g, add, in_errt, 2, errt, NULL, 0) | node(g, scale, &errt, 1, dyt, &inv_rows, sizeof inv_rows);
  if (e) return 1;

  /* Backward: each gradient all-reduced as soon as it exists, while the next ones compute. */
  const int order[NW] = {W2, W2T, W1, W1T};
  for (int i = 0; i < NW; i++) {
    int k = order[i];
    switch (k) {
      case W2: e |= matmul_node(g, mm, a1t, dy, grad[W2], H, O, b); break;
      case W2T: e |= matmul_node(g, mm, dyt, a1, grad[W2T], O, H, b); break;
      case W1: {
        gkrt_tensor in_dz1[2] = {da1, z1};
        e |= matmul_node(g, mm, dy, s->w[W2T], da1, b, H, O) | node(g, relu_grad, in_dz1, 2, dz1, NULL, 0);
        e |= matmul_node(g, mm, s->xt, dz1, grad[W1], D, H, b);
        break;
      }
      case W1T: {
        gkrt_tensor in_dz1t[2] = {da1t, z1t};
        e |= matmul_node(g, mm, s->w[W2], dyt, da1t, H, b, O) | node(g, relu_grad, in_dz1t, 2, dz1t, NULL, 0);
        e |= matmul_node(g, mm, dz1t, s->x, grad[W1T], H, D, b);
        break;
      }
    }
    if (e) return 1;
    if (comm)
      TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_AVG, 0, GKRT_DTYPE_F32,
                                    &grad[k], 1, &grad[k], 1, NULL));
  }

  /* SGD: W_next = W + (−lr)·grad. The host copies W_next into W between steps. */
  const float neg_lr = -DP_LR;
  for (int k = 0; k < NW; k++) {
    gkrt_tensor in_upd[2] = {s->w[k], stepv[k]};
    e |= node(g, scale, &grad[k], 1, stepv[k], &neg_lr, sizeof neg_lr) | node(g, add, in_upd, 2, s->w_next[k], NULL, 0);
  }
  if (e) return 1;
  /* The defaults (DDP's 1 MiB first bucket) would put all four gradients (24 KiB) in one call.
   * 16 KiB buckets make two calls, as the info log says ("2 all-reduce nodes fused"): grad_W2,
   * grad_W2T and grad_W1 (4 + 4 + 8 KiB) issued together at grad_W1's node, then grad_W1T. */
  if (comm) TRY(gkrt_graph_set_collective_buckets(g, 16384, 16384));
  TRY(gkrt_graph_finalize(g));
  gkrt_kernel *ks[] = {add, relu, relu_grad, scale, mm};
  for (int i = 0; i < 5; i++) TRY(gkrt_kernel_release(ks[i]));
  return 0;
}

/* Writes the shard (rows first..first+rows of the batch) and the initial weights. */
static int step_load(step_graph *s, const problem *p, size_t first) {
  const size_t n = s->rows;
  float *x = malloc(n * DP_D * sizeof(float)), *xt = malloc(n * DP_D * sizeof(float));
  float *nt = malloc(n * DP_O * sizeof(float)), *ntt = malloc(n * DP_O * sizeof(float));
  int bad = !x || !xt || !nt || !ntt;
  if (!bad) {
    memcpy(x, p->x + first * DP_D, n * DP_D * sizeof(float));
    for (size_t i = 0; i < n * DP_O; i++) nt[i] = -p->t[first * DP_O + i];
    transpose(x, xt, n, DP_D);
    transpose(nt, ntt, n, DP_O);
    bad |= check(gkrt_graph_write_tensor(s->graph, s->x, x, n * DP_D * sizeof(float)), "write x");
    bad |= check(gkrt_graph_write_tensor(s->graph, s->xt, xt, n * DP_D * sizeof(float)), "write xT");
    bad |= check(gkrt_graph_write_tensor(s->graph, s->nt, nt, n * DP_O * sizeof(float)), "write -t");
    bad |= check(gkrt_graph_write_tensor(s->graph, s->ntt, ntt, n * DP_O * sizeof(float)), "write -tT");
    for (int k = 0; k < NW && !bad; k++)
      bad |= check(gkrt_graph_write_tensor(s->graph, s->w[k], p->w[k], w_rows[k] * w_cols[k] * sizeof(float)),
                   "write weight");
  }
  free(x);
  free(xt);
  free(nt);
  free(ntt);
  return bad;
}

/* Runs one step: loss (½·mean |y − t|² over the shard, before the update) into *loss, then the
 * updated weights copied back into the parameters and into `w` (DP_PARAMS floats, NW blocks). */
static int step_run(gkrt_runtime *rt, step_graph *s, const problem *p, size_t first, float *w, double *loss) {
  TRY(gkrt_runtime_run(rt, s->graph));
  float y[DP_O * 512];
  TRY(gkrt_graph_read_tensor(s->graph, s->y, y, s->rows * DP_O * sizeof(float)));
  double sum = 0;
  for (size_t i = 0; i < s->rows * DP_O; i++) {
    double d = (double)y[i] - p->t[first * DP_O + i];
    sum += d * d;
  }
  *loss = 0.5 * sum / (double)s->rows;
  for (int k = 0; k < NW; k++) {
    size_t bytes = w_rows[k] * w_cols[k] * sizeof(float);
    TRY(gkrt_graph_read_tensor(s->graph, s->w_next[k], w, bytes));
    TRY(gkrt_graph_write_tensor(s->graph, s->w[k], w, bytes));
    w += w_rows[k] * w_cols[k];
  }
  return 0;
}

/* 0 when every Wᵀ block is the exact transpose of its W. */
static int transposes_exact(const float *w, const char *who) {
  const float *w1 = w, *w1t = w1 + DP_D * DP_H, *w2 = w1t + DP_D * DP_H, *w2t = w2 + DP_H * DP_O;
  size_t bad = 0;
  for (size_t i = 0; i < DP_D; i++)
    for (size_t j = 0; j < DP_H; j++) bad += memcmp(&w1[i * DP_H + j], &w1t[j * DP_D + i], sizeof(float)) != 0;
  for (size_t i = 0; i < DP_H; i++)
    for (size_t j = 0; j < DP_O; j++) bad += memcmp(&w2[i * DP_O + j], &w2t[j * DP_H + i], sizeof(float)) != 0;
  if (bad) fprintf(stderr, "%s: %zu weights differ from their transposed copy\n", who, bad);
  return bad != 0;
}

/* Every rank's weights bit for bit equal: an all-reduce MIN and MAX of them equals each own copy. */
static int ranks_identical(gkrt_runtime *rt, gkrt_comm *comm, const float *w, uint32_t rank) {
  gkrt_graph *g;
  TRY(gkrt_graph_create(rt, &g));
  gkrt_tensor in, lo, hi;
  const uint64_t bytes = DP_PARAMS * sizeof(float);
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_INPUT, "weights", &in));
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_OUTPUT, "min", &lo));
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_OUTPUT, "max", &hi));
  TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_MIN, 0, GKRT_DTYPE_F32, &in, 1, &lo, 1,
                                NULL));
  TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_MAX, 0, GKRT_DTYPE_F32, &in, 1, &hi, 1,
                                NULL));
  TRY(gkrt_graph_finalize(g));
  TRY(gkrt_graph_write_tensor(g, in, w, bytes));
  TRY(gkrt_runtime_run(rt, g));
  float *mins = malloc(bytes), *maxs = malloc(bytes);
  int bad = !mins || !maxs;
  if (!bad) {
    bad |= check(gkrt_graph_read_tensor(g, lo, mins, bytes), "read min");
    bad |= check(gkrt_graph_read_tensor(g, hi, maxs, bytes), "read max");
  }
  if (!bad && (memcmp(mins, w, bytes) != 0 || memcmp(maxs, w, bytes) != 0)) {
    fprintf(stderr, "rank %u: the ranks' weights are not identical\n", rank);
    bad = 1;
  }
  free(mins);
  free(maxs);
  TRY(gkrt_graph_release(g));
  return bad;
}

/* Largest |a − b| over the weights, and the largest |b|. */
static void compare(const float *a, const float *b, double *max_diff, double *max_abs) {
  *max_diff = 0;
  *max_abs = 0;
  for (size_t i = 0; i < DP_PARAMS; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > *max_diff) *max_diff = d;
    if (fabs(b[i]) > *max_abs) *max_abs = fabs(b[i]);
  }
}

typedef struct options {
  uint32_t ranks, rank, nranks, steps;
  int rank_given;
  size_t batch;
  const char *id_file;
} options;

/* The single-runtime reference on the combined batch: its weights after K steps and its loss. */
static int reference(const options *o, const problem *p, float *w, double *losses) {
  gkrt_config cfg;
  TRY(gkrt_config_init(&cfg));
  cfg.device_ordinal = o->ranks ? 0 : o->rank; /* this process's GPU */
  gkrt_runtime *rt;
  TRY(gkrt_runtime_create(&cfg, &rt));
  step_graph s;
  if (step_build(rt, NULL, p->batch, &s) || step_load(&s, p, 0)) return 1;
  for (uint32_t k = 0; k < o->steps; k++)
    if (step_run(rt, &s, p, 0, w, &losses[k])) return 1;
  TRY(gkrt_graph_release(s.graph));
  TRY(gkrt_runtime_release(rt));
  return transposes_exact(w, "reference");
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

/* One rank: K steps on its shard, then the identity check. */
typedef struct rank_job {
  const options *o;
  const problem *p;
  gkrt_unique_id id;
  uint32_t rank, nranks;
  float *w;       /* out: weights after K steps */
  double *losses; /* out: shard loss per step */
  double step_ms; /* out: median wall time of a step (run, loss read, weights copied back) */
  int failed;
} rank_job;

static int rank_body(rank_job *j) {
  gkrt_config cfg;
  TRY(gkrt_config_init(&cfg));
  cfg.device_ordinal = j->rank; /* device = rank (the host backend has one device and ignores it) */
  if (j->rank == 0) cfg.log_level = 3; /* info: the backend picked, and how many all-reduces were fused */
  gkrt_runtime *rt;
  TRY(gkrt_runtime_create(&cfg, &rt));
  gkrt_device_kind dev;
  TRY(gkrt_runtime_device(rt, &dev));
  if (!j->o->ranks && j->nranks > 1 && dev == GKRT_DEVICE_HOST) {
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
  int bad = step_build(rt, comm, rows, &s) || step_load(&s, j->p, first);
  double *ms = calloc(j->o->steps, sizeof(double));
  bad |= !ms;
  for (uint32_t k = 0; k < j->o->steps && !bad; k++) {
    double t0 = now_ms();
    bad = step_run(rt, &s, j->p, first, j->w, &j->losses[k]);
    ms[k] = now_ms() - t0;
  }
  if (!bad) j->step_ms = median_ms(ms, j->o->steps);
  free(ms);
  if (!bad) bad = transposes_exact(j->w, "rank");
  if (!bad) bad = ranks_identical(rt, comm, j->w, j->rank);
  /* A rank that failed aborts, so the others' collectives fail instead of waiting for it. */
  if (bad && gkrt_comm_abort(comm) != GKRT_STATUS_OK) fprintf(stderr, "rank %u: abort failed\n", j->rank);
  if (s.graph) TRY(gkrt_graph_release(s.graph));
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
          "%s\nusage: gkrt_data_parallel --ranks N | --rank R --nranks N --id-file PATH  [--steps K] [--batch B]\n",
          why);
  return 2;
}

static int parse(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->steps = 5;
  o->batch = 32;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) return usage("every flag takes a value");
    const char *f = argv[i], *v = argv[++i];
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    int numeric = *v && !*end;
    if (!strcmp(f, "--id-file")) o->id_file = v;
    else if (!numeric) return usage("flag values must be whole numbers");
    else if (!strcmp(f, "--ranks")) o->ranks = (uint32_t)n;
    else if (!strcmp(f, "--rank")) o->rank = (uint32_t)n, o->rank_given = 1;
    else if (!strcmp(f, "--nranks")) o->nranks = (uint32_t)n;
    else if (!strcmp(f, "--steps")) o->steps = (uint32_t)n;
    else if (!strcmp(f, "--batch")) o->batch = n;
    else return usage("unknown flag");
  }
  uint32_t n = o->ranks ? o->ranks : o->nranks;
  if (o->ranks && (o->rank_given || o->nranks || o->id_file)) return usage("--ranks (threads) or --rank/--nranks/--id-file, not both");
  if (!o->ranks && (!o->nranks || !o->id_file || o->rank >= o->nranks))
    return usage("give --ranks N, or --rank R --nranks N --id-file PATH with R < N");
  if (n > DP_MAX_RANKS) return usage("at most 64 ranks");
  if (o->steps == 0 || o->steps > 1000) return usage("--steps must be 1..1000");
  if (o->batch == 0 || o->batch > 512 || o->batch % n) return usage("--batch must be 1..512 and a multiple of the ranks");
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

int main(int argc, char **argv) {
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc;
  const uint32_t n = o.ranks ? o.ranks : o.nranks;
  problem p;
  if (problem_make(&p, o.batch)) return 1;
  float *ref_w = calloc(DP_PARAMS, sizeof(float));
  double ref_loss[1000];
  /* This process's ranks: all of them as threads, or the one given. */
  const uint32_t local = o.ranks ? o.ranks : 1;
  rank_job jobs[DP_MAX_RANKS];
  int bad = !ref_w;
  for (uint32_t r = 0; r < local && !bad; r++) {
    jobs[r] = (rank_job){&o, &p, {{0}}, o.ranks ? r : o.rank, n, calloc(DP_PARAMS, sizeof(float)),
                         calloc(o.steps, sizeof(double)), 0, 0};
    bad |= !jobs[r].w || !jobs[r].losses;
  }
  if (bad) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }
  printf("gkrt %s: data-parallel MLP %d-%d-%d, batch %zu over %u ranks (%s), %u steps\n", gkrt_version(), DP_D, DP_H,
         DP_O, o.batch, n, o.ranks ? "threads of one process" : "one process each", o.steps);

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
  if (reference(&o, &p, ref_w, ref_loss)) {
    fprintf(stderr, "FAILED: the single-runtime reference failed\n");
    return 1;
  }

  for (uint32_t k = 0; k < o.steps; k++) {
    /* Threads: every shard's loss is here, and their mean is the batch's. A process sees its own. */
    double loss = 0;
    for (uint32_t r = 0; r < local; r++) loss += jobs[r].losses[k] / local;
    printf("step %u  loss %.6f  (%s; one runtime on the combined batch: %.6f)\n", k + 1, loss,
           o.ranks ? "mean over the ranks" : "this rank's shard", ref_loss[k]);
  }
  /* Scaling (run.sh mgpu): the per-rank batch is batch / ranks; throughput = batch / step time. */
  for (uint32_t r = 0; r < local; r++)
    printf("rank %u: step time %.3f ms (median of %u), %zu rows per rank\n", jobs[r].rank, jobs[r].step_ms, o.steps,
           o.batch / n);
  for (uint32_t r = 0; r < local; r++) {
    double max_diff, max_abs;
    compare(jobs[r].w, ref_w, &max_diff, &max_abs);
    int close = max_diff <= DP_TOL * max_abs;
    printf("rank %u: weights vs the single runtime: max |diff| %.3g (tolerance %.3g = %.0e x max |w| %.3g) -> %s\n",
           jobs[r].rank, max_diff, DP_TOL * max_abs, DP_TOL, max_abs, close ? "close" : "TOO FAR");
    bad |= !close;
    /* ranks_identical already checked this across processes; threads can also compare directly. */
    if (memcmp(jobs[r].w, jobs[0].w, DP_PARAMS * sizeof(float)) != 0) {
      printf("rank %u: weights differ from rank %u's\n", jobs[r].rank, jobs[0].rank);
      bad = 1;
    }
  }
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
  printf("every rank's weights identical bit for bit; equal to the single runtime's within tolerance\nOK\n");
  return 0;
}
