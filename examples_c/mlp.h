/*
 * The demo network, shared by the demo (examples_c/demo.c) and its test (c_tests/int_demo_graph.c):
 * a residual two-layer MLP step built from gkrt's built-ins, and the same arithmetic in plain C.
 *
 *   h1 = x·W1            z1 = h1 + bias (bias = fill 0.1)     a1 = relu(z1)
 *   h2 = a1·W2           a2 = relu(h2)                        r  = a2 + a1
 *   y  = r·W3  (output)  g  = 0.5 * relu_grad(r, z1)  (output: gradient through the first relu)
 *
 * Every built-in appears at least once. The C reference accumulates each matrix-product output
 * over k in order with separate multiply and add, the arithmetic gkrt's built-ins promise, so the
 * comparison is exact.
 */
#ifndef GKRT_EXAMPLE_MLP_H
#define GKRT_EXAMPLE_MLP_H

#include <gkrt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MLP_B = 64, MLP_D = 128, MLP_H = 256, MLP_O = 32 };

typedef struct mlp {
  gkrt_graph *graph;
  gkrt_tensor x, w1, w2, w3, y, g;
  /* sum of every intermediate's size (what a runtime without freeing would hold) */
  uint64_t intermediate_bytes;
} mlp;

static int mlp_check(gkrt_status st, const char *what) {
  if (st != GKRT_STATUS_OK) {
    char msg[512];
    gkrt_last_error_message(msg, sizeof msg);
    fprintf(stderr, "%s failed: %s: %s\n", what, gkrt_status_name(st), msg);
    return 1;
  }
  return 0;
}

#define MLP_TRY(call)                \
  do {                               \
    if (mlp_check((call), #call)) return 1; \
  } while (0)

static int mlp_node(gkrt_graph *g, gkrt_kernel *k, const gkrt_tensor *in, size_t nin, gkrt_tensor out,
                    const void *params, size_t params_size) {
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, params, params_size};
  MLP_TRY(gkrt_graph_add_kernel(g, k, in, nin, &out, 1, NULL, 0, &launch, NULL));
  return 0;
}

/* Builds and finalizes the graph on `rt`. Returns 0 on success. */
static int mlp_build(gkrt_runtime *rt, mlp *m) {
  gkrt_kernel *fill, *add, *relu, *relu_grad, *scale, *matmul;
  MLP_TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_FILL, &fill));
  MLP_TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, &add));
  MLP_TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &relu));
  MLP_TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU_GRAD, &relu_grad));
  MLP_TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_SCALE, &scale));
  MLP_TRY(gkrt_kernel_builtin(rt, GKRT_BUILTIN_MATMUL, &matmul));

  gkrt_graph *g;
  MLP_TRY(gkrt_graph_create(rt, &g));
  m->graph = g;
  const uint64_t f = sizeof(float);
  MLP_TRY(gkrt_graph_add_tensor(g, MLP_B * MLP_D * f, GKRT_TENSOR_INPUT, "x", &m->x));
  MLP_TRY(gkrt_graph_add_tensor(g, MLP_D * MLP_H * f, GKRT_TENSOR_PARAMETER, "W1", &m->w1));
  MLP_TRY(gkrt_graph_add_tensor(g, MLP_H * MLP_H * f, GKRT_TENSOR_PARAMETER, "W2", &m->w2));
  MLP_TRY(gkrt_graph_add_tensor(g, MLP_H * MLP_O * f, GKRT_TENSOR_PARAMETER, "W3", &m->w3));
  gkrt_tensor bias, h1, z1, a1, h2, a2, r, gz, t;
  const uint64_t bh = MLP_B * MLP_H * f;
  const char *names[] = {"bias", "h1", "z1", "a1", "h2", "a2", "r", "grad_z1"};
  gkrt_tensor *ts[] = {&bias, &h1, &z1, &a1, &h2, &a2, &r, &gz};
  m->intermediate_bytes = 0;
  for (int i = 0; i < 8; i++) {
    MLP_TRY(gkrt_graph_add_tensor(g, bh, GKRT_TENSOR_INTERMEDIATE, names[i], ts[i]));
    m->intermediate_bytes += bh;
  }
  MLP_TRY(gkrt_graph_add_tensor(g, MLP_B * MLP_O * f, GKRT_TENSOR_OUTPUT, "y", &m->y));
  MLP_TRY(gkrt_graph_add_tensor(g, bh, GKRT_TENSOR_OUTPUT, "g", &m->g));
  (void)t;

  const float bias_value = 0.1f, half = 0.5f;
  const uint32_t mm1[3] = {MLP_B, MLP_H, MLP_D}, mm2[3] = {MLP_B, MLP_H, MLP_H}, mm3[3] = {MLP_B, MLP_O, MLP_H};
  if (mlp_node(g, fill, NULL, 0, bias, &bias_value, sizeof bias_value)) return 1;
  gkrt_tensor in_h1[2] = {m->x, m->w1};
  if (mlp_node(g, matmul, in_h1, 2, h1, mm1, sizeof mm1)) return 1;
  gkrt_tensor in_z1[2] = {h1, bias};
  if (mlp_node(g, add, in_z1, 2, z1, NULL, 0)) return 1;
  if (mlp_node(g, relu, &z1, 1, a1, NULL, 0)) return 1;
  gkrt_tensor in_h2[2] = {a1, m->w2};
  if (mlp_node(g, matmul, in_h2, 2, h2, mm2, sizeof mm2)) return 1;
  if (mlp_node(g, relu, &h2, 1, a2, NULL, 0)) return 1;
  gkrt_tensor in_r[2] = {a2, a1};
  if (mlp_node(g, add, in_r, 2, r, NULL, 0)) return 1;
  gkrt_tensor in_y[2] = {r, m->w3};
  if (mlp_node(g, matmul, in_y, 2, m->y, mm3, sizeof mm3)) return 1;
  gkrt_tensor in_gz[2] = {r, z1};
  if (mlp_node(g, relu_grad, in_gz, 2, gz, NULL, 0)) return 1;
  if (mlp_node(g, scale, &gz, 1, m->g, &half, sizeof half)) return 1;
  MLP_TRY(gkrt_graph_finalize(g));

  gkrt_kernel *ks[] = {fill, add, relu, relu_grad, scale, matmul};
  for (int i = 0; i < 6; i++) MLP_TRY(gkrt_kernel_release(ks[i]));
  return 0;
}

/* Deterministic inputs in [-1, 1). */
static void mlp_fill_random(float *v, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = (float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
  }
}

static void ref_matmul(const float *a, const float *b, float *c, int m, int n, int k) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int p = 0; p < k; p++) {
        float prod = a[i * k + p] * b[p * n + j];
        acc = acc + prod;
      }
      c[i * n + j] = acc;
    }
}

/* The same step in plain C. */
static void mlp_reference(const float *x, const float *w1, const float *w2, const float *w3, float *y, float *g) {
  const int bh = MLP_B * MLP_H;
  float *h1 = malloc(bh * sizeof(float)), *z1 = malloc(bh * sizeof(float)), *a1 = malloc(bh * sizeof(float));
  float *h2 = malloc(bh * sizeof(float)), *r = malloc(bh * sizeof(float));
  ref_matmul(x, w1, h1, MLP_B, MLP_H, MLP_D);
  for (int i = 0; i < bh; i++) {
    z1[i] = h1[i] + 0.1f;
    a1[i] = z1[i] > 0.0f ? z1[i] : 0.0f;
  }
  ref_matmul(a1, w2, h2, MLP_B, MLP_H, MLP_H);
  for (int i = 0; i < bh; i++) {
    float a2 = h2[i] > 0.0f ? h2[i] : 0.0f;
    r[i] = a2 + a1[i];
  }
  ref_matmul(r, w3, y, MLP_B, MLP_O, MLP_H);
  for (int i = 0; i < bh; i++) g[i] = 0.5f * (z1[i] > 0.0f ? r[i] : 0.0f);
  free(h1); free(z1); free(a1); free(h2); free(r);
}

#endif
