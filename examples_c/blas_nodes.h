/*
 * f32 BLAS operations as gkrt nodes, the way a user of gkrt adds a library's kernels: one host
 * callback kernel that, on the CUDA backend, calls cuBLAS (cublas_dl.h, opened at run time) on the
 * stream gkrt gives it, and on the host backend runs the same operation as a CPU loop. Each node's
 * parameters say which operation it is:
 *
 *   gemm  C[m×n] = op(A)·op(B), op(A) m×k (A stored [m×k], or [k×m] with trans_a), op(B) k×n
 *         (B stored [k×n], or [n×k] with trans_b); inputs (A, B), output C; all row-major and
 *         dense. Transposes are flags, so a matrix is never stored twice.
 *   axpy  y += alpha·x over n floats, in place: inputs (x, y), output y (the same tensor).
 *
 * cuBLAS is column-major: a row-major X[r×c] is its column-major Xᵀ, so gemm asks cuBLAS for
 * Cᵀ = op(B)ᵀ·op(A)ᵀ (operands swapped, the same flags). cuBLAS computes in f32 (no TF32: its
 * default math mode). The CPU loops sum each product over k in order, multiply then add, and
 * axpy rounds alpha·x before adding it (build with -ffp-contract=off): deterministic, so ranks
 * running them on the same data agree bit for bit. Link with -ldl.
 */
#ifndef GKRT_EXAMPLE_BLAS_NODES_H
#define GKRT_EXAMPLE_BLAS_NODES_H

#include <gkrt.h>
#include <stdint.h>
#include <string.h>

#include "cublas_dl.h"

enum { BLAS_GEMM = 1, BLAS_AXPY = 2 };

typedef struct blas_params {
  uint32_t op;                        /* BLAS_GEMM or BLAS_AXPY */
  uint32_t m, n, k, trans_a, trans_b; /* gemm; axpy: n floats */
  float alpha;                        /* axpy */
} blas_params;

/* 0 when the node's buffers hold the operation's operands (a node built wrongly fails its run
 * instead of reading or writing out of bounds). */
static inline int blas_args_ok(const gkrt_callback_args *a, blas_params *p) {
  if (a->params_size != sizeof *p || a->num_inputs != 2 || a->num_outputs != 1) return 1;
  memcpy(p, a->params, sizeof *p); /* gkrt's parameter bytes carry no alignment promise */
  const uint64_t f = sizeof(float);
  if (p->op == BLAS_GEMM)
    return a->inputs[0].size < (uint64_t)p->m * p->k * f || a->inputs[1].size < (uint64_t)p->k * p->n * f ||
           a->outputs[0].size < (uint64_t)p->m * p->n * f;
  /* axpy in place: y is input 1 and the output, one buffer. */
  return p->op != BLAS_AXPY || a->inputs[0].size < p->n * f || a->outputs[0].size < p->n * f ||
         a->inputs[1].ptr != a->outputs[0].ptr;
}

static inline int32_t blas_cpu_cb(const gkrt_callback_args *a, void *user) {
  (void)user;
  blas_params p;
  if (blas_args_ok(a, &p)) return 1;
  const float *A = a->inputs[0].ptr, *B = a->inputs[1].ptr;
  float *C = a->outputs[0].ptr;
  if (p.op == BLAS_AXPY) {
    for (size_t i = 0; i < p.n; i++) {
      const float step = p.alpha * A[i];
      C[i] = C[i] + step;
    }
    return 0;
  }
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

static inline int32_t blas_cublas_cb(const gkrt_callback_args *a, void *user) {
  cublas_dl *b = user;
  blas_params p;
  if (blas_args_ok(a, &p)) return 1;
  if (cublas_dl_handle(b, a->stream)) return 2;
  int st;
  if (p.op == BLAS_AXPY) {
    st = b->saxpy(b->handle, (int)p.n, &p.alpha, a->inputs[0].ptr, 1, a->outputs[0].ptr, 1);
  } else {
    const float one = 1.0f, zero = 0.0f;
    /* Row-major leading dimensions: a stored matrix's column count. */
    const int lda = (int)(p.trans_a ? p.m : p.k), ldb = (int)(p.trans_b ? p.k : p.n);
    st = b->sgemm(b->handle, p.trans_b ? CUBLAS_DL_OP_T : CUBLAS_DL_OP_N, p.trans_a ? CUBLAS_DL_OP_T : CUBLAS_DL_OP_N,
                  (int)p.n, (int)p.m, (int)p.k, &one, a->inputs[1].ptr, ldb, a->inputs[0].ptr, lda, &zero,
                  a->outputs[0].ptr, (int)p.n);
  }
  if (st != 0) {
    fprintf(stderr, "cuBLAS %s failed (status %d) in node %u\n", p.op == BLAS_AXPY ? "saxpy" : "sgemm", st, a->node);
    return 3;
  }
  return 0;
}

static inline void blas_cublas_free(void *user) {
  cublas_dl_close(user);
  free(user);
}

/* The kernel for `rt`'s backend: cuBLAS on CUDA, the CPU loops on the host backend. 0 on success
 * (a message on stderr otherwise). */
static inline int blas_kernel(gkrt_runtime *rt, gkrt_kernel **out) {
  gkrt_device_kind dev;
  if (gkrt_runtime_device(rt, &dev) != GKRT_STATUS_OK) {
    fprintf(stderr, "blas_kernel: cannot tell the runtime's backend\n");
    return 1;
  }
  if (dev != GKRT_DEVICE_CUDA) {
    if (gkrt_kernel_from_callback(rt, blas_cpu_cb, NULL, out) == GKRT_STATUS_OK) return 0;
    fprintf(stderr, "blas_kernel: gkrt_kernel_from_callback failed\n");
    return 1;
  }
  cublas_dl *b = calloc(1, sizeof *b);
  if (!b || cublas_dl_open(b)) {
    fprintf(stderr, "blas_kernel: cuBLAS could not be set up\n");
    free(b);
    return 1;
  }
  if (gkrt_kernel_from_callback_with_free(rt, blas_cublas_cb, b, blas_cublas_free, out) != GKRT_STATUS_OK) {
    fprintf(stderr, "blas_kernel: gkrt_kernel_from_callback_with_free failed\n");
    blas_cublas_free(b);
    return 1;
  }
  return 0;
}

static inline gkrt_status blas_add(gkrt_graph *g, gkrt_kernel *blas, const blas_params *p, gkrt_tensor in0,
                                   gkrt_tensor in1, gkrt_tensor out, uint32_t *index) {
  const gkrt_tensor in[2] = {in0, in1};
  const gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, p, sizeof *p};
  return gkrt_graph_add_kernel(g, blas, in, 2, &out, 1, NULL, 0, &launch, index);
}

/* Adds C = op(A)·op(B) (see the top) to `g`; its node index into *index when not NULL. */
static inline gkrt_status gemm_add(gkrt_graph *g, gkrt_kernel *blas, gkrt_tensor a, gkrt_tensor b, gkrt_tensor c,
                                   uint32_t m, uint32_t n, uint32_t k, int trans_a, int trans_b, uint32_t *index) {
  const blas_params p = {BLAS_GEMM, m, n, k, trans_a != 0, trans_b != 0, 0.0f};
  return blas_add(g, blas, &p, a, b, c, index);
}

/* Adds y += alpha·x (n floats, y updated in place) to `g`. */
static inline gkrt_status axpy_add(gkrt_graph *g, gkrt_kernel *blas, gkrt_tensor x, gkrt_tensor y, uint32_t n,
                                   float alpha, uint32_t *index) {
  const blas_params p = {BLAS_AXPY, 0, n, 0, 0, 0, alpha};
  return blas_add(g, blas, &p, x, y, y, index);
}

#endif
