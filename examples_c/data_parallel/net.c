/* The network's layout (net.h) and the synthetic problem: deterministic pseudo-random inputs,
 * targets from a fixed random teacher, and the initial weights. */
#include "net.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void net_make(net *nw, uint32_t depth, size_t in, size_t width, size_t out, float lr) {
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
void fill_random(float *v, size_t n, uint32_t seed, float scale) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = scale * ((float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f);
  }
}

int problem_make(problem *p, const net *nw, size_t batch) {
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

void problem_free(problem *p) {
  free(p->x);
  free(p->t);
  free(p->w);
}
