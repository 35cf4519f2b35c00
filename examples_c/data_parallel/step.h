/* One rank's training step as a gkrt graph (step.c): forward, backward with each weight
 * gradient all-reduced as soon as it exists, and the SGD update; loading it, running it, reading
 * its weights back. Also the product kernel's self-test (selftest.c). */
#ifndef GKRT_DP_STEP_H
#define GKRT_DP_STEP_H

#include <gkrt.h>

#include "net.h"

/* One rank's training step as a graph. */
typedef struct step_graph {
  gkrt_graph *graph;
  size_t rows;        /* this rank's shard */
  gkrt_tensor x, nt;  /* inputs: the shard and −t */
  gkrt_tensor w[DP_MAX_DEPTH], y;
} step_graph;

typedef struct kernels {
  gkrt_kernel *add, *relu, *relu_grad, *scale, *blas;
} kernels;

void kernels_release(kernels *K);
int kernels_make(gkrt_runtime *rt, kernels *K);
int tensor(gkrt_graph *g, size_t floats, gkrt_tensor_kind kind, const char *name, gkrt_tensor *out);
int gemm_node(gkrt_graph *g, gkrt_kernel *blas, gkrt_tensor a, gkrt_tensor b, gkrt_tensor c, size_t m, size_t n,
              size_t k, int ta, int tb);

int step_build(gkrt_runtime *rt, gkrt_comm *comm, const net *nw, size_t rows, uint32_t bucket_kib, step_graph *s);
int step_load(step_graph *s, const problem *p, size_t first);
int step_run(gkrt_runtime *rt, step_graph *s, const problem *p, size_t first, float *y, double *loss);
int step_weights(step_graph *s, const net *nw, float *w);

int gemm_selftest(gkrt_runtime *rt);

#endif
