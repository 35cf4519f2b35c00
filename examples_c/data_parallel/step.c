/* One rank's training step as a graph (step.h): its tensors, the kernels of its nodes (built-ins
 * and the BLAS callback kernel of blas_nodes.h), the forward, backward and SGD nodes, and the
 * step's loading, running and weights. */
#include "step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../blas_nodes.h"
#include "status.h"

static int node(gkrt_graph *g, gkrt_kernel *k, const gkrt_tensor *in, size_t nin, gkrt_tensor out,
                const void *params, size_t params_size, uint32_t *index) {
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, params, params_size};
  TRY(gkrt_graph_add_kernel(g, k, in, nin, &out, 1, NULL, 0, &launch, index));
  return 0;
}

/* c[m×n] = op(a)·op(b) (blas_nodes.h: a is [k×m] with ta, b is [n×k] with tb). */
int gemm_node(gkrt_graph *g, gkrt_kernel *blas, gkrt_tensor a, gkrt_tensor b, gkrt_tensor c, size_t m,
                     size_t n, size_t k, int ta, int tb) {
  TRY(gemm_add(g, blas, a, b, c, (uint32_t)m, (uint32_t)n, (uint32_t)k, ta, tb, NULL));
  return 0;
}

int tensor(gkrt_graph *g, size_t floats, gkrt_tensor_kind kind, const char *name, gkrt_tensor *out) {
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

void kernels_release(kernels *K) {
  gkrt_kernel *ks[] = {K->add, K->relu, K->relu_grad, K->scale, K->blas};
  for (int i = 0; i < 5; i++)
    if (ks[i] && gkrt_kernel_release(ks[i]) != GKRT_STATUS_OK) fprintf(stderr, "kernel release failed\n");
  memset(K, 0, sizeof *K);
}

/* The built-ins for the element-wise nodes and the BLAS kernel (products and the SGD step: cuBLAS
 * or the CPU loops). */
int kernels_make(gkrt_runtime *rt, kernels *K) {
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
int step_build(gkrt_runtime *rt, gkrt_comm *comm, const net *nw, size_t rows, uint32_t bucket_kib,
                      step_graph *s) {
  kernels K;
  if (kernels_make(rt, &K)) return 1;
  gkrt_graph *g;
  int bad = check(gkrt_graph_create(rt, &g), "graph create");
  if (!bad) bad = step_build_graph(g, &K, comm, nw, rows, bucket_kib, s);
  kernels_release(&K);
  return bad;
}

/* Writes the shard (rows first..first+rows of the batch) and the initial weights. */
int step_load(step_graph *s, const problem *p, size_t first) {
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
int step_run(gkrt_runtime *rt, step_graph *s, const problem *p, size_t first, float *y, double *loss) {
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
int step_weights(step_graph *s, const net *nw, float *w) {
  for (uint32_t k = 0; k < nw->depth; k++)
    TRY(gkrt_graph_read_tensor(s->graph, s->w[k], w + nw->off[k], layer_floats(nw, k) * sizeof(float)));
  return 0;
}
