/* One rank of the data-parallel example (rank.c): its job and results, run on a thread. */
#ifndef GKRT_DP_RANK_H
#define GKRT_DP_RANK_H

#include <gkrt.h>

#include "net.h"
#include "options.h"

/* One rank. */
typedef struct rank_job {
  const options *o;
  const problem *p;
  gkrt_unique_id id;
  uint32_t rank, nranks;
  float *w;       /* out: weights after every step */
  double *losses; /* out: shard loss per step */
  double step_ms; /* out: median wall time of a timed step (run, output read, loss) */
  gkrt_stats stats; /* out: the runtime's figures after the steps */
  int failed;
} rank_job;

/* The pthread body of a rank: runs it, setting j->failed. */
void *rank_thread(void *arg);

#endif
