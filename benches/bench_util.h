/* Shared by the GPU benchmarks: checked CUDA driver and gkrt calls, a monotonic clock, a median,
 * the chain kernel's parameters and reading its PTX. */
#ifndef GKRT_BENCH_UTIL_H
#define GKRT_BENCH_UTIL_H

#include <cuda.h>
#include <gkrt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CU(call)                                                               \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      const char *n_;                                                          \
      cuGetErrorName(r_, &n_);                                                 \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, n_);     \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define GK(call)                                                                                     \
  do {                                                                                               \
    gkrt_status s_ = (call);                                                                         \
    if (s_ != GKRT_STATUS_OK) {                                                                      \
      char m_[2048];                                                                                 \
      gkrt_last_error_message(m_, sizeof m_);                                                        \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, gkrt_status_name(s_), m_); \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The parameters of benches/chain_kernel.cu's axpb kernel (out = a*in + b over n floats). */
typedef struct {
  float a, b;
  unsigned n;
} axpb_params;

/* The whole file at `path`, NUL-terminated (the PTX a bench loads); exits on failure. */
static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(n + 1);
  if (fread(buf, 1, n, f) != (size_t)n) exit(1);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* Sorts `v` and returns its middle element. */
static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  return v[n / 2];
}

#endif
