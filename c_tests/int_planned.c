/*
 * int_planned: GKRT_MEMORY_PLANNED. The demo MLP gives bit-exact outputs run after run with
 * inputs and weights changed in between (also when later runs are replayed); from the second
 * run on a run makes no pool allocation (last_run_pool_allocs == 0) and allocated bytes do not
 * move; the arena is at least the computed transient peak and at most the sum of all
 * transients. A graph with a host callback calls it on every run and computes right (on CUDA
 * too: the callback copies through the driver, cb_device.h); a failing
 * callback gives CALLBACK_FAILED naming the node and leaves the graph and runtime usable;
 * releasing the graphs gives all memory back.
 */
#include "cb_device.h"
#include "mlp.h"
#include "test_util.h"

static float x[MLP_B * MLP_D], w1[MLP_D * MLP_H], w2[MLP_H * MLP_H], w3[MLP_H * MLP_O];
static float y[MLP_B * MLP_O], g[MLP_B * MLP_H], y_ref[MLP_B * MLP_O], g_ref[MLP_B * MLP_H];

typedef struct {
  int calls;
  int32_t fail; /* what to return (the output is written all the same) */
} cb_state;

enum { CB_N = 1000 };
static float cb_in[CB_N], cb_out[CB_N];

/* out = in + 1, on either backend (cb_device.h). */
static int32_t plus_one_cb(const gkrt_callback_args *a, void *user) {
  cb_state *s = user;
  s->calls++;
  if (a->num_inputs != 1 || a->num_outputs != 1 || a->outputs[0].size > sizeof cb_out) return 98;
  size_t n = a->outputs[0].size / 4;
  if (cbdev_read(a, a->inputs[0], cb_in, n * 4)) return 95;
  for (size_t i = 0; i < n; i++) cb_out[i] = cb_in[i] + 1.0f;
  if (cbdev_write(a, a->outputs[0], cb_out, n * 4)) return 94;
  return s->fail;
}

static float relu_ref(float v) { return v > 0.0f ? v : 0.0f; }

int main(void) {
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.memory_mode = GKRT_MEMORY_PLANNED;
  cfg.host_jitter_us = 20;
  cfg.log_level = 1;
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(&cfg, &rt));
  cbdev_init(rt);
  const uint64_t base = allocated_bytes(rt);

  /* --- The MLP. --- */
  mlp m;
  CHECK(mlp_build(rt, &m) == 0);
  gkrt_graph_info info = info_of(m.graph);
  CHECK_EQ_U64(info.peak_transient_bytes, 4 * 65536); /* as in dynamic mode: see int_demo_graph */
  mlp_fill_random(x, MLP_B * MLP_D, 1);
  mlp_fill_random(w1, MLP_D * MLP_H, 2);
  mlp_fill_random(w2, MLP_H * MLP_H, 3);
  mlp_fill_random(w3, MLP_H * MLP_O, 4);
  OK(gkrt_graph_write_tensor(m.graph, m.w1, w1, sizeof w1));
  OK(gkrt_graph_write_tensor(m.graph, m.w2, w2, sizeof w2));
  OK(gkrt_graph_write_tensor(m.graph, m.w3, w3, sizeof w3));
  uint64_t after_first = 0;
  for (int run = 0; run < 5; run++) {
    mlp_fill_random(x, MLP_B * MLP_D, 100 + run);
    OK(gkrt_graph_write_tensor(m.graph, m.x, x, sizeof x));
    if (run == 3) {
      mlp_fill_random(w3, MLP_H * MLP_O, 44);
      OK(gkrt_graph_write_tensor(m.graph, m.w3, w3, sizeof w3));
    }
    OK(gkrt_runtime_reset_peak_stats(rt));
    gkrt_stats before = stats_of(rt);
    OK(gkrt_runtime_run(rt, m.graph));
    gkrt_stats after = stats_of(rt);
    memset(y, 0, sizeof y);
    memset(g, 0, sizeof g);
    OK(gkrt_graph_read_tensor(m.graph, m.y, y, sizeof y));
    OK(gkrt_graph_read_tensor(m.graph, m.g, g, sizeof g));
    mlp_reference(x, w1, w2, w3, y_ref, g_ref);
    CHECK_BITS(y, y_ref, MLP_B * MLP_O);
    CHECK_BITS(g, g_ref, MLP_B * MLP_H);
    CHECK_EQ_U64(after.runs - before.runs, 1);
    if (run == 0) {
      after_first = after.allocated_bytes;
      uint64_t arena = after.allocated_bytes - base - info.persistent_bytes;
      CHECK(arena >= info.peak_transient_bytes);
      CHECK(arena <= info.transient_total_bytes);
    } else {
      CHECK_EQ_U64(after.last_run_pool_allocs, 0);
      CHECK_EQ_U64(after.alloc_count, before.alloc_count);
      CHECK_EQ_U64(after.allocated_bytes, after_first);
      CHECK_EQ_U64(after.peak_allocated_bytes, before.allocated_bytes);
    }
  }

  /* --- A callback between built-ins, in planned mode: called on every run. --- */
  enum { N = CB_N };
  cb_state st = {0, 0};
  gkrt_kernel *cb, *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  OK(gkrt_kernel_from_callback(rt, plus_one_cb, &st, &cb));
  gkrt_graph *gc;
  OK(gkrt_graph_create(rt, &gc));
  gkrt_tensor cx = add_tensor(gc, N * 4, GKRT_TENSOR_INPUT, "cx");
  gkrt_tensor ca = add_tensor(gc, N * 4, GKRT_TENSOR_INTERMEDIATE, "ca");
  gkrt_tensor cbt = add_tensor(gc, N * 4, GKRT_TENSOR_INTERMEDIATE, "cb");
  gkrt_tensor cy = add_tensor(gc, N * 4, GKRT_TENSOR_OUTPUT, "cy");
  const float m3 = -3.0f;
  OK(add_node(gc, scale, &cx, 1, ca, &m3, 4));
  uint32_t cb_node = 0;
  OK(gkrt_graph_add_kernel(gc, cb, &ca, 1, &cbt, 1, NULL, 0, NULL, &cb_node));
  OK(add_node(gc, relu, &cbt, 1, cy, NULL, 0));
  OK(gkrt_graph_finalize(gc));
  float xv[N], yv[N], want[N];
  for (int run = 0; run < 4; run++) {
    fill_floats(xv, N, 70 + run);
    OK(gkrt_graph_write_tensor(gc, cx, xv, sizeof xv));
    if (run == 2) {
      /* A failing run in the middle. */
      st.fail = 5;
      uint64_t before = allocated_bytes(rt);
      FAILS(gkrt_runtime_run(rt, gc), GKRT_STATUS_CALLBACK_FAILED, "node 1");
      MSG_HAS_NODE(cb_node);
      CHECK_EQ_U64(allocated_bytes(rt), before);
      st.fail = 0;
    }
    int calls = st.calls;
    OK(gkrt_runtime_run(rt, gc));
    CHECK_EQ_U64(st.calls, calls + 1);
    OK(gkrt_graph_read_tensor(gc, cy, yv, sizeof yv));
    for (int i = 0; i < N; i++) want[i] = relu_ref(m3 * xv[i] + 1.0f);
    CHECK_BITS(yv, want, N);
  }

  /* The MLP still runs right after all that. */
  OK(gkrt_runtime_run(rt, m.graph));
  OK(gkrt_graph_read_tensor(m.graph, m.y, y, sizeof y));
  CHECK_BITS(y, y_ref, MLP_B * MLP_O);

  OK(gkrt_graph_release(m.graph));
  OK(gkrt_graph_release(gc));
  CHECK_EQ_U64(allocated_bytes(rt), base);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(scale));
  OK(gkrt_runtime_release(rt));
  return test_done("int_planned");
}
