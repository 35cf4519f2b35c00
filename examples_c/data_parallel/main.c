/*
 * gkrt data-parallel training: every rank runs the same training step of an MLP on its shard of
 * one fixed synthetic batch; the gradients are averaged across ranks by all-reduce nodes in the
 * graph (fused into buckets at finalize, as PyTorch DDP does), so every rank takes the same SGD
 * step. The program then checks what data parallelism promises:
 *
 *   1. every rank's parameters are identical, bit for bit (an all-reduce MIN and MAX of them
 *      must both equal each rank's own copy);
 *   2. they equal, within a tolerance, those of one runtime training on the combined batch with
 *      the same network and no communicator. Not bit for bit: a rank sums its shard's rows, then
 *      the all-reduce sums the ranks' partial gradients and divides by the number of ranks,
 *      while the single run sums all rows at once and divides by the batch size — the same
 *      real numbers, rounded in another order. The tolerance (DP_TOL relative to the largest
 *      weight, 1e-5 x 0.2 here) is far above that rounding (1.5e-8 after 5 steps at 2 and 4
 *      ranks) and far below a real mistake (summing the gradients instead of averaging: 4e-2).
 *
 * It prints the loss per step and "OK" last; any failed check exits non-zero.
 *
 *   gkrt_data_parallel --ranks N                       N ranks as threads of this process (host
 *                                                      backend: runtimes of one process are the ranks)
 *   gkrt_data_parallel --rank R --nranks N --id-file PATH
 *                                                      one rank per process, on device R (CUDA:
 *                                                      NCCL). Rank 0 writes the 128-byte unique id
 *                                                      to PATH (a path no earlier job left behind);
 *                                                      the others wait for it and read it.
 *   --steps K (default 5), --batch B (rows of the combined batch, default 32; N must divide it)
 *   --in D --width H --out O --depth L (defaults 32, 64, 16, 2): L weight layers D→H→…→H→O
 *   --lr X (default 0.2)
 *   --bucket-kib K (default 16): all-reduce buckets of K KiB; 0: the library's defaults, which
 *                  are PyTorch DDP's (first bucket 1 MiB, later ones 25 MiB)
 *   --trace DIR --trace-steps T: after the K timed steps, T more steps traced (gkrt's run
 *                  traces), rank R's written to DIR/trace_rankR.json. scripts/gpu/mgpu_overlap.py
 *                  reads from them the communication left exposed (not overlapped by compute).
 *   --memory-limit MIB: the ranks' runtimes' memory limit (0, the default: none); a graph
 *                  over it swaps (and recomputes the ReLUs, declared recomputable). The
 *                  reference runs unconstrained.
 *   --reference 0: skip check 2 (the single runtime on the combined batch costs n steps' work per
 *                  step; scripts/gpu/mgpu.sh skips it where a fingerprint comparison stands in).
 *
 * Per rank it prints its median step time, its memory figures and a fingerprint (FNV-1a of its
 * final weights' bytes and of its losses' bytes): two runs that trained identically print the
 * same fingerprint, which is how scripts/gpu/mgpu.sh compares a memory-limited run with the
 * unconstrained one.
 *
 * GKRT_DEVICE (host|cuda|auto) picks the backend; rank R uses device R (so --ranks N on CUDA
 * needs N GPUs: NCCL refuses two ranks on one).
 *
 * The network: a_0 = x, a_k = relu(a_{k-1}·W_k) for the hidden layers, y = a_{L-1}·W_L (no bias),
 * loss = ½·mean over rows of |y − t|², t = x·Wt for a fixed random "teacher" Wt; W_k is row-major
 * [in × out]. The matrix products and the SGD step (an axpy) are host-callback nodes
 * (blas_nodes.h): cuBLAS on the node's stream on CUDA, CPU loops on the host backend (so CI runs
 * the same graph). The backward
 * products take their transposes as flags (dW_k = a_{k-1}ᵀ·dz_k, da_{k-1} = dz_k·W_kᵀ), so
 * every weight and every gradient exists once. Before training each rank checks the product
 * kernel against plain C in those three forms. The SGD step updates the parameters in place on
 * the device, last layer first, so the updates of layers already reduced run while the first
 * layer's gradient is still being all-reduced.
 *
 * This file: the program — its ranks started (threads, or this process's one with the unique id
 * shared through a file), the single-runtime reference, the losses and the verdict printed. The
 * rest of the example: options.c (the command line), net.c (the network and the synthetic
 * problem), step.c (a rank's training step as a graph), selftest.c (the product kernel against
 * plain C), rank.c (one rank's run), checks.c (the checks and the per-rank report).
 */
#include <gkrt.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checks.h"
#include "net.h"
#include "options.h"
#include "rank.h"
#include "status.h"
#include "step.h"

/* The single-runtime reference on the combined batch: its weights after every step and its
 * loss per step. */
static int reference(const options *o, const problem *p, float *w, double *losses) {
  gkrt_config cfg;
  TRY(gkrt_config_init(&cfg));
  cfg.device_ordinal = o->ranks ? 0 : o->rank; /* this process's GPU */
  gkrt_runtime *rt;
  TRY(gkrt_runtime_create(&cfg, &rt));
  step_graph s;
  float *y = malloc(p->batch * o->nw.dims[o->nw.depth] * sizeof(float));
  if (!y || step_build(rt, NULL, &o->nw, p->batch, 0, &s) || step_load(&s, p, 0)) return 1;
  for (uint32_t k = 0; k < o->steps + o->trace_steps; k++)
    if (step_run(rt, &s, p, 0, y, &losses[k])) return 1;
  free(y);
  if (step_weights(&s, &o->nw, w)) return 1;
  TRY(gkrt_graph_release(s.graph));
  TRY(gkrt_runtime_release(rt));
  return 0;
}

/* Rank 0 writes the id to PATH (through a temporary file renamed into place, so a reader never
 * sees half of it); the others poll for it, for up to two minutes. */
static int share_id(const options *o, gkrt_unique_id *id) {
  if (o->rank == 0) {
    gkrt_config cfg;
    TRY(gkrt_config_init(&cfg));
    gkrt_runtime *rt;
    TRY(gkrt_runtime_create(&cfg, &rt));
    TRY(gkrt_comm_get_unique_id(rt, id));
    TRY(gkrt_runtime_release(rt));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->id_file);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, o->id_file) != 0) {
      fprintf(stderr, "cannot write the id to %s: %s\n", o->id_file, strerror(errno));
      return 1;
    }
    return 0;
  }
  for (int tries = 0; tries < 1200; tries++) {
    FILE *f = fopen(o->id_file, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return 0;
    }
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  fprintf(stderr, "rank %u: no id in %s after two minutes\n", o->rank, o->id_file);
  return 1;
}

int main(int argc, char **argv) {
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc;
  const uint32_t n = o.ranks ? o.ranks : o.nranks, total = o.steps + o.trace_steps;
  const net *nw = &o.nw;
  problem p;
  if (problem_make(&p, nw, o.batch)) return 1;
  float *ref_w = calloc(nw->params, sizeof(float));
  double ref_loss[DP_MAX_STEPS];
  /* This process's ranks: all of them as threads, or the one given. */
  const uint32_t local = o.ranks ? o.ranks : 1;
  rank_job jobs[DP_MAX_RANKS];
  int bad = !ref_w;
  for (uint32_t r = 0; r < local && !bad; r++) {
    jobs[r] = (rank_job){&o, &p, {{0}}, o.ranks ? r : o.rank, n, calloc(nw->params, sizeof(float)),
                         calloc(total, sizeof(double)), 0, {0}, 0};
    bad |= !jobs[r].w || !jobs[r].losses;
  }
  if (bad) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }
  char shape[256];
  int len = snprintf(shape, sizeof shape, "%zu", nw->dims[0]);
  for (uint32_t k = 1; k <= nw->depth && len > 0 && (size_t)len < sizeof shape; k++)
    len += snprintf(shape + len, sizeof shape - (size_t)len, "-%zu", nw->dims[k]);
  printf("gkrt %s: data-parallel MLP %s (%zu weights, %.1f MiB of gradients all-reduced per step), "
         "batch %zu over %u ranks (%s), %u steps\n",
         gkrt_version(), shape, nw->params, nw->params * 4.0 / 1048576.0, o.batch, n,
         o.ranks ? "threads of one process" : "one process each", total);

  gkrt_unique_id id;
  if (o.ranks) {
    gkrt_config cfg;
    gkrt_runtime *rt;
    if (check(gkrt_config_init(&cfg), "config") || check(gkrt_runtime_create(&cfg, &rt), "runtime") ||
        check(gkrt_comm_get_unique_id(rt, &id), "unique id") || check(gkrt_runtime_release(rt), "release"))
      return 1;
  } else if (share_id(&o, &id)) {
    return 1;
  }
  pthread_t threads[DP_MAX_RANKS];
  for (uint32_t r = 0; r < local; r++) {
    jobs[r].id = id;
    if (pthread_create(&threads[r], NULL, rank_thread, &jobs[r]) != 0) {
      fprintf(stderr, "cannot start a thread\n");
      return 1;
    }
  }
  for (uint32_t r = 0; r < local; r++) {
    pthread_join(threads[r], NULL);
    bad |= jobs[r].failed;
  }
  if (bad) {
    fprintf(stderr, "FAILED: a rank's training step failed\n");
    return 1;
  }
  if (!o.skip_reference && reference(&o, &p, ref_w, ref_loss)) {
    fprintf(stderr, "FAILED: the single-runtime reference failed\n");
    return 1;
  }

  for (uint32_t k = 0; k < total; k++) {
    /* Threads: every shard's loss is here, and their mean is the batch's. A process sees its own. */
    double loss = 0;
    for (uint32_t r = 0; r < local; r++) loss += jobs[r].losses[k] / local;
    if (o.skip_reference)
      printf("step %u  loss %.6f  (%s)\n", k + 1, loss, o.ranks ? "mean over the ranks" : "this rank's shard");
    else
      printf("step %u  loss %.6f  (%s; one runtime on the combined batch: %.6f)\n", k + 1, loss,
             o.ranks ? "mean over the ranks" : "this rank's shard", ref_loss[k]);
  }
  bad = report(&o, jobs, local, n, o.skip_reference ? NULL : ref_w);
  for (uint32_t r = 0; r < local; r++) {
    free(jobs[r].w);
    free(jobs[r].losses);
  }
  free(ref_w);
  problem_free(&p);
  if (bad) {
    printf("FAILED\n");
    return 1;
  }
  printf("every rank's weights identical bit for bit; %s\nOK\n",
         o.skip_reference ? "the single-runtime reference not run (--reference 0)"
                          : "equal to the single runtime's within tolerance");
  return 0;
}
