/*
 * int_blas_nodes: the data-parallel example's BLAS nodes (examples_c/blas_nodes.h: host
 * callbacks, cuBLAS on CUDA, CPU loops on the host backend) against plain C. gemm (row-major
 * C = op(A)·op(B)) in all four transpose forms on shapes with 1s and odd sizes; axpy (y += a·x
 * in place) on a parameter over two runs. The host loops compute in the reference's order, so
 * there the results must be bit-identical; cuBLAS may sum in another order or fuse multiply and
 * add, so on CUDA within 1e-5 of the sum of |terms|. A node whose sizes exceed its buffers, and
 * an axpy whose y is not its output, fail their run with GKRT_STATUS_CALLBACK_FAILED (nothing
 * read or written out of bounds), and the runtime then runs the next graph.
 */
#include <math.h>

#include "common.h"
#include "blas_nodes.h"

static void fill(float *v, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = (float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
  }
}

/* 0 when got[i] matches want[i]: bit for bit on the host, within 1e-5 of mag[i] on CUDA. */
static size_t differ(int host, const float *got, const float *want, const float *mag, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    bad += host ? memcmp(&got[i], &want[i], sizeof(float)) != 0 : !(fabsf(got[i] - want[i]) <= 1e-5f * mag[i] + 1e-30f);
  return bad;
}

/* One product of logical shapes op(A) m×k, op(B) k×n, stored as the flags say. */
static void one_case(gkrt_runtime *rt, gkrt_kernel *blas, uint32_t m, uint32_t n, uint32_t k, int ta, int tb) {
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n); /* logical op(A), op(B) */
  float *as = malloc(sizeof(float) * m * k), *bs = malloc(sizeof(float) * k * n); /* as stored */
  float *want = malloc(sizeof(float) * m * n), *mag = malloc(sizeof(float) * m * n), *got = malloc(sizeof(float) * m * n);
  if (!a || !b || !as || !bs || !want || !mag || !got) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  fill(a, (size_t)m * k, m + 7 * k + ta);
  fill(b, (size_t)k * n, n + 5 * k + tb);
  for (uint32_t i = 0; i < m; i++)
    for (uint32_t q = 0; q < k; q++) as[ta ? (size_t)q * m + i : (size_t)i * k + q] = a[(size_t)i * k + q];
  for (uint32_t q = 0; q < k; q++)
    for (uint32_t j = 0; j < n; j++) bs[tb ? (size_t)j * k + q : (size_t)q * n + j] = b[(size_t)q * n + j];
  for (uint32_t i = 0; i < m; i++)
    for (uint32_t j = 0; j < n; j++) {
      float acc = 0.0f, abs_sum = 0.0f;
      for (uint32_t q = 0; q < k; q++) {
        const float prod = a[(size_t)i * k + q] * b[(size_t)q * n + j];
        acc = acc + prod;
        abs_sum += fabsf(prod);
      }
      want[(size_t)i * n + j] = acc;
      mag[(size_t)i * n + j] = abs_sum;
    }
  gkrt_graph *g;
  gkrt_tensor ta_, tb_, tc;
  OK(gkrt_graph_create(rt, &g));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * m * k, GKRT_TENSOR_INPUT, "A", &ta_));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * k * n, GKRT_TENSOR_INPUT, "B", &tb_));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * m * n, GKRT_TENSOR_OUTPUT, "C", &tc));
  OK(gemm_add(g, blas, ta_, tb_, tc, m, n, k, ta, tb, NULL));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_write_tensor(g, ta_, as, sizeof(float) * m * k));
  OK(gkrt_graph_write_tensor(g, tb_, bs, sizeof(float) * k * n));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, tc, got, sizeof(float) * m * n));
  const size_t bad = differ(test_on_host(rt), got, want, mag, (size_t)m * n);
  if (bad) fprintf(stderr, "%ux%ux%u ta=%d tb=%d: %zu of %u elements differ from plain C\n", m, n, k, ta, tb, bad, m * n);
  CHECK(bad == 0);
  OK(gkrt_graph_release(g));
  free(a);
  free(b);
  free(as);
  free(bs);
  free(want);
  free(mag);
  free(got);
}

/* y += a·x on a parameter, twice (two runs): the second run reads the first's result. */
static void axpy_case(gkrt_runtime *rt, gkrt_kernel *blas, uint32_t n, float alpha) {
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
  float *mag = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
  if (!x || !y || !want || !mag || !got) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  fill(x, n, 3 + n);
  fill(y, n, 4 + n);
  for (uint32_t i = 0; i < n; i++) {
    float w = y[i];
    for (int r = 0; r < 2; r++) {
      const float step = alpha * x[i];
      w = w + step;
    }
    want[i] = w;
    mag[i] = fabsf(y[i]) + 2 * fabsf(alpha * x[i]);
  }
  gkrt_graph *g;
  gkrt_tensor tx, ty;
  OK(gkrt_graph_create(rt, &g));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * n, GKRT_TENSOR_INPUT, "x", &tx));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * n, GKRT_TENSOR_PARAMETER, "y", &ty));
  OK(axpy_add(g, blas, tx, ty, n, alpha, NULL));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_write_tensor(g, tx, x, sizeof(float) * n));
  OK(gkrt_graph_write_tensor(g, ty, y, sizeof(float) * n));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, ty, got, sizeof(float) * n));
  const size_t bad = differ(test_on_host(rt), got, want, mag, n);
  if (bad) fprintf(stderr, "axpy n=%u: %zu elements differ from plain C\n", n, bad);
  CHECK(bad == 0);
  OK(gkrt_graph_release(g));
  free(x);
  free(y);
  free(want);
  free(mag);
  free(got);
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *blas;
  if (blas_kernel(rt, &blas)) return 1;
  const uint32_t shapes[][3] = {{1, 1, 1}, {5, 3, 7}, {1, 17, 33}, {33, 1, 17}, {64, 48, 1}, {37, 29, 130}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int f = 0; f < 4; f++) one_case(rt, blas, shapes[s][0], shapes[s][1], shapes[s][2], f & 1, f >> 1);

  /* k = 9 where the buffers hold k = 8: refused by the callback, before any access. */
  gkrt_graph *g;
  gkrt_tensor a, b, c;
  OK(gkrt_graph_create(rt, &g));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 4 * 8, GKRT_TENSOR_INPUT, "A", &a));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 8 * 4, GKRT_TENSOR_INPUT, "B", &b));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 4 * 4, GKRT_TENSOR_OUTPUT, "C", &c));
  OK(gemm_add(g, blas, a, b, c, 4, 4, 9, 0, 0, NULL));
  OK(gkrt_graph_finalize(g));
  float zeros[32] = {0};
  OK(gkrt_graph_write_tensor(g, a, zeros, sizeof zeros));
  OK(gkrt_graph_write_tensor(g, b, zeros, sizeof zeros));
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_CALLBACK_FAILED, "host callback");
  OK(gkrt_graph_release(g));
  one_case(rt, blas, 5, 3, 7, 1, 1); /* the runtime still runs products */

  axpy_case(rt, blas, 1, -0.5f);
  axpy_case(rt, blas, 1000, 0.01f);
  /* axpy whose y (input 1) is not its output: refused (it updates y in place). */
  gkrt_tensor x, y, out;
  OK(gkrt_graph_create(rt, &g));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 8, GKRT_TENSOR_INPUT, "x", &x));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 8, GKRT_TENSOR_INPUT, "y", &y));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 8, GKRT_TENSOR_OUTPUT, "out", &out));
  const blas_params p = {BLAS_AXPY, 0, 8, 0, 0, 0, 1.0f};
  OK(blas_add(g, blas, &p, x, y, out, NULL));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_write_tensor(g, x, zeros, sizeof(float) * 8));
  OK(gkrt_graph_write_tensor(g, y, zeros, sizeof(float) * 8));
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_CALLBACK_FAILED, "host callback");
  OK(gkrt_graph_release(g));
  axpy_case(rt, blas, 7, 2.0f);

  OK(gkrt_kernel_release(blas));
  OK(gkrt_runtime_release(rt));
  return test_done("int_blas_nodes");
}
