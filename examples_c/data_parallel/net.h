/* The data-parallel example's network and data: the MLP's shape and where each layer's weights
 * sit in one flat array, and the synthetic problem (the combined batch, its teacher's targets and
 * the initial weights) that every rank and the reference share. */
#ifndef GKRT_DP_NET_H
#define GKRT_DP_NET_H

#include <stddef.h>
#include <stdint.h>

enum { DP_MAX_DEPTH = 16 };

/* The network's shape: layer k (0-based) maps dims[k] to dims[k+1]. The weights live in one flat
 * array, layer by layer, W_k row-major [dims[k] × dims[k+1]]. */
typedef struct net {
  uint32_t depth;
  size_t dims[DP_MAX_DEPTH + 1];
  size_t off[DP_MAX_DEPTH]; /* offset of W_k */
  size_t params;            /* floats */
  float lr;
} net;

static inline size_t layer_floats(const net *nw, uint32_t k) { return nw->dims[k] * nw->dims[k + 1]; }

void net_make(net *nw, uint32_t depth, size_t in, size_t width, size_t out, float lr);
void fill_random(float *v, size_t n, uint32_t seed, float scale);

/* The combined batch and the initial weights, the same for every rank and the reference. */
typedef struct problem {
  const net *nw;
  size_t batch;
  float *x, *t; /* [batch, D], [batch, O] */
  float *w;     /* initial weights (nw->params floats) */
} problem;

int problem_make(problem *p, const net *nw, size_t batch);
void problem_free(problem *p);

#endif
