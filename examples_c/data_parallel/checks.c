/* The checks and the report (checks.h): the ranks-identical all-reduce MIN/MAX check, the
 * comparison with the reference, and the run's fingerprint (FNV-1a). */
#include "checks.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

/* Floats per chunk of the ranks-identical check (at most): its graph holds three chunks. */
#define DP_CHECK_CHUNK ((size_t)4 << 20)

/* Every rank's weights bit for bit equal: an all-reduce MIN and MAX of them equals each own
 * copy. In chunks of at most DP_CHECK_CHUNK floats and an eighth of the memory limit (its three
 * tensors then fit under it, with room for the pool's rounding); every rank has the same limit,
 * so they run the same chunks. */
int ranks_identical(gkrt_runtime *rt, gkrt_comm *comm, const float *w, size_t floats, size_t limit_mib,
                           uint32_t rank) {
  size_t chunk = floats < DP_CHECK_CHUNK ? floats : DP_CHECK_CHUNK;
  if (limit_mib && chunk > (limit_mib << 20) / 8 / sizeof(float)) chunk = (limit_mib << 20) / 8 / sizeof(float);
  const uint64_t bytes = chunk * sizeof(float);
  gkrt_graph *g;
  TRY(gkrt_graph_create(rt, &g));
  gkrt_tensor in, lo, hi;
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_INPUT, "weights", &in));
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_OUTPUT, "min", &lo));
  TRY(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_OUTPUT, "max", &hi));
  TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_MIN, 0, GKRT_DTYPE_F32, &in, 1, &lo, 1,
                                NULL));
  TRY(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_MAX, 0, GKRT_DTYPE_F32, &in, 1, &hi, 1,
                                NULL));
  TRY(gkrt_graph_finalize(g));
  float *buf = calloc(chunk, sizeof(float)), *mins = malloc(bytes), *maxs = malloc(bytes);
  int bad = !buf || !mins || !maxs;
  size_t differ = 0;
  /* Every rank runs the same number of chunks (the same `floats`); the last one is padded with
   * zeros on every rank alike. */
  for (size_t at = 0; at < floats && !bad; at += chunk) {
    const size_t n = floats - at < chunk ? floats - at : chunk;
    memset(buf, 0, bytes);
    memcpy(buf, w + at, n * sizeof(float));
    bad |= check(gkrt_graph_write_tensor(g, in, buf, bytes), "write weights");
    bad |= bad || check(gkrt_runtime_run(rt, g), "run the identity check");
    bad |= bad || check(gkrt_graph_read_tensor(g, lo, mins, bytes), "read min");
    bad |= bad || check(gkrt_graph_read_tensor(g, hi, maxs, bytes), "read max");
    if (!bad) differ += memcmp(mins, buf, bytes) != 0 || memcmp(maxs, buf, bytes) != 0;
  }
  if (!bad && differ) {
    fprintf(stderr, "rank %u: the ranks' weights are not identical (%zu chunks differ)\n", rank, differ);
    bad = 1;
  }
  free(buf);
  free(mins);
  free(maxs);
  TRY(gkrt_graph_release(g));
  return bad;
}

/* Largest |a − b| over the weights, and the largest |b|. */
static void compare(const float *a, const float *b, size_t n, double *max_diff, double *max_abs) {
  *max_diff = 0;
  *max_abs = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > *max_diff || d != d) *max_diff = d; /* a NaN is never "close" */
    if (fabs(b[i]) > *max_abs) *max_abs = fabs(b[i]);
  }
}

/* FNV-1a, 64 bits, of `bytes` bytes: the run's fingerprint. */
static uint64_t fnv1a(const void *data, size_t bytes) {
  const unsigned char *p = data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* Per rank: step time, memory, fingerprint; then whether its weights are close to the
 * reference's (`ref_w`, NULL when it did not run) and equal to the first local rank's. Returns
 * non-zero on a failed check. */
int report(const options *o, const rank_job *jobs, uint32_t local, uint32_t n, const float *ref_w) {
  const uint32_t total = o->steps + o->trace_steps;
  int bad = 0;
  for (uint32_t r = 0; r < local; r++) {
    const rank_job *j = &jobs[r];
    printf("rank %u: step time %.3f ms (median of %u), %zu rows per rank\n", j->rank, j->step_ms, o->steps,
           o->batch / n);
    printf("rank %u: memory limit %zu MiB (0: none), peak reserved %.1f MiB, swapped out %.1f MiB, in %.1f MiB, "
           "tensors recomputed %llu, evictions %llu\n",
           j->rank, o->memory_limit_mib, j->stats.peak_reserved_bytes / 1048576.0, j->stats.swap_out_bytes / 1048576.0,
           j->stats.swap_in_bytes / 1048576.0, (unsigned long long)j->stats.tensors_recomputed,
           (unsigned long long)j->stats.evictions);
    printf("rank %u: fingerprint weights %016llx losses %016llx\n", j->rank,
           (unsigned long long)fnv1a(j->w, o->nw.params * sizeof(float)),
           (unsigned long long)fnv1a(j->losses, total * sizeof(double)));
    if (o->trace_steps)
      printf("rank %u: steps %u..%u traced: %s/trace_rank%u.json\n", j->rank, o->steps + 1, total, o->trace_dir,
             j->rank);
  }
  for (uint32_t r = 0; r < local && ref_w; r++) {
    double max_diff, max_abs;
    compare(jobs[r].w, ref_w, o->nw.params, &max_diff, &max_abs);
    int close = max_diff <= DP_TOL * max_abs;
    printf("rank %u: weights vs the single runtime: max |diff| %.3g (tolerance %.3g = %.0e x max |w| %.3g) -> %s\n",
           jobs[r].rank, max_diff, DP_TOL * max_abs, DP_TOL, max_abs, close ? "close" : "TOO FAR");
    bad |= !close;
  }
  for (uint32_t r = 0; r < local; r++) {
    /* ranks_identical already checked this across processes; threads can also compare directly. */
    if (memcmp(jobs[r].w, jobs[0].w, o->nw.params * sizeof(float)) != 0) {
      printf("rank %u: weights differ from rank %u's\n", jobs[r].rank, jobs[0].rank);
      bad = 1;
    }
  }
  return bad;
}
