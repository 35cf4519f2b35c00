/*
 * int_async_run: gkrt_runtime_run_async / gkrt_graph_wait / gkrt_stream_create /
 * gkrt_stream_synchronize. A run queued on a host stream returns before a slow callback in it has
 * run; waiting for the host's stream (not the graph) finds the output written, so the host's
 * stream is ordered after the run. Runs of one graph back to back accumulate in place through
 * bound memory (each reads the last one's result): ordered, in dynamic and planned mode. A
 * callback failing on the device surfaces at the wait (not at the queueing), and the graph runs
 * again afterwards. Waits on a graph never run, swapping graphs, foreign graphs and unknown
 * streams give statuses naming the fault; a graph released with a run in flight is drained.
 */
#include <time.h>
#include <unistd.h>

#include "dev_mem.h"
#include "test_util.h"

enum { N = 64, BYTES = N * 4, RUNS = 6 };

static volatile int fail_next = 0;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* out = in + 1, after a 100 ms pause (the device is "busy"); fails with 42 when asked to. */
static int32_t slow_inc(const gkrt_callback_args *a, void *user) {
  (void)user;
  float v[N];
  usleep(100 * 1000);
  if (fail_next) return 42;
  if (cbdev_read(a, a->inputs[0], v, BYTES)) return 95;
  for (int i = 0; i < N; i++) v[i] += 1.0f;
  return cbdev_write(a, a->outputs[0], v, BYTES) ? 94 : 0;
}

static void run_mode(gkrt_memory_mode mode) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, mode, 0, 0, 1);
  cbdev_init(rt);
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD), *cb = NULL;
  OK(gkrt_kernel_from_callback(rt, slow_inc, NULL, &cb));

  /* acc_out (bound to the same memory as acc) = acc + one: each run adds one in place. */
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor acc = add_tensor(g, BYTES, GKRT_TENSOR_PARAMETER, "acc");
  gkrt_tensor one = add_tensor(g, BYTES, GKRT_TENSOR_PARAMETER, "one");
  gkrt_tensor acc_out = add_tensor(g, BYTES, GKRT_TENSOR_OUTPUT, "acc_out");
  gkrt_tensor in2[2] = {acc, one};
  OK(add_node(g, add, in2, 2, acc_out, NULL, 0));
  OK(gkrt_graph_finalize(g));

  /* The slow graph: y = x + 1 by a callback that takes 30 ms. */
  gkrt_graph *slow;
  OK(gkrt_graph_create(rt, &slow));
  gkrt_tensor x = add_tensor(slow, BYTES, GKRT_TENSOR_INPUT, "x_in");
  gkrt_tensor y = add_tensor(slow, BYTES, GKRT_TENSOR_OUTPUT, "y_out");
  OK(add_node(slow, cb, &x, 1, y, NULL, 0));
  OK(gkrt_graph_finalize(slow));

  /* --- Waits before any run, bad streams, foreign graphs. --- */
  FAILS(gkrt_graph_wait(rt, g), GKRT_STATUS_INVALID_STATE, "never run");
  void *s = NULL;
  FAILS(gkrt_stream_create(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  OK(gkrt_stream_create(rt, &s));
  CHECK(s != NULL);
  gkrt_runtime *rt2 = runtime_with(GKRT_DEVICE_AUTO, mode, 0, 0, 1);
  FAILS(gkrt_runtime_run_async(rt2, g, s), GKRT_STATUS_INVALID_ARGUMENT, "another runtime");
  FAILS(gkrt_graph_wait(rt2, g), GKRT_STATUS_INVALID_ARGUMENT, "another runtime");
  OK(gkrt_runtime_release(rt2));
  /* Inputs never written: refused before anything is queued. */
  FAILS(gkrt_runtime_run_async(rt, g, s), GKRT_STATUS_INVALID_STATE, "acc");
  FAILS(gkrt_graph_wait(rt, g), GKRT_STATUS_INVALID_STATE, "never run");

  float ones[N], zeros[N], got[N], want[N];
  for (int i = 0; i < N; i++) ones[i] = 1.0f, zeros[i] = 0.0f;
  void *accb = dev_alloc(rt, BYTES);
  dev_put(accb, zeros, BYTES);
  OK(gkrt_graph_bind_tensor(g, acc, accb, BYTES));
  OK(gkrt_graph_bind_tensor(g, acc_out, accb, BYTES));
  OK(gkrt_graph_write_tensor(g, one, ones, BYTES));
  if (test_on_host(rt)) {
    FAILS(gkrt_runtime_run_async(rt, g, (void *)(uintptr_t)0x1234), GKRT_STATUS_INVALID_ARGUMENT, "stream");
  }

  /* --- Back to back, ordered: RUNS increments, on gkrt's stream and on the host's. --- */
  for (int r = 0; r < RUNS; r++) OK(gkrt_runtime_run_async(rt, g, r % 2 ? s : NULL));
  OK(gkrt_graph_wait(rt, g));
  OK(gkrt_graph_wait(rt, g)); /* nothing in flight: at once */
  dev_get(got, accb, BYTES);
  for (int i = 0; i < N; i++) want[i] = (float)RUNS;
  CHECK_BITS(got, want, N);
  if (mode == GKRT_MEMORY_PLANNED) CHECK_EQ_U64(stats_of(rt).last_run_pool_allocs, 0);
  /* A synchronous run after asynchronous ones is ordered after them too. */
  for (int r = 0; r < RUNS; r++) OK(gkrt_runtime_run_async(rt, g, s));
  OK(gkrt_runtime_run(rt, g));
  dev_get(got, accb, BYTES);
  for (int i = 0; i < N; i++) want[i] = (float)(2 * RUNS + 1);
  CHECK_BITS(got, want, N);

  /* --- The host's stream is ordered after the run: queued returns early, the stream waits. --- */
  float xv[N];
  fill_floats(xv, N, 5);
  OK(gkrt_graph_write_tensor(slow, x, xv, BYTES));
  void *yb = dev_alloc(rt, BYTES);
  dev_put(yb, zeros, BYTES);
  OK(gkrt_graph_bind_tensor(slow, y, yb, BYTES));
  double t0 = now_ms();
  OK(gkrt_runtime_run_async(rt, slow, s));
  double queued_ms = now_ms() - t0;
  if (test_on_host(rt)) CHECK(queued_ms < 75.0); /* the callback alone sleeps 100 ms */
  OK(gkrt_stream_synchronize(rt, s));
  CHECK(now_ms() - t0 >= 99.0);
  dev_get(got, yb, BYTES);
  for (int i = 0; i < N; i++) want[i] = xv[i] + 1.0f;
  CHECK_BITS(got, want, N);
  OK(gkrt_graph_wait(rt, slow));

  /* --- A failure on the device surfaces at the wait; the graph runs again after it. --- */
  if (test_on_host(rt)) { /* on CUDA a callback runs at queueing: its failure is returned there */
    fail_next = 1;
    OK(gkrt_runtime_run_async(rt, slow, s));
    FAILS(gkrt_graph_wait(rt, slow), GKRT_STATUS_CALLBACK_FAILED, "42");
    fail_next = 0;
    OK(gkrt_graph_wait(rt, slow));
    CHECK_RUNTIME_WORKS(rt);
    OK(gkrt_runtime_run_async(rt, slow, NULL));
    OK(gkrt_graph_wait(rt, slow));
    dev_get(got, yb, BYTES);
    CHECK_BITS(got, want, N);
  }

  /* --- Released with runs in flight: drained first; the bound memory is the host's. --- */
  OK(gkrt_runtime_run_async(rt, g, s));
  OK(gkrt_runtime_run_async(rt, slow, s));
  OK(gkrt_graph_release(g));
  OK(gkrt_graph_release(slow));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, accb, BYTES);
  for (int i = 0; i < N; i++) want[i] = (float)(2 * RUNS + 2);
  CHECK_BITS(got, want, N);
  OK(gkrt_free(rt, accb, NULL));
  OK(gkrt_free(rt, yb, NULL));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  OK(gkrt_kernel_release(add));
  OK(gkrt_kernel_release(cb));
  OK(gkrt_runtime_release(rt));
}

/* A swapping graph runs only synchronously. */
static void swapping_graph(void) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, GKRT_MEMORY_DYNAMIC, 6 * 4096, 0, 1);
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor t[7];
  const gkrt_tensor_kind kinds[7] = {GKRT_TENSOR_INPUT, GKRT_TENSOR_PARAMETER, GKRT_TENSOR_PARAMETER,
                                     GKRT_TENSOR_PARAMETER, GKRT_TENSOR_INTERMEDIATE,
                                     GKRT_TENSOR_INTERMEDIATE, GKRT_TENSOR_OUTPUT};
  for (int i = 0; i < 7; i++) t[i] = add_tensor(g, 4096, kinds[i], "t");
  gkrt_tensor n0[2] = {t[0], t[1]}, n1[2] = {t[4], t[2]}, n2[2] = {t[5], t[3]};
  OK(add_node(g, add, n0, 2, t[4], NULL, 0));
  OK(add_node(g, add, n1, 2, t[5], NULL, 0));
  OK(add_node(g, add, n2, 2, t[6], NULL, 0));
  OK(gkrt_graph_finalize(g));
  unsigned char buf[4096] = {0};
  for (int i = 0; i < 4; i++) OK(gkrt_graph_write_tensor(g, t[i], buf, sizeof buf));
  FAILS(gkrt_runtime_run_async(rt, g, NULL), GKRT_STATUS_INVALID_STATE, "swaps");
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_wait(rt, g)); /* after a synchronous run: nothing to wait for */
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(add));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

int main(void) {
  run_mode(GKRT_MEMORY_DYNAMIC);
  run_mode(GKRT_MEMORY_PLANNED);
  swapping_graph();
  return test_done("int_async_run");
}
