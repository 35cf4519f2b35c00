/*
 * A row-major f32 matrix product as a gkrt node, the way a user of gkrt adds a library's kernel:
 * a host callback that, on the CUDA backend, calls cuBLAS (cublas_dl.h, opened at run time) on the
 * stream gkrt gives it, and on the host backend runs the same product as a CPU loop. Transposes
 * are flags, so a matrix is never stored twice:
 *
 *   C[m×n] = op(A)·op(B), op(A) m×k (A stored [m×k], or [k×m] with trans_a), op(B) k×n (B stored
 *   [k×n], or [n×k] with trans_b); inputs (A, B), output C, all row-major and dense.
 *
 * cuBLAS is column-major: a row-major X[r×c] is its column-major Xᵀ, so the node asks cuBLAS for
 * Cᵀ = op(B)ᵀ·op(A)ᵀ (operands swapped, the same flags). cuBLAS's sgemm computes in f32 (no TF32:
 * its default math mode). The CPU loop sums each output over k in order, multiply then add (build
 * with -ffp-contract=off): deterministic, so ranks running it on the same data agree bit for bit.
 * Link with -ldl.
 */
#ifndef GKRT_EXAMPLE_GEMM_NODE_H
#define GKRT_EXAMPLE_GEMM_NODE_H

#include <gkrt.h>
#include <stdint.h>
#include <string.h>

#include "cublas_dl.h"

typedef struct gemm_params {
  uint32_t m, n, k, trans_a, trans_b;
} gemm_params;

/* 0 when the node's buffers hold the product's operands (a node built wrongly fails its run
 * instead of reading or writing out of bounds). */
static inline int gemm_args_ok(const gkrt_callback_args *a, gemm_params *p) {
  if (a->params_size != sizeof *p || a->num_inputs != 2 || a->num_outputs != 1) return 1;
  memcpy(p, a->params, sizeof *p); /* gkrt's parameter bytes carry no alignment promise */
  const uint64_t f = sizeof(float);
  return a->inputs[0].size < (uint64_t)p->m * p->k * f || a->inputs[1].size < (uint64_t)p->k * p->n * f ||
         a->outputs[0].size < (uint64_t)p->m * p->n * f;
}

static inline int32_t gemm_cpu_cb(const gkrt_callback_args *a, void *user) {
  (void)user;
  gemm_params p;
  if (gemm_args_ok(a, &p)) return 1;
  const float *A = a->inputs[0].ptr, *B = a->inputs[1].ptr;
  float *C = a->outputs[0].ptr;
  /* Element strides of op(A) (row i, column q) and op(B) (row q, column j). */
  const size_t ai = p.trans_a ? 1 : p.k, aq = p.trans_a ? p.m : 1;
  const size_t bq = p.trans_b ? 1 : p.n, bj = p.trans_b ? p.k : 1;
  for (size_t i = 0; i < p.m; i++)
    for (size_t j = 0; j < p.n; j++) {
      float acc = 0.0f;
      for (size_t q = 0; q < p.k; q++) {
        const float prod = A[i * ai + q * aq] * B[q * bq + j * bj];
        acc = acc + prod;
      }
      C[i * p.n + j] = acc;
    }
  return 0;
}

static inline int32_t gemm_cublas_cb(const gkrt_callback_args *a, void *user) {
  cublas_dl *b = user;
  gemm_params p;
  if (gemm_args_ok(a, &p)) return 1;
  if (cublas_dl_handle(b, a->stream)) return 2;
  const float one = 1.0f, zero = 0.0f;
  /* Row-major leading dimensions: a stored matrix's column count. */
  const int lda = (int)(p.trans_a ? p.m : p.k), ldb = (int)(p.trans_b ? p.k : p.n);
  int st = b->sgemm(b->handle, p.trans_b ? CUBLAS_DL_OP_T : CUBLAS_DL_OP_N, p.trans_a ? CUBLAS_DL_OP_T : CUBLAS_DL_OP_N,
                    (int)p.n, (int)p.m, (int)p.k, &one, a->inputs[1].ptr, ldb, a->inputs[0].ptr, lda, &zero,
                    a->outputs[0].ptr, (int)p.n);
  if (st != 0) {
    fprintf(stderr, "cuBLAS sgemm failed (status %d) in node %u\n", st, a->node);
    return 3;
  }
  return 0;
}

static inline void gemm_cublas_free(void *user) {
  cublas_dl_close(user);
  free(user);
}

/* The product kernel for `rt`'s backend: cuBLAS on CUDA, the CPU loop on the host backend.
 * 0 on success (a message on stderr otherwise). */
static inline int gemm_kernel(gkrt_runtime *rt, gkrt_kernel **out) {
  gkrt_device_kind dev;
  if (gkrt_runtime_device(rt, &dev) != GKRT_STATUS_OK) {
    fprintf(stderr, "gemm_kernel: cannot tell the runtime's backend\n");
    return 1;
  }
  if (dev != GKRT_DEVICE_CUDA) {
    if (gkrt_kernel_from_callback(rt, gemm_cpu_cb, NULL, out) == GKRT_STATUS_OK) return 0;
    fprintf(stderr, "gemm_kernel: gkrt_kernel_from_callback failed\n");
    return 1;
  }
  cublas_dl *b = calloc(1, sizeof *b);
  if (!b || cublas_dl_open(b)) {
    fprintf(stderr, "gemm_kernel: cuBLAS could not be set up\n");
    free(b);
    return 1;
  }
  if (gkrt_kernel_from_callback_with_free(rt, gemm_cublas_cb, b, gemm_cublas_free, out) != GKRT_STATUS_OK) {
    fprintf(stderr, "gemm_kernel: gkrt_kernel_from_callback_with_free failed\n");
    gemm_cublas_free(b);
    return 1;
  }
  return 0;
}

/* Adds C = op(A)·op(B) (see the top) to `g`; its node index into *index when not NULL. */
static inline gkrt_status gemm_add(gkrt_graph *g, gkrt_kernel *gemm, gkrt_tensor a, gkrt_tensor b, gkrt_tensor c,
                                   uint32_t m, uint32_t n, uint32_t k, int trans_a, int trans_b, uint32_t *index) {
  const gemm_params p = {m, n, k, trans_a != 0, trans_b != 0};
  const gkrt_tensor in[2] = {a, b};
  const gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, &p, sizeof p};
  return gkrt_graph_add_kernel(g, gemm, in, 2, &c, 1, NULL, 0, &launch, index);
}

#endif
