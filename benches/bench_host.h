/* Shared by every benchmark, including those built without CUDA's headers (history_cost,
 * trace_cost): a checked gkrt call, monotonic clocks and a median. */
#ifndef GKRT_BENCH_HOST_H
#define GKRT_BENCH_HOST_H

#include <gkrt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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

static inline double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static inline double now_ms(void) { return now_ns() / 1e6; }

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts `v` and returns its median (the mean of the middle two when `n` is even). */
static inline double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
