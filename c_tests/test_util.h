/*
 * More helpers for the C tests, on top of common.h: message checks, deterministic test data,
 * building single nodes, memory statistics, and a "the runtime still works" probe to run after
 * every failure.
 */
#ifndef GKRT_TEST_UTIL_H
#define GKRT_TEST_UTIL_H

#include "common.h"

#include <inttypes.h>

/* Marks common.h's helpers used, so a test that needs none of them compiles without warnings. */
static inline void test_util_uses_(void) {
  (void)test_on_host;
  (void)test_runtime;
}

/* The last error message must also contain `needle` (checked after a FAILS). */
#define MSG_HAS(needle)                                                                              \
  do {                                                                                               \
    if (strstr(last_error(), (needle)) == NULL) {                                                    \
      fprintf(stderr, "%s:%d: message \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__,         \
              last_error(), (const char *)(needle));                                                 \
      test_failures++;                                                                               \
    }                                                                                                \
  } while (0)

/* True when `msg` mentions the number `v`, in decimal or in hex (0x...). */
static inline int mentions_u64(const char *msg, uint64_t v) {
  char dec[32], hex[32], hexu[32];
  snprintf(dec, sizeof dec, "%" PRIu64, v);
  snprintf(hex, sizeof hex, "0x%" PRIx64, v);
  snprintf(hexu, sizeof hexu, "0x%" PRIX64, v);
  const char *p = msg;
  /* A decimal match must not be part of a longer number ("10" inside "1024" does not count). */
  while ((p = strstr(p, dec)) != NULL) {
    int before = p > msg && p[-1] >= '0' && p[-1] <= '9';
    char after = p[strlen(dec)];
    if (!before && !(after >= '0' && after <= '9')) return 1;
    p++;
  }
  return strstr(msg, hex) != NULL || strstr(msg, hexu) != NULL;
}

/* The last error message must mention the number `v` (a size, an id, a node index). */
#define MSG_HAS_U64(v)                                                                               \
  do {                                                                                               \
    uint64_t v_ = (uint64_t)(v);                                                                     \
    if (!mentions_u64(last_error(), v_)) {                                                           \
      fprintf(stderr, "%s:%d: message \"%s\" does not mention %" PRIu64 " (%s)\n", __FILE__,         \
              __LINE__, last_error(), v_, #v);                                                       \
      test_failures++;                                                                               \
    }                                                                                                \
  } while (0)

/* The last error message must say "node N". */
#define MSG_HAS_NODE(n)                                                                              \
  do {                                                                                               \
    char node_needle_[32];                                                                           \
    snprintf(node_needle_, sizeof node_needle_, "node %u", (unsigned)(n));                           \
    MSG_HAS(node_needle_);                                                                           \
  } while (0)

#define CHECK_EQ_STR(a, b)                                                                           \
  do {                                                                                               \
    const char *sa_ = (a), *sb_ = (b);                                                               \
    if (sa_ == NULL || sb_ == NULL || strcmp(sa_, sb_) != 0) {                                       \
      fprintf(stderr, "%s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a,              \
              sa_ ? sa_ : "(null)", sb_ ? sb_ : "(null)");                                           \
      test_failures++;                                                                               \
    }                                                                                                \
  } while (0)

/* Bit-exact comparison of two float arrays; reports the first difference. */
#define CHECK_BITS(got, want, n) check_bits_((got), (want), (n), __FILE__, __LINE__, #got)
static inline void check_bits_(const float *got, const float *want, size_t n, const char *file, int line,
                        const char *what) {
  for (size_t i = 0; i < n; i++) {
    if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      uint32_t g, w;
      memcpy(&g, &got[i], 4);
      memcpy(&w, &want[i], 4);
      fprintf(stderr, "%s:%d: %s[%zu] = %.9g (0x%08x), expected %.9g (0x%08x) (%zu elements)\n", file,
              line, what, i, got[i], g, want[i], w, n);
      test_failures++;
      return;
    }
  }
}

/* Deterministic pseudo-random numbers. */
static inline uint32_t rng_next(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

/* Floats in [-4, 4) with every awkward value mixed in: +0.0, -0.0, small subnormals, exact
 * integers and values whose sums round. Never NaN or infinity (a NaN's payload may differ). */
static inline void fill_floats(float *v, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 0x9e3779b9u;
  if (s == 0) s = 1;
  for (size_t i = 0; i < n; i++) {
    uint32_t r = rng_next(&s);
    switch (r % 16) {
      case 0: v[i] = 0.0f; break;
      case 1: v[i] = -0.0f; break;
      case 2: {
        uint32_t bits = (rng_next(&s) & 0x007fffffu) | (r & 0x80000000u); /* a subnormal */
        memcpy(&v[i], &bits, 4);
        break;
      }
      case 3: v[i] = (float)((int)(rng_next(&s) % 9) - 4); break;
      default: v[i] = (float)(rng_next(&s) >> 8) / 2097152.0f - 4.0f; break;
    }
  }
}

static inline void fill_bytes(void *p, size_t n, uint32_t seed) {
  uint32_t s = seed * 747796405u + 2891336453u;
  if (s == 0) s = 1;
  for (size_t i = 0; i < n; i++) ((unsigned char *)p)[i] = (unsigned char)(rng_next(&s) >> 11);
}

static inline float *alloc_floats(size_t n) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) {
    fprintf(stderr, "out of host memory\n");
    exit(1);
  }
  return p;
}

/* A runtime on `device` (GKRT_DEVICE_AUTO lets GKRT_DEVICE choose) with these limits (0: none),
 * memory mode and log level. */
static inline gkrt_runtime *runtime_with(gkrt_device_kind device, gkrt_memory_mode mode, uint64_t memory_limit,
                                         uint64_t host_memory_limit, uint32_t log_level) {
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.device = device;
  cfg.memory_mode = mode;
  cfg.memory_limit = memory_limit;
  cfg.host_memory_limit = host_memory_limit;
  cfg.log_level = log_level;
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(&cfg, &rt));
  return rt;
}

static inline gkrt_kernel *builtin_kernel(gkrt_runtime *rt, gkrt_builtin b) {
  gkrt_kernel *k = NULL;
  OK(gkrt_kernel_builtin(rt, b, &k));
  return k;
}

/* A node with one output and optional parameters (NULL launch when there are none). */
static inline gkrt_status add_node(gkrt_graph *g, const gkrt_kernel *k, const gkrt_tensor *in, size_t nin,
                            gkrt_tensor out, const void *params, size_t params_size) {
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, params, params_size};
  return gkrt_graph_add_kernel(g, k, in, nin, &out, 1, NULL, 0, params_size ? &launch : NULL, NULL);
}

static inline gkrt_tensor add_tensor(gkrt_graph *g, uint64_t size, gkrt_tensor_kind kind, const char *name) {
  gkrt_tensor t = 0;
  OK(gkrt_graph_add_tensor(g, size, kind, name, &t));
  return t;
}

static inline gkrt_stats stats_of(gkrt_runtime *rt) {
  gkrt_stats s;
  OK(gkrt_runtime_stats(rt, &s));
  return s;
}

static inline uint64_t allocated_bytes(gkrt_runtime *rt) { return stats_of(rt).allocated_bytes; }

static inline gkrt_graph_info info_of(gkrt_graph *g) {
  gkrt_graph_info i;
  OK(gkrt_graph_get_info(g, &i));
  return i;
}

/*
 * Proves a runtime still works: builds a fresh graph (input x, fill, add, relu, scale, with an
 * intermediate freed mid-run), runs it twice with different inputs and checks the outputs
 * bit-exact, and checks the runtime's allocated bytes are back where they were once the graph
 * is released. Use after every failure: CHECK_RUNTIME_WORKS(rt).
 */
#define CHECK_RUNTIME_WORKS(rt) check_runtime_works_((rt), __FILE__, __LINE__)
static inline void check_runtime_works_(gkrt_runtime *rt, const char *file, int line) {
  enum { N = 300 };
  int before_failures = test_failures;
  uint64_t allocated_before = allocated_bytes(rt);
  gkrt_kernel *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL), *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, N * 4, GKRT_TENSOR_INPUT, "probe_x");
  gkrt_tensor c = add_tensor(g, N * 4, GKRT_TENSOR_INTERMEDIATE, "probe_c");
  gkrt_tensor s = add_tensor(g, N * 4, GKRT_TENSOR_INTERMEDIATE, "probe_s");
  gkrt_tensor r = add_tensor(g, N * 4, GKRT_TENSOR_INTERMEDIATE, "probe_r");
  gkrt_tensor y = add_tensor(g, N * 4, GKRT_TENSOR_OUTPUT, "probe_y");
  const float c_val = 0.75f, alpha = -2.5f;
  OK(add_node(g, fill, NULL, 0, c, &c_val, sizeof c_val));
  gkrt_tensor xs[2] = {x, c};
  OK(add_node(g, add, xs, 2, s, NULL, 0));
  OK(add_node(g, relu, &s, 1, r, NULL, 0));
  OK(add_node(g, scale, &r, 1, y, &alpha, sizeof alpha));
  OK(gkrt_graph_finalize(g));
  float in[N], out[N], want[N];
  for (int round = 0; round < 2; round++) {
    fill_floats(in, N, 1000 + round);
    OK(gkrt_graph_write_tensor(g, x, in, sizeof in));
    OK(gkrt_runtime_run(rt, g));
    OK(gkrt_graph_read_tensor(g, y, out, sizeof out));
    for (int i = 0; i < N; i++) {
      float sum = in[i] + c_val;
      float rl = sum > 0.0f ? sum : 0.0f;
      want[i] = alpha * rl;
    }
    check_bits_(out, want, N, file, line, "runtime probe output");
  }
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(fill));
  OK(gkrt_kernel_release(add));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(scale));
  uint64_t allocated_after = allocated_bytes(rt);
  if (allocated_after != allocated_before) {
    fprintf(stderr, "%s:%d: runtime probe: allocated bytes %llu after, %llu before\n", file, line,
            (unsigned long long)allocated_after, (unsigned long long)allocated_before);
    test_failures++;
  }
  if (test_failures != before_failures)
    fprintf(stderr, "%s:%d: the runtime no longer works correctly\n", file, line);
}

#endif
