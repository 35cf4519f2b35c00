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

/* ------------------------------------------------------------------------------------------ */
/* The model */

/* MAXN: random nodes stop at MAXN - 8, leaving room for the fills op_cycle adds. */
enum { MAXRT = 3, MAXK = 12, MAXG = 5, MAXT = 20, MAXN = 22, MAXRAW = 8, MAXDEAD = 16 };
enum { K_NEG = 100, K_FAIL = 101 }; /* callback kernels; built-ins use their GKRT_BUILTIN_* value */

typedef struct {
  gkrt_runtime *h;
  int handle_live; /* the handle; the runtime object lives on while graphs or kernels hold it */
  int shared;      /* made by main for all threads: never released here, statistics not exact */
  int tight;       /* a memory limit or pinned limit is set: OUT_OF_MEMORY is a possible answer */
  int planned;
  void *raw[MAXRAW];
  size_t raw_size[MAXRAW];
  int nraw;
} mrt;

typedef struct {
  gkrt_kernel *h;
  int live;
  int rt;
  int kind;
} mkern;

typedef struct {
  gkrt_tensor id;
  uint64_t size;
  uint32_t kind;
  char name[40];
  int produced; /* some node writes it */
  int has;      /* 0: no contents; 1: has; 2: maybe (a failed run may have produced it) */
  int known;    /* the model knows its bytes */
  unsigned char *val;
} mtensor;

typedef struct {
  int kind;
  int nin;
  int in[2];
  int out;
  float param;
  uint32_t mnk[3];
} mnode;

typedef struct {
  gkrt_graph *h;
  int live;
  int rt;
  int finalized;
  int nt, nn;
  mtensor t[MAXT];
  mnode n[MAXN];
  int has_fail_node;
} mgraph;

typedef struct world world;
struct world {
  uint64_t seed;
  int thread;
  uint64_t rng;
  long call; /* index of the API call being made */
  const char *op;
  int failed;
  mrt rt[MAXRT];
  int nrt;
  mkern k[MAXK];
  int nk;
  mgraph g[MAXG];
  int ng;
  void *dead[MAXDEAD]; /* released handles, for use after release */
  int ndead;
  int shared_mode;
  /* counts, for the summary */
  long ok_calls, err_calls, runs_ok, runs_oom, reads_checked, swapped;
};

/* The read-only graph all threads of a shared-runtime seed run. */
static struct {
  gkrt_graph *g;
  gkrt_tensor y;
  float want[64];
} shared_graph;

static volatile int stop_all = 0;

/* common.h's last_error() keeps the text in one static buffer; threads need their own. */
static const char *error_text(void) {
  static __thread char buf[1024];
  gkrt_last_error_message(buf, sizeof buf);
  return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* The oracle */

#define S_(x) (1u << (x))
#define S_OK S_(GKRT_STATUS_OK)
#define S_ARG S_(GKRT_STATUS_INVALID_ARGUMENT)
#define S_STATE S_(GKRT_STATUS_INVALID_STATE)
#define S_OOM S_(GKRT_STATUS_OUT_OF_MEMORY)
#define S_CB S_(GKRT_STATUS_CALLBACK_FAILED)

static pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(world *w, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(world *w, int line, const char *fmt, ...) {
  pthread_mutex_lock(&print_mu);
  fprintf(stderr, "FUZZ FAILURE seed=%llu thread=%d call=%ld op=%s (fuzz_api.c:%d): ", (unsigned long long)w->seed,
          w->thread, w->call, w->op, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n  repeat with: fuzz_api --seed %llu --calls %ld --trace\n", (unsigned long long)w->seed,
          calls_per_seed);
  pthread_mutex_unlock(&print_mu);
  w->failed = 1;
}
#define FAIL(w, ...) fail((w), __LINE__, __VA_ARGS__)

static void mask_names(unsigned mask, char *buf, size_t len) {
  buf[0] = 0;
  for (int s = 0; s < 11; s++)
    if (mask & S_(s)) {
      size_t used = strlen(buf);
      snprintf(buf + used, len - used, "%s%s", used ? " or " : "", gkrt_status_name(s));
    }
}

/* The last error after a failure: present, and copied out as documented (NUL-terminated,
 * truncated to len - 1, nothing written past len). */
static void check_message(world *w) {
  size_t full = gkrt_last_error_message(NULL, 0);
  if (full == 0) {
    FAIL(w, "a failing call left no message");
    return;
  }
  char buf[48];
  size_t len = 1 + below(&w->rng, 40);
  memset(buf, 0x7F, sizeof buf);
  size_t got = gkrt_last_error_message(buf, len);
  size_t n = full < len - 1 ? full : len - 1;
  if (got != full || buf[n] != 0 || (n + 1 < sizeof buf && buf[n + 1] != 0x7F) || memchr(buf, 0, n) != NULL)
    FAIL(w, "gkrt_last_error_message(buf, %zu): returned %zu (full %zu), buffer not as documented", len, got, full);
}

/* Checks a status against the set the model allows; returns the status. */
static gkrt_status expect_(world *w, gkrt_status got, unsigned allowed, const char *what, int line) {
  if ((unsigned)got < 32 && (allowed & S_(got))) {
    if (got != GKRT_STATUS_OK) {
      w->err_calls++;
      check_message(w);
    } else {
      w->ok_calls++;
    }
    return got;
  }
  char names[256];
  mask_names(allowed, names, sizeof names);
  fail(w, line, "%s -> %s (%s), expected %s", what, gkrt_status_name(got), error_text(), names);
  return got;
}
#define CALL(w, expr, allowed) (((w)->call++), expect_((w), (expr), (allowed), #expr, __LINE__))

/* Out-parameter sentinels. */
#define SENT_PTR ((void *)(uintptr_t)0x5e475e47u)
#define SENT_U64 0x5e475e475e475e47ull

/* ------------------------------------------------------------------------------------------ */
/* Helpers on the model */

static int live_rt_handles(world *w) {
  int n = 0;
  for (int i = 0; i < w->nrt; i++) n += w->rt[i].handle_live;
  return n;
}

static int pick_live_rt(world *w) {
  int idx[MAXRT], n = 0;
  for (int i = 0; i < w->nrt; i++)
    if (w->rt[i].handle_live) idx[n++] = i;
  return n ? idx[below(&w->rng, n)] : -1;
}

static int pick_live_graph(world *w) {
  int idx[MAXG], n = 0;
  for (int i = 0; i < w->ng; i++)
    if (w->g[i].live) idx[n++] = i;
  return n ? idx[below(&w->rng, n)] : -1;
}

static int pick_live_kernel(world *w, int rt, int kind) { /* rt/kind -1: any */
  int idx[MAXK], n = 0;
  for (int i = 0; i < w->nk; i++)
    if (w->k[i].live && (rt < 0 || w->k[i].rt == rt) && (kind < 0 || w->k[i].kind == kind)) idx[n++] = i;
  return n ? idx[below(&w->rng, n)] : -1;
}

static void remember_dead(world *w, void *h) {
  if (w->ndead < MAXDEAD)
    w->dead[w->ndead++] = h;
  else
    w->dead[below(&w->rng, MAXDEAD)] = h;
}

/* A handle no live object has: a released one, or made up (odd, so never a key; or the address
 * of a local). */
static void *bogus_handle(world *w) {
  int c = below(&w->rng, 4);
  if (c == 0 && w->ndead) return w->dead[below(&w->rng, w->ndead)];
  if (c == 1) return (void *)(uintptr_t)(rnd(&w->rng) | 1);
  if (c == 2) return (void *)w; /* an address, not a handle */
  return (void *)(uintptr_t)(1 + 2 * below(&w->rng, 1000));
}

/* Does any live object still hold runtime object `ri`? */
static int rt_object_alive(world *w, int ri) {
  if (w->rt[ri].handle_live) return 1;
  for (int i = 0; i < w->ng; i++)
    if (w->g[i].live && w->g[i].rt == ri) return 1;
  for (int i = 0; i < w->nk; i++)
    if (w->k[i].live && w->k[i].rt == ri) return 1;
  return 0;
}

static uint64_t round256(uint64_t v) { return (v + 255) & ~255ull; }

/* Memory statistics of a runtime whose handle is live and which this world alone uses. */
static void check_stats(world *w, int ri) {
  mrt *r = &w->rt[ri];
  if (!r->handle_live || r->shared || w->failed) return;
  gkrt_stats s;
  memset(&s, 0xAB, sizeof s);
  if (CALL(w, gkrt_runtime_stats(r->h, &s), S_OK) != GKRT_STATUS_OK) return;
  uint64_t bound = 0;
  int graphs = 0;
  for (int i = 0; i < r->nraw; i++) bound += round256(r->raw_size[i]);
  for (int gi = 0; gi < w->ng; gi++) {
    mgraph *g = &w->g[gi];
    if (!g->live || g->rt != ri) continue;
    graphs++;
    for (int t = 0; t < g->nt; t++)
      if (g->t[t].kind != GKRT_TENSOR_INTERMEDIATE) bound += round256(g->t[t].size);
    if (r->planned && g->finalized) {
      gkrt_graph_info info;
      if (CALL(w, gkrt_graph_get_info(g->h, &info), S_OK) == GKRT_STATUS_OK) bound += info.transient_total_bytes;
    }
  }
  if (s.allocated_bytes > bound)
    FAIL(w, "runtime %d: %llu bytes allocated, more than its %d graphs and %d raw blocks can hold (%llu)", ri,
         (unsigned long long)s.allocated_bytes, graphs, r->nraw, (unsigned long long)bound);
  if (graphs == 0 && r->nraw == 0 && s.allocated_bytes != 0)
    FAIL(w, "runtime %d: %llu bytes allocated with no graph and no raw block left", ri,
         (unsigned long long)s.allocated_bytes);
  if (s.reserved_bytes < s.allocated_bytes || s.peak_allocated_bytes < s.allocated_bytes)
    FAIL(w, "runtime %d: reserved %llu / peak %llu below allocated %llu", ri, (unsigned long long)s.reserved_bytes,
         (unsigned long long)s.peak_allocated_bytes, (unsigned long long)s.allocated_bytes);
}

/* ------------------------------------------------------------------------------------------ */
/* The model's interpretation of a graph (the built-in arithmetic contract). */

static void model_run(mgraph *g) {
  /* Intermediates start unknown each run; persistent tensors keep their bytes. */
  for (int t = 0; t < g->nt; t++)
    if (g->t[t].kind == GKRT_TENSOR_INTERMEDIATE) g->t[t].known = 0;
  for (int i = 0; i < g->nn; i++) {
    mnode *n = &g->n[i];
    mtensor *o = &g->t[n->out];
    int known = 1;
    for (int j = 0; j < n->nin; j++) known &= g->t[n->in[j]].known;
    size_t cnt = o->size / 4;
    float *out = (float *)o->val;
    const float *a = n->nin > 0 ? (const float *)g->t[n->in[0]].val : NULL;
    const float *b = n->nin > 1 ? (const float *)g->t[n->in[1]].val : NULL;
    /* In-place nodes read what they write: element i depends only on element i, except for
     * matmul, which never writes its inputs. */
    switch (n->kind) {
      case GKRT_BUILTIN_FILL:
        for (size_t e = 0; e < cnt; e++) out[e] = n->param;
        known = 1;
        break;
      case GKRT_BUILTIN_COPY: memmove(o->val, g->t[n->in[0]].val, o->size); break;
      case GKRT_BUILTIN_ADD:
        for (size_t e = 0; e < cnt; e++) out[e] = a[e] + b[e];
        break;
      case GKRT_BUILTIN_SCALE:
        for (size_t e = 0; e < cnt; e++) out[e] = n->param * a[e];
        break;
      case GKRT_BUILTIN_RELU:
        for (size_t e = 0; e < cnt; e++) out[e] = a[e] > 0.0f ? a[e] : 0.0f;
        break;
      case GKRT_BUILTIN_RELU_GRAD: /* inputs: grad, x */
        for (size_t e = 0; e < cnt; e++) out[e] = b[e] > 0.0f ? a[e] : 0.0f;
        break;
      case GKRT_BUILTIN_MATMUL: {
        uint32_t m = n->mnk[0], nn = n->mnk[1], k = n->mnk[2];
        for (uint32_t r = 0; r < m; r++)
          for (uint32_t c = 0; c < nn; c++) {
            float acc = 0.0f;
            for (uint32_t p = 0; p < k; p++) {
              float prod = a[r * k + p] * b[p * nn + c];
              acc = acc + prod;
            }
            out[r * nn + c] = acc;
          }
        break;
      }
      case K_NEG:
        for (size_t e = 0; e < cnt; e++) out[e] = -a[e];
        break;
      default: break;
    }
    o->known = known;
    if (o->kind != GKRT_TENSOR_INTERMEDIATE) o->has = 1;
  }
}

/* After a failed run: whatever nodes write is unknown now (some ran, some did not). */
static void model_failed_run(mgraph *g) {
  for (int i = 0; i < g->nn; i++) {
    mtensor *o = &g->t[g->n[i].out];
    o->known = 0;
    if (o->kind != GKRT_TENSOR_INTERMEDIATE && o->has == 0) o->has = 2;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Host callbacks (run on the host backend's stream worker, with host pointers). */

static int32_t neg_cb(const gkrt_callback_args *args, void *user) {
  (void)user;
  if (args->num_inputs != 1 || args->num_outputs != 1 || args->inputs[0].size != args->outputs[0].size) return 99;
  const float *in = args->inputs[0].ptr;
  float *out = args->outputs[0].ptr;
  for (size_t i = 0; i < args->outputs[0].size / 4; i++) out[i] = -in[i];
  return 0;
}

static int32_t fail_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  return 7;
}

/* ------------------------------------------------------------------------------------------ */
/* Operations. Each makes one to a few API calls, good or with exactly one defect. */

static void graph_release_model(world *w, int gi);

static void op_runtime_create(world *w) {
  w->op = "runtime_create";
  gkrt_config cfg;
  if (CALL(w, gkrt_config_init(&cfg), S_OK) != GKRT_STATUS_OK) return;
  cfg.device = GKRT_DEVICE_HOST;
  cfg.log_level = 0;
  cfg.seed = rnd(&w->rng);
  cfg.host_jitter_us = chance(&w->rng, 30) ? below(&w->rng, 20) : 0;
  gkrt_runtime *out = SENT_PTR;
  int defect = chance(&w->rng, 25) ? 1 + below(&w->rng, 5) : 0;
  switch (defect) {
    case 1: cfg.device = 3 + below(&w->rng, 1000); break;
    case 2: cfg.memory_mode = 2 + (uint32_t)below(&w->rng, 0xFFFFFFF0u); break;
    case 3: cfg.log_level = 6 + below(&w->rng, 100); break;
    case 4: cfg.pool_growth = 3 + below(&w->rng, 1000); break;
    case 5: CALL(w, gkrt_runtime_create(&cfg, NULL), S_ARG); return;
    default: break;
  }
  if (defect) {
    CALL(w, gkrt_runtime_create(&cfg, &out), S_ARG);
    if (out != SENT_PTR) FAIL(w, "runtime_create wrote *out on failure");
    return;
  }
  /* Live runtime objects are bounded (each has stream threads). */
  int slot = -1;
  for (int i = 0; i < w->nrt; i++)
    if (!rt_object_alive(w, i)) slot = i;
  if (slot < 0 && w->nrt < MAXRT) slot = w->nrt;
  if (slot < 0) {
    /* Every slot holds a runtime kept alive by graphs or kernels after its handle went: release
     * those of one such runtime (its last references) to make room. */
    int victim = -1;
    for (int i = 0; i < w->nrt; i++)
      if (!w->rt[i].handle_live && !w->rt[i].shared) victim = i;
    if (victim < 0) return;
    for (int i = 0; i < w->ng; i++)
      if (w->g[i].live && w->g[i].rt == victim && CALL(w, gkrt_graph_release(w->g[i].h), S_OK) == GKRT_STATUS_OK)
        graph_release_model(w, i);
    for (int i = 0; i < w->nk; i++)
      if (w->k[i].live && w->k[i].rt == victim && CALL(w, gkrt_kernel_release(w->k[i].h), S_OK) == GKRT_STATUS_OK) {
        w->k[i].live = 0;
        remember_dead(w, w->k[i].h);
      }
    slot = victim;
  }
  static const uint64_t limits[] = {2 << 10, 4 << 10, 8 << 10, 64 << 10};
  int tight = chance(&w->rng, 45);
  cfg.memory_limit = tight ? limits[below(&w->rng, 4)] : 0;
  cfg.host_memory_limit = chance(&w->rng, 10) ? (16 << 10) : 0;
  cfg.memory_mode = chance(&w->rng, 30) ? GKRT_MEMORY_PLANNED : GKRT_MEMORY_DYNAMIC;
  cfg.pool_growth = below(&w->rng, 3);
  int defaults = chance(&w->rng, 5);
  if (CALL(w, gkrt_runtime_create(defaults ? NULL : &cfg, &out), S_OK) != GKRT_STATUS_OK) return;
  if (out == SENT_PTR || out == NULL) {
    FAIL(w, "runtime_create succeeded without writing *out");
    return;
  }
  mrt *r = &w->rt[slot];
  memset(r, 0, sizeof *r);
  r->h = out;
  r->handle_live = 1;
  r->tight = !defaults && (cfg.memory_limit != 0 || cfg.host_memory_limit != 0);
  r->planned = !defaults && cfg.memory_mode == GKRT_MEMORY_PLANNED;
  if (slot == w->nrt) w->nrt++;
  /* A NULL config gives the defaults: dynamic, no limit. */
  gkrt_device_kind kind = 77;
  CALL(w, gkrt_runtime_device(out, &kind), S_OK);
  if (kind != GKRT_DEVICE_HOST && kind != GKRT_DEVICE_CUDA) FAIL(w, "runtime_device gave %u", kind);
  check_stats(w, slot);
}

static void op_runtime_release(world *w) {
  w->op = "runtime_release";
  int c = below(&w->rng, 10);
  if (c == 0) {
    CALL(w, gkrt_runtime_release(NULL), S_OK);
    return;
  }
  if (c <= 2) {
    CALL(w, gkrt_runtime_release((gkrt_runtime *)bogus_handle(w)), S_ARG);
    return;
  }
  if (c == 3 && w->ng) { /* a graph or kernel handle passed as a runtime */
    int gi = pick_live_graph(w);
    if (gi >= 0) CALL(w, gkrt_runtime_release((gkrt_runtime *)w->g[gi].h), S_ARG);
    return;
  }
  int ri = pick_live_rt(w);
  if (ri < 0 || w->rt[ri].shared) return;
  /* Graphs and kernels made from it keep it alive; its raw blocks go with it. */
  gkrt_stats st;
  if (CALL(w, gkrt_runtime_stats(w->rt[ri].h, &st), S_OK) == GKRT_STATUS_OK) w->swapped += st.tensors_swapped_out;
  if (CALL(w, gkrt_runtime_release(w->rt[ri].h), S_OK) != GKRT_STATUS_OK) return;
  w->rt[ri].handle_live = 0;
  w->rt[ri].nraw = 0;
  remember_dead(w, w->rt[ri].h);
}

static void op_kernel_create(world *w) {
  w->op = "kernel_create";
  int ri = pick_live_rt(w);
  gkrt_kernel *out = SENT_PTR;
  if (ri < 0) return;
  gkrt_runtime *rt = w->rt[ri].h;
  int c = below(&w->rng, 12);
  if (c == 0) {
    CALL(w, gkrt_kernel_builtin(rt, 7 + (gkrt_builtin)below(&w->rng, 0xFFFFFFF0u), &out), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_kernel_builtin((gkrt_runtime *)bogus_handle(w), GKRT_BUILTIN_ADD, &out), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, NULL), S_ARG);
  } else if (c == 3) {
    CALL(w, gkrt_kernel_from_callback(rt, NULL, NULL, &out), S_ARG);
  } else if (c == 4) {
    /* PTX on the host backend: UNSUPPORTED; a NULL text: INVALID_ARGUMENT. */
    if (chance(&w->rng, 50))
      CALL(w, gkrt_kernel_from_ptx(rt, ".version 7.0\n", "f", &out), S_(GKRT_STATUS_UNSUPPORTED));
    else
      CALL(w, gkrt_kernel_from_ptx(rt, NULL, "f", &out), S_ARG);
  }
  if (c <= 4) {
    if (out != SENT_PTR) FAIL(w, "kernel creation wrote *out on failure");
    return;
  }
  int slot = -1;
  for (int i = 0; i < w->nk; i++)
    if (!w->k[i].live) slot = i;
  if (slot < 0 && w->nk < MAXK) slot = w->nk;
  if (slot < 0) return;
  int kind;
  gkrt_status st;
  if (c == 11) {
    kind = chance(&w->rng, 25) ? K_FAIL : K_NEG;
    st = CALL(w, gkrt_kernel_from_callback(rt, kind == K_NEG ? neg_cb : fail_cb, w, &out), S_OK);
  } else {
    kind = (int)below(&w->rng, 7);
    st = CALL(w, gkrt_kernel_builtin(rt, (gkrt_builtin)kind, &out), S_OK);
  }
  if (st != GKRT_STATUS_OK) return;
  if (out == SENT_PTR || out == NULL) {
    FAIL(w, "kernel creation succeeded without writing *out");
    return;
  }
  w->k[slot] = (mkern){out, 1, ri, kind};
  if (slot == w->nk) w->nk++;
}

static void op_kernel_release(world *w) {
  w->op = "kernel_release";
  int c = below(&w->rng, 8);
  if (c == 0) {
    CALL(w, gkrt_kernel_release(NULL), S_OK);
  } else if (c == 1) {
    CALL(w, gkrt_kernel_release((gkrt_kernel *)bogus_handle(w)), S_ARG);
  } else if (c == 2) {
    int ri = pick_live_rt(w);
    if (ri >= 0) CALL(w, gkrt_kernel_release((gkrt_kernel *)w->rt[ri].h), S_ARG);
  } else {
    int ki = pick_live_kernel(w, -1, -1);
    if (ki < 0) return;
    /* Graphs that use it keep what they need. */
    if (CALL(w, gkrt_kernel_release(w->k[ki].h), S_OK) != GKRT_STATUS_OK) return;
    w->k[ki].live = 0;
    remember_dead(w, w->k[ki].h);
  }
}

static void op_graph_create(world *w) {
  w->op = "graph_create";
  gkrt_graph *out = SENT_PTR;
  int ri = pick_live_rt(w);
  int c = below(&w->rng, 10);
  if (c == 0 || ri < 0) {
    CALL(w, gkrt_graph_create((gkrt_runtime *)bogus_handle(w), &out), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_graph_create(w->rt[ri].h, NULL), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_create(NULL, &out), S_ARG);
  }
  if (c <= 2 || ri < 0) {
    if (out != SENT_PTR) FAIL(w, "graph_create wrote *out on failure");
    return;
  }
  int slot = -1;
  for (int i = 0; i < w->ng; i++)
    if (!w->g[i].live) slot = i;
  if (slot < 0 && w->ng < MAXG) slot = w->ng;
  if (slot < 0) return;
  if (CALL(w, gkrt_graph_create(w->rt[ri].h, &out), S_OK) != GKRT_STATUS_OK) return;
  if (out == SENT_PTR || out == NULL) {
    FAIL(w, "graph_create succeeded without writing *out");
    return;
  }
  mgraph *g = &w->g[slot];
  for (int t = 0; t < g->nt; t++) free(g->t[t].val);
  memset(g, 0, sizeof *g);
  g->h = out;
  g->live = 1;
  g->rt = ri;
  if (slot == w->ng) w->ng++;
}

static void graph_release_model(world *w, int gi) {
  mgraph *g = &w->g[gi];
  for (int t = 0; t < g->nt; t++) {
    free(g->t[t].val);
    g->t[t].val = NULL;
  }
  g->live = 0;
  g->nt = g->nn = 0;
  remember_dead(w, g->h);
}

static void op_graph_release(world *w) {
  w->op = "graph_release";
  int c = below(&w->rng, 8);
  if (c == 0) {
    CALL(w, gkrt_graph_release(NULL), S_OK);
  } else if (c == 1) {
    CALL(w, gkrt_graph_release((gkrt_graph *)bogus_handle(w)), S_ARG);
  } else if (c == 2) {
    int ki = pick_live_kernel(w, -1, -1);
    if (ki >= 0) CALL(w, gkrt_graph_release((gkrt_graph *)w->k[ki].h), S_ARG);
  } else {
    int gi = pick_live_graph(w);
    if (gi < 0) return;
    int ri = w->g[gi].rt;
    if (CALL(w, gkrt_graph_release(w->g[gi].h), S_OK) != GKRT_STATUS_OK) return;
    graph_release_model(w, gi);
    check_stats(w, ri);
  }
}

static uint64_t tensor_size(world *w) {
  int c = below(&w->rng, 10);
  if (c < 7) return 4ull * (1 + below(&w->rng, 8)) * (1 + below(&w->rng, 8));
  if (c < 9) {
    static const uint64_t big[] = {256 * 4, 1000 * 4, 4096 * 4};
    return big[below(&w->rng, 3)];
  }
  return 1 + below(&w->rng, 37); /* any byte count: only copy (and errors) use these */
}

static void op_add_tensor(world *w) {
  w->op = "add_tensor";
  int gi = pick_live_graph(w);
  gkrt_tensor out = SENT_U64;
  if (gi < 0) {
    CALL(w, gkrt_graph_add_tensor((gkrt_graph *)bogus_handle(w), 16, GKRT_TENSOR_INPUT, "x", &out), S_ARG);
    return;
  }
  mgraph *g = &w->g[gi];
  char name[40];
  snprintf(name, sizeof name, "s%llu_t%d_g%d_%d", (unsigned long long)w->seed, w->thread, gi, g->nt);
  int c = below(&w->rng, 10);
  if (c == 0) {
    static const uint64_t bad[] = {0, (1ull << 48) + 1, 1ull << 63, UINT64_MAX - 255, UINT64_MAX};
    uint64_t size = bad[below(&w->rng, 5)];
    gkrt_status st = CALL(w, gkrt_graph_add_tensor(g->h, size, below(&w->rng, 4), name, &out),
                          g->finalized ? S_ARG | S_STATE : S_ARG);
    if (st == GKRT_STATUS_INVALID_ARGUMENT && !g->finalized && !strstr(error_text(), name))
      FAIL(w, "add_tensor of %llu bytes: message \"%s\" does not name %s", (unsigned long long)size, error_text(), name);
  } else if (c == 1) {
    CALL(w, gkrt_graph_add_tensor(g->h, 16, 4 + (uint32_t)below(&w->rng, 0xFFFFFF00u), name, &out),
         g->finalized ? S_ARG | S_STATE : S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_add_tensor(g->h, 16, GKRT_TENSOR_INPUT, name, NULL), g->finalized ? S_ARG | S_STATE : S_ARG);
  }
  if (c <= 2) {
    if (out != SENT_U64) FAIL(w, "add_tensor wrote *out on failure");
    return;
  }
  if (g->finalized) {
    CALL(w, gkrt_graph_add_tensor(g->h, 16, GKRT_TENSOR_INPUT, name, &out), S_STATE);
    if (out != SENT_U64) FAIL(w, "add_tensor wrote *out on failure");
    return;
  }
  if (g->nt >= MAXT) return;
  uint64_t size = tensor_size(w);
  uint32_t kind = below(&w->rng, 4);
  if (kind == GKRT_TENSOR_OUTPUT && size % 4) size = 4 * size; /* outputs can always be filled */
  int named = chance(&w->rng, 85);
  if (CALL(w, gkrt_graph_add_tensor(g->h, size, kind, named ? name : NULL, &out), S_OK) != GKRT_STATUS_OK) return;
  for (int t = 0; t < g->nt; t++)
    if (g->t[t].id == out) FAIL(w, "add_tensor gave id %llu twice", (unsigned long long)out);
  mtensor *t = &g->t[g->nt++];
  memset(t, 0, sizeof *t);
  t->id = out;
  t->size = size;
  t->kind = kind;
  if (named) snprintf(t->name, sizeof t->name, "%s", name);
  t->val = calloc(1, size);
}

static int readable(mtensor *t) {
  return t->kind == GKRT_TENSOR_INPUT || t->kind == GKRT_TENSOR_PARAMETER || t->produced;
}
static int writable(mtensor *t) { return t->kind != GKRT_TENSOR_INPUT; }

/* Picks a tensor of graph g with `size` (0: any size that is a whole number of floats, or any
 * size when `any_bytes`) that is readable (want_read) or writable (!want_read). -1 if none. */
static int pick_tensor(world *w, mgraph *g, uint64_t size, int want_read, int any_bytes) {
  int idx[MAXT], n = 0;
  for (int t = 0; t < g->nt; t++) {
    mtensor *x = &g->t[t];
    if (size ? x->size != size : (!any_bytes && x->size % 4 != 0)) continue;
    if (want_read ? !readable(x) : !writable(x)) continue;
    idx[n++] = t;
  }
  return n ? idx[below(&w->rng, n)] : -1;
}

/* A valid node, built from the graph's tensors; returns 0 when none could be found. */
static int plan_node(world *w, mgraph *g, int kind, mnode *n) {
  memset(n, 0, sizeof *n);
  n->kind = kind;
  if (kind == GKRT_BUILTIN_MATMUL) {
    for (int tries = 0; tries < 12; tries++) {
      uint32_t m = 1 + below(&w->rng, 8), nn = 1 + below(&w->rng, 8), k = 1 + below(&w->rng, 8);
      int a = pick_tensor(w, g, 4ull * m * k, 1, 0), b = pick_tensor(w, g, 4ull * k * nn, 1, 0);
      int o = pick_tensor(w, g, 4ull * m * nn, 0, 0);
      if (a < 0 || b < 0 || o < 0 || o == a || o == b) continue;
      n->nin = 2;
      n->in[0] = a;
      n->in[1] = b;
      n->out = o;
      n->mnk[0] = m;
      n->mnk[1] = nn;
      n->mnk[2] = k;
      return 1;
    }
    return 0;
  }
  int o = pick_tensor(w, g, 0, 0, kind == GKRT_BUILTIN_COPY);
  if (o < 0) return 0;
  n->out = o;
  uint64_t size = g->t[o].size;
  n->nin = kind == GKRT_BUILTIN_FILL ? 0 : (kind == GKRT_BUILTIN_ADD || kind == GKRT_BUILTIN_RELU_GRAD) ? 2 : 1;
  for (int j = 0; j < n->nin; j++) {
    n->in[j] = pick_tensor(w, g, size, 1, 1);
    if (n->in[j] < 0) return 0;
  }
  static const float params[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.3333333f, 1e-30f, 65504.0f};
  n->param = params[below(&w->rng, 7)];
  return 1;
}

static void op_add_node(world *w) {
  w->op = "add_kernel";
  int gi = pick_live_graph(w);
  if (gi < 0) return;
  mgraph *g = &w->g[gi];
  int c = below(&w->rng, 100);
  /* A kernel of the graph's runtime. */
  int ki = pick_live_kernel(w, g->rt, -1);
  if (ki < 0) return;
  mkern *k = &w->k[ki];
  mnode n;
  int kind = k->kind == K_FAIL ? K_NEG : k->kind;
  if (!plan_node(w, g, kind, &n)) return;
  gkrt_tensor in[2], out = g->t[n.out].id;
  for (int j = 0; j < n.nin; j++) in[j] = g->t[n.in[j]].id;
  gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, NULL, 0};
  if (kind == GKRT_BUILTIN_FILL || kind == GKRT_BUILTIN_SCALE) {
    l.params = &n.param;
    l.params_size = 4;
  } else if (kind == GKRT_BUILTIN_MATMUL) {
    l.params = n.mnk;
    l.params_size = 12;
  }
  uint64_t ws[3] = {1 + below(&w->rng, 5000), 1 + below(&w->rng, 300), 256};
  size_t nws = below(&w->rng, 4);
  uint32_t node = 0xabcdu;
  const gkrt_launch *lp = (l.params_size == 0 && chance(&w->rng, 50)) ? NULL : &l;
  unsigned ok_or_state = g->finalized ? S_STATE : S_OK;
  unsigned bad = g->finalized ? S_ARG | S_STATE : S_ARG; /* which check comes first is not said */

  if (c < 30) { /* one defect */
    int d = below(&w->rng, 13);
    gkrt_status st = GKRT_STATUS_OK;
    gkrt_tensor badid;
    switch (d) {
      case 0: st = CALL(w, gkrt_graph_add_kernel(NULL, k->h, in, n.nin, &out, 1, ws, nws, lp, &node), S_ARG); break;
      case 1:
        st = CALL(w, gkrt_graph_add_kernel(g->h, (gkrt_kernel *)bogus_handle(w), in, n.nin, &out, 1, ws, nws, lp, &node),
                  bad);
        break;
      case 2: /* a kernel of another runtime */ {
        int other = -1;
        for (int i = 0; i < w->nk; i++)
          if (w->k[i].live && w->k[i].rt != g->rt) other = i;
        if (other < 0) return;
        st = CALL(w, gkrt_graph_add_kernel(g->h, w->k[other].h, in, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      }
      case 3: /* an id of another graph, or made up */ {
        int og = pick_live_graph(w);
        badid = (og >= 0 && og != gi && w->g[og].nt) ? w->g[og].t[0].id : rnd(&w->rng);
        if (n.nin && chance(&w->rng, 50))
          in[0] = badid;
        else
          out = badid;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      }
      case 4:
        if (!n.nin) return;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, NULL, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      case 5: st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, NULL, 1, ws, nws, lp, &node), bad); break;
      case 6: st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, NULL, 1 + below(&w->rng, 4), lp, &node), bad); break;
      case 7: /* a zero launch dimension */ {
        gkrt_launch z = l;
        if (chance(&w->rng, 50))
          z.grid[below(&w->rng, 3)] = 0;
        else
          z.block[below(&w->rng, 3)] = 0;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, &z, &node), bad);
        break;
      }
      case 8: /* a workspace of 0 or past 2^48 bytes */ {
        uint64_t bw[2] = {256, chance(&w->rng, 50) ? 0 : (1ull << 48) + 1 + below(&w->rng, 1000)};
        if (chance(&w->rng, 30)) bw[1] = UINT64_MAX;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, bw, 2, lp, &node), bad);
        break;
      }
      case 9: /* params NULL with a size */ {
        gkrt_launch z = l;
        z.params = NULL;
        z.params_size = 4 + below(&w->rng, 64);
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, &z, &node), bad);
        break;
      }
      case 10: /* a built-in with a parameter blob of the wrong size */ {
        if (kind >= K_NEG) return;
        double wide = 1.0;
        gkrt_launch z = l;
        z.params = &wide;
        z.params_size = l.params_size == 4 ? 8 : l.params_size == 12 ? 8 : 4;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, &z, &node), bad);
        break;
      }
      case 11: /* a built-in with the wrong number of inputs or outputs */ {
        if (kind >= K_NEG) return;
        gkrt_tensor more[3];
        for (int j = 0; j < 3; j++) more[j] = n.nin ? in[j % n.nin] : out;
        if (chance(&w->rng, 50))
          st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, more, n.nin + 1, &out, 1, ws, nws, lp, &node), bad);
        else
          st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 0, ws, nws, lp, &node), bad);
        break;
      }
      case 12: /* a tensor of the wrong size, or an intermediate nobody wrote yet */ {
        int wrong = -1;
        for (int t = 0; t < g->nt; t++) {
          mtensor *x = &g->t[t];
          int unwritten = x->kind == GKRT_TENSOR_INTERMEDIATE && !x->produced;
          if (n.nin && (unwritten || (readable(x) && x->size != g->t[n.in[0]].size && kind != GKRT_BUILTIN_MATMUL)))
            wrong = t;
        }
        /* Callbacks take any sizes: for them only the unwritten intermediate is a defect. */
        if (wrong >= 0 && kind >= K_NEG && !(g->t[wrong].kind == GKRT_TENSOR_INTERMEDIATE && !g->t[wrong].produced))
          return;
        if (wrong < 0 || !n.nin) return;
        in[0] = g->t[wrong].id;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      }
    }
    (void)st;
    if (node != 0xabcdu) FAIL(w, "add_kernel wrote *node_out on failure");
    return;
  }
  /* A good node (refused as a whole once the graph is final). */
  if (g->nn >= MAXN - 8 && !g->finalized) return;
  gkrt_status st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, lp,
                                                  chance(&w->rng, 80) ? &node : NULL),
                        ok_or_state);
  if (st != GKRT_STATUS_OK) return;
  if (node != 0xabcdu && node != (uint32_t)g->nn) FAIL(w, "add_kernel gave node %u, expected %d", node, g->nn);
  n.kind = k->kind;
  g->n[g->nn++] = n;
  g->t[n.out].produced = 1;
  if (k->kind == K_FAIL) g->has_fail_node = 1;
}

static void op_recomputable(world *w) {
  w->op = "set_node_recomputable";
  int gi = pick_live_graph(w);
  if (gi < 0) {
    CALL(w, gkrt_graph_set_node_recomputable((gkrt_graph *)bogus_handle(w), 0, 1), S_ARG);
    return;
  }
  mgraph *g = &w->g[gi];
  uint32_t node = chance(&w->rng, 15) ? (uint32_t)g->nn + below(&w->rng, 3) * 1000 : below(&w->rng, g->nn + 1);
  if (chance(&w->rng, 5)) node = UINT32_MAX;
  int yes = chance(&w->rng, 70) ? 1 + (int)below(&w->rng, 5) : 0;
  unsigned want;
  if (g->finalized)
    want = node < (uint32_t)g->nn ? S_STATE : S_STATE | S_ARG;
  else if (node >= (uint32_t)g->nn)
    want = S_ARG;
  else {
    mnode *n = &g->n[node];
    int reads_own = 0;
    for (int j = 0; j < n->nin; j++) reads_own |= n->in[j] == n->out;
    want = (!yes || !reads_own) ? S_OK : S_ARG;
  }
  CALL(w, gkrt_graph_set_node_recomputable(g->h, node, yes), want);
}

static void op_finalize(world *w) {
  w->op = "finalize";
  int gi = pick_live_graph(w);
  if (gi < 0 || chance(&w->rng, 5)) {
    CALL(w, gkrt_graph_finalize(chance(&w->rng, 50) ? NULL : (gkrt_graph *)bogus_handle(w)), S_ARG);
    return;
  }
  mgraph *g = &w->g[gi];
  if (g->finalized) {
    CALL(w, gkrt_graph_finalize(g->h), S_STATE);
    return;
  }
  int unwritten_output = 0;
  for (int t = 0; t < g->nt; t++)
    if (g->t[t].kind == GKRT_TENSOR_OUTPUT && !g->t[t].produced) unwritten_output = 1;
  if (g->nn == 0) {
    /* The header says it fails; api_graph accepts either status for an empty graph. */
    CALL(w, gkrt_graph_finalize(g->h), S_ARG | S_STATE);
    return;
  }
  if (unwritten_output) {
    CALL(w, gkrt_graph_finalize(g->h), S_ARG);
    return;
  }
  /* A finalize may refuse a graph no budget can run (OUT_OF_MEMORY) only under a limit. */
  gkrt_status st = CALL(w, gkrt_graph_finalize(g->h), w->rt[g->rt].tight ? S_OK | S_OOM : S_OK);
  g->finalized = st == GKRT_STATUS_OK;
}

static void op_get_info(world *w) {
  w->op = "get_info";
  int gi = pick_live_graph(w);
  gkrt_graph_info info;
  memset(&info, 0xAB, sizeof info);
  if (gi < 0 || chance(&w->rng, 10)) {
    CALL(w, gkrt_graph_get_info((gkrt_graph *)bogus_handle(w), &info), S_ARG);
    if (info.num_nodes != 0xABABABABABABABABull) FAIL(w, "get_info wrote *out on failure");
    return;
  }
  mgraph *g = &w->g[gi];
  if (chance(&w->rng, 10)) {
    CALL(w, gkrt_graph_get_info(g->h, NULL), S_ARG);
    return;
  }
  if (CALL(w, gkrt_graph_get_info(g->h, &info), S_OK) != GKRT_STATUS_OK) return;
  if (info.num_tensors != (uint64_t)g->nt || info.num_nodes != (uint64_t)g->nn || info.finalized != (uint32_t)g->finalized)
    FAIL(w, "get_info: %llu tensors, %llu nodes, finalized %u; the model has %d, %d, %d",
         (unsigned long long)info.num_tensors, (unsigned long long)info.num_nodes, info.finalized, g->nt, g->nn,
         g->finalized);
  if (g->finalized && info.peak_node >= (uint32_t)g->nn) FAIL(w, "get_info: peak_node %u of %d nodes", info.peak_node, g->nn);
}

static void random_floats(world *w, mtensor *t) {
  if (t->size % 4) {
    for (uint64_t i = 0; i < t->size; i++) t->val[i] = (unsigned char)rnd(&w->rng);
  } else {
    fill_floats((float *)t->val, t->size / 4, (uint32_t)rnd(&w->rng));
  }
}

static void op_write(world *w) {
  w->op = "write_tensor";
  int gi = pick_live_graph(w);
  if (gi < 0 || w->g[gi].nt == 0) return;
  mgraph *g = &w->g[gi];
  int ti = below(&w->rng, g->nt);
  for (int tries = 0; tries < 6 && chance(&w->rng, 70); tries++) {
    mtensor *x = &g->t[ti];
    if ((x->kind == GKRT_TENSOR_INPUT || x->kind == GKRT_TENSOR_PARAMETER) && x->has != 1) break;
    ti = below(&w->rng, g->nt);
  }
  mtensor *t = &g->t[ti];
  unsigned char *buf = malloc(t->size + 512);
  memcpy(buf, t->val, t->size);
  int c = below(&w->rng, 12);
  if (c == 0) {
    static const size_t off[] = {1, 4, 256};
    size_t size = chance(&w->rng, 50) ? t->size + off[below(&w->rng, 3)] : t->size - 1;
    if (chance(&w->rng, 20)) size = SIZE_MAX - below(&w->rng, 2);
    gkrt_status st = CALL(w, gkrt_graph_write_tensor(g->h, t->id, buf, size), S_ARG);
    if (st == GKRT_STATUS_INVALID_ARGUMENT && t->name[0] && !strstr(error_text(), t->name))
      FAIL(w, "write of %zu bytes to %s: message \"%s\" does not name it", size, t->name, error_text());
  } else if (c == 1) {
    CALL(w, gkrt_graph_write_tensor(g->h, t->id, NULL, t->size), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_write_tensor((gkrt_graph *)bogus_handle(w), t->id, buf, t->size), S_ARG);
  } else if (c == 3) {
    int og = pick_live_graph(w);
    if (og >= 0 && og != gi) CALL(w, gkrt_graph_write_tensor(w->g[og].h, t->id, buf, t->size), S_ARG);
  } else if (t->kind == GKRT_TENSOR_INTERMEDIATE) {
    CALL(w, gkrt_graph_write_tensor(g->h, t->id, buf, t->size), S_ARG);
  } else {
    mtensor scratch = *t;
    scratch.val = buf;
    random_floats(w, &scratch);
    gkrt_status st = CALL(w, gkrt_graph_write_tensor(g->h, t->id, buf, t->size), w->rt[g->rt].tight ? S_OK | S_OOM : S_OK);
    if (st == GKRT_STATUS_OK) {
      memcpy(t->val, buf, t->size);
      t->has = 1;
      t->known = 1;
      /* Copied at the call: scribbling on the buffer now changes nothing. */
      memset(buf, 0xEE, t->size);
    }
  }
  free(buf);
}

static void op_read(world *w) {
  w->op = "read_tensor";
  int gi = pick_live_graph(w);
  if (gi < 0 || w->g[gi].nt == 0) return;
  mgraph *g = &w->g[gi];
  mtensor *t = &g->t[below(&w->rng, g->nt)];
  size_t cap = t->size + 16;
  unsigned char *buf = malloc(cap);
  memset(buf, 0xC3, cap);
  int c = below(&w->rng, 10);
  int untouched = 1;
  if (c == 0) {
    size_t size = chance(&w->rng, 50) ? t->size + 1 + below(&w->rng, 16) : t->size - 1;
    if (chance(&w->rng, 20)) size = SIZE_MAX;
    CALL(w, gkrt_graph_read_tensor(g->h, t->id, buf, size), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_graph_read_tensor(g->h, t->id, NULL, t->size), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_read_tensor((gkrt_graph *)bogus_handle(w), t->id, buf, t->size), S_ARG);
  } else if (t->kind == GKRT_TENSOR_INTERMEDIATE) {
    CALL(w, gkrt_graph_read_tensor(g->h, t->id, buf, t->size), S_ARG);
  } else {
    unsigned want = t->has == 1 ? S_OK : t->has == 2 ? S_OK | S_STATE : S_STATE;
    gkrt_status st = CALL(w, gkrt_graph_read_tensor(g->h, t->id, buf, t->size), want);
    if (st == GKRT_STATUS_INVALID_STATE) t->has = 0;
    if (st == GKRT_STATUS_OK) {
      untouched = 0;
      t->has = 1;
      if (t->known) {
        w->reads_checked++;
        if (memcmp(buf, t->val, t->size) != 0) {
          size_t i = 0;
          while (buf[i] == t->val[i]) i++;
          FAIL(w, "read of %s (%llu bytes, kind %u): byte %zu is 0x%02x, the model says 0x%02x", t->name[0] ? t->name : "(unnamed)",
               (unsigned long long)t->size, t->kind, i, buf[i], t->val[i]);
        }
      } else {
        memcpy(t->val, buf, t->size); /* from now on the model knows these bytes */
        t->known = 1;
      }
    }
  }
  for (size_t i = untouched ? 0 : t->size; i < cap; i++)
    if (buf[i] != 0xC3) {
      FAIL(w, "read_tensor wrote byte %zu of the caller's buffer (%s)", i, untouched ? "on failure" : "past the tensor");
      break;
    }
  free(buf);
}

/* Which status a run of graph gi must give. */
static unsigned run_expectation(world *w, mgraph *g) {
  if (!g->finalized) return S_STATE;
  unsigned want = S_OK;
  /* Inputs and parameters whose first use reads them need contents. */
  int missing = 0, maybe = 0;
  for (int t = 0; t < g->nt; t++) {
    mtensor *x = &g->t[t];
    if (x->kind != GKRT_TENSOR_INPUT && x->kind != GKRT_TENSOR_PARAMETER) continue;
    for (int i = 0; i < g->nn; i++) {
      mnode *n = &g->n[i];
      int reads = 0;
      for (int j = 0; j < n->nin; j++) reads |= n->in[j] == t;
      if (reads) {
        missing |= x->has == 0;
        maybe |= x->has == 2;
        break;
      }
      if (n->out == t) break;
    }
  }
  if (missing) return S_STATE | S_ARG; /* the header does not say which; api_tensor_io takes both */
  if (maybe) want |= S_STATE | S_ARG;
  if (w->rt[g->rt].tight) want |= S_OOM;
  if (g->has_fail_node) want = (want & ~S_OK) | S_CB;
  return want;
}

static void op_run(world *w) {
  w->op = "run";
  int gi = pick_live_graph(w);
  if (gi < 0) return;
  for (int tries = 0; tries < 4 && !w->g[gi].finalized && chance(&w->rng, 80); tries++) gi = pick_live_graph(w);
  mgraph *g = &w->g[gi];
  int c = below(&w->rng, 12);
  if (c == 0) {
    CALL(w, gkrt_runtime_run((gkrt_runtime *)bogus_handle(w), g->h), S_ARG);
    return;
  }
  if (c == 1) {
    int ri = pick_live_rt(w);
    if (ri >= 0) CALL(w, gkrt_runtime_run(w->rt[ri].h, chance(&w->rng, 50) ? NULL : (gkrt_graph *)bogus_handle(w)), S_ARG);
    return;
  }
  if (c == 2) { /* another runtime's handle */
    for (int ri = 0; ri < w->nrt; ri++)
      if (ri != g->rt && w->rt[ri].handle_live) {
        CALL(w, gkrt_runtime_run(w->rt[ri].h, g->h), g->finalized ? S_ARG : S_ARG | S_STATE);
        return;
      }
    return;
  }
  mrt *r = &w->rt[g->rt];
  if (!r->handle_live) return; /* its runtime lives on, but no handle names it any more */
  unsigned want = run_expectation(w, g);
  gkrt_status st = CALL(w, gkrt_runtime_run(r->h, g->h), want);
  if (st == GKRT_STATUS_OK) {
    w->runs_ok++;
    model_run(g);
  } else if (st == GKRT_STATUS_OUT_OF_MEMORY || st == GKRT_STATUS_CALLBACK_FAILED) {
    w->runs_oom += st == GKRT_STATUS_OUT_OF_MEMORY;
    model_failed_run(g);
  } else if (g->finalized && (st == GKRT_STATUS_INVALID_STATE || st == GKRT_STATUS_INVALID_ARGUMENT)) {
    /* Refused for a missing input: nothing ran. A "maybe" tensor turned out to be empty. */
  }
  check_stats(w, g->rt);
}

static void op_raw(world *w) {
  w->op = "malloc_free";
  int ri = pick_live_rt(w);
  if (ri < 0) return;
  mrt *r = &w->rt[ri];
  void *p = SENT_PTR;
  int c = below(&w->rng, 12);
  if (c == 0) {
    CALL(w, gkrt_malloc(r->h, 0, NULL, &p), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_malloc(r->h, SIZE_MAX - below(&w->rng, 300), NULL, &p), S_OOM | S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_malloc(r->h, 64, NULL, NULL), S_ARG);
  } else if (c == 3) {
    CALL(w, gkrt_malloc((gkrt_runtime *)bogus_handle(w), 64, NULL, &p), S_ARG);
  } else if (c == 4) {
    CALL(w, gkrt_malloc(r->h, 64, (void *)(uintptr_t)(rnd(&w->rng) | 1), &p), S_ARG); /* a stream host code cannot name */
  } else if (c == 5) {
    CALL(w, gkrt_free(r->h, (void *)(uintptr_t)(rnd(&w->rng) | 1), NULL), S_ARG);
  } else if (c == 6) {
    CALL(w, gkrt_free(r->h, NULL, NULL), S_OK);
  }
  if (c <= 6) {
    if (p != SENT_PTR) FAIL(w, "gkrt_malloc wrote *out on failure");
    return;
  }
  if (r->shared) return; /* raw blocks on the shared runtime would make its statistics unpredictable */
  if ((c < 10 && r->nraw < MAXRAW) || r->nraw == 0) {
    size_t size = 1 + below(&w->rng, chance(&w->rng, 20) ? 3u << 20 : 5000);
    gkrt_status st = CALL(w, gkrt_malloc(r->h, size, NULL, &p), r->tight ? S_OK | S_OOM : S_OK);
    if (st == GKRT_STATUS_OK) {
      if (p == SENT_PTR || p == NULL || ((uintptr_t)p & 255) != 0) FAIL(w, "gkrt_malloc gave %p", p);
      r->raw[r->nraw] = p;
      r->raw_size[r->nraw++] = size;
    } else if (p != SENT_PTR) {
      FAIL(w, "gkrt_malloc wrote *out on failure");
    }
  } else {
    int i = below(&w->rng, r->nraw);
    void *q = r->raw[i];
    if (CALL(w, gkrt_free(r->h, q, NULL), S_OK) != GKRT_STATUS_OK) return;
    r->raw[i] = r->raw[--r->nraw];
    r->raw_size[i] = r->raw_size[r->nraw];
    CALL(w, gkrt_free(r->h, q, NULL), S_ARG); /* freed twice */
  }
  check_stats(w, ri);
}

static void op_misc(world *w) {
  w->op = "runtime_misc";
  int ri = pick_live_rt(w);
  gkrt_runtime *h = ri >= 0 ? w->rt[ri].h : NULL;
  gkrt_stats s;
  memset(&s, 0xAB, sizeof s);
  uint64_t released = SENT_U64;
  gkrt_device_kind kind = 77;
  switch (below(&w->rng, 12)) {
    case 0: CALL(w, gkrt_runtime_synchronize(h), h ? S_OK : S_ARG); break;
    case 1: CALL(w, gkrt_runtime_synchronize((gkrt_runtime *)bogus_handle(w)), S_ARG); break;
    case 2:
      CALL(w, gkrt_runtime_stats((gkrt_runtime *)bogus_handle(w), &s), S_ARG);
      if (s.allocated_bytes != 0xABABABABABABABABull) FAIL(w, "runtime_stats wrote *out on failure");
      break;
    case 3: if (h) CALL(w, gkrt_runtime_stats(h, NULL), S_ARG); break;
    case 4: CALL(w, gkrt_runtime_reset_peak_stats(h), h ? S_OK : S_ARG); break;
    case 5:
      CALL(w, gkrt_runtime_release_cached(h, chance(&w->rng, 50) ? &released : NULL), h ? S_OK : S_ARG);
      break;
    case 6:
      CALL(w, gkrt_runtime_device((gkrt_runtime *)bogus_handle(w), &kind), S_ARG);
      if (kind != 77) FAIL(w, "runtime_device wrote *out on failure");
      break;
    case 7: if (h) CALL(w, gkrt_runtime_device(h, NULL), S_ARG); break;
    case 8: CALL(w, gkrt_config_init(NULL), S_ARG); break;
    case 9: {
      int32_t v = (int32_t)rnd(&w->rng);
      const char *name = gkrt_status_name(v);
      w->call++;
      if (!name || ((v < 0 || v > 9) && strcmp(name, "GKRT_STATUS_UNKNOWN") != 0)) FAIL(w, "status_name(%d)", v);
      break;
    }
    case 10: { /* a graph handle where a runtime goes, and the reverse */
      int gi = pick_live_graph(w);
      if (gi >= 0) CALL(w, gkrt_runtime_stats((gkrt_runtime *)w->g[gi].h, &s), S_ARG);
      if (h) CALL(w, gkrt_graph_finalize((gkrt_graph *)h), S_ARG);
      break;
    }
    default: if (ri >= 0) check_stats(w, ri); break;
  }
}

/* The graph every thread of a shared-runtime seed runs: same inputs, so always the same output. */
static void op_shared_graph(world *w) {
  w->op = "shared_graph";
  if (!shared_graph.g) return;
  int shared = -1;
  for (int i = 0; i < w->nrt; i++)
    if (w->rt[i].shared) shared = i;
  if (shared < 0) return;
  CALL(w, gkrt_runtime_run(w->rt[shared].h, shared_graph.g), S_OK);
  float y[64];
  memset(y, 0, sizeof y);
  if (CALL(w, gkrt_graph_read_tensor(shared_graph.g, shared_graph.y, y, sizeof y), S_OK) == GKRT_STATUS_OK &&
      memcmp(y, shared_graph.want, sizeof y) != 0)
    FAIL(w, "the shared graph's output differs from its reference");
}

/* The happy path, so that runs and bit-exact reads are many: complete a graph (a fill for
 * every output nobody writes), finalize it, write every input and parameter without contents,
 * run, and read back every persistent tensor. */
static void op_cycle(world *w) {
  w->op = "write_run_read";
  int gi = pick_live_graph(w);
  for (int tries = 0; tries < 4 && gi >= 0 && w->g[gi].nn == 0; tries++) gi = pick_live_graph(w);
  if (gi < 0) return;
  mgraph *g = &w->g[gi];
  mrt *r = &w->rt[g->rt];
  if (!g->finalized) {
    int fk = pick_live_kernel(w, g->rt, GKRT_BUILTIN_FILL);
    for (int t = 0; t < g->nt && !w->failed; t++) {
      mtensor *x = &g->t[t];
      if (x->kind != GKRT_TENSOR_OUTPUT || x->produced) continue;
      if (fk < 0 || g->nn >= MAXN) return;
      mnode n = {GKRT_BUILTIN_FILL, 0, {0, 0}, t, (float)t - 2.5f, {0, 0, 0}};
      gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &n.param, 4};
      if (CALL(w, gkrt_graph_add_kernel(g->h, w->k[fk].h, NULL, 0, &x->id, 1, NULL, 0, &l, NULL), S_OK) != GKRT_STATUS_OK)
        return;
      g->n[g->nn++] = n;
      x->produced = 1;
    }
    if (g->nn == 0) return;
    gkrt_status st = CALL(w, gkrt_graph_finalize(g->h), r->tight ? S_OK | S_OOM : S_OK);
    if (st != GKRT_STATUS_OK) return;
    g->finalized = 1;
  }
  for (int t = 0; t < g->nt && !w->failed; t++) {
    mtensor *x = &g->t[t];
    if ((x->kind != GKRT_TENSOR_INPUT && x->kind != GKRT_TENSOR_PARAMETER) || x->has == 1) continue;
    unsigned char *buf = malloc(x->size);
    mtensor scratch = *x;
    scratch.val = buf;
    random_floats(w, &scratch);
    if (CALL(w, gkrt_graph_write_tensor(g->h, x->id, buf, x->size), r->tight ? S_OK | S_OOM : S_OK) == GKRT_STATUS_OK) {
      memcpy(x->val, buf, x->size);
      x->has = x->known = 1;
    }
    free(buf);
  }
  if (!r->handle_live || w->failed) return;
  gkrt_status st = CALL(w, gkrt_runtime_run(r->h, g->h), run_expectation(w, g));
  if (st == GKRT_STATUS_OK) {
    w->runs_ok++;
    model_run(g);
  } else if (st == GKRT_STATUS_OUT_OF_MEMORY || st == GKRT_STATUS_CALLBACK_FAILED) {
    w->runs_oom += st == GKRT_STATUS_OUT_OF_MEMORY;
    model_failed_run(g);
  }
  check_stats(w, g->rt);
  for (int t = 0; t < g->nt && !w->failed; t++) {
    mtensor *x = &g->t[t];
    if (x->kind == GKRT_TENSOR_INTERMEDIATE || x->has == 0) continue;
    unsigned char *buf = malloc(x->size);
    gkrt_status rs = CALL(w, gkrt_graph_read_tensor(g->h, x->id, buf, x->size), x->has == 1 ? S_OK : S_OK | S_STATE);
    if (rs == GKRT_STATUS_OK) {
      x->has = 1;
      if (x->known) {
        w->reads_checked++;
        if (memcmp(buf, x->val, x->size) != 0) {
          size_t i = 0;
          while (buf[i] == x->val[i]) i++;
          FAIL(w, "read of %s (%llu bytes, kind %u) after a run: byte %zu is 0x%02x, the model says 0x%02x",
               x->name[0] ? x->name : "(unnamed)", (unsigned long long)x->size, x->kind, i, buf[i], x->val[i]);
        }
      } else {
        memcpy(x->val, buf, x->size);
        x->known = 1;
      }
    } else {
      x->has = 0;
    }
    free(buf);
  }
}

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
