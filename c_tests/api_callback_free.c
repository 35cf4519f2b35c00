/*
 * api_callback_free: gkrt_kernel_from_callback_with_free frees the callback's user data once,
 * when the kernel's handle and every graph using it are gone — not before, not twice — and a
 * call that fails leaves the data to the caller.
 */
#include "test_util.h"

static int frees;
static int calls;

static void free_counter(void *user) {
  CHECK(user == &calls);
  frees++;
}

static int32_t count_call(const gkrt_callback_args *args, void *user) {
  (void)args;
  (*(int *)user)++;
  return 0;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *k = NULL;

  /* A failed call frees nothing. */
  FAILS(gkrt_kernel_from_callback_with_free(rt, NULL, &calls, free_counter, &k), GKRT_STATUS_INVALID_ARGUMENT,
        "callback");
  FAILS(gkrt_kernel_from_callback_with_free(rt, count_call, &calls, free_counter, NULL),
        GKRT_STATUS_INVALID_ARGUMENT, "out");
  CHECK_EQ_U64(frees, 0);

  /* Used by two graphs: freed after the kernel and both graphs are released, once. */
  OK(gkrt_kernel_from_callback_with_free(rt, count_call, &calls, free_counter, &k));
  gkrt_graph *g[2];
  for (int i = 0; i < 2; i++) {
    OK(gkrt_graph_create(rt, &g[i]));
    gkrt_tensor x = add_tensor(g[i], 64, GKRT_TENSOR_INPUT, "x");
    OK(gkrt_graph_add_kernel(g[i], k, &x, 1, NULL, 0, NULL, 0, NULL, NULL));
    OK(gkrt_graph_finalize(g[i]));
    float v[16] = {0};
    OK(gkrt_graph_write_tensor(g[i], x, v, sizeof v));
  }
  OK(gkrt_kernel_release(k));
  CHECK_EQ_U64(frees, 0);
  OK(gkrt_runtime_run(rt, g[0])); /* the graphs still call it */
  OK(gkrt_graph_release(g[0]));
  CHECK_EQ_U64(frees, 0);
  OK(gkrt_runtime_run(rt, g[1]));
  CHECK_EQ_U64(calls, 2);
  OK(gkrt_graph_release(g[1]));
  CHECK_EQ_U64(frees, 1);

  /* A kernel no graph uses: freed at its release. A NULL free function frees nothing. */
  OK(gkrt_kernel_from_callback_with_free(rt, count_call, &calls, free_counter, &k));
  OK(gkrt_kernel_release(k));
  CHECK_EQ_U64(frees, 2);
  OK(gkrt_kernel_from_callback_with_free(rt, count_call, &calls, NULL, &k));
  OK(gkrt_kernel_release(k));
  CHECK_EQ_U64(frees, 2);

  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_done("api_callback_free");
}
