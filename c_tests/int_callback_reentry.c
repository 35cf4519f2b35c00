/*
 * int_callback_reentry: a host callback may call back into gkrt. The header allows any call
 * from any thread and forbids nothing inside a callback, so each call made from inside one
 * (status names, another runtime's statistics, the own runtime's statistics, the info of a
 * graph of the same runtime and of the callback's own graph) must return — with OK or with an
 * error status saying why not — and never deadlock; the run then completes. A watchdog
 * (alarm) turns a hang into a failure that names the call that hung, instead of a CTest
 * timeout.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <unistd.h>

#include "test_util.h"

static gkrt_runtime *rt, *rt2;
static gkrt_graph *own_graph, *sibling_graph, *other_rt_graph;
static const char *volatile stage = "before the run";
static gkrt_status results[6];
static int calls;

static void on_alarm(int sig) {
  (void)sig;
  const char *a = "int_callback_reentry: deadlock: the call hung: ";
  ssize_t n = write(2, a, strlen(a));
  n += write(2, (const char *)stage, strlen((const char *)stage));
  n += write(2, "\n", 1);
  _exit(n > 0 ? 1 : 2);
}

static int32_t reenter_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  calls++;
  gkrt_stats s;
  gkrt_graph_info info;
  stage = "gkrt_status_name / gkrt_version (from a callback)";
  results[0] = (gkrt_status_name(0) != NULL && gkrt_version() != NULL) ? GKRT_STATUS_OK : GKRT_STATUS_INTERNAL;
  stage = "gkrt_runtime_stats of another runtime (from a callback)";
  results[1] = gkrt_runtime_stats(rt2, &s);
  stage = "gkrt_graph_get_info of another runtime's graph (from a callback)";
  results[2] = gkrt_graph_get_info(other_rt_graph, &info);
  stage = "gkrt_graph_get_info of another graph of the same runtime (from a callback)";
  results[3] = gkrt_graph_get_info(sibling_graph, &info);
  stage = "gkrt_runtime_stats of the callback's own runtime (from a callback)";
  results[4] = gkrt_runtime_stats(rt, &s);
  stage = "gkrt_graph_get_info of the callback's own graph (from a callback)";
  results[5] = gkrt_graph_get_info(own_graph, &info);
  stage = "returning from the callback";
  return 0;
}

int main(void) {
  signal(SIGALRM, on_alarm);
  /* GKRT_TEST_WATCHDOG_S: more time where everything is slower (under compute-sanitizer). */
  const char *watchdog = getenv("GKRT_TEST_WATCHDOG_S");
  alarm(watchdog && atoi(watchdog) > 0 ? (unsigned)atoi(watchdog) : 20u);
  rt = test_runtime(0);
  rt2 = test_runtime(0);
  gkrt_kernel *cb, *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  OK(gkrt_kernel_from_callback(rt, reenter_cb, NULL, &cb));
  OK(gkrt_graph_create(rt, &own_graph));
  OK(gkrt_graph_create(rt, &sibling_graph));
  OK(gkrt_graph_create(rt2, &other_rt_graph));
  gkrt_tensor x = add_tensor(own_graph, 64, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor y = add_tensor(own_graph, 64, GKRT_TENSOR_OUTPUT, "y");
  OK(add_node(own_graph, relu, &x, 1, y, NULL, 0));
  OK(gkrt_graph_add_kernel(own_graph, cb, &y, 1, NULL, 0, NULL, 0, NULL, NULL));
  OK(gkrt_graph_finalize(own_graph));
  float v[16], r[16], w[16];
  fill_floats(v, 16, 5);
  for (int i = 0; i < 16; i++) w[i] = v[i] > 0.0f ? v[i] : 0.0f;
  OK(gkrt_graph_write_tensor(own_graph, x, v, sizeof v));

  stage = "gkrt_runtime_run";
  OK(gkrt_runtime_run(rt, own_graph));
  stage = "after the run";
  alarm(0);
  CHECK_EQ_U64(calls, 1);
  CHECK_EQ_U64(results[0], GKRT_STATUS_OK);
  CHECK_EQ_U64(results[1], GKRT_STATUS_OK); /* another runtime shares nothing with this run */
  CHECK_EQ_U64(results[2], GKRT_STATUS_OK);
  for (int i = 3; i < 6; i++)
    CHECK(results[i] == GKRT_STATUS_OK || results[i] == GKRT_STATUS_INVALID_STATE);
  OK(gkrt_graph_read_tensor(own_graph, y, r, sizeof r));
  CHECK_BITS(r, w, 16);
  CHECK_RUNTIME_WORKS(rt);

  OK(gkrt_graph_release(own_graph));
  OK(gkrt_graph_release(sibling_graph));
  OK(gkrt_graph_release(other_rt_graph));
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_runtime_release(rt));
  OK(gkrt_runtime_release(rt2));
  return test_done("int_callback_reentry");
}
