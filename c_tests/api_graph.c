/*
 * api_graph: gkrt_graph_create / add_tensor / add_kernel / finalize / get_info / release and
 * run's graph checks. Bad input of every kind (NULL handles and pointers, zero and huge sizes,
 * bad kinds, unknown and foreign tensor ids, intermediates and outputs read before any node
 * writes them, duplicate outputs, zero launch dimensions, bad workspaces, built-in shape
 * errors, a kernel of another runtime, edits after finalize, finalize of an empty graph or one
 * with an unwritten output, running an unfinalized graph) gets an error status and a message
 * naming what is at fault; a failed call changes nothing, and the graph and runtime keep
 * working.
 */
#include "test_util.h"

static int32_t noop_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  return 0;
}

/* add_kernel with a single output and a launch carrying `params`, expecting failure. */
#define NODE_FAILS(g, k, in, nin, out, params, psize, status, needle)                                \
  do {                                                                                               \
    gkrt_tensor out_ = (out);                                                                        \
    gkrt_launch l_ = {{1, 1, 1}, {1, 1, 1}, 0, (params), (psize)};                                   \
    uint32_t node_ = 0xabcdu;                                                                        \
    FAILS(gkrt_graph_add_kernel((g), (k), (in), (nin), &out_, 1, NULL, 0, &l_, &node_), (status),    \
          (needle));                                                                                 \
    CHECK_EQ_U64(node_, 0xabcdu);                                                                    \
  } while (0)

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_runtime *rt2 = test_runtime(0);

  /* --- gkrt_graph_create --- */
  gkrt_graph *g = (gkrt_graph *)(uintptr_t)0x5e47;
  FAILS(gkrt_graph_create(NULL, &g), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  CHECK(g == (gkrt_graph *)(uintptr_t)0x5e47);
  FAILS(gkrt_graph_create(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  OK(gkrt_graph_create(rt, &g));
  gkrt_graph *g2, *g3;
  OK(gkrt_graph_create(rt, &g2));
  OK(gkrt_graph_create(rt, &g3));
  CHECK(g != g2 && g2 != g3);

  /* --- gkrt_graph_add_tensor: kinds, sizes, names, out. --- */
  gkrt_tensor t = 0x5e47;
  FAILS(gkrt_graph_add_tensor(NULL, 16, GKRT_TENSOR_INPUT, "t", &t), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_add_tensor(g3, 16, GKRT_TENSOR_INPUT, "t", NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_graph_add_tensor(g3, 0, GKRT_TENSOR_INPUT, "zero_t", &t), GKRT_STATUS_INVALID_ARGUMENT, "zero_t");
  MSG_HAS_U64(0);
  FAILS(gkrt_graph_add_tensor(g3, 0, GKRT_TENSOR_INTERMEDIATE, "zero_mid", &t), GKRT_STATUS_INVALID_ARGUMENT,
        "zero_mid");
  FAILS(gkrt_graph_add_tensor(g3, 1ull << 60, GKRT_TENSOR_INTERMEDIATE, "huge_t", &t),
        GKRT_STATUS_INVALID_ARGUMENT, "huge_t");
  MSG_HAS_U64(1ull << 60);
  FAILS(gkrt_graph_add_tensor(g3, (1ull << 48) + 1, GKRT_TENSOR_OUTPUT, "just_too_big", &t),
        GKRT_STATUS_INVALID_ARGUMENT, "just_too_big");
  MSG_HAS_U64((1ull << 48) + 1);
  FAILS(gkrt_graph_add_tensor(g3, UINT64_MAX, GKRT_TENSOR_INPUT, NULL, &t), GKRT_STATUS_INVALID_ARGUMENT, "size");
  MSG_HAS_U64(UINT64_MAX);
  FAILS(gkrt_graph_add_tensor(g3, 16, 77, "bad_kind", &t), GKRT_STATUS_INVALID_ARGUMENT, "kind");
  MSG_HAS_U64(77);
  FAILS(gkrt_graph_add_tensor(g3, 16, 0xFFFFFFFFu, "bad_kind", &t), GKRT_STATUS_INVALID_ARGUMENT, "kind");
  CHECK_EQ_U64(t, 0x5e47); /* no failure wrote the out-parameter */
  CHECK_EQ_U64(info_of(g3).num_tensors, 0); /* and none added a tensor */
  /* The largest size (2^48) is accepted; so are 1 byte, odd sizes and a NULL name. */
  gkrt_tensor max_t = add_tensor(g3, 1ull << 48, GKRT_TENSOR_INTERMEDIATE, "max_t");
  gkrt_tensor one_t = add_tensor(g3, 1, GKRT_TENSOR_INPUT, "one_byte");
  gkrt_tensor odd6 = add_tensor(g3, 6, GKRT_TENSOR_INTERMEDIATE, "odd6");
  gkrt_tensor unnamed = add_tensor(g3, 16, GKRT_TENSOR_PARAMETER, NULL);
  CHECK(max_t != one_t && one_t != odd6 && odd6 != unnamed);
  CHECK_EQ_U64(info_of(g3).num_tensors, 4);

  /* The main graph's tensors. */
  gkrt_tensor x = add_tensor(g, 1024, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor w = add_tensor(g, 1024, GKRT_TENSOR_PARAMETER, "w");
  gkrt_tensor big = add_tensor(g, 2048, GKRT_TENSOR_INPUT, "big");
  gkrt_tensor nwm = add_tensor(g, 1024, GKRT_TENSOR_INTERMEDIATE, "never_written_mid");
  gkrt_tensor uwo = add_tensor(g, 1024, GKRT_TENSOR_OUTPUT, "unwritten_out");
  gkrt_tensor dup = add_tensor(g, 1024, GKRT_TENSOR_OUTPUT, "dup_out");
  gkrt_tensor late = add_tensor(g, 1024, GKRT_TENSOR_OUTPUT, "late_out");
  gkrt_tensor a = add_tensor(g, 1024, GKRT_TENSOR_INTERMEDIATE, "a");
  gkrt_tensor y = add_tensor(g, 1024, GKRT_TENSOR_OUTPUT, "y");
  gkrt_tensor ma = add_tensor(g, 4 * 3 * 4, GKRT_TENSOR_INPUT, "ma");  /* 4x3 */
  gkrt_tensor mb = add_tensor(g, 3 * 5 * 4, GKRT_TENSOR_INPUT, "mb");  /* 3x5 */
  gkrt_tensor mc = add_tensor(g, 4 * 5 * 4, GKRT_TENSOR_OUTPUT, "mc"); /* 4x5 */
  gkrt_tensor sq = add_tensor(g, 16, GKRT_TENSOR_PARAMETER, "sq");     /* 2x2 */
  gkrt_tensor sq2 = add_tensor(g, 16, GKRT_TENSOR_PARAMETER, "sq2");   /* 2x2 */
  const uint64_t num_tensors = 14;
  gkrt_tensor ids[] = {x, w, big, nwm, uwo, dup, late, a, y, ma, mb, mc, sq, sq2};
  for (size_t i = 0; i < num_tensors; i++)
    for (size_t j = 0; j < i; j++) CHECK(ids[i] != ids[j]);
  gkrt_tensor foreign = add_tensor(g2, 1024, GKRT_TENSOR_INPUT, "foreign_t");
  for (size_t i = 0; i < num_tensors; i++) CHECK(ids[i] != foreign);

  gkrt_kernel *copy = builtin_kernel(rt, GKRT_BUILTIN_COPY), *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *matmul = builtin_kernel(rt, GKRT_BUILTIN_MATMUL);
  gkrt_kernel *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL), *scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  gkrt_kernel *cb = NULL;
  OK(gkrt_kernel_from_callback(rt, noop_cb, NULL, &cb));
  gkrt_kernel *relu_rt2 = builtin_kernel(rt2, GKRT_BUILTIN_RELU);

  /* --- Valid nodes, and the node index they get. --- */
  uint32_t node = 99;
  OK(gkrt_graph_add_kernel(g, relu, &x, 1, &a, 1, NULL, 0, NULL, &node));
  CHECK_EQ_U64(node, 0);
  gkrt_tensor a_w[2] = {a, w};
  OK(gkrt_graph_add_kernel(g, add, a_w, 2, &y, 1, NULL, 0, NULL, &node));
  CHECK_EQ_U64(node, 1);
  const uint32_t mm_ok[3] = {4, 5, 3}; /* m, n, k */
  gkrt_launch mm_launch = {{1, 1, 1}, {1, 1, 1}, 0, mm_ok, sizeof mm_ok};
  gkrt_tensor ma_mb[2] = {ma, mb};
  OK(gkrt_graph_add_kernel(g, matmul, ma_mb, 2, &mc, 1, NULL, 0, &mm_launch, &node));
  CHECK_EQ_U64(node, 2);
  OK(gkrt_graph_add_kernel(g, cb, &y, 1, NULL, 0, NULL, 0, NULL, NULL)); /* callback: no outputs, NULL node_out */
  uint32_t next = 4; /* the index the next node would get */
  CHECK_EQ_U64(info_of(g).num_nodes, next);

  /* --- add_kernel: NULL and wrong handles. --- */
  NODE_FAILS(NULL, relu, &x, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "graph");
  NODE_FAILS(g, NULL, &x, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  NODE_FAILS(g, (gkrt_kernel *)g2, &x, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "graph");
  NODE_FAILS((gkrt_graph *)relu, relu, &x, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  NODE_FAILS(g, (gkrt_kernel *)(uintptr_t)0xdeadbeef0ull, &x, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  /* A kernel of another runtime. */
  NODE_FAILS(g, relu_rt2, &x, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "runtime");

  /* --- Unknown and foreign tensor ids, as inputs and as outputs: the message names the id. --- */
  const gkrt_tensor unknown_ids[] = {x + 1000, 0, UINT64_MAX, (x & 0xFFFFFFFF00000000ull) + num_tensors};
  for (size_t i = 0; i < sizeof unknown_ids / sizeof unknown_ids[0]; i++) {
    gkrt_tensor bad = unknown_ids[i];
    NODE_FAILS(g, relu, &bad, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "tensor");
    MSG_HAS_U64(bad);
    NODE_FAILS(g, relu, &x, 1, bad, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "tensor");
    MSG_HAS_U64(bad);
  }
  NODE_FAILS(g, relu, &foreign, 1, a, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "tensor");
  MSG_HAS_U64(foreign);
  NODE_FAILS(g, relu, &x, 1, foreign, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "tensor");
  MSG_HAS_U64(foreign);
  gkrt_tensor x_foreign[2] = {x, foreign};
  NODE_FAILS(g, add, x_foreign, 2, y, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "tensor");
  MSG_HAS_U64(foreign);
  /* ...and the other graph does not accept this graph's ids either. */
  gkrt_tensor f_out = add_tensor(g2, 1024, GKRT_TENSOR_OUTPUT, "foreign_out");
  NODE_FAILS(g2, relu, &x, 1, f_out, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "tensor");
  MSG_HAS_U64(x);

  /* --- Read before any node writes it: an intermediate, an output. --- */
  NODE_FAILS(g, copy, &nwm, 1, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "never_written_mid");
  MSG_HAS_NODE(next);
  NODE_FAILS(g, copy, &uwo, 1, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "unwritten_out");
  MSG_HAS_NODE(next);
  /* A node may not read what it writes itself for the first time. */
  NODE_FAILS(g, relu, &late, 1, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "late_out");

  /* --- Duplicate output. --- */
  gkrt_tensor dups[2] = {dup, dup};
  FAILS(gkrt_graph_add_kernel(g, cb, &x, 1, dups, 2, NULL, 0, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "dup_out");

  /* --- NULL arrays with non-zero counts. --- */
  FAILS(gkrt_graph_add_kernel(g, cb, NULL, 1, &late, 1, NULL, 0, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "inputs");
  MSG_HAS_U64(1);
  FAILS(gkrt_graph_add_kernel(g, cb, &x, 1, NULL, 3, NULL, 0, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "outputs");
  MSG_HAS_U64(3);
  FAILS(gkrt_graph_add_kernel(g, cb, &x, 1, &late, 1, NULL, 2, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT,
        "workspace");
  MSG_HAS_U64(2);
  /* params NULL with a non-zero size. */
  NODE_FAILS(g, scale, &x, 1, late, NULL, 4, GKRT_STATUS_INVALID_ARGUMENT, "params");

  /* --- Zero launch dimensions. --- */
  for (int d = 0; d < 3; d++) {
    gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, NULL, 0};
    l.grid[d] = 0;
    FAILS(gkrt_graph_add_kernel(g, cb, &x, 1, &late, 1, NULL, 0, &l, NULL), GKRT_STATUS_INVALID_ARGUMENT, "grid");
    l.grid[d] = 1;
    l.block[d] = 0;
    FAILS(gkrt_graph_add_kernel(g, cb, &x, 1, &late, 1, NULL, 0, &l, NULL), GKRT_STATUS_INVALID_ARGUMENT, "block");
  }

  /* --- Workspace sizes: 0 and beyond 2^48; the message names the size. --- */
  const uint64_t bad_ws[] = {0, (1ull << 48) + 1, 1ull << 60, UINT64_MAX};
  for (size_t i = 0; i < sizeof bad_ws / sizeof bad_ws[0]; i++) {
    uint64_t ws[2] = {256, bad_ws[i]};
    FAILS(gkrt_graph_add_kernel(g, cb, &x, 1, &late, 1, ws, 2, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT,
          "workspace");
    MSG_HAS_U64(bad_ws[i]);
    MSG_HAS_NODE(next);
  }

  /* --- Built-in shape and parameter errors: the message names the node and the sizes. --- */
  gkrt_tensor x_big[2] = {x, big};
  NODE_FAILS(g, add, x_big, 2, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "add");
  MSG_HAS_U64(2048);
  MSG_HAS_NODE(next);
  NODE_FAILS(g, copy, &big, 1, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "copy");
  MSG_HAS_U64(2048);
  NODE_FAILS(g, relu, &big, 1, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "relu");
  MSG_HAS_U64(2048);
  NODE_FAILS(g, relu, x_big, 2, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "relu"); /* arity */
  FAILS(gkrt_graph_add_kernel(g, relu, &x, 1, NULL, 0, NULL, 0, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "output");
  const uint32_t mm7[2] = {4, 5};
  NODE_FAILS(g, matmul, ma_mb, 2, mc, mm7, 7, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  MSG_HAS_U64(7);
  NODE_FAILS(g, matmul, ma_mb, 2, mc, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  const uint32_t mm_wrong_k[3] = {4, 5, 2}; /* a must then be 32 bytes, it has 48 */
  NODE_FAILS(g, matmul, ma_mb, 2, mc, mm_wrong_k, sizeof mm_wrong_k, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  MSG_HAS_U64(48);
  MSG_HAS_NODE(next);
  const uint32_t mm_wrong_n[3] = {4, 6, 3}; /* b must be 72 bytes (has 60), out 96 (has 80) */
  NODE_FAILS(g, matmul, ma_mb, 2, mc, mm_wrong_n, sizeof mm_wrong_n, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  MSG_HAS_U64(60);
  const uint32_t mm_zero[3] = {0, 5, 3};
  NODE_FAILS(g, matmul, ma_mb, 2, mc, mm_zero, sizeof mm_zero, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  const uint32_t mm_sq[3] = {2, 2, 2};
  gkrt_tensor sq_sq2[2] = {sq, sq2};
  NODE_FAILS(g, matmul, sq_sq2, 2, sq, mm_sq, sizeof mm_sq, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  MSG_HAS_NODE(next);
  const float one = 1.0f;
  const double wide = 1.0;
  NODE_FAILS(g, fill, NULL, 0, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "fill");
  NODE_FAILS(g, fill, NULL, 0, late, &wide, sizeof wide, GKRT_STATUS_INVALID_ARGUMENT, "fill");
  MSG_HAS_U64(8);
  NODE_FAILS(g, scale, &x, 1, late, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "scale");
  NODE_FAILS(g, relu, &x, 1, late, &one, sizeof one, GKRT_STATUS_INVALID_ARGUMENT, "relu");
  MSG_HAS_U64(4);
  /* f32 built-ins on a tensor that is not a whole number of floats (g3's 6-byte odd6). */
  FAILS(add_node(g3, fill, NULL, 0, odd6, &one, sizeof one), GKRT_STATUS_INVALID_ARGUMENT, "fill");
  MSG_HAS_U64(6);

  /* None of the failures added a node or marked an output written. */
  CHECK_EQ_U64(info_of(g).num_nodes, next);
  CHECK_EQ_U64(info_of(g).num_tensors, num_tensors);
  NODE_FAILS(g, copy, &late, 1, uwo, NULL, 0, GKRT_STATUS_INVALID_ARGUMENT, "late_out");

  /* --- get_info before finalize: counts only. --- */
  gkrt_graph_info info;
  memset(&info, 0xAB, sizeof info);
  OK(gkrt_graph_get_info(g, &info));
  CHECK_EQ_U64(info.num_tensors, num_tensors);
  CHECK_EQ_U64(info.num_nodes, next);
  CHECK_EQ_U64(info.finalized, 0);
  CHECK_EQ_U64(info.peak_transient_bytes, 0);
  CHECK_EQ_U64(info.persistent_bytes, 0);
  CHECK_EQ_U64(info.transient_total_bytes, 0);
  FAILS(gkrt_graph_get_info(g, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_graph_get_info(NULL, &info), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_get_info((gkrt_graph *)rt, &info), GKRT_STATUS_INVALID_ARGUMENT, "runtime");

  /* --- Running an unfinalized graph. --- */
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_INVALID_STATE, "final");
  CHECK_EQ_U64(stats_of(rt).runs, 0);

  /* --- Finalize: empty graphs, outputs nobody writes; a failed finalize leaves the graph
   * editable. --- */
  gkrt_graph *empty;
  OK(gkrt_graph_create(rt, &empty));
  gkrt_status st = gkrt_graph_finalize(empty);
  CHECK(st == GKRT_STATUS_INVALID_ARGUMENT || st == GKRT_STATUS_INVALID_STATE);
  MSG_HAS("node");
  add_tensor(empty, 64, GKRT_TENSOR_INPUT, "lonely");
  st = gkrt_graph_finalize(empty);
  CHECK(st == GKRT_STATUS_INVALID_ARGUMENT || st == GKRT_STATUS_INVALID_STATE);
  MSG_HAS("node");
  CHECK_EQ_U64(info_of(empty).finalized, 0);
  FAILS(gkrt_runtime_run(rt, empty), GKRT_STATUS_INVALID_STATE, "final");
  OK(gkrt_graph_release(empty));

  FAILS(gkrt_graph_finalize(g), GKRT_STATUS_INVALID_ARGUMENT, "unwritten_out");
  CHECK_EQ_U64(info_of(g).finalized, 0);
  OK(gkrt_graph_add_kernel(g, fill, NULL, 0, &uwo, 1, NULL, 0, &(gkrt_launch){{1, 1, 1}, {1, 1, 1}, 0, &one, 4}, &node));
  CHECK_EQ_U64(node, next++);
  FAILS(gkrt_graph_finalize(g), GKRT_STATUS_INVALID_ARGUMENT, "dup_out");
  const float two = 2.0f, three = 3.0f, four = 4.0f;
  OK(add_node(g, fill, NULL, 0, dup, &two, 4));
  OK(add_node(g, fill, NULL, 0, late, &three, 4));
  OK(add_node(g, fill, NULL, 0, nwm, &four, 4)); /* an intermediate written and never read */
  next += 3;
  FAILS(gkrt_graph_finalize(NULL), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  OK(gkrt_graph_finalize(g));

  /* --- After finalize: no more edits; get_info has the liveness figures. --- */
  FAILS(gkrt_graph_finalize(g), GKRT_STATUS_INVALID_STATE, "final");
  t = 0x5e47;
  FAILS(gkrt_graph_add_tensor(g, 64, GKRT_TENSOR_INPUT, "too_late", &t), GKRT_STATUS_INVALID_STATE, "final");
  CHECK_EQ_U64(t, 0x5e47);
  FAILS(gkrt_graph_add_kernel(g, relu, &x, 1, &a, 1, NULL, 0, NULL, NULL), GKRT_STATUS_INVALID_STATE, "final");
  memset(&info, 0xAB, sizeof info);
  OK(gkrt_graph_get_info(g, &info));
  CHECK_EQ_U64(info.num_tensors, num_tensors);
  CHECK_EQ_U64(info.num_nodes, next);
  CHECK_EQ_U64(info.finalized, 1);
  /* Persistent: x, w, uwo, dup, late, y 1024 each; big 2048; ma 48, mb 60, mc 80, sq 16, sq2 16
   * round up to 256 each: 6*1024 + 2048 + 5*256 = 9472. */
  CHECK_EQ_U64(info.persistent_bytes, 9472);
  /* Transient: a (1024, nodes 0-1) and never_written_mid (1024, node 7), never live together. */
  CHECK_EQ_U64(info.transient_total_bytes, 2048);
  CHECK_EQ_U64(info.peak_transient_bytes, 1024);
  CHECK(info.peak_node < next);

  /* --- Running it: the wrong runtime, NULL graph, then for real. --- */
  FAILS(gkrt_runtime_run(rt2, g), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_run(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_runtime_run(rt, (gkrt_graph *)cb), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  CHECK_EQ_U64(stats_of(rt).runs, 0);
  CHECK_EQ_U64(stats_of(rt2).runs, 0);
  float xv[256], wv[256], yv[256], want[256], mav[12], mbv[15], mcv[20], mcw[20], c[256];
  fill_floats(xv, 256, 1);
  fill_floats(wv, 256, 2);
  fill_floats(mav, 12, 3);
  fill_floats(mbv, 15, 4);
  OK(gkrt_graph_write_tensor(g, x, xv, sizeof xv));
  OK(gkrt_graph_write_tensor(g, w, wv, sizeof wv));
  OK(gkrt_graph_write_tensor(g, ma, mav, sizeof mav));
  OK(gkrt_graph_write_tensor(g, mb, mbv, sizeof mbv));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, yv, sizeof yv));
  for (int i = 0; i < 256; i++) want[i] = (xv[i] > 0.0f ? xv[i] : 0.0f) + wv[i];
  CHECK_BITS(yv, want, 256);
  OK(gkrt_graph_read_tensor(g, mc, mcv, sizeof mcv));
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 5; j++) {
      float acc = 0.0f;
      for (int p = 0; p < 3; p++) acc = acc + mav[i * 3 + p] * mbv[p * 5 + j];
      mcw[i * 5 + j] = acc;
    }
  CHECK_BITS(mcv, mcw, 20);
  const gkrt_tensor filled[3] = {uwo, dup, late};
  const float fills[3] = {1.0f, 2.0f, 3.0f};
  for (int f = 0; f < 3; f++) {
    OK(gkrt_graph_read_tensor(g, filled[f], c, sizeof c));
    for (int i = 0; i < 256; i++) want[i] = fills[f];
    CHECK_BITS(c, want, 256);
  }
  CHECK_EQ_U64(stats_of(rt).runs, 1);
  CHECK_EQ_U64(stats_of(rt).nodes_launched, next);

  /* --- Release: NULL, twice, wrong kind. --- */
  OK(gkrt_graph_release(NULL));
  FAILS(gkrt_graph_release((gkrt_graph *)relu), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  OK(gkrt_graph_release(g3));
  FAILS(gkrt_graph_release(g3), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_get_info(g3, &info), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_add_tensor(g3, 16, GKRT_TENSOR_INPUT, "after_release", &t), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  /* The graph still runs after all that, and the runtime works. */
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, yv, sizeof yv));
  for (int i = 0; i < 256; i++) want[i] = (xv[i] > 0.0f ? xv[i] : 0.0f) + wv[i];
  CHECK_BITS(yv, want, 256);
  CHECK_RUNTIME_WORKS(rt);
  CHECK_RUNTIME_WORKS(rt2);

  OK(gkrt_graph_release(g));
  OK(gkrt_graph_release(g2));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  gkrt_kernel *ks[] = {copy, add, relu, matmul, fill, scale, cb, relu_rt2};
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) OK(gkrt_kernel_release(ks[i]));
  OK(gkrt_runtime_release(rt));
  OK(gkrt_runtime_release(rt2));
  return test_done("api_graph");
}
