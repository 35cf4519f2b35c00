/*
 * int_recompute: gkrt_graph_set_node_recomputable. Refused with a clear error for a NULL graph,
 * an unknown node, a node with two outputs, a node that reads what it writes, and after
 * finalize. Then a training-like chain (matmul, ReLU declared recomputable, a backward pass
 * reading every ReLU output again) runs under a third of its working set: outputs bit-identical
 * to an unlimited run, run after run; the statistics count rebuilt tensors; the memory limit
 * holds; and what stays allocated after a run is back to the baseline once the graph goes.
 */
#include "cb_device.h"
#include "test_util.h"

enum { SIDE = 64, LAYERS = 6 };
#define BYTES ((uint64_t)SIDE * SIDE * 4)

/* Writes zeros to its outputs (on CUDA through the driver: cb_device.h), so nothing reads
 * memory a node declared as written but left as it was. */
static int32_t two_outputs_cb(const gkrt_callback_args *args, void *user) {
  (void)user;
  for (size_t i = 0; i < args->num_outputs; i++)
    if (cbdev_fill(args, args->outputs[i], 0)) return 1;
  return 0;
}

/* Forward z_i = x_i·w_i, x_{i+1} = relu(z_i); backward g_i = relu'(g_{i+1}, z_i), d_i = x_i·g_i
 * (a far read of each ReLU output), summed into the output. Returns the graph. */
static gkrt_graph *chain(gkrt_runtime *rt, int recompute, gkrt_tensor *w, gkrt_tensor *x0, gkrt_tensor *out) {
  gkrt_kernel *mm = builtin_kernel(rt, GKRT_BUILTIN_MATMUL), *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_kernel *grad = builtin_kernel(rt, GKRT_BUILTIN_RELU_GRAD), *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  const uint32_t dims[3] = {SIDE, SIDE, SIDE};
  gkrt_tensor x[LAYERS + 1], z[LAYERS];
  *x0 = x[0] = add_tensor(g, BYTES, GKRT_TENSOR_INPUT, "x0");
  for (int i = 0; i < LAYERS; i++) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    w[i] = add_tensor(g, BYTES, GKRT_TENSOR_PARAMETER, name);
    snprintf(name, sizeof name, "z%d", i);
    z[i] = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, name);
    snprintf(name, sizeof name, "x%d", i + 1);
    x[i + 1] = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, name);
    gkrt_tensor in[2] = {x[i], w[i]};
    OK(add_node(g, mm, in, 2, z[i], dims, sizeof dims));
    uint32_t node;
    OK(gkrt_graph_add_kernel(g, relu, &z[i], 1, &x[i + 1], 1, NULL, 0, NULL, &node));
    if (recompute) OK(gkrt_graph_set_node_recomputable(g, node, 1));
  }
  gkrt_tensor acc = x[LAYERS];
  for (int i = LAYERS - 1; i >= 0; i--) {
    gkrt_tensor gi = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, "g");
    gkrt_tensor di = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, "d");
    gkrt_tensor next = add_tensor(g, BYTES, i == 0 ? GKRT_TENSOR_OUTPUT : GKRT_TENSOR_INTERMEDIATE, "acc");
    gkrt_tensor gin[2] = {acc, z[i]};
    OK(add_node(g, grad, gin, 2, gi, NULL, 0));
    gkrt_tensor din[2] = {x[i], gi};
    OK(add_node(g, mm, din, 2, di, dims, sizeof dims));
    gkrt_tensor sum[2] = {di, gi};
    OK(add_node(g, add, sum, 2, next, NULL, 0));
    acc = next;
  }
  *out = acc;
  OK(gkrt_kernel_release(mm));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(grad));
  OK(gkrt_kernel_release(add));
  return g;
}

static void write_inputs(gkrt_graph *g, const gkrt_tensor *w, gkrt_tensor x0, float *buf, uint32_t seed) {
  for (int i = 0; i < LAYERS; i++) {
    fill_floats(buf, SIDE * SIDE, seed + (uint32_t)i);
    /* Small weights keep the products finite through the chain. */
    for (int k = 0; k < SIDE * SIDE; k++) buf[k] *= 0.05f;
    OK(gkrt_graph_write_tensor(g, w[i], buf, BYTES));
  }
  fill_floats(buf, SIDE * SIDE, seed + 100);
  OK(gkrt_graph_write_tensor(g, x0, buf, BYTES));
}

int main(void) {
  /* --- Bad calls: each refused with its reason; the graph stays usable. --- */
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *two = NULL;
  cbdev_init(rt);
  OK(gkrt_kernel_from_callback(rt, two_outputs_cb, NULL, &two));
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor a = add_tensor(g, 256, GKRT_TENSOR_INPUT, "a");
  gkrt_tensor b = add_tensor(g, 256, GKRT_TENSOR_INTERMEDIATE, "b");
  gkrt_tensor c = add_tensor(g, 256, GKRT_TENSOR_INTERMEDIATE, "c");
  gkrt_tensor y = add_tensor(g, 256, GKRT_TENSOR_OUTPUT, "y");
  OK(add_node(g, relu, &a, 1, b, NULL, 0)); /* node 0 */
  gkrt_tensor outs[2] = {c, y};
  OK(gkrt_graph_add_kernel(g, two, &b, 1, outs, 2, NULL, 0, NULL, NULL)); /* node 1 */
  OK(gkrt_graph_add_kernel(g, two, &y, 1, &y, 1, NULL, 0, NULL, NULL));  /* node 2: in place */
  FAILS(gkrt_graph_set_node_recomputable(NULL, 0, 1), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_set_node_recomputable(g, 7, 1), GKRT_STATUS_INVALID_ARGUMENT, "node 7");
  MSG_HAS("3 nodes");
  FAILS(gkrt_graph_set_node_recomputable(g, 1, 1), GKRT_STATUS_INVALID_ARGUMENT, "2 outputs");
  MSG_HAS_NODE(1);
  FAILS(gkrt_graph_set_node_recomputable(g, 2, 1), GKRT_STATUS_INVALID_ARGUMENT, "reads the tensor it writes");
  OK(gkrt_graph_set_node_recomputable(g, 2, 0)); /* "not recomputable" is always allowed */
  OK(gkrt_graph_set_node_recomputable(g, 0, 1));
  OK(gkrt_graph_finalize(g));
  FAILS(gkrt_graph_set_node_recomputable(g, 0, 0), GKRT_STATUS_INVALID_STATE, "finalized");
  float buf[64] = {0};
  OK(gkrt_graph_write_tensor(g, a, buf, 256));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(two));

  /* --- The reference: no limit, nothing swapped or recomputed. --- */
  float *host = alloc_floats(SIDE * SIDE), *want = alloc_floats(SIDE * SIDE), *got = alloc_floats(SIDE * SIDE);
  gkrt_tensor w[LAYERS], x0, out;
  gkrt_graph *ref = chain(rt, 1, w, &x0, &out);
  OK(gkrt_graph_finalize(ref));
  gkrt_graph_info info = info_of(ref);
  uint64_t working_set = info.persistent_bytes + info.peak_transient_bytes;
  write_inputs(ref, w, x0, host, 7);
  OK(gkrt_runtime_run(rt, ref));
  OK(gkrt_graph_read_tensor(ref, out, want, BYTES));
  CHECK_EQ_U64(stats_of(rt).tensors_recomputed, 0);
  OK(gkrt_graph_release(ref));
  OK(gkrt_runtime_release(rt));

  /* --- A third of the working set: ReLU outputs are rebuilt, results identical. --- */
  uint64_t limit = working_set / 3;
  rt = test_runtime(limit);
  uint64_t baseline = allocated_bytes(rt);
  gkrt_graph *small = chain(rt, 1, w, &x0, &out);
  OK(gkrt_graph_finalize(small));
  write_inputs(small, w, x0, host, 7);
  for (int run = 0; run < 3; run++) {
    OK(gkrt_runtime_run(rt, small));
    memset(got, 0xff, BYTES);
    OK(gkrt_graph_read_tensor(small, out, got, BYTES));
    CHECK(memcmp(got, want, BYTES) == 0);
  }
  gkrt_stats s = stats_of(rt);
  CHECK(s.tensors_recomputed > 0);
  CHECK(s.peak_reserved_bytes <= limit);
  CHECK(s.swap_out_bytes + s.swap_in_bytes > 0);
  OK(gkrt_graph_release(small));
  CHECK_EQ_U64(allocated_bytes(rt), baseline);

  /* --- The same chain without the declaration is never recomputed, with the same results. --- */
  gkrt_graph *plain = chain(rt, 0, w, &x0, &out);
  OK(gkrt_graph_finalize(plain));
  write_inputs(plain, w, x0, host, 7);
  uint64_t rebuilt = stats_of(rt).tensors_recomputed;
  OK(gkrt_runtime_run(rt, plain));
  OK(gkrt_graph_read_tensor(plain, out, got, BYTES));
  CHECK(memcmp(got, want, BYTES) == 0);
  CHECK_EQ_U64(stats_of(rt).tensors_recomputed, rebuilt);
  OK(gkrt_graph_release(plain));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  free(host);
  free(want);
  free(got);
  return test_done("int_recompute");
}
