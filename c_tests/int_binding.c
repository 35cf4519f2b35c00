/*
 * int_binding: gkrt_graph_bind_tensor / gkrt_graph_unbind_tensor, in dynamic and planned mode.
 * Inputs, a parameter and an output bound to gkrt_malloc memory are read and written in place:
 * the host changes the bound input's memory between runs with no gkrt call and the next run sees
 * it; the output appears in the bound memory; no pool memory is taken for them and nothing is
 * copied (no pool allocation for the output, no swap copy). Rebinding between runs, unbinding
 * (the tensor is then unwritten), writes and reads through a bound tensor, every error (NULL
 * pointer, too few bytes, an intermediate, a foreign tensor, before finalize, a swapping
 * graph) with the tensor named, and release of a graph leaving the host's memory alone.
 */
#include "dev_mem.h"
#include "test_util.h"

enum { N = 256, BYTES = N * 4 };

static void expect_y(const float *x, const float *w, const void *ybuf) {
  float want[N], got[N];
  for (int i = 0; i < N; i++) want[i] = (x[i] + w[i]) * 2.0f;
  dev_get(got, ybuf, BYTES);
  CHECK_BITS(got, want, N);
}

static void run_mode(gkrt_memory_mode mode) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, mode, 0, 0, 1);
  cbdev_init(rt);
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD), *scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  gkrt_graph *g, *other;
  OK(gkrt_graph_create(rt, &g));
  OK(gkrt_graph_create(rt, &other));
  gkrt_tensor x = add_tensor(g, BYTES, GKRT_TENSOR_INPUT, "x_in");
  gkrt_tensor w = add_tensor(g, BYTES, GKRT_TENSOR_PARAMETER, "w_param");
  gkrt_tensor mid = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, "mid_t");
  gkrt_tensor y = add_tensor(g, BYTES, GKRT_TENSOR_OUTPUT, "y_out");
  gkrt_tensor foreign = add_tensor(other, BYTES, GKRT_TENSOR_INPUT, "foreign_in");
  gkrt_tensor xw[2] = {x, w};
  const float two = 2.0f;
  OK(add_node(g, add, xw, 2, mid, NULL, 0));
  OK(add_node(g, scale, &mid, 1, y, &two, sizeof two));

  void *xb = dev_alloc(rt, BYTES), *wb = dev_alloc(rt, BYTES), *yb = dev_alloc(rt, BYTES);
  void *xb2 = dev_alloc(rt, BYTES), *yb2 = dev_alloc(rt, 2 * BYTES);
  float xv[N], wv[N], xv2[N], tmp[N];
  fill_floats(xv, N, 1);
  fill_floats(wv, N, 2);
  fill_floats(xv2, N, 3);
  dev_put(xb, xv, BYTES);
  dev_put(wb, wv, BYTES);
  dev_put(xb2, xv2, BYTES);

  /* --- Before finalize: refused, naming the tensor. --- */
  FAILS(gkrt_graph_bind_tensor(g, x, xb, BYTES), GKRT_STATUS_INVALID_STATE, "x_in");
  MSG_HAS("finalize");
  OK(gkrt_graph_finalize(g));

  /* --- Errors: each names the tensor (and the sizes); nothing is bound after them. --- */
  FAILS(gkrt_graph_bind_tensor(g, x, NULL, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "x_in");
  MSG_HAS("NULL");
  FAILS(gkrt_graph_bind_tensor(g, x, xb, BYTES - 4), GKRT_STATUS_INVALID_ARGUMENT, "x_in");
  MSG_HAS_U64(BYTES - 4);
  MSG_HAS_U64(BYTES);
  FAILS(gkrt_graph_bind_tensor(g, mid, xb, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "mid_t");
  MSG_HAS("intermediate");
  FAILS(gkrt_graph_unbind_tensor(g, mid), GKRT_STATUS_INVALID_ARGUMENT, "mid_t");
  FAILS(gkrt_graph_bind_tensor(g, foreign, xb, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "");
  FAILS(gkrt_graph_bind_tensor(NULL, x, xb, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "");
  FAILS(gkrt_graph_tensor_is_bound(g, x, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  uint32_t bound = 7;
  OK(gkrt_graph_tensor_is_bound(g, x, &bound));
  CHECK_EQ_U64(bound, 0);
  /* The failed binds left x unwritten. */
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_INVALID_STATE, "x_in");
  CHECK_RUNTIME_WORKS(rt);

  /* --- Bound: in place, no pool memory, no copies. --- */
  OK(gkrt_graph_bind_tensor(g, x, xb, BYTES));
  OK(gkrt_graph_bind_tensor(g, w, wb, BYTES));
  OK(gkrt_graph_bind_tensor(g, y, yb2, 2 * BYTES)); /* more than the tensor needs is fine */
  OK(gkrt_graph_bind_tensor(g, y, yb, BYTES));      /* rebound before any run */
  OK(gkrt_graph_tensor_is_bound(g, y, &bound));
  CHECK_EQ_U64(bound, 1);
  const gkrt_stats before = stats_of(rt);
  OK(gkrt_runtime_run(rt, g));
  const gkrt_stats after = stats_of(rt);
  expect_y(xv, wv, yb);
  /* The output got no pool block (an unbound output's first run allocates it). */
  CHECK_EQ_U64(after.last_run_pool_allocs, mode == GKRT_MEMORY_PLANNED ? 0 : 1 /* mid */);
  CHECK_EQ_U64(after.swap_in_bytes + after.swap_out_bytes, 0);
  if (mode == GKRT_MEMORY_DYNAMIC) CHECK_EQ_U64(after.allocated_bytes, before.allocated_bytes);
  /* Reads go to the bound memory. */
  OK(gkrt_graph_read_tensor(g, y, tmp, BYTES));
  {
    float want[N];
    dev_get(want, yb, BYTES);
    CHECK_BITS(tmp, want, N);
  }
  const uint64_t steady = allocated_bytes(rt);

  /* The host changes the bound input in place; the next run reads the new contents. */
  for (int round = 0; round < 3; round++) {
    xv[round] += 1.0f;
    dev_put(xb, xv, BYTES);
    OK(gkrt_runtime_run(rt, g));
    expect_y(xv, wv, yb);
    CHECK_EQ_U64(stats_of(rt).last_run_pool_allocs, mode == GKRT_MEMORY_PLANNED ? 0 : 1);
    CHECK_EQ_U64(allocated_bytes(rt), steady);
  }

  /* --- Rebinding between runs: the input, then the output (the old output stays as it was). --- */
  OK(gkrt_graph_bind_tensor(g, x, xb2, BYTES));
  OK(gkrt_runtime_run(rt, g));
  expect_y(xv2, wv, yb);
  OK(gkrt_graph_bind_tensor(g, y, yb2, 2 * BYTES));
  OK(gkrt_graph_bind_tensor(g, x, xb, BYTES));
  OK(gkrt_runtime_run(rt, g));
  expect_y(xv, wv, yb2);
  expect_y(xv2, wv, yb);
  OK(gkrt_graph_bind_tensor(g, x, xb, BYTES)); /* the same address again */
  OK(gkrt_runtime_run(rt, g));
  expect_y(xv, wv, yb2);
  CHECK_EQ_U64(allocated_bytes(rt), steady);

  /* --- Writes through a bound tensor land in the bound memory. --- */
  float wv2[N];
  fill_floats(wv2, N, 4);
  OK(gkrt_graph_write_tensor(g, w, wv2, BYTES));
  dev_get(tmp, wb, BYTES);
  CHECK_BITS(tmp, wv2, N);
  OK(gkrt_runtime_run(rt, g));
  expect_y(xv, wv2, yb2);

  /* --- Unbinding: unwritten again, then an ordinary pool-held tensor. --- */
  OK(gkrt_graph_unbind_tensor(g, x));
  OK(gkrt_graph_unbind_tensor(g, x)); /* not bound: a no-op */
  OK(gkrt_graph_tensor_is_bound(g, x, &bound));
  CHECK_EQ_U64(bound, 0);
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_INVALID_STATE, "x_in");
  OK(gkrt_graph_write_tensor(g, x, xv2, BYTES));
  CHECK_EQ_U64(allocated_bytes(rt), steady + BYTES);
  OK(gkrt_runtime_run(rt, g));
  expect_y(xv2, wv2, yb2);
  /* Binding a tensor that holds a pool block returns the block. */
  OK(gkrt_graph_bind_tensor(g, x, xb, BYTES));
  CHECK_EQ_U64(allocated_bytes(rt), steady);
  OK(gkrt_runtime_run(rt, g));
  expect_y(xv, wv2, yb2);
  /* An output unbound after a run: produced into a pool block by the next. */
  OK(gkrt_graph_unbind_tensor(g, y));
  FAILS(gkrt_graph_read_tensor(g, y, tmp, BYTES), GKRT_STATUS_INVALID_STATE, "y_out");
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, tmp, BYTES));
  {
    float want[N];
    for (int i = 0; i < N; i++) want[i] = (xv[i] + wv2[i]) * 2.0f;
    CHECK_BITS(tmp, want, N);
  }
  CHECK_EQ_U64(allocated_bytes(rt), steady + BYTES);

  /* --- Releasing the graph leaves the host's memory alone: each is still a live block. --- */
  OK(gkrt_graph_release(g));
  OK(gkrt_graph_release(other));
  OK(gkrt_free(rt, xb, NULL));
  OK(gkrt_free(rt, wb, NULL));
  OK(gkrt_free(rt, yb, NULL));
  OK(gkrt_free(rt, xb2, NULL));
  OK(gkrt_free(rt, yb2, NULL));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_kernel_release(add));
  OK(gkrt_kernel_release(scale));
  OK(gkrt_runtime_release(rt));
}

/* A graph that swaps moves persistent tensors: binding is refused, with the reason. */
static void swapping_graph(void) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, GKRT_MEMORY_DYNAMIC, 6 * 4096, 0, 1);
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor a = add_tensor(g, 4096, GKRT_TENSOR_INPUT, "a_in");
  gkrt_tensor b = add_tensor(g, 4096, GKRT_TENSOR_PARAMETER, "b_param");
  gkrt_tensor c = add_tensor(g, 4096, GKRT_TENSOR_PARAMETER, "c_param");
  gkrt_tensor d = add_tensor(g, 4096, GKRT_TENSOR_PARAMETER, "d_param");
  gkrt_tensor m1 = add_tensor(g, 4096, GKRT_TENSOR_INTERMEDIATE, "m1");
  gkrt_tensor m2 = add_tensor(g, 4096, GKRT_TENSOR_INTERMEDIATE, "m2");
  gkrt_tensor y = add_tensor(g, 4096, GKRT_TENSOR_OUTPUT, "y_out");
  gkrt_tensor ab[2] = {a, b}, m1c[2] = {m1, c}, m2d[2] = {m2, d};
  OK(add_node(g, add, ab, 2, m1, NULL, 0));
  OK(add_node(g, add, m1c, 2, m2, NULL, 0));
  OK(add_node(g, add, m2d, 2, y, NULL, 0));
  OK(gkrt_graph_finalize(g));
  void *p = dev_alloc(rt, 4096);
  FAILS(gkrt_graph_bind_tensor(g, a, p, 4096), GKRT_STATUS_INVALID_STATE, "a_in");
  MSG_HAS("swap");
  OK(gkrt_free(rt, p, NULL));
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(add));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

int main(void) {
  run_mode(GKRT_MEMORY_DYNAMIC);
  run_mode(GKRT_MEMORY_PLANNED);
  swapping_graph();
  return test_done("int_binding");
}
