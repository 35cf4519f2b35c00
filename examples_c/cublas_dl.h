/*
 * cuBLAS opened at run time (dlopen), for examples whose matrix products run as gkrt host-callback
 * nodes: building needs no CUDA toolkit, and the host backend never loads it. Only the entry
 * points the examples call, declared by hand (cublas_api.h's signatures, handles and streams as
 * void *, enums as int). Link with -ldl.
 *
 * The handle is made by the first call that needs it (cublas_dl_handle), from inside a node's
 * callback: gkrt runs CUDA callbacks on the thread running the graph with the runtime's device
 * current, so the handle belongs to the runtime's device even when the process has several
 * (one runtime per device, one handle each).
 */
#ifndef GKRT_EXAMPLE_CUBLAS_DL_H
#define GKRT_EXAMPLE_CUBLAS_DL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* cublasOperation_t */
enum { CUBLAS_DL_OP_N = 0, CUBLAS_DL_OP_T = 1 };

typedef int (*cublas_dl_create_fn)(void **handle);
typedef int (*cublas_dl_destroy_fn)(void *handle);
typedef int (*cublas_dl_set_stream_fn)(void *handle, void *stream);
typedef int (*cublas_dl_sgemm_fn)(void *handle, int ta, int tb, int m, int n, int k, const float *alpha,
                                  const float *a, int lda, const float *b, int ldb, const float *beta, float *c,
                                  int ldc);
typedef int (*cublas_dl_saxpy_fn)(void *handle, int n, const float *alpha, const float *x, int incx, float *y,
                                  int incy);

typedef struct cublas_dl {
  void *lib, *handle;
  cublas_dl_create_fn create;
  cublas_dl_destroy_fn destroy;
  cublas_dl_set_stream_fn set_stream;
  cublas_dl_sgemm_fn sgemm;
  cublas_dl_saxpy_fn saxpy;
} cublas_dl;

static inline void *cublas_dl_sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) fprintf(stderr, "libcublas has no %s\n", name);
  return p;
}

/* Opens the library (the loader's path first, then $CUDA_HOME/lib64 and /usr/local/cuda/lib64)
 * and finds the entry points; no handle yet. 0 on success, a message on stderr otherwise. */
static inline int cublas_dl_open(cublas_dl *b) {
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
    return 1;
  }
  b->lib = lib;
  b->handle = NULL;
  b->create = (cublas_dl_create_fn)cublas_dl_sym(lib, "cublasCreate_v2");
  b->destroy = (cublas_dl_destroy_fn)cublas_dl_sym(lib, "cublasDestroy_v2");
  b->set_stream = (cublas_dl_set_stream_fn)cublas_dl_sym(lib, "cublasSetStream_v2");
  b->sgemm = (cublas_dl_sgemm_fn)cublas_dl_sym(lib, "cublasSgemm_v2");
  b->saxpy = (cublas_dl_saxpy_fn)cublas_dl_sym(lib, "cublasSaxpy_v2");
  return !b->create || !b->destroy || !b->set_stream || !b->sgemm || !b->saxpy;
}

/* The handle, made on first use (see the top), bound to `stream`. 0 on success. */
static inline int cublas_dl_handle(cublas_dl *b, void *stream) {
  if (!b->handle) {
    int st = b->create(&b->handle);
    if (st != 0) {
      fprintf(stderr, "cublasCreate failed (status %d)\n", st);
      b->handle = NULL;
      return 1;
    }
  }
  int st = b->set_stream(b->handle, stream);
  if (st != 0) fprintf(stderr, "cublasSetStream failed (status %d)\n", st);
  return st != 0;
}

/* Destroys the handle, if one was made. The library stays loaded: cuBLAS registers
 * process-exit work that needs it. */
static inline void cublas_dl_close(cublas_dl *b) {
  if (b->handle) b->destroy(b->handle);
  b->handle = NULL;
}

#endif
