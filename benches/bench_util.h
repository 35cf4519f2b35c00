/* Shared by the GPU benchmarks: checked CUDA driver and gkrt calls, a monotonic clock, a median. */
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

/* Sorts `v` and returns its middle element. */
static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  return v[n / 2];
}

#endif
