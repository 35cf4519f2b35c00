/*
 * The GPT-2 example's matrix products on CUDA (OP_GEMM, ops.h): a host callback that runs the
 * node's list of column-major products through cuBLAS on the stream gkrt gives it. cuBLAS is
 * opened with dlopen at run time, so building needs no CUDA toolkit.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* --- cuBLAS, opened at run time. Only the few entry points used, declared by hand. --- */
typedef int (*blas_create_fn)(void **handle);
typedef int (*blas_destroy_fn)(void *handle);
typedef int (*blas_set_stream_fn)(void *handle, void *stream);
typedef int (*blas_sgemm_batched_fn)(void *handle, int ta, int tb, int m, int n, int k, const float *alpha,
                                     const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
                                     const float *beta, float *c, int ldc, long long sc, int batch);
typedef int (*blas_sgemm_fn)(void *handle, int ta, int tb, int m, int n, int k, const float *alpha, const float *a,
                             int lda, const float *b, int ldb, const float *beta, float *c, int ldc);

typedef struct {
  void *lib, *handle;
  blas_destroy_fn destroy;
  blas_set_stream_fn set_stream;
  blas_sgemm_fn sgemm;
  blas_sgemm_batched_fn sgemm_batched;
} blas;

static int32_t gemm_cb(const gkrt_callback_args *a, void *user) {
  blas *b = user;
  p_gemm p; /* copied: gkrt's parameter bytes carry no alignment promise */
  if (a->params_size != sizeof p || a->num_outputs != 1) return 1;
  memcpy(&p, a->params, sizeof p);
  if (p.count > GEMM_MAX_OPS) return 1;
  if (b->set_stream(b->handle, a->stream) != 0) return 2;
  for (uint32_t i = 0; i < p.count; i++) {
    const gemm_op *o = &p.ops[i];
    if (o->a_in >= a->num_inputs || o->b_in >= a->num_inputs) return 1;
    const float *A = (const float *)a->inputs[o->a_in].ptr + o->a_off;
    const float *B = (const float *)a->inputs[o->b_in].ptr + o->b_off;
    float *C = (float *)a->outputs[0].ptr + o->c_off;
    int st = o->batch == 1
                 ? b->sgemm(b->handle, (int)o->trans_a, (int)o->trans_b, (int)o->m, (int)o->n, (int)o->k, &o->alpha, A,
                            (int)o->lda, B, (int)o->ldb, &o->beta, C, (int)o->ldc)
                 : b->sgemm_batched(b->handle, (int)o->trans_a, (int)o->trans_b, (int)o->m, (int)o->n, (int)o->k,
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
  if (b->handle) b->destroy(b->handle);
  /* The library stays loaded: cuBLAS registers process-exit work that needs it. */
  free(b);
}

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) fprintf(stderr, "libcublas has no %s\n", name);
  return p;
}

static blas *blas_open(void) {
  /* The loader's path first, then the toolkit's usual home ($CUDA_HOME, /usr/local/cuda). */
  const char *names[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  const char *home = getenv("CUDA_HOME");
  char path[1024];
  for (int i = 0; i < 2 && !lib; i++) {
    snprintf(path, sizeof path, "%s/lib64/libcublas.so", i == 0 && home ? home : "/usr/local/cuda");
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (!lib) {
    fprintf(stderr, "cannot open libcublas (put CUDA's lib64 on LD_LIBRARY_PATH): %s\n", dlerror());
    return NULL;
  }
  blas *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->lib = lib;
  blas_create_fn create = (blas_create_fn)sym(lib, "cublasCreate_v2");
  b->destroy = (blas_destroy_fn)sym(lib, "cublasDestroy_v2");
  b->set_stream = (blas_set_stream_fn)sym(lib, "cublasSetStream_v2");
  b->sgemm = (blas_sgemm_fn)sym(lib, "cublasSgemm_v2");
  b->sgemm_batched = (blas_sgemm_batched_fn)sym(lib, "cublasSgemmStridedBatched");
  if (!create || !b->destroy || !b->set_stream || !b->sgemm || !b->sgemm_batched || create(&b->handle) != 0) {
    fprintf(stderr, "cuBLAS could not be set up\n");
    free(b);
    return NULL;
  }
  return b;
}

int gpt2_gemm_kernel_cublas(gkrt_runtime *rt, gkrt_kernel **out) {
  blas *b = blas_open();
  if (!b) return 1;
  gkrt_status st = gkrt_kernel_from_callback_with_free(rt, gemm_cb, b, blas_free, out);
  if (st != GKRT_STATUS_OK) {
    fprintf(stderr, "gkrt_kernel_from_callback_with_free: %s\n", gkrt_status_name(st));
    blas_free(b);
    return 1;
  }
  return 0;
}
