/* One rank (rank.h): its runtime and communicator, the product self-test, its step built and
 * loaded, the timed and traced steps, and the check that every rank's weights are identical. */
#include "rank.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "checks.h"
#include "status.h"
#include "step.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts `v`; its median (the upper middle one for an even count: a step time, no averaging). */
static double median_ms(double *v, uint32_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* The timed steps, then the traced ones (their trace written to the trace folder). */
static int rank_steps(gkrt_runtime *rt, rank_job *j, step_graph *s, size_t first) {
  const options *o = j->o;
  float *y = malloc(s->rows * o->nw.dims[o->nw.depth] * sizeof(float));
  double *ms = calloc(o->steps, sizeof(double));
  int bad = !y || !ms;
  for (uint32_t k = 0; k < o->steps && !bad; k++) {
    double t0 = now_ms();
    bad = step_run(rt, s, j->p, first, y, &j->losses[k]);
    ms[k] = now_ms() - t0;
  }
  if (!bad) j->step_ms = median_ms(ms, o->steps);
  if (!bad && o->trace_steps && !(bad = check(gkrt_runtime_trace_begin(rt), "trace begin"))) {
    for (uint32_t k = 0; k < o->trace_steps && !bad; k++)
      bad = step_run(rt, s, j->p, first, y, &j->losses[o->steps + k]);
    char path[4096];
    snprintf(path, sizeof path, "%s/trace_rank%u.json", o->trace_dir, j->rank);
    /* Ended even after a failed step, so the runtime is left untraced. */
    bad |= check(gkrt_runtime_trace_end(rt, path), "trace end");
  }
  free(y);
  free(ms);
  return bad;
}

static int rank_body(rank_job *j) {
  const options *o = j->o;
  gkrt_config cfg;
  TRY(gkrt_config_init(&cfg));
  cfg.device_ordinal = j->rank; /* device = rank (the host backend has one device and ignores it) */
  cfg.memory_limit = (uint64_t)o->memory_limit_mib << 20;
  if (j->rank == 0) cfg.log_level = 3; /* info: the backend picked, and how many all-reduces were fused */
  gkrt_runtime *rt;
  TRY(gkrt_runtime_create(&cfg, &rt));
  gkrt_device_kind dev;
  TRY(gkrt_runtime_device(rt, &dev));
  if (!o->ranks && j->nranks > 1 && dev == GKRT_DEVICE_HOST) {
    /* Its ranks meet in a registry of this process: another process's would wait forever. */
    fprintf(stderr, "rank %u: the host backend's ranks are threads of one process: use --ranks N, or "
                    "GKRT_DEVICE=cuda for one process per GPU\n", j->rank);
    TRY(gkrt_runtime_release(rt));
    return 1;
  }
  gkrt_comm *comm;
  TRY(gkrt_comm_init_rank(rt, &j->id, j->rank, j->nranks, 0, &comm));
  const size_t rows = j->p->batch / j->nranks, first = j->rank * rows;
  step_graph s = {0};
  int bad = gemm_selftest(rt);
  if (bad) fprintf(stderr, "rank %u: the product kernel disagrees with plain C\n", j->rank);
  else if (j->rank == 0)
    printf("rank 0: products: %s, checked against plain C\n",
           dev == GKRT_DEVICE_CUDA ? "cuBLAS sgemm and saxpy in host-callback nodes" : "CPU loops in host-callback nodes");
  if (!bad) bad = step_build(rt, comm, &o->nw, rows, o->bucket_kib, &s) || step_load(&s, j->p, first);
  if (!bad) bad = rank_steps(rt, j, &s, first);
  if (!bad) bad = step_weights(&s, &o->nw, j->w);
  if (!bad) bad = check(gkrt_runtime_stats(rt, &j->stats), "stats");
  /* The step's memory goes back before the identity check's graph needs its own. */
  if (s.graph && check(gkrt_graph_release(s.graph), "release the step")) bad = 1;
  if (!bad) bad = ranks_identical(rt, comm, j->w, o->nw.params, o->memory_limit_mib, j->rank);
  /* A rank that failed aborts, so the others' collectives fail instead of waiting for it. */
  if (bad && gkrt_comm_abort(comm) != GKRT_STATUS_OK) fprintf(stderr, "rank %u: abort failed\n", j->rank);
  TRY(gkrt_comm_release(comm));
  TRY(gkrt_runtime_release(rt));
  return bad;
}

void *rank_thread(void *arg) {
  rank_job *j = arg;
  j->failed = rank_body(j);
  return NULL;
}
