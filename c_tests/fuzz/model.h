/*
 * fuzz_api, the model of every object, the oracle that checks answers against it, and its arithmetic.
 * A part of fuzz_api.c's one translation unit, included by it in order (each part uses what
 * the parts before it define); c_tests/CMakeLists.txt makes a test only of each .c file directly in c_tests.
 */

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
