/*
 * int_gemm_node: the data-parallel example's product node (examples_c/gemm_node.h) — a host
 * callback computing row-major C = op(A)·op(B), cuBLAS on CUDA, a CPU loop on the host backend —
 * against plain C, in all four transpose forms, on shapes with 1s and odd sizes. The host loop
 * sums in the order the reference does, so there the results must be bit-identical; cuBLAS may
 * sum in another order, so on CUDA within 1e-5 of the sum of |products|. A node whose sizes
 * exceed its buffers fails its run with GKRT_STATUS_CALLBACK_FAILED (nothing read or written out
 * of bounds), and the runtime then runs the next graph.
 */
#include <math.h>

#include "common.h"
#include "gemm_node.h"

static void fill(float *v, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = (float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
  }
}

/* One product of logical shapes op(A) m×k, op(B) k×n, stored as the flags say. */
static void one_case(gkrt_runtime *rt, gkrt_kernel *gemm, uint32_t m, uint32_t n, uint32_t k, int ta, int tb) {
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
  OK(gemm_add(g, gemm, ta_, tb_, tc, m, n, k, ta, tb, NULL));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_write_tensor(g, ta_, as, sizeof(float) * m * k));
  OK(gkrt_graph_write_tensor(g, tb_, bs, sizeof(float) * k * n));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, tc, got, sizeof(float) * m * n));
  const int host = test_on_host(rt);
  size_t bad = 0;
  for (size_t i = 0; i < (size_t)m * n; i++)
    bad += host ? memcmp(&got[i], &want[i], sizeof(float)) != 0 : !(fabsf(got[i] - want[i]) <= 1e-5f * mag[i] + 1e-30f);
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

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *gemm;
  if (gemm_kernel(rt, &gemm)) return 1;
  const uint32_t shapes[][3] = {{1, 1, 1}, {5, 3, 7}, {1, 17, 33}, {33, 1, 17}, {64, 48, 1}, {37, 29, 130}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int f = 0; f < 4; f++) one_case(rt, gemm, shapes[s][0], shapes[s][1], shapes[s][2], f & 1, f >> 1);

  /* k = 9 where the buffers hold k = 8: refused by the callback, before any access. */
  gkrt_graph *g;
  gkrt_tensor a, b, c;
  OK(gkrt_graph_create(rt, &g));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 4 * 8, GKRT_TENSOR_INPUT, "A", &a));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 8 * 4, GKRT_TENSOR_INPUT, "B", &b));
  OK(gkrt_graph_add_tensor(g, sizeof(float) * 4 * 4, GKRT_TENSOR_OUTPUT, "C", &c));
  OK(gemm_add(g, gemm, a, b, c, 4, 4, 9, 0, 0, NULL));
  OK(gkrt_graph_finalize(g));
  float zeros[32] = {0};
  OK(gkrt_graph_write_tensor(g, a, zeros, sizeof zeros));
  OK(gkrt_graph_write_tensor(g, b, zeros, sizeof zeros));
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_CALLBACK_FAILED, "host callback");
  OK(gkrt_graph_release(g));
  one_case(rt, gemm, 5, 3, 7, 1, 1); /* the runtime still runs products */

  OK(gkrt_kernel_release(gemm));
  OK(gkrt_runtime_release(rt));
  return test_done("int_gemm_node");
}
