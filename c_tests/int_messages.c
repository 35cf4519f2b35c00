/*
 * int_messages: failures that explain themselves. An out-of-memory run names the node, the
 * tensor, the bytes asked, allocated and reserved, the largest free block and the largest
 * tensors on the device; a failure for pinned host memory says so and names the host memory
 * limit (not the device's); finalize warns about a node only when it cannot run under the limit.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "test_util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int cannot_run_warnings;

static void on_log(uint32_t level, const char *target, const char *message, void *user) {
  (void)target;
  (void)user;
  pthread_mutex_lock(&mu);
  if (level == 2 && strstr(message, "runs will fail there")) cannot_run_warnings++;
  pthread_mutex_unlock(&mu);
}

static int warnings_so_far(void) {
  pthread_mutex_lock(&mu);
  int n = cannot_run_warnings;
  pthread_mutex_unlock(&mu);
  return n;
}

/* The message tests' runtime: a device and a host memory limit, warnings logged. */
static gkrt_runtime *limited(uint64_t device, uint64_t host) {
  return runtime_with(GKRT_DEVICE_AUTO, GKRT_MEMORY_DYNAMIC, device, host, 2);
}

/* x -> relu -> y, each `bytes`. */
static gkrt_graph *relu_graph(gkrt_runtime *rt, gkrt_kernel *relu, uint64_t bytes, gkrt_tensor *x, gkrt_tensor *y) {
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  *x = add_tensor(g, bytes, GKRT_TENSOR_INPUT, "big_in");
  *y = add_tensor(g, bytes, GKRT_TENSOR_OUTPUT, "big_out");
  OK(add_node(g, relu, x, 1, *y, NULL, 0));
  return g;
}

int main(void) {
  OK(gkrt_set_log_callback(on_log, NULL));
  float *v = alloc_floats(16384);

  /* Out of device memory: a node whose input and output do not fit the limit together. */
  gkrt_runtime *rt = limited(96 << 10, 0);
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_tensor x, y;
  gkrt_graph *g = relu_graph(rt, relu, 64 << 10, &x, &y);
  int before = warnings_so_far();
  OK(gkrt_graph_finalize(g));
  CHECK_EQ_U64(warnings_so_far() - before, 1); /* 128 KiB of its own under a 96 KiB limit */
  OK(gkrt_graph_write_tensor(g, x, v, 64 << 10));
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_OUT_OF_MEMORY, "node 0");
  MSG_HAS("big_out");            /* the tensor being allocated */
  MSG_HAS("largest free block");
  MSG_HAS("largest tensors on the device");
  MSG_HAS("memory limit");
  MSG_HAS_U64(96 << 10);
  OK(gkrt_graph_release(g));
  CHECK_RUNTIME_WORKS(rt);

  /* A graph that must swap but whose every node fits: no warning. */
  gkrt_graph *chain;
  OK(gkrt_graph_create(rt, &chain));
  gkrt_tensor t[6];
  t[0] = add_tensor(chain, 16 << 10, GKRT_TENSOR_INPUT, "t0");
  for (int i = 1; i < 6; i++) {
    char name[8];
    snprintf(name, sizeof name, "t%d", i);
    t[i] = add_tensor(chain, 16 << 10, i == 5 ? GKRT_TENSOR_OUTPUT : GKRT_TENSOR_INTERMEDIATE, name);
  }
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  OK(add_node(chain, relu, &t[0], 1, t[1], NULL, 0));
  OK(add_node(chain, relu, &t[1], 1, t[2], NULL, 0));
  OK(add_node(chain, relu, &t[2], 1, t[3], NULL, 0));
  gkrt_tensor pair[2] = {t[1], t[3]};
  OK(add_node(chain, add, pair, 2, t[4], NULL, 0));
  gkrt_tensor pair2[2] = {t[2], t[4]};
  OK(add_node(chain, add, pair2, 2, t[5], NULL, 0));
  before = warnings_so_far();
  OK(gkrt_graph_finalize(chain));
  CHECK_EQ_U64(warnings_so_far() - before, 0);
  OK(gkrt_graph_release(chain));
  OK(gkrt_kernel_release(add));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_runtime_release(rt));

  /* Out of pinned host memory: a swapping graph's input goes to the host, over a 4 KiB cap. */
  rt = limited(96 << 10, 4096);
  relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  g = relu_graph(rt, relu, 64 << 10, &x, &y);
  OK(gkrt_graph_finalize(g));
  FAILS(gkrt_graph_write_tensor(g, x, v, 64 << 10), GKRT_STATUS_OUT_OF_MEMORY, "pinned host memory");
  MSG_HAS("host memory limit");
  MSG_HAS_U64(4096);
  CHECK(strstr(last_error(), "out of device memory") == NULL);
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(relu));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));

  OK(gkrt_set_log_callback(NULL, NULL));
  free(v);
  return test_done("int_messages");
}
