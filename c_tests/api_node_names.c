/*
 * api_node_names: gkrt_graph_set_node_name gives a node a name that messages use ("node 1
 * 'loss' (host callback)"), checked where it comes in (NULL, non-UTF-8, an unknown node, after
 * finalize), and an empty name removes it.
 */
#include "test_util.h"

static int32_t fails(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  return 3;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *cb;
  OK(gkrt_kernel_from_callback(rt, fails, NULL, &cb));
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, 64, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor h = add_tensor(g, 64, GKRT_TENSOR_INTERMEDIATE, "h");
  OK(add_node(g, relu, &x, 1, h, NULL, 0));
  OK(gkrt_graph_add_kernel(g, cb, &h, 1, NULL, 0, NULL, 0, NULL, NULL));

  FAILS(gkrt_graph_set_node_name(g, 0, NULL), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  FAILS(gkrt_graph_set_node_name(g, 2, "nope"), GKRT_STATUS_INVALID_ARGUMENT, "node 2");
  FAILS(gkrt_graph_set_node_name(g, 0, "\xff\xfe"), GKRT_STATUS_INVALID_ARGUMENT, "UTF-8");
  FAILS(gkrt_graph_set_node_name(NULL, 0, "a"), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  OK(gkrt_graph_set_node_name(g, 0, "first"));
  OK(gkrt_graph_set_node_name(g, 0, "")); /* removed */
  OK(gkrt_graph_set_node_name(g, 1, "loss"));
  OK(gkrt_graph_finalize(g));
  FAILS(gkrt_graph_set_node_name(g, 1, "late"), GKRT_STATUS_INVALID_STATE, "final");

  float v[16] = {0};
  OK(gkrt_graph_write_tensor(g, x, v, sizeof v));
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_CALLBACK_FAILED, "node 1 'loss' (host callback)");

  /* A node whose name was removed is named by its index alone. */
  gkrt_graph *g2;
  OK(gkrt_graph_create(rt, &g2));
  gkrt_tensor a = add_tensor(g2, 64, GKRT_TENSOR_INPUT, "a");
  OK(gkrt_graph_add_kernel(g2, cb, &a, 1, NULL, 0, NULL, 0, NULL, NULL));
  OK(gkrt_graph_set_node_name(g2, 0, "gone"));
  OK(gkrt_graph_set_node_name(g2, 0, ""));
  OK(gkrt_graph_finalize(g2));
  OK(gkrt_graph_write_tensor(g2, a, v, sizeof v));
  FAILS(gkrt_runtime_run(rt, g2), GKRT_STATUS_CALLBACK_FAILED, "node 0 (host callback)");
  CHECK(strstr(last_error(), "gone") == NULL);

  OK(gkrt_graph_release(g));
  OK(gkrt_graph_release(g2));
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(relu));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_done("api_node_names");
}
