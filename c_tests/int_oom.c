/*
 * int_oom: a runtime with a 1 MiB memory limit. A node whose intermediate, or whose workspace,
 * is larger than the limit; two intermediates that fit alone but not together; a tensor write
 * larger than the limit. Each fails with OUT_OF_MEMORY naming the node (where there is one), the
 * tensor and the size; allocated bytes go back to the baseline; failed_alloc_count counts it;
 * and afterwards graphs that fit (one using most of the limit) run correctly on the same runtime.
 */
#include "test_util.h"

#define MIB (1024ull * 1024ull)

int main(void) {
  gkrt_runtime *rt = test_runtime(MIB);
  CHECK_EQ_U64(stats_of(rt).memory_limit, MIB);
  gkrt_kernel *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL), *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_kernel *matmul = builtin_kernel(rt, GKRT_BUILTIN_MATMUL);
  const float one = 1.0f, half = 0.5f;
  float xv[1024], yv[1024];
  fill_floats(xv, 1024, 4);

  /* --- 1. An intermediate of 1.5 MiB: node 0 cannot allocate it. --- */
  gkrt_graph *g1;
  OK(gkrt_graph_create(rt, &g1));
  gkrt_tensor x1 = add_tensor(g1, 4096, GKRT_TENSOR_INPUT, "x1");
  gkrt_tensor big = add_tensor(g1, 1572864, GKRT_TENSOR_INTERMEDIATE, "big_mid");
  gkrt_tensor y1 = add_tensor(g1, 4096, GKRT_TENSOR_OUTPUT, "y1");
  OK(add_node(g1, fill, NULL, 0, big, &one, 4));
  OK(add_node(g1, relu, &x1, 1, y1, NULL, 0));
  OK(gkrt_graph_finalize(g1)); /* finalize only warns: the limit may change by the time it runs */
  OK(gkrt_graph_write_tensor(g1, x1, xv, 4096));
  for (int attempt = 0; attempt < 2; attempt++) {
    gkrt_stats before = stats_of(rt);
    FAILS(gkrt_runtime_run(rt, g1), GKRT_STATUS_OUT_OF_MEMORY, "big_mid");
    MSG_HAS_NODE(0);
    MSG_HAS_U64(1572864);
    gkrt_stats after = stats_of(rt);
    CHECK_EQ_U64(after.allocated_bytes, before.allocated_bytes);
    CHECK_EQ_U64(after.requested_bytes, before.requested_bytes);
    CHECK(after.failed_alloc_count > before.failed_alloc_count);
    CHECK(after.reserved_bytes <= MIB);
    FAILS(gkrt_graph_read_tensor(g1, y1, yv, 4096), GKRT_STATUS_INVALID_STATE, "y1");
  }
  CHECK_RUNTIME_WORKS(rt);

  /* --- 2. A 2 MiB workspace. --- */
  gkrt_graph *g2;
  OK(gkrt_graph_create(rt, &g2));
  gkrt_tensor x2 = add_tensor(g2, 4096, GKRT_TENSOR_INPUT, "x2");
  gkrt_tensor y2 = add_tensor(g2, 4096, GKRT_TENSOR_OUTPUT, "y2");
  const uint64_t ws[1] = {2 * MIB};
  OK(gkrt_graph_add_kernel(g2, relu, &x2, 1, &y2, 1, ws, 1, NULL, NULL));
  OK(gkrt_graph_finalize(g2));
  OK(gkrt_graph_write_tensor(g2, x2, xv, 4096));
  uint64_t before = allocated_bytes(rt);
  FAILS(gkrt_runtime_run(rt, g2), GKRT_STATUS_OUT_OF_MEMORY, "workspace");
  MSG_HAS_NODE(0);
  MSG_HAS_U64(2 * MIB);
  uint64_t after = allocated_bytes(rt);
  CHECK(after == before || after == before + 4096); /* the output's memory may stay */
  before = after;
  FAILS(gkrt_runtime_run(rt, g2), GKRT_STATUS_OUT_OF_MEMORY, "workspace");
  MSG_HAS_U64(2 * MIB);
  CHECK_EQ_U64(allocated_bytes(rt), before);
  CHECK_RUNTIME_WORKS(rt);

  /* --- 3. Two 600 KiB intermediates live together (m1 . m2 -> a 1x1 output): node 1 fails,
   * and node 0's m1 is given back. --- */
  gkrt_graph *g3;
  OK(gkrt_graph_create(rt, &g3));
  gkrt_tensor m1 = add_tensor(g3, 614400, GKRT_TENSOR_INTERMEDIATE, "m1"); /* 1 x 153600 */
  gkrt_tensor m2 = add_tensor(g3, 614400, GKRT_TENSOR_INTERMEDIATE, "m2"); /* 153600 x 1 */
  gkrt_tensor y3 = add_tensor(g3, 4, GKRT_TENSOR_OUTPUT, "y3");
  OK(add_node(g3, fill, NULL, 0, m1, &one, 4));
  OK(add_node(g3, fill, NULL, 0, m2, &half, 4));
  const uint32_t dims3[3] = {1, 1, 153600};
  gkrt_tensor mm3[2] = {m1, m2};
  OK(add_node(g3, matmul, mm3, 2, y3, dims3, sizeof dims3));
  OK(gkrt_graph_finalize(g3));
  CHECK_EQ_U64(info_of(g3).peak_transient_bytes, 2 * 614400);
  gkrt_stats s_before = stats_of(rt);
  FAILS(gkrt_runtime_run(rt, g3), GKRT_STATUS_OUT_OF_MEMORY, "m2");
  MSG_HAS_NODE(1);
  MSG_HAS_U64(614400);
  gkrt_stats s_after = stats_of(rt);
  CHECK_EQ_U64(s_after.allocated_bytes, s_before.allocated_bytes);
  CHECK_EQ_U64(s_after.alloc_count - s_before.alloc_count, s_after.free_count - s_before.free_count);
  CHECK(s_after.failed_alloc_count > s_before.failed_alloc_count);
  CHECK_RUNTIME_WORKS(rt);

  /* --- 4. Writing a 2 MiB input. --- */
  gkrt_graph *g4;
  OK(gkrt_graph_create(rt, &g4));
  gkrt_tensor huge_in = add_tensor(g4, 2 * MIB, GKRT_TENSOR_INPUT, "huge_in");
  gkrt_tensor small_out = add_tensor(g4, 2 * MIB, GKRT_TENSOR_OUTPUT, "huge_out");
  OK(add_node(g4, relu, &huge_in, 1, small_out, NULL, 0));
  OK(gkrt_graph_finalize(g4));
  void *huge = calloc(1, 2 * MIB);
  before = allocated_bytes(rt);
  FAILS(gkrt_graph_write_tensor(g4, huge_in, huge, 2 * MIB), GKRT_STATUS_OUT_OF_MEMORY, "");
  MSG_HAS_U64(2 * MIB);
  CHECK_EQ_U64(allocated_bytes(rt), before);
  FAILS(gkrt_graph_read_tensor(g4, huge_in, huge, 2 * MIB), GKRT_STATUS_INVALID_STATE, "huge_in");
  gkrt_status st = gkrt_runtime_run(rt, g4); /* its input was never written */
  CHECK(st == GKRT_STATUS_INVALID_STATE || st == GKRT_STATUS_INVALID_ARGUMENT);
  MSG_HAS("huge_in");
  CHECK_EQ_U64(allocated_bytes(rt), before);
  free(huge);

  /* --- Graphs that fit still run: release the failed ones, then use 800 KiB of the 1 MiB
   * (two 400 KiB intermediates live together) and check the number. --- */
  OK(gkrt_graph_release(g1));
  OK(gkrt_graph_release(g2));
  OK(gkrt_graph_release(g3));
  OK(gkrt_graph_release(g4));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  gkrt_graph *g5;
  OK(gkrt_graph_create(rt, &g5));
  gkrt_tensor n1 = add_tensor(g5, 409600, GKRT_TENSOR_INTERMEDIATE, "n1"); /* 1 x 102400 */
  gkrt_tensor n2 = add_tensor(g5, 409600, GKRT_TENSOR_INTERMEDIATE, "n2"); /* 102400 x 1 */
  gkrt_tensor y5 = add_tensor(g5, 4, GKRT_TENSOR_OUTPUT, "y5");
  OK(add_node(g5, fill, NULL, 0, n1, &one, 4));
  OK(add_node(g5, fill, NULL, 0, n2, &half, 4));
  const uint32_t dims5[3] = {1, 1, 102400};
  gkrt_tensor mm5[2] = {n1, n2};
  OK(add_node(g5, matmul, mm5, 2, y5, dims5, sizeof dims5));
  OK(gkrt_graph_finalize(g5));
  for (int run = 0; run < 3; run++) {
    OK(gkrt_runtime_run(rt, g5));
    float y = 0;
    OK(gkrt_graph_read_tensor(g5, y5, &y, 4));
    CHECK(y == 51200.0f); /* 102400 * (1 * 0.5), exact */
    CHECK_EQ_U64(allocated_bytes(rt), 256);
  }
  OK(gkrt_graph_release(g5));
  CHECK_RUNTIME_WORKS(rt);
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  OK(gkrt_kernel_release(fill));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(matmul));
  OK(gkrt_runtime_release(rt));
  return test_done("int_oom");
}
