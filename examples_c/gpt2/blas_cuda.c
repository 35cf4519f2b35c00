/*
 * The GPT-2 example's matrix products on CUDA (OP_GEMM, ops.h): a host callback that runs the
 * node's list of column-major products through cuBLAS on the stream gkrt gives it — cublasSgemm
 * for f32, cublasGemmEx with bf16 A, B and C and f32 compute (CUBLAS_COMPUTE_32F) for bf16. cuBLAS
 * is opened with dlopen at run time (../cublas_dl.h, shared with the data-parallel example), so
 * building needs no CUDA toolkit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cublas_dl.h"
#include "ops.h"

/* --- The entry points beyond cublas_dl.h's, declared by hand. --- */
typedef int (*blas_sgemm_batched_fn)(void *handle, int ta, int tb, int m, int n, int k, const float *alpha,
                                     const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
                                     const float *beta, float *c, int ldc, long long sc, int batch);
typedef int (*blas_gemm_ex_fn)(void *handle, int ta, int tb, int m, int n, int k, const void *alpha, const void *a,
                               int a_type, int lda, const void *b, int b_type, int ldb, const void *beta, void *c,
                               int c_type, int ldc, int compute, int algo);
typedef int (*blas_gemm_ex_batched_fn)(void *handle, int ta, int tb, int m, int n, int k, const void *alpha,
                                       const void *a, int a_type, int lda, long long sa, const void *b, int b_type,
                                       int ldb, long long sb, const void *beta, void *c, int c_type, int ldc,
                                       long long sc, int batch, int compute, int algo);
/* cudaDataType_t, cublasComputeType_t and cublasGemmAlgo_t values (library_types.h, cublas_api.h). */
enum { CUDA_R_16BF_ = 14, CUBLAS_COMPUTE_32F_ = 68, CUBLAS_GEMM_DEFAULT_ = -1 };

typedef struct {
  cublas_dl dl; /* the library, its handle, create/destroy/set_stream/sgemm */
  blas_sgemm_batched_fn sgemm_batched;
  blas_gemm_ex_fn gemm_ex;                 /* bf16 only */
  blas_gemm_ex_batched_fn gemm_ex_batched; /* bf16 only */
  gpt2_dtype dtype;
} blas;

/* One product in bf16: A, B, C bf16 (2 bytes an element), alpha and beta f32, f32 accumulation. */
static int gemm_bf16(const blas *b, const gemm_op *o, const void *a_base, const void *b_base, void *c_base) {
  const char *A = (const char *)a_base + o->a_off * 2, *B = (const char *)b_base + o->b_off * 2;
  char *C = (char *)c_base + o->c_off * 2;
  if (o->batch == 1)
    return b->gemm_ex(b->dl.handle, (int)o->trans_a, (int)o->trans_b, (int)o->m, (int)o->n, (int)o->k, &o->alpha, A,
                      CUDA_R_16BF_, (int)o->lda, B, CUDA_R_16BF_, (int)o->ldb, &o->beta, C, CUDA_R_16BF_, (int)o->ldc,
                      CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
  return b->gemm_ex_batched(b->dl.handle, (int)o->trans_a, (int)o->trans_b, (int)o->m, (int)o->n, (int)o->k, &o->alpha,
                            A, CUDA_R_16BF_, (int)o->lda, (long long)o->stride_a, B, CUDA_R_16BF_, (int)o->ldb,
                            (long long)o->stride_b, &o->beta, C, CUDA_R_16BF_, (int)o->ldc, (long long)o->stride_c,
                            (int)o->batch, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
}

static int32_t gemm_cb(const gkrt_callback_args *a, void *user) {
  blas *b = user;
  p_gemm p; /* copied: gkrt's parameter bytes carry no alignment promise */
  if (a->params_size != sizeof p || a->num_outputs != 1) return 1;
  memcpy(&p, a->params, sizeof p);
  if (p.count > GEMM_MAX_OPS) return 1;
  if (b->dl.set_stream(b->dl.handle, a->stream) != 0) return 2;
  for (uint32_t i = 0; i < p.count; i++) {
    const gemm_op *o = &p.ops[i];
    if (o->a_in >= a->num_inputs || o->b_in >= a->num_inputs) return 1;
    if (b->dtype == GPT2_BF16) {
      int st = gemm_bf16(b, o, a->inputs[o->a_in].ptr, a->inputs[o->b_in].ptr, a->outputs[0].ptr);
      if (st != 0) {
        fprintf(stderr, "cuBLAS GemmEx (bf16) failed (status %d) in node %u\n", st, a->node);
        return 3;
      }
      continue;
    }
    const float *A = (const float *)a->inputs[o->a_in].ptr + o->a_off;
    const float *B = (const float *)a->inputs[o->b_in].ptr + o->b_off;
    float *C = (float *)a->outputs[0].ptr + o->c_off;
    int st = o->batch == 1
                 ? b->dl.sgemm(b->dl.handle, (int)o->trans_a, (int)o->trans_b, (int)o->m, (int)o->n, (int)o->k, &o->alpha, A,
                            (int)o->lda, B, (int)o->ldb, &o->beta, C, (int)o->ldc)
                 : b->sgemm_batched(b->dl.handle, (int)o->trans_a, (int)o->trans_b, (int)o->m, (int)o->n, (int)o->k,
                                    &o->alpha, A, (int)o->lda, (long long)o->stride_a, B, (int)o->ldb,
                                    (long long)o->stride_b, &o->beta, C, (int)o->ldc, (long long)o->stride_c,
                                    (int)o->batch);
    if (st != 0) {
      fprintf(stderr, "cuBLAS sgemm failed (status %d) in node %u\n", st, a->node);
      return 3;
    }
  }
  return 0;
}

static void blas_free(void *user) {
  blas *b = user;
  cublas_dl_close(&b->dl);
  free(b);
}

static blas *blas_open(gpt2_dtype dtype) {
  blas *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  if (cublas_dl_open(&b->dl)) {
    fprintf(stderr, "cuBLAS could not be set up\n");
    free(b);
    return NULL;
  }
  void *lib = b->dl.lib;
  b->sgemm_batched = (blas_sgemm_batched_fn)cublas_dl_sym(lib, "cublasSgemmStridedBatched");
  b->dtype = dtype;
  int ex_ok = 1;
  if (dtype == GPT2_BF16) {
    b->gemm_ex = (blas_gemm_ex_fn)cublas_dl_sym(lib, "cublasGemmEx");
    b->gemm_ex_batched = (blas_gemm_ex_batched_fn)cublas_dl_sym(lib, "cublasGemmStridedBatchedEx");
    ex_ok = b->gemm_ex && b->gemm_ex_batched;
  }
  /* The handle now (the runtime just made its device current on this thread). */
  if (!b->sgemm_batched || !ex_ok || b->dl.create(&b->dl.handle) != 0) {
    fprintf(stderr, "cuBLAS could not be set up\n");
    b->dl.handle = NULL;
    free(b);
    return NULL;
  }
  return b;
}

int gpt2_gemm_kernel_cublas(gkrt_runtime *rt, gpt2_dtype dtype, gkrt_kernel **out) {
  blas *b = blas_open(dtype);
  if (!b) return 1;
  gkrt_status st = gkrt_kernel_from_callback_with_free(rt, gemm_cb, b, blas_free, out);
  if (st != GKRT_STATUS_OK) {
    fprintf(stderr, "gkrt_kernel_from_callback_with_free: %s\n", gkrt_status_name(st));
    blas_free(b);
    return 1;
  }
  return 0;
}
