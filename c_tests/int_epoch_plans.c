/*
 * int_epoch_plans: a graph run again and again places its intermediates by the plan of the run
 * before. Its persistent tensors (the input, the parameter, the output) stay on the device from
 * one run to the next in a lane of the pool of their own, so the compute stream's working range
 * empties at each run's end; on a device with virtual memory the second run is planned from the
 * first and every later run follows its plan to the end (gkrt_stats.pool_epochs_followed), maps
 * no page and reserves nothing more. The runtime has a memory limit: its own streams grow by
 * virtual ranges only under one (gkrt_config.pool_growth, auto). The host backend has no
 * virtual memory: no epochs there.
 * Each run gets a new input, and every output is checked bit-exact against plain C, so a block
 * handed out twice shows up as a wrong number.
 */
#include "test_util.h"

enum { N = 1 << 16, RUNS = 6 }; /* 256 KiB tensors */

static float xv[N], wv[N], yv[N], want[N];

static float relu_ref(float v) { return v > 0.0f ? v : 0.0f; }

/* y = relu(0.5 * relu(x + w) + (x + w)) */
static void reference(void) {
  for (int i = 0; i < N; i++) {
    float a = xv[i] + wv[i];
    float c = 0.5f * relu_ref(a);
    want[i] = relu_ref(c + a);
  }
}

static gkrt_stats stats_now(gkrt_runtime *rt) {
  gkrt_stats s;
  OK(gkrt_runtime_stats_sized(rt, &s, sizeof s));
  CHECK_EQ_U64(s.struct_size, sizeof s);
  return s;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(1ull << 30);
  const int host = test_on_host(rt);
  gkrt_kernel *kadd = builtin_kernel(rt, GKRT_BUILTIN_ADD), *krelu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_kernel *kscale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  const gkrt_tensor_kind I = GKRT_TENSOR_INTERMEDIATE;
  gkrt_tensor x = add_tensor(g, N * 4, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor w = add_tensor(g, N * 4, GKRT_TENSOR_PARAMETER, "w");
  gkrt_tensor a = add_tensor(g, N * 4, I, "a"), b = add_tensor(g, N * 4, I, "b");
  gkrt_tensor c = add_tensor(g, N * 4, I, "c"), d = add_tensor(g, N * 4, I, "d");
  gkrt_tensor y = add_tensor(g, N * 4, GKRT_TENSOR_OUTPUT, "y");
  const float half = 0.5f;
  gkrt_tensor in2[2] = {x, w};
  OK(add_node(g, kadd, in2, 2, a, NULL, 0));
  OK(add_node(g, krelu, &a, 1, b, NULL, 0));
  OK(add_node(g, kscale, &b, 1, c, &half, 4));
  in2[0] = c, in2[1] = a;
  OK(add_node(g, kadd, in2, 2, d, NULL, 0));
  OK(add_node(g, krelu, &d, 1, y, NULL, 0));
  OK(gkrt_graph_finalize(g));

  fill_floats(wv, N, 7);
  OK(gkrt_graph_write_tensor(g, w, wv, sizeof wv));
  gkrt_stats after[RUNS];
  for (int r = 0; r < RUNS; r++) {
    fill_floats(xv, N, 100 + (uint32_t)r);
    OK(gkrt_graph_write_tensor(g, x, xv, sizeof xv));
    OK(gkrt_runtime_run(rt, g));
    OK(gkrt_graph_read_tensor(g, y, yv, sizeof yv));
    reference();
    CHECK_BITS(yv, want, N);
    after[r] = stats_now(rt);
  }
  const gkrt_stats *last = &after[RUNS - 1];
  if (host) {
    CHECK_EQ_U64(last->pool_epochs_followed, 0);
  } else {
    /* Run 1 is logged; runs 2 .. RUNS follow the plan made at run 2's start. */
    CHECK_EQ_U64(last->pool_epochs_followed, RUNS - 1);
    /* From the third run on nothing is mapped and nothing more reserved. */
    CHECK_EQ_U64(last->page_map_count, after[1].page_map_count);
    CHECK_EQ_U64(last->reserved_bytes, after[1].reserved_bytes);
    CHECK_EQ_U64(last->peak_reserved_bytes, after[1].peak_reserved_bytes);
  }
  CHECK_EQ_U64(last->pool_epochs_left, 0);
  /* Persistent tensors only, between runs: x, w, y. */
  CHECK_EQ_U64(last->allocated_bytes, 3 * N * 4);
  printf("epochs followed %llu, left %llu; reserved %llu B (peak %llu), %llu pages mapped in all\n",
         (unsigned long long)last->pool_epochs_followed, (unsigned long long)last->pool_epochs_left,
         (unsigned long long)last->reserved_bytes, (unsigned long long)last->peak_reserved_bytes,
         (unsigned long long)last->page_map_count);

  OK(gkrt_graph_release(g));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_kernel_release(kadd));
  OK(gkrt_kernel_release(krelu));
  OK(gkrt_kernel_release(kscale));
  OK(gkrt_runtime_release(rt));
  return test_done("int_epoch_plans");
}
