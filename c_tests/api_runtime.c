/*
 * api_runtime: configuration defaults, runtime creation (NULL config, NULL out, every bad
 * field, bad environment overrides, a missing device), gkrt_runtime_device, stats,
 * reset_peak_stats, synchronize, and release (NULL, twice, a handle of another kind, made-up
 * pointers). After every failure the runtime still runs a graph correctly.
 */
#define _GNU_SOURCE
#include "test_util.h"

/* Creates a runtime from `cfg` expecting `status` and a message naming `needle`; on failure
 * the out-parameter must be left untouched. */
#define CREATE_FAILS(cfg, status, needle)                                                            \
  do {                                                                                               \
    gkrt_runtime *sentinel_ = (gkrt_runtime *)(uintptr_t)0x5e47;                                     \
    gkrt_runtime *out_ = sentinel_;                                                                  \
    FAILS(gkrt_runtime_create((cfg), &out_), (status), (needle));                                    \
    CHECK(out_ == sentinel_);                                                                        \
  } while (0)

static char *saved_env(const char *name) {
  const char *v = getenv(name);
  return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *value) {
  if (value) {
    setenv(name, value, 1);
    free(value);
  } else {
    unsetenv(name);
  }
}

int main(void) {
  /* --- gkrt_config_init: every field written with its documented default. --- */
  gkrt_config cfg;
  memset(&cfg, 0xAB, sizeof cfg);
  OK(gkrt_config_init(&cfg));
  CHECK_EQ_U64(cfg.device, GKRT_DEVICE_AUTO);
  CHECK_EQ_U64(cfg.device_ordinal, 0);
  CHECK_EQ_U64(cfg.memory_limit, 0);
  CHECK_EQ_U64(cfg.memory_mode, GKRT_MEMORY_DYNAMIC);
  CHECK_EQ_U64(cfg.log_level, 2);
  CHECK_EQ_U64(cfg.host_jitter_us, 0);
  CHECK_EQ_U64(cfg.pool_growth, GKRT_POOL_GROWTH_AUTO);
  CHECK(cfg.seed != 0xABABABABABABABABull); /* written too */
  FAILS(gkrt_config_init(NULL), GKRT_STATUS_INVALID_ARGUMENT, "config");

  const char *env_device = getenv("GKRT_DEVICE");
  int want_cuda = env_device && (strcmp(env_device, "cuda") == 0 || strcmp(env_device, "gpu") == 0);
  int want_host = env_device && (strcmp(env_device, "host") == 0 || strcmp(env_device, "cpu") == 0);

  /* --- gkrt_runtime_create with NULL config: the defaults (device AUTO, overridable). --- */
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(NULL, &rt));
  CHECK(rt != NULL);
  gkrt_device_kind kind = 12345;
  OK(gkrt_runtime_device(rt, &kind));
  CHECK(kind == GKRT_DEVICE_HOST || kind == GKRT_DEVICE_CUDA);
  if (want_cuda) CHECK_EQ_U64(kind, GKRT_DEVICE_CUDA);
  if (want_host) CHECK_EQ_U64(kind, GKRT_DEVICE_HOST);
  gkrt_stats st = stats_of(rt);
  CHECK_EQ_U64(st.allocated_bytes, 0);
  CHECK_EQ_U64(st.requested_bytes, 0);
  CHECK_EQ_U64(st.runs, 0);
  CHECK_EQ_U64(st.nodes_launched, 0);
  CHECK_EQ_U64(st.alloc_count, 0);
  CHECK_EQ_U64(st.failed_alloc_count, 0);
  CHECK(st.memory_limit > 0);
  if (kind == GKRT_DEVICE_HOST) CHECK_EQ_U64(st.memory_limit, 16ull << 30); /* documented default */
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));

  /* --- NULL out. --- */
  OK(gkrt_config_init(&cfg));
  FAILS(gkrt_runtime_create(&cfg, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_runtime_create(NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");

  /* --- Every malformed field: INVALID_ARGUMENT naming the field and the value. --- */
  OK(gkrt_config_init(&cfg));
  cfg.device = 7;
  CREATE_FAILS(&cfg, GKRT_STATUS_INVALID_ARGUMENT, "device");
  MSG_HAS_U64(7);
  OK(gkrt_config_init(&cfg));
  cfg.device = 0xFFFFFFFFu;
  CREATE_FAILS(&cfg, GKRT_STATUS_INVALID_ARGUMENT, "device");
  OK(gkrt_config_init(&cfg));
  cfg.memory_mode = 5;
  CREATE_FAILS(&cfg, GKRT_STATUS_INVALID_ARGUMENT, "memory_mode");
  MSG_HAS_U64(5);
  OK(gkrt_config_init(&cfg));
  cfg.log_level = 6;
  CREATE_FAILS(&cfg, GKRT_STATUS_INVALID_ARGUMENT, "log_level");
  MSG_HAS_U64(6);
  OK(gkrt_config_init(&cfg));
  cfg.pool_growth = 7;
  CREATE_FAILS(&cfg, GKRT_STATUS_INVALID_ARGUMENT, "pool_growth");
  MSG_HAS_U64(7);
  /* Each way of growing makes a working runtime (on the host backend both are segments). */
  for (gkrt_pool_growth g = GKRT_POOL_GROWTH_AUTO; g <= GKRT_POOL_GROWTH_VIRTUAL; g++) {
    OK(gkrt_config_init(&cfg));
    cfg.pool_growth = g;
    gkrt_runtime *grown = NULL;
    OK(gkrt_runtime_create(&cfg, &grown));
    void *p = NULL;
    OK(gkrt_malloc(grown, 3 << 20, NULL, &p));
    CHECK(p != NULL);
    OK(gkrt_free(grown, p, NULL));
    OK(gkrt_runtime_release(grown));
  }

  /* --- Bad environment overrides: INVALID_ARGUMENT naming the variable. --- */
  char *old_device = saved_env("GKRT_DEVICE");
  setenv("GKRT_DEVICE", "banana", 1);
  CREATE_FAILS(NULL, GKRT_STATUS_INVALID_ARGUMENT, "GKRT_DEVICE");
  MSG_HAS("banana");
  restore_env("GKRT_DEVICE", old_device);
  char *old_jitter = saved_env("GKRT_HOST_JITTER_US");
  setenv("GKRT_HOST_JITTER_US", "lots", 1);
  CREATE_FAILS(NULL, GKRT_STATUS_INVALID_ARGUMENT, "GKRT_HOST_JITTER_US");
  restore_env("GKRT_HOST_JITTER_US", old_jitter);

  /* --- A CUDA device that does not exist: NO_DEVICE, on any machine. GKRT_DEVICE would
   * override the config's device, so it is cleared for this call. --- */
  old_device = saved_env("GKRT_DEVICE");
  unsetenv("GKRT_DEVICE");
  OK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_CUDA;
  cfg.device_ordinal = 999;
  CREATE_FAILS(&cfg, GKRT_STATUS_NO_DEVICE, "CUDA");
  /* AUTO falls back to the host backend rather than failing, whatever the ordinal. */
  cfg.device = GKRT_DEVICE_AUTO;
  cfg.log_level = 0;
  gkrt_runtime *auto_rt = NULL;
  OK(gkrt_runtime_create(&cfg, &auto_rt));
  OK(gkrt_runtime_device(auto_rt, &kind));
  CHECK_EQ_U64(kind, GKRT_DEVICE_HOST);
  CHECK_RUNTIME_WORKS(auto_rt);
  OK(gkrt_runtime_release(auto_rt));
  /* An explicit host runtime is a host runtime. */
  OK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_HOST;
  gkrt_runtime *host_rt = NULL;
  OK(gkrt_runtime_create(&cfg, &host_rt));
  OK(gkrt_runtime_device(host_rt, &kind));
  CHECK_EQ_U64(kind, GKRT_DEVICE_HOST);
  OK(gkrt_runtime_release(host_rt));
  restore_env("GKRT_DEVICE", old_device);

  /* --- Valid non-default settings are accepted: planned mode, log level 0, a memory limit. --- */
  OK(gkrt_config_init(&cfg));
  cfg.memory_mode = GKRT_MEMORY_PLANNED;
  cfg.log_level = 0;
  cfg.memory_limit = 64ull << 20;
  cfg.host_jitter_us = 5;
  cfg.seed = 42;
  rt = NULL;
  OK(gkrt_runtime_create(&cfg, &rt));
  CHECK_EQ_U64(stats_of(rt).memory_limit, 64ull << 20);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));

  /* --- The main runtime for the rest. --- */
  rt = test_runtime(32ull << 20);
  CHECK_EQ_U64(stats_of(rt).memory_limit, 32ull << 20);

  /* gkrt_runtime_device / gkrt_runtime_stats: NULL runtime, NULL out. */
  kind = 777;
  FAILS(gkrt_runtime_device(NULL, &kind), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  CHECK_EQ_U64(kind, 777);
  FAILS(gkrt_runtime_device(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_runtime_stats(NULL, &st), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_stats(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_runtime_reset_peak_stats(NULL), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_synchronize(NULL), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_run(NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "runtime");

  /* --- Statistics: rounding, requested bytes, counts, peaks, reset_peak_stats. --- */
  gkrt_stats s0 = stats_of(rt);
  CHECK_EQ_U64(s0.allocated_bytes, 0);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor t1000 = add_tensor(g, 1000, GKRT_TENSOR_INPUT, "t1000");
  gkrt_tensor t4096 = add_tensor(g, 4096, GKRT_TENSOR_PARAMETER, "t4096");
  CHECK_EQ_U64(stats_of(rt).allocated_bytes, 0); /* memory comes with the first write */
  unsigned char buf[4096];
  fill_bytes(buf, sizeof buf, 3);
  OK(gkrt_graph_write_tensor(g, t1000, buf, 1000));
  OK(gkrt_graph_write_tensor(g, t4096, buf, 4096));
  OK(gkrt_graph_write_tensor(g, t4096, buf, 4096)); /* a second write reuses the memory */
  gkrt_stats s1 = stats_of(rt);
  CHECK_EQ_U64(s1.allocated_bytes, 1024 + 4096); /* 1000 rounds up to 1024 */
  CHECK_EQ_U64(s1.requested_bytes, 1000 + 4096);
  CHECK_EQ_U64(s1.alloc_count - s0.alloc_count, 2);
  CHECK_EQ_U64(s1.peak_allocated_bytes, 1024 + 4096);
  CHECK(s1.reserved_bytes >= s1.allocated_bytes);
  CHECK(s1.peak_reserved_bytes >= s1.reserved_bytes);
  CHECK(s1.segment_count >= 1);
  OK(gkrt_graph_release(g));
  gkrt_stats s2 = stats_of(rt);
  CHECK_EQ_U64(s2.allocated_bytes, 0);
  CHECK_EQ_U64(s2.requested_bytes, 0);
  CHECK_EQ_U64(s2.free_count - s1.free_count, 2);
  CHECK_EQ_U64(s2.peak_allocated_bytes, 1024 + 4096); /* the peak stays until reset */
  OK(gkrt_runtime_reset_peak_stats(rt));
  gkrt_stats s3 = stats_of(rt);
  CHECK_EQ_U64(s3.peak_allocated_bytes, s3.allocated_bytes);
  CHECK_EQ_U64(s3.peak_allocated_bytes, 0);
  CHECK_EQ_U64(s3.peak_reserved_bytes, s3.reserved_bytes);

  /* Run counters: the probe runs a 4-node graph twice. */
  gkrt_stats before_probe = stats_of(rt);
  CHECK_RUNTIME_WORKS(rt);
  gkrt_stats after_probe = stats_of(rt);
  CHECK_EQ_U64(after_probe.runs - before_probe.runs, 2);
  CHECK_EQ_U64(after_probe.nodes_launched - before_probe.nodes_launched, 8);

  /* synchronize: fine when idle and after work. */
  OK(gkrt_runtime_synchronize(rt));
  OK(gkrt_runtime_synchronize(rt));

  /* --- Handles of another kind passed as a runtime. --- */
  OK(gkrt_graph_create(rt, &g));
  gkrt_kernel *k = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_runtime *graph_as_rt = (gkrt_runtime *)g, *kernel_as_rt = (gkrt_runtime *)k;
  FAILS(gkrt_runtime_device(graph_as_rt, &kind), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_runtime_stats(graph_as_rt, &st), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_runtime_reset_peak_stats(kernel_as_rt), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  FAILS(gkrt_runtime_synchronize(kernel_as_rt), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  FAILS(gkrt_runtime_run(graph_as_rt, g), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_runtime_release(graph_as_rt), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_runtime_release(kernel_as_rt), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  FAILS(gkrt_graph_create(graph_as_rt, &g), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  /* A runtime passed as a graph or kernel. */
  FAILS(gkrt_graph_release((gkrt_graph *)rt), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_kernel_release((gkrt_kernel *)rt), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  /* None of those released anything: the graph and kernel still work, so does the runtime. */
  gkrt_tensor gx = add_tensor(g, 64, GKRT_TENSOR_INPUT, "gx");
  gkrt_tensor gy = add_tensor(g, 64, GKRT_TENSOR_OUTPUT, "gy");
  OK(add_node(g, k, &gx, 1, gy, NULL, 0));
  OK(gkrt_graph_finalize(g));
  float in16[16], out16[16], want16[16];
  fill_floats(in16, 16, 9);
  OK(gkrt_graph_write_tensor(g, gx, in16, sizeof in16));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, gy, out16, sizeof out16));
  for (int i = 0; i < 16; i++) want16[i] = in16[i] > 0.0f ? in16[i] : 0.0f;
  CHECK_BITS(out16, want16, 16);
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(k));
  CHECK_RUNTIME_WORKS(rt);

  /* --- Made-up pointers: never a crash, always INVALID_ARGUMENT. --- */
  gkrt_runtime *bogus[] = {(gkrt_runtime *)(uintptr_t)0xdeadbeef0ull, (gkrt_runtime *)&cfg,
                           (gkrt_runtime *)(uintptr_t)1, (gkrt_runtime *)(uintptr_t)UINTPTR_MAX};
  for (size_t i = 0; i < sizeof bogus / sizeof bogus[0]; i++) {
    FAILS(gkrt_runtime_device(bogus[i], &kind), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
    FAILS(gkrt_runtime_stats(bogus[i], &st), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
    FAILS(gkrt_runtime_reset_peak_stats(bogus[i]), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
    FAILS(gkrt_runtime_synchronize(bogus[i]), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
    FAILS(gkrt_runtime_release(bogus[i]), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
    FAILS(gkrt_graph_create(bogus[i], &g), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
    FAILS(gkrt_kernel_builtin(bogus[i], GKRT_BUILTIN_ADD, &k), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  }
  CHECK_RUNTIME_WORKS(rt);

  /* --- Release: NULL is a no-op; twice is INVALID_ARGUMENT; a released handle is dead. --- */
  OK(gkrt_runtime_release(NULL));
  gkrt_runtime *rt2 = test_runtime(0);
  OK(gkrt_runtime_release(rt2));
  FAILS(gkrt_runtime_release(rt2), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_stats(rt2, &st), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_device(rt2, &kind), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_synchronize(rt2), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_graph_create(rt2, &g), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  /* ...and releasing another runtime twice did not touch this one. */
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  FAILS(gkrt_runtime_release(rt), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  return test_done("api_runtime");
}
