/*
 * gkrt_graph_info.min_memory_limit: the smallest memory limit a graph can run under, swapping.
 * A chain x -> +w0 -> +w1 ... -> y whose persistent tensors alone exceed that limit: the figure is
 * three tensors (a node's two inputs and its output); the graph runs at exactly that limit, with
 * results equal to an unlimited run, and 256 bytes below it fails with OUT_OF_MEMORY naming a node
 * (the runtime stays usable). A graph that is not finalized reports 0.
 */
#include "test_util.h"

enum { N = 1024, LAYERS = 6 };
#define BYTES ((uint64_t)N * 4)

static gkrt_graph *chain(gkrt_runtime *rt, gkrt_tensor *x, gkrt_tensor *w, gkrt_tensor *y) {
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  *x = add_tensor(g, BYTES, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor prev = *x;
  for (int i = 0; i < LAYERS; i++) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    w[i] = add_tensor(g, BYTES, GKRT_TENSOR_PARAMETER, name);
    gkrt_tensor out = i == LAYERS - 1 ? (*y = add_tensor(g, BYTES, GKRT_TENSOR_OUTPUT, "y"))
                                      : add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, "h");
    gkrt_tensor in[2] = {prev, w[i]};
    OK(add_node(g, add, in, 2, out, NULL, 0));
    prev = out;
  }
  OK(gkrt_kernel_release(add));
  return g;
}

/* Runs the chain under `limit`; returns the status of the run, the output in `out`. */
static gkrt_status run_at(uint64_t limit, float *out, uint64_t *min_limit) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, GKRT_MEMORY_DYNAMIC, limit, 0, 1);
  gkrt_tensor x, w[LAYERS], y = 0;
  gkrt_graph *g = chain(rt, &x, w, &y);
  CHECK_EQ_U64(info_of(g).min_memory_limit, 0); /* not finalized yet */
  OK(gkrt_graph_finalize(g));
  gkrt_graph_info info = info_of(g);
  *min_limit = info.min_memory_limit;
  float *v = alloc_floats(N);
  fill_floats(v, N, 1);
  OK(gkrt_graph_write_tensor(g, x, v, BYTES));
  for (int i = 0; i < LAYERS; i++) {
    fill_floats(v, N, 10 + i);
    OK(gkrt_graph_write_tensor(g, w[i], v, BYTES));
  }
  gkrt_status s = gkrt_runtime_run(rt, g);
  if (s == GKRT_STATUS_OK) {
    OK(gkrt_graph_read_tensor(g, y, out, BYTES));
  } else {
    CHECK(s == GKRT_STATUS_OUT_OF_MEMORY);
    CHECK(strstr(last_error(), "node") != NULL);
    CHECK_RUNTIME_WORKS(rt);
  }
  free(v);
  OK(gkrt_graph_release(g));
  OK(gkrt_runtime_release(rt));
  return s;
}

int main(void) {
  float *want = alloc_floats(N), *got = alloc_floats(N);
  uint64_t min_limit = 0;
  OK(run_at(0, want, &min_limit));
  /* A node's two inputs and its output; the persistent tensors alone (x, 6 weights, y) are more. */
  CHECK_EQ_U64(min_limit, 3 * BYTES);
  CHECK((LAYERS + 2) * BYTES > min_limit);

  uint64_t again = 0;
  OK(run_at(min_limit, got, &again));
  CHECK_EQ_U64(again, min_limit);
  CHECK(memcmp(got, want, BYTES) == 0);

  gkrt_status s = run_at(min_limit - 256, got, &again);
  CHECK(s == GKRT_STATUS_OUT_OF_MEMORY);
  free(want);
  free(got);
  return test_done("int_min_limit");
}
