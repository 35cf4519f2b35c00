/* The product kernel checked against plain C before training (step.h). */
#include <math.h>
#include <stdio.h>

#include "net.h"
#include "status.h"
#include "step.h"

/* The product kernel against plain C on small odd sizes, in the three forms the step uses (a·b,
 * aᵀ·b, a·bᵀ), so a mistake in the flags or the operand order shows here rather than as a
 * network that trains wrongly on every rank alike. On CUDA it checks the cuBLAS call. Relative
 * tolerance 1e-5 (sums of 7 products; exact on the host loop, which adds in the same order). */
int gemm_selftest(gkrt_runtime *rt) {
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
