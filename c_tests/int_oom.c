/*
 * int_oom: a runtime with a 1 MiB memory limit. A node whose intermediate, or whose workspace,
 * is larger than the limit; a node that needs two earlier intermediates and a workspace that
 * together exceed it; an input larger than the limit. Each run fails with OUT_OF_MEMORY naming
 * the node, the tensor and the size; nothing leaks (a repeated failure leaves allocated bytes
 * exactly where they were); and afterwards graphs that fit (one using most of the limit) run
 * correctly on the same runtime.
 */
#include "test_util.h"

#define MIB (1024ull * 1024ull)

static int sink_calls;

static int32_t sink_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  sink_calls++;
  return 0;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(MIB);
  CHECK_EQ_U64(stats_of(rt).memory_limit, MIB);
  gkrt_kernel *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL), *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_kernel *matmul = builtin_kernel(rt, GKRT_BUILTIN_MATMUL), *sink = NULL;
  OK(gkrt_kernel_from_callback(rt, sink_cb, NULL, &sink));
  const float one = 1.0f, half = 0.5f;
  float xv[1024], yv[1024];
  fill_floats(xv, 1024, 4);

  /* --- 1. An intermediate of 1.5 MiB: node 0 cannot have it, whatever else is moved out of
   * the way. A failed run leaks nothing: at most the graph's persistent tensors (which a run
   * brings in) are added, and a second failed run changes nothing at all. --- */
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
    if (attempt == 0) {
      CHECK(after.allocated_bytes <= before.allocated_bytes + info_of(g1).persistent_bytes);
    } else {
      CHECK_EQ_U64(after.allocated_bytes, before.allocated_bytes);
      CHECK_EQ_U64(after.requested_bytes, before.requested_bytes);
    }
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
  CHECK(after <= before + info_of(g2).persistent_bytes); /* x2 and y2 at most */
  before = after;
  FAILS(gkrt_runtime_run(rt, g2), GKRT_STATUS_OUT_OF_MEMORY, "workspace");
  MSG_HAS_NODE(0);
  MSG_HAS_U64(2 * MIB);
  CHECK_EQ_U64(allocated_bytes(rt), before);
  CHECK_RUNTIME_WORKS(rt);

  /* --- 3. Nodes 0 and 1 make two 300 KiB intermediates; node 2 reads both and wants a 600 KiB
   * workspace: 1.2 MiB at once. Node 2 fails, naming itself and a size (its workspace, or its
   * total), and the intermediates of nodes 0 and 1 are given back (the graph has no persistent
   * tensors, so allocated bytes must be exactly where they were). --- */
  gkrt_graph *g3;
  OK(gkrt_graph_create(rt, &g3));
  gkrt_tensor m1 = add_tensor(g3, 307200, GKRT_TENSOR_INTERMEDIATE, "m1");
  gkrt_tensor m2 = add_tensor(g3, 307200, GKRT_TENSOR_INTERMEDIATE, "m2");
  OK(add_node(g3, fill, NULL, 0, m1, &one, 4));
  OK(add_node(g3, fill, NULL, 0, m2, &half, 4));
  gkrt_tensor m12[2] = {m1, m2};
  const uint64_t ws3[1] = {614400};
  OK(gkrt_graph_add_kernel(g3, sink, m12, 2, NULL, 0, ws3, 1, NULL, NULL));
  OK(gkrt_graph_finalize(g3));
  CHECK_EQ_U64(info_of(g3).peak_transient_bytes, 4 * 307200);
  for (int attempt = 0; attempt < 2; attempt++) {
    gkrt_stats s_before = stats_of(rt);
    FAILS(gkrt_runtime_run(rt, g3), GKRT_STATUS_OUT_OF_MEMORY, "node 2");
    if (!mentions_u64(last_error(), 614400) && !mentions_u64(last_error(), 4 * 307200)) {
      fprintf(stderr, "%s:%d: message \"%s\" names neither the workspace's size nor the node's total\n", __FILE__,
              __LINE__, last_error());
      test_failures++;
    }
    gkrt_stats s_after = stats_of(rt);
    CHECK_EQ_U64(s_after.allocated_bytes, s_before.allocated_bytes);
    CHECK_EQ_U64(s_after.requested_bytes, s_before.requested_bytes);
    CHECK_EQ_U64(s_after.alloc_count - s_before.alloc_count, s_after.free_count - s_before.free_count);
  }
  CHECK_EQ_U64(sink_calls, 0); /* the node never ran */
  CHECK_RUNTIME_WORKS(rt);

  /* --- 4. A 2 MiB input under a 1 MiB limit. The write may fail (OUT_OF_MEMORY naming the
   * size, and then the tensor has no contents), or the runtime may keep the data off the device
   * (then it reads back exactly); either way a run that needs it on the device fails with
   * OUT_OF_MEMORY naming the node, and leaks nothing. --- */
  gkrt_graph *g4;
  OK(gkrt_graph_create(rt, &g4));
  gkrt_tensor huge_in = add_tensor(g4, 2 * MIB, GKRT_TENSOR_INPUT, "huge_in");
  gkrt_tensor small_out = add_tensor(g4, 4, GKRT_TENSOR_OUTPUT, "small_out");
  const uint32_t dims4[3] = {1, 1, 524288};
  gkrt_tensor hh[2] = {huge_in, huge_in};
  OK(add_node(g4, matmul, hh, 2, small_out, dims4, sizeof dims4));
  OK(gkrt_graph_finalize(g4));
  unsigned char *huge = malloc(2 * MIB), *huge_back = malloc(2 * MIB);
  for (size_t i = 0; i < 2 * MIB / 4; i++) ((float *)huge)[i] = 0.25f;
  before = allocated_bytes(rt);
  gkrt_status st = gkrt_graph_write_tensor(g4, huge_in, huge, 2 * MIB);
  if (st == GKRT_STATUS_OK) {
    OK(gkrt_graph_read_tensor(g4, huge_in, huge_back, 2 * MIB));
    CHECK(memcmp(huge, huge_back, 2 * MIB) == 0);
    CHECK(allocated_bytes(rt) <= MIB);
    FAILS(gkrt_runtime_run(rt, g4), GKRT_STATUS_OUT_OF_MEMORY, "node 0");
    MSG_HAS_U64(2 * MIB);
    uint64_t held = allocated_bytes(rt);
    FAILS(gkrt_runtime_run(rt, g4), GKRT_STATUS_OUT_OF_MEMORY, "node 0");
    CHECK_EQ_U64(allocated_bytes(rt), held);
    FAILS(gkrt_graph_read_tensor(g4, small_out, huge_back, 4), GKRT_STATUS_INVALID_STATE, "small_out");
  } else {
    CHECK_EQ_U64(st, GKRT_STATUS_OUT_OF_MEMORY);
    MSG_HAS_U64(2 * MIB);
    CHECK_EQ_U64(allocated_bytes(rt), before);
    FAILS(gkrt_graph_read_tensor(g4, huge_in, huge_back, 2 * MIB), GKRT_STATUS_INVALID_STATE, "huge_in");
    st = gkrt_runtime_run(rt, g4); /* its input was never written */
    CHECK(st == GKRT_STATUS_INVALID_STATE || st == GKRT_STATUS_INVALID_ARGUMENT);
    MSG_HAS("huge_in");
    CHECK_EQ_U64(allocated_bytes(rt), before);
  }
  free(huge);
  free(huge_back);
  CHECK_RUNTIME_WORKS(rt);

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

  /* A node that reads one 400 KiB tensor twice needs it once: m, then k = m + m, then
   * y = k . k — 800 KiB live at most, which fits. */
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_graph *g6;
  OK(gkrt_graph_create(rt, &g6));
  gkrt_tensor p1 = add_tensor(g6, 409600, GKRT_TENSOR_INTERMEDIATE, "p1");
  gkrt_tensor p2 = add_tensor(g6, 409600, GKRT_TENSOR_INTERMEDIATE, "p2");
  gkrt_tensor y6 = add_tensor(g6, 4, GKRT_TENSOR_OUTPUT, "y6");
  OK(add_node(g6, fill, NULL, 0, p1, &one, 4));
  gkrt_tensor p11[2] = {p1, p1}, p22[2] = {p2, p2};
  OK(add_node(g6, add, p11, 2, p2, NULL, 0));
  OK(add_node(g6, matmul, p22, 2, y6, dims5, sizeof dims5));
  OK(gkrt_graph_finalize(g6));
  OK(gkrt_runtime_run(rt, g6));
  float y6v = 0;
  OK(gkrt_graph_read_tensor(g6, y6, &y6v, 4));
  CHECK(y6v == 409600.0f); /* 102400 * (2 * 2) */
  OK(gkrt_graph_release(g6));
  OK(gkrt_kernel_release(add));
  CHECK_RUNTIME_WORKS(rt);
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  OK(gkrt_kernel_release(fill));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(matmul));
  OK(gkrt_kernel_release(sink));
  OK(gkrt_runtime_release(rt));
  return test_done("int_oom");
}
