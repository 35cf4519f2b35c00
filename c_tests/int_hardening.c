/*
 * int_hardening: the findings of an outside attack on the C API, each reproduced.
 *  1. A matmul whose m·k·4 wraps in 64 bits is refused when its node is added (it was accepted,
 *     and its run wrote past its buffers).
 *  2. Workspaces whose sum wraps are refused when the node is added, in dynamic and planned mode
 *     (the graph reported 0 bytes, or finalize failed and left the graph runnable).
 *  3. A released runtime handle whose home now serves another runtime is refused with
 *     GKRT_STATUS_INVALID_ARGUMENT from inside that runtime's callback (it said INVALID_STATE);
 *     from another thread, at once, is api_limits' stale_runtime_handle.
 *  5. The edges the header now states: a callback may release its own graph; a callback's
 *     stream is the runtime's compute stream, which gkrt_malloc accepts; a planned graph's first
 *     run allocates the outputs no write put on the device, later runs nothing.
 *  6. A graph released in one thread while another graph of the same runtime runs in another
 *     does not take that run's failure: the failing callback's run reports it. (The fuzzer found
 *     the release draining the streams outside the runtime's lock under ASan's timing; this
 *     test fixes one interleaving of it, not that timing.)
 * (4, running out of handles, is api_limits' concern.)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* --- 1 and 2: sizes that wrap --- */

static void wrapping_sizes_are_refused(gkrt_memory_mode mode) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, mode, 0, 0, 1);
  gkrt_kernel *mm = builtin_kernel(rt, GKRT_BUILTIN_MATMUL);
  gkrt_kernel *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));

  /* m = n = k = 3,037,000,500: m·k·4 = 2^65 + 581,896,768, which wraps to 581,896,768. */
  uint32_t dims[3] = {3037000500u, 3037000500u, 3037000500u};
  uint64_t wrapped = (uint64_t)dims[0] * dims[2] * 4u;
  CHECK_EQ_U64(wrapped, 581896768u);
  gkrt_tensor a = add_tensor(g, wrapped, GKRT_TENSOR_INPUT, "a");
  gkrt_tensor b = add_tensor(g, wrapped, GKRT_TENSOR_INPUT, "b");
  gkrt_tensor c = add_tensor(g, wrapped, GKRT_TENSOR_OUTPUT, "c");
  gkrt_tensor ab[2] = {a, b};
  gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, dims, sizeof dims};
  uint32_t node = 77;
  FAILS(gkrt_graph_add_kernel(g, mm, ab, 2, &c, 1, NULL, 0, &l, &node), GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  MSG_HAS("3037000500");
  MSG_HAS("2^64");
  CHECK_EQ_U64(node, 77); /* out-parameter untouched */

  /* 65,536 workspaces of 2^48 bytes: the sum is 2^64, which wraps to 0. */
  size_t n_ws = 65536;
  uint64_t *ws = malloc(n_ws * sizeof *ws);
  for (size_t i = 0; i < n_ws; i++) ws[i] = 1ull << 48;
  float one = 1.0f;
  gkrt_launch with_one = {{1, 1, 1}, {1, 1, 1}, 0, &one, sizeof one};
  gkrt_tensor y = add_tensor(g, 1024, GKRT_TENSOR_OUTPUT, "y");
  FAILS(gkrt_graph_add_kernel(g, fill, NULL, 0, &y, 1, ws, n_ws, &with_one, NULL), GKRT_STATUS_INVALID_ARGUMENT,
        "workspaces");
  MSG_HAS("node 0");
  free(ws);
  /* Nothing was added: the graph has no node, so it cannot finalize or run. */
  gkrt_graph_info info = info_of(g);
  CHECK_EQ_U64(info.num_nodes, 0);
  FAILS(gkrt_graph_finalize(g), GKRT_STATUS_INVALID_ARGUMENT, "no nodes");
  CHECK_EQ_U64(info_of(g).finalized, 0);
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_INVALID_STATE, "finalize");
  OK(gkrt_graph_release(g));

  /* The graph's total is bounded too: 2^12 tensors of 2^48 bytes pass 2^60. */
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor t;
  gkrt_status st = GKRT_STATUS_OK;
  int added = 0;
  for (int i = 0; i < 5000 && st == GKRT_STATUS_OK; i++) {
    st = gkrt_graph_add_tensor(g, 1ull << 48, GKRT_TENSOR_INTERMEDIATE, "big", &t);
    added += st == GKRT_STATUS_OK;
  }
  CHECK_EQ_U64(st, GKRT_STATUS_INVALID_ARGUMENT);
  CHECK_EQ_U64(added, 4096);
  MSG_HAS("1152921504606846976"); /* 2^60 */

  /* A small graph on the same runtime still works and its figures are right. */
  gkrt_graph *ok_graph;
  OK(gkrt_graph_create(rt, &ok_graph));
  gkrt_tensor z = add_tensor(ok_graph, 4096, GKRT_TENSOR_OUTPUT, "z");
  uint64_t small_ws[2] = {1000, 3000};
  OK(gkrt_graph_add_kernel(ok_graph, fill, NULL, 0, &z, 1, small_ws, 2, &with_one, NULL));
  OK(gkrt_graph_finalize(ok_graph));
  info = info_of(ok_graph);
  CHECK_EQ_U64(info.transient_total_bytes, 1024 + 3072);
  OK(gkrt_runtime_run(rt, ok_graph));
  float out[1024];
  OK(gkrt_graph_read_tensor(ok_graph, z, out, sizeof out));
  CHECK(out[0] == 1.0f && out[1023] == 1.0f);
  OK(gkrt_graph_release(ok_graph));
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(mm));
  OK(gkrt_kernel_release(fill));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

/* --- 3: a released handle, met inside a callback of the runtime that took over its home ---
 * (From another thread, the same handle is api_limits' stale_runtime_handle.) */

static gkrt_runtime *stale_rt;
static gkrt_status inside_status;
static double inside_ms;

static int32_t probe_stale(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  gkrt_stats s;
  double t = now_ms();
  inside_status = gkrt_runtime_stats(stale_rt, &s);
  inside_ms = now_ms() - t;
  return 0;
}

static void stale_handles_are_refused_inside_callbacks(void) {
  stale_rt = test_runtime(0);
  OK(gkrt_runtime_release(stale_rt));
  gkrt_runtime *rt = test_runtime(0); /* takes the home the released runtime gave back */
  CHECK(rt != stale_rt);
  gkrt_kernel *cb;
  OK(gkrt_kernel_from_callback(rt, probe_stale, NULL, &cb));
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, 64, GKRT_TENSOR_INPUT, "x");
  OK(gkrt_graph_add_kernel(g, cb, &x, 1, NULL, 0, NULL, 0, NULL, NULL));
  OK(gkrt_graph_finalize(g));
  float v[16] = {0};
  OK(gkrt_graph_write_tensor(g, x, v, sizeof v));
  OK(gkrt_runtime_run(rt, g));
  /* The status a released handle gets, not INVALID_STATE for the busy runtime in its home. */
  CHECK_EQ_U64(inside_status, GKRT_STATUS_INVALID_ARGUMENT);
  if (inside_ms > 50) {
    fprintf(stderr, "a stale handle waited %.1f ms inside the callback\n", inside_ms);
    test_failures++;
  }
  FAILS(gkrt_runtime_release(stale_rt), GKRT_STATUS_INVALID_ARGUMENT, "not live");
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(cb));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

/* --- 5: the edges the header states --- */

static gkrt_graph *self_graph;
static gkrt_status self_release_status = GKRT_STATUS_INTERNAL;
static void *seen_stream;

static int32_t release_own_graph(const gkrt_callback_args *args, void *user) {
  (void)user;
  seen_stream = args->stream;
  self_release_status = gkrt_graph_release(self_graph);
  /* The node's buffers stay valid for the rest of the callback and the run. */
  return 0;
}

static void a_callback_may_release_its_graph_and_name_its_stream(void) {
  gkrt_runtime *rt = test_runtime(0);
  uint64_t base = allocated_bytes(rt);
  gkrt_kernel *cb, *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  OK(gkrt_kernel_from_callback(rt, release_own_graph, NULL, &cb));
  OK(gkrt_graph_create(rt, &self_graph));
  gkrt_tensor x = add_tensor(self_graph, 4096, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor h = add_tensor(self_graph, 4096, GKRT_TENSOR_INTERMEDIATE, "h");
  gkrt_tensor y = add_tensor(self_graph, 4096, GKRT_TENSOR_OUTPUT, "y");
  OK(add_node(self_graph, relu, &x, 1, h, NULL, 0));
  OK(gkrt_graph_add_kernel(self_graph, cb, &h, 1, NULL, 0, NULL, 0, NULL, NULL));
  OK(add_node(self_graph, relu, &h, 1, y, NULL, 0));
  OK(gkrt_graph_finalize(self_graph));
  float v[1024];
  fill_floats(v, 1024, 3);
  OK(gkrt_graph_write_tensor(self_graph, x, v, sizeof v));
  OK(gkrt_runtime_run(rt, self_graph));
  CHECK_EQ_U64(self_release_status, GKRT_STATUS_OK);
  gkrt_graph_info info;
  FAILS(gkrt_graph_get_info(self_graph, &info), GKRT_STATUS_INVALID_ARGUMENT, "not live");
  FAILS(gkrt_runtime_run(rt, self_graph), GKRT_STATUS_INVALID_ARGUMENT, "not live");
  /* The graph's memory went with the end of the run. */
  CHECK_EQ_U64(allocated_bytes(rt), base);

  /* The callback's stream is the runtime's compute stream: gkrt_malloc takes it. */
  CHECK(seen_stream != NULL);
  void *p = NULL;
  OK(gkrt_malloc(rt, 1000, seen_stream, &p));
  CHECK(p != NULL);
  OK(gkrt_free(rt, p, seen_stream));
  OK(gkrt_runtime_synchronize(rt));
  CHECK_EQ_U64(allocated_bytes(rt), base);
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(relu));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

static void planned_first_run_allocates_unwritten_outputs_only(void) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, GKRT_MEMORY_PLANNED, 0, 0, 1);
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, 4096, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor h = add_tensor(g, 4096, GKRT_TENSOR_INTERMEDIATE, "h");
  gkrt_tensor y1 = add_tensor(g, 4096, GKRT_TENSOR_OUTPUT, "y1");
  gkrt_tensor y2 = add_tensor(g, 4096, GKRT_TENSOR_OUTPUT, "y2");
  OK(add_node(g, relu, &x, 1, h, NULL, 0));
  OK(add_node(g, relu, &h, 1, y1, NULL, 0));
  OK(add_node(g, relu, &h, 1, y2, NULL, 0));
  OK(gkrt_graph_finalize(g));
  float v[1024];
  fill_floats(v, 1024, 4);
  OK(gkrt_graph_write_tensor(g, x, v, sizeof v));
  OK(gkrt_runtime_run(rt, g));
  CHECK_EQ_U64(stats_of(rt).last_run_pool_allocs, 2); /* y1 and y2; h is in the arena */
  OK(gkrt_runtime_run(rt, g));
  CHECK_EQ_U64(stats_of(rt).last_run_pool_allocs, 0);
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_runtime_release(rt));
}

/* --- 6: a release in another thread does not take a run's failure --- */

static int32_t slow_failure(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  usleep(200 * 1000);
  return 5;
}

struct releaser {
  gkrt_graph *g;
  gkrt_status status;
};

static void *release_later(void *arg) {
  struct releaser *r = arg;
  usleep(50 * 1000); /* inside the 200 ms callback */
  r->status = gkrt_graph_release(r->g);
  return NULL;
}

static void a_release_elsewhere_keeps_the_runs_failure(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *cb, *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  OK(gkrt_kernel_from_callback(rt, slow_failure, NULL, &cb));
  gkrt_graph *failing, *other;
  OK(gkrt_graph_create(rt, &failing));
  gkrt_tensor x = add_tensor(failing, 64, GKRT_TENSOR_INPUT, "x");
  OK(gkrt_graph_add_kernel(failing, cb, &x, 1, NULL, 0, NULL, 0, NULL, NULL));
  OK(gkrt_graph_finalize(failing));
  float v[16] = {0};
  OK(gkrt_graph_write_tensor(failing, x, v, sizeof v));
  OK(gkrt_graph_create(rt, &other));
  gkrt_tensor a = add_tensor(other, 64, GKRT_TENSOR_INPUT, "a");
  gkrt_tensor b = add_tensor(other, 64, GKRT_TENSOR_OUTPUT, "b");
  OK(add_node(other, relu, &a, 1, b, NULL, 0));
  OK(gkrt_graph_finalize(other));
  OK(gkrt_graph_write_tensor(other, a, v, sizeof v));
  struct releaser r = {other, GKRT_STATUS_INTERNAL};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, release_later, &r) == 0);
  FAILS(gkrt_runtime_run(rt, failing), GKRT_STATUS_CALLBACK_FAILED, "node 0");
  pthread_join(th, NULL);
  CHECK_EQ_U64(r.status, GKRT_STATUS_OK);
  OK(gkrt_graph_release(failing));
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(relu));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

int main(void) {
  wrapping_sizes_are_refused(GKRT_MEMORY_DYNAMIC);
  wrapping_sizes_are_refused(GKRT_MEMORY_PLANNED);
  stale_handles_are_refused_inside_callbacks();
  a_callback_may_release_its_graph_and_name_its_stream();
  planned_first_run_allocates_unwritten_outputs_only();
  a_release_elsewhere_keeps_the_runs_failure();
  return test_done("int_hardening");
}
