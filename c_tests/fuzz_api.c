/*
 * fuzz_api: random sequences of C API calls, checked against what include/gkrt.h promises.
 *
 * Each seed drives one or more "worlds" (one per thread): runtimes (default, tiny memory limits
 * that force swapping and OUT_OF_MEMORY, planned mode), kernels (every built-in, a negating host
 * callback, a failing one), graphs of random nodes, host writes and reads, runs, raw pool
 * allocations, releases in any order. A model beside it knows what each call must answer:
 *   - the status the header documents for the situation: NULL or made-up or released or
 *     wrong-kind handles and NULL pointers give INVALID_ARGUMENT, calls in the wrong order
 *     (editing a finalized graph, running an unfinalized one, reading a tensor with no contents)
 *     give INVALID_STATE, bad enum values and sizes give INVALID_ARGUMENT, OUT_OF_MEMORY only
 *     under a memory limit, CALLBACK_FAILED only for a graph with a failing callback; never
 *     INTERNAL, never a crash. Every bad call has exactly one defect, so there is one right
 *     answer.
 *   - every failure leaves a message (gkrt_last_error_message, per thread, NUL-terminated and
 *     truncated as documented), and its out-parameters untouched (pre-filled with a sentinel).
 *   - every tensor read is bit-exact against a plain C interpretation of the graph (the
 *     built-in arithmetic contract: one IEEE f32 operation per element, matmul summing over k
 *     in order without FMA; built with -ffp-contract=off).
 *   - allocated bytes never exceed what live graphs and raw blocks can hold (no intermediate
 *     outlives its run, failed or not), and are 0 once a runtime's graphs and blocks are gone.
 * Threads: 2-4 worlds on their own runtimes, or sharing one runtime (and one read-only graph
 * they all run), which the header says is safe.
 *
 * Usage: fuzz_api [--calls N] [--seed S]... [--trace]
 *   environment: GKRT_FUZZ_CALLS (calls per seed), GKRT_FUZZ_SEEDS ("1,2,3" or "100-140"),
 *   GKRT_FUZZ_TRACE=1 (print every operation). Without seeds a fixed list runs. A failure prints
 *   the seed, thread and call index, and the command that repeats it.
 *
 * Parts (one translation unit, included in order): fuzz/model.h (the model and the oracle),
 * fuzz/ops_objects.h, fuzz/ops_build.h, fuzz/ops_data.h (the operations); this file holds the
 * settings and the driver (worlds, seeds, threads).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <time.h>

#include "test_util.h"

/* ------------------------------------------------------------------------------------------ */
/* Random numbers and settings */

static uint64_t rnd(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint32_t below(uint64_t *s, uint32_t n) { return n ? (uint32_t)(rnd(s) % n) : 0; }
static int chance(uint64_t *s, int percent) { return (int)below(s, 100) < percent; }

static long calls_per_seed = 3000; /* per thread */
static int trace = 0;

#include "fuzz/model.h"
#include "fuzz/ops_objects.h"
#include "fuzz/ops_build.h"
#include "fuzz/ops_data.h"

/* ------------------------------------------------------------------------------------------ */
/* A world: its calls, then teardown in random order. */

static void teardown(world *w) {
  w->op = "teardown";
  /* Everything is released, in a random order; statistics go back to 0 on runtimes still named. */
  for (;;) {
    int choices = 0;
    for (int i = 0; i < w->ng; i++) choices += w->g[i].live;
    for (int i = 0; i < w->nk; i++) choices += w->k[i].live;
    for (int i = 0; i < w->nrt; i++) choices += w->rt[i].handle_live && !w->rt[i].shared;
    if (!choices) break;
    int pick = below(&w->rng, choices);
    for (int i = 0; i < w->ng && pick >= 0; i++)
      if (w->g[i].live && pick-- == 0) {
        int ri = w->g[i].rt;
        CALL(w, gkrt_graph_release(w->g[i].h), S_OK);
        graph_release_model(w, i);
        check_stats(w, ri);
      }
    for (int i = 0; i < w->nk && pick >= 0; i++)
      if (w->k[i].live && pick-- == 0) {
        CALL(w, gkrt_kernel_release(w->k[i].h), S_OK);
        w->k[i].live = 0;
      }
    for (int i = 0; i < w->nrt && pick >= 0; i++)
      if (w->rt[i].handle_live && !w->rt[i].shared && pick-- == 0) {
        mrt *r = &w->rt[i];
        while (r->nraw) CALL(w, gkrt_free(r->h, r->raw[--r->nraw], NULL), S_OK);
        check_stats(w, i);
        gkrt_stats st;
        if (CALL(w, gkrt_runtime_stats(r->h, &st), S_OK) == GKRT_STATUS_OK) w->swapped += st.tensors_swapped_out;
        CALL(w, gkrt_runtime_release(r->h), S_OK);
        r->handle_live = 0;
      }
    if (w->failed) break;
  }
  for (int i = 0; i < w->nrt; i++) {
    mrt *r = &w->rt[i];
    if (r->shared)
      while (r->nraw) CALL(w, gkrt_free(r->h, r->raw[--r->nraw], NULL), S_OK);
  }
  /* Every handle is dead now: all answer INVALID_ARGUMENT, twice released or not. */
  for (int i = 0; i < w->ndead; i++) CALL(w, gkrt_graph_release((gkrt_graph *)w->dead[i]), S_ARG);
}

typedef void (*op_fn)(world *);
static const struct {
  op_fn fn;
  int weight;
} ops[] = {
    {op_runtime_create, 3}, {op_runtime_release, 1}, {op_kernel_create, 6}, {op_kernel_release, 2},
    {op_graph_create, 4},   {op_graph_release, 3},   {op_add_tensor, 14},   {op_add_node, 18},
    {op_recomputable, 3},   {op_finalize, 6},        {op_get_info, 3},      {op_write, 12},
    {op_read, 12},          {op_run, 12},            {op_raw, 4},           {op_misc, 4},
    {op_shared_graph, 2},   {op_cycle, 10},
};

static void *world_main(void *arg) {
  world *w = arg;
  int total = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) total += ops[i].weight;
  while (w->call < calls_per_seed && !w->failed && !stop_all) {
    int pick = below(&w->rng, total);
    size_t i = 0;
    while (pick >= ops[i].weight) pick -= ops[i++].weight;
    /* A world without a runtime makes one first. */
    if (live_rt_handles(w) == 0 && chance(&w->rng, 80)) i = 0;
    long before = w->call;
    ops[i].fn(w);
    if (trace && w->call != before) {
      pthread_mutex_lock(&print_mu);
      printf("seed %llu thread %d calls %ld..%ld: %s\n", (unsigned long long)w->seed, w->thread, before, w->call - 1, w->op);
      pthread_mutex_unlock(&print_mu);
    }
    if (w->call == before) w->call++; /* an op that found nothing to do still counts, so every seed ends */
  }
  if (!w->failed) teardown(w);
  for (int i = 0; i < MAXG; i++)
    for (int t = 0; t < MAXT; t++) {
      free(w->g[i].t[t].val);
      w->g[i].t[t].val = NULL;
    }
  if (w->failed) stop_all = 1;
  return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* A seed: its thread layout, a shared runtime if any, the worlds. */

static int run_seed(uint64_t seed, long *total_calls) {
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  int nthreads = below(&s, 4) == 0 ? 1 : 2 + below(&s, 3);
  int shared = nthreads > 1 && chance(&s, 50);
  world *ws = calloc(nthreads, sizeof *ws);
  gkrt_runtime *srt = NULL;
  gkrt_kernel *sk[3] = {NULL, NULL, NULL};
  int failed = 0;
  if (shared) {
    /* One runtime for all threads, and a graph they all run: y = relu(x * 1.5 + w). */
    gkrt_config cfg;
    OK(gkrt_config_init(&cfg));
    cfg.device = GKRT_DEVICE_HOST;
    cfg.log_level = 0;
    cfg.host_jitter_us = below(&s, 10);
    cfg.memory_mode = chance(&s, 30) ? GKRT_MEMORY_PLANNED : GKRT_MEMORY_DYNAMIC;
    OK(gkrt_runtime_create(&cfg, &srt));
    sk[0] = builtin_kernel(srt, GKRT_BUILTIN_SCALE);
    sk[1] = builtin_kernel(srt, GKRT_BUILTIN_ADD);
    sk[2] = builtin_kernel(srt, GKRT_BUILTIN_RELU);
    OK(gkrt_graph_create(srt, &shared_graph.g));
    gkrt_tensor x = add_tensor(shared_graph.g, 256, GKRT_TENSOR_INPUT, "shared_x");
    gkrt_tensor wt = add_tensor(shared_graph.g, 256, GKRT_TENSOR_PARAMETER, "shared_w");
    gkrt_tensor a = add_tensor(shared_graph.g, 256, GKRT_TENSOR_INTERMEDIATE, "shared_a");
    gkrt_tensor b = add_tensor(shared_graph.g, 256, GKRT_TENSOR_INTERMEDIATE, "shared_b");
    shared_graph.y = add_tensor(shared_graph.g, 256, GKRT_TENSOR_OUTPUT, "shared_y");
    const float alpha = 1.5f;
    OK(add_node(shared_graph.g, sk[0], &x, 1, a, &alpha, sizeof alpha));
    gkrt_tensor aw[2] = {a, wt};
    OK(add_node(shared_graph.g, sk[1], aw, 2, b, NULL, 0));
    OK(add_node(shared_graph.g, sk[2], &b, 1, shared_graph.y, NULL, 0));
    OK(gkrt_graph_finalize(shared_graph.g));
    float xv[64], wv[64];
    fill_floats(xv, 64, (uint32_t)seed);
    fill_floats(wv, 64, (uint32_t)seed + 1);
    OK(gkrt_graph_write_tensor(shared_graph.g, x, xv, sizeof xv));
    OK(gkrt_graph_write_tensor(shared_graph.g, wt, wv, sizeof wv));
    for (int i = 0; i < 64; i++) {
      float sa = alpha * xv[i];
      float sb = sa + wv[i];
      shared_graph.want[i] = sb > 0.0f ? sb : 0.0f;
    }
  }
  for (int t = 0; t < nthreads; t++) {
    world *w = &ws[t];
    w->seed = seed;
    w->thread = t;
    w->rng = seed * 1000003ull + (uint64_t)t * 0x9E3779B97F4A7C15ull + 7;
    w->shared_mode = shared;
    if (shared) {
      w->rt[0].h = srt;
      w->rt[0].handle_live = 1;
      w->rt[0].shared = 1;
      w->nrt = 1;
    }
  }
  if (nthreads == 1) {
    world_main(&ws[0]);
  } else {
    pthread_t th[4];
    for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, world_main, &ws[t]);
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
  }
  long calls = 0, reads = 0, runs = 0, ooms = 0, errs = 0, swapped = 0;
  for (int t = 0; t < nthreads; t++) {
    failed |= ws[t].failed;
    calls += ws[t].call;
    reads += ws[t].reads_checked;
    runs += ws[t].runs_ok;
    ooms += ws[t].runs_oom;
    errs += ws[t].err_calls;
    swapped += ws[t].swapped;
  }
  if (shared) {
    OK(gkrt_graph_release(shared_graph.g));
    shared_graph.g = NULL;
    for (int i = 0; i < 3; i++) OK(gkrt_kernel_release(sk[i]));
    /* Every thread released what it made on the shared runtime: back to 0. */
    gkrt_stats st;
    OK(gkrt_runtime_stats(srt, &st));
    if (!failed && st.allocated_bytes != 0) {
      fprintf(stderr, "FUZZ FAILURE seed=%llu: the shared runtime holds %llu bytes after teardown\n",
              (unsigned long long)seed, (unsigned long long)st.allocated_bytes);
      failed = 1;
    }
    OK(gkrt_runtime_release(srt));
  }
  printf("seed %llu: %d thread(s)%s, %ld calls (%ld refused as expected), %ld runs (%ld out of memory), %ld tensors "
         "swapped out, %ld reads compared: %s\n",
         (unsigned long long)seed, nthreads, shared ? " sharing a runtime" : "", calls, errs, runs, ooms, swapped, reads,
         failed ? "FAILED" : "ok");
  fflush(stdout);
  *total_calls += calls;
  free(ws);
  return failed;
}

static void add_seeds(const char *spec, uint64_t *seeds, int *n, int max) {
  while (*spec && *n < max) {
    char *end;
    unsigned long long a = strtoull(spec, &end, 10), b = a;
    if (end == spec) break;
    if (*end == '-') b = strtoull(end + 1, &end, 10);
    for (unsigned long long s = a; s <= b && *n < max; s++) seeds[(*n)++] = s;
    spec = *end == ',' ? end + 1 : end;
  }
}

int main(int argc, char **argv) {
  enum { MAXSEEDS = 4096 };
  static uint64_t seeds[MAXSEEDS];
  int nseeds = 0;
  const char *env;
  /* The model is the host backend's: its runtimes ask for it, and the process-wide runtime of
   * the PyTorch entry points takes GKRT_DEVICE (which would also override the runtimes' choice).
   * On CUDA a made-up stream handle is undefined behaviour, as in CUDA itself. */
  setenv("GKRT_DEVICE", "host", 1);
  if ((env = getenv("GKRT_FUZZ_CALLS")) && *env) calls_per_seed = atol(env);
  if ((env = getenv("GKRT_FUZZ_SEEDS")) && *env) add_seeds(env, seeds, &nseeds, MAXSEEDS);
  if ((env = getenv("GKRT_FUZZ_TRACE")) && *env == '1') trace = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--calls") && i + 1 < argc) {
      calls_per_seed = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      add_seeds(argv[++i], seeds, &nseeds, MAXSEEDS);
    } else if (!strcmp(argv[i], "--trace")) {
      trace = 1;
    } else {
      fprintf(stderr, "usage: %s [--calls N] [--seed S|A-B|A,B,...]... [--trace]\n", argv[0]);
      return 2;
    }
  }
  if (nseeds == 0) add_seeds("1-48", seeds, &nseeds, MAXSEEDS); /* CI's fixed list */
  test_util_uses_();
  long total = 0;
  int failed = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < nseeds; i++) {
    failed |= run_seed(seeds[i], &total);
    stop_all = 0;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("fuzz_api: %d seed(s), %ld calls of at most %ld per thread, %.1f s\n", nseeds, total, calls_per_seed,
         (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
  if (failed) {
    fprintf(stderr, "fuzz_api: FAILED\n");
    return 1;
  }
  return test_done("fuzz_api");
}
