/*
 * leak_cycles: creating and releasing runtimes, kernels and graphs over and over (releasing in
 * a rotating order, with 4 MiB tensors written, run and read each time) leaks nothing: within a
 * held runtime allocated bytes return to zero after each graph; on the host backend, where
 * "device" memory is process memory, the resident set stays flat (a leaked runtime or graph
 * would add megabytes per cycle).
 */
#include "test_util.h"

/* CYCLES by default; GKRT_TEST_LEAK_CYCLES=n (at least 4: every release order) runs fewer, as
 * scripts/gpu/run.sh sanitize does, where each runtime's module loads are slow. */
enum { CYCLES = 60, WARMUP = 10, N = 1 << 20 /* floats: 4 MiB */ };

static long resident_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long size = 0, resident = -1;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * 4096;
}

static int32_t touch_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  ++*(int *)user;
  return 0;
}

int main(void) {
  float *xv = alloc_floats(N), *yv = alloc_floats(N);
  fill_floats(xv, N, 8);
  long rss_after_warmup = -1;
  int host = 0, cb_calls = 0, cycles = CYCLES;
  const char *env_cycles = getenv("GKRT_TEST_LEAK_CYCLES");
  if (env_cycles && atoi(env_cycles) >= 4 && atoi(env_cycles) <= CYCLES) cycles = atoi(env_cycles);
  if (cycles != CYCLES) printf("leak_cycles: %d cycles (GKRT_TEST_LEAK_CYCLES)\n", cycles);
  for (int cycle = 0; cycle < cycles; cycle++) {
    gkrt_runtime *rt = test_runtime(0);
    host = test_on_host(rt);
    gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *cb = NULL;
    OK(gkrt_kernel_from_callback(rt, touch_cb, &cb_calls, &cb));
    gkrt_graph *g, *g_unused;
    OK(gkrt_graph_create(rt, &g));
    OK(gkrt_graph_create(rt, &g_unused));
    gkrt_tensor x = add_tensor(g, N * 4ull, GKRT_TENSOR_INPUT, "x");
    gkrt_tensor m = add_tensor(g, N * 4ull, GKRT_TENSOR_INTERMEDIATE, "m");
    gkrt_tensor y = add_tensor(g, N * 4ull, GKRT_TENSOR_OUTPUT, "y");
    add_tensor(g_unused, N * 4ull, GKRT_TENSOR_INPUT, "unused");
    OK(add_node(g, relu, &x, 1, m, NULL, 0));
    const uint64_t ws = 1 << 20;
    OK(gkrt_graph_add_kernel(g, cb, &m, 1, NULL, 0, &ws, 1, NULL, NULL));
    OK(add_node(g, relu, &m, 1, y, NULL, 0));
    OK(gkrt_graph_finalize(g));
    OK(gkrt_graph_write_tensor(g, x, xv, N * 4ull));
    OK(gkrt_runtime_run(rt, g));
    OK(gkrt_graph_read_tensor(g, y, yv, N * 4ull));
    if (cycle == 0)
      for (int i = 0; i < N; i++) CHECK(memcmp(&yv[i], &(float){xv[i] > 0.0f ? xv[i] : 0.0f}, 4) == 0);
    CHECK_EQ_U64(allocated_bytes(rt), 2 * 4ull * N); /* x and y stay; m and the workspace went back */
    switch (cycle % 4) {
      case 0: /* graph, kernels, runtime */
        OK(gkrt_graph_release(g));
        CHECK_EQ_U64(allocated_bytes(rt), 0);
        OK(gkrt_kernel_release(relu));
        OK(gkrt_kernel_release(cb));
        OK(gkrt_runtime_release(rt));
        break;
      case 1: /* runtime first */
        OK(gkrt_runtime_release(rt));
        OK(gkrt_kernel_release(cb));
        OK(gkrt_graph_release(g));
        OK(gkrt_kernel_release(relu));
        break;
      case 2: /* kernels, runtime, graph */
        OK(gkrt_kernel_release(relu));
        OK(gkrt_kernel_release(cb));
        OK(gkrt_runtime_release(rt));
        OK(gkrt_graph_release(g));
        break;
      default: /* graph, runtime, kernels */
        OK(gkrt_graph_release(g));
        OK(gkrt_runtime_release(rt));
        OK(gkrt_kernel_release(cb));
        OK(gkrt_kernel_release(relu));
        break;
    }
    OK(gkrt_graph_release(g_unused));
    if (cycle == WARMUP - 1) rss_after_warmup = resident_bytes();
  }
  CHECK_EQ_U64(cb_calls, cycles);
  long rss_end = resident_bytes();
  /* Under ASan or valgrind (GKRT_TEST_NO_RSS set) the resident set says nothing: the tool's own
   * bookkeeping grows it, and the tool checks for leaks itself. */
  const char *no_rss = getenv("GKRT_TEST_NO_RSS");
  if (host && cycles == CYCLES && rss_after_warmup > 0 && rss_end > 0 &&
      !(no_rss && *no_rss && strcmp(no_rss, "0") != 0)) {
    long growth = rss_end - rss_after_warmup;
    printf("resident set: %ld MiB after warm-up, %ld MiB at the end\n", rss_after_warmup >> 20, rss_end >> 20);
    /* Each cycle touches 8 MiB of tensors plus 5 MiB of transients: a leak of any of it over 50
     * cycles would be hundreds of MiB. */
    CHECK(growth < 48l * 1024 * 1024);
  }
  free(xv);
  free(yv);
  gkrt_runtime *rt = test_runtime(0);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_done("leak_cycles");
}
