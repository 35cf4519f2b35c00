/*
 * leak_release_order: ownership. Graphs and kernels keep their runtime alive: after the
 * runtime's handle is released, its graph can still be finalized, written and read (its
 * results intact), while the dead runtime handle is refused (INVALID_ARGUMENT) rather than
 * used. Runtime, graph and two kernels are released in each of the 24 possible orders without
 * a crash; a graph's release gives its memory back to a runtime still held; releasing any
 * handle twice is INVALID_ARGUMENT naming its kind.
 */
#include "test_util.h"

enum { N = 512 };

typedef struct {
  gkrt_runtime *rt;
  gkrt_kernel *scale, *relu;
  gkrt_graph *g;
  gkrt_tensor x, y;
  float xv[N], want[N];
} setup;

/* x -> scale(-2) -> a -> relu -> y, built, finalized, written and run once. */
static void build(setup *s, uint32_t seed, int run) {
  s->rt = test_runtime(0);
  s->scale = builtin_kernel(s->rt, GKRT_BUILTIN_SCALE);
  s->relu = builtin_kernel(s->rt, GKRT_BUILTIN_RELU);
  OK(gkrt_graph_create(s->rt, &s->g));
  s->x = add_tensor(s->g, N * 4, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor a = add_tensor(s->g, N * 4, GKRT_TENSOR_INTERMEDIATE, "a");
  s->y = add_tensor(s->g, N * 4, GKRT_TENSOR_OUTPUT, "y");
  const float m2 = -2.0f;
  OK(add_node(s->g, s->scale, &s->x, 1, a, &m2, 4));
  OK(add_node(s->g, s->relu, &a, 1, s->y, NULL, 0));
  OK(gkrt_graph_finalize(s->g));
  fill_floats(s->xv, N, seed);
  for (int i = 0; i < N; i++) {
    float v = m2 * s->xv[i];
    s->want[i] = v > 0.0f ? v : 0.0f;
  }
  OK(gkrt_graph_write_tensor(s->g, s->x, s->xv, sizeof s->xv));
  if (run) OK(gkrt_runtime_run(s->rt, s->g));
}

static void check_y(setup *s) {
  float yv[N];
  OK(gkrt_graph_read_tensor(s->g, s->y, yv, sizeof yv));
  CHECK_BITS(yv, s->want, N);
}

int main(void) {
  /* --- The runtime's handle released first: the graph still holds its results. --- */
  setup s;
  build(&s, 1, 1);
  OK(gkrt_runtime_release(s.rt));
  check_y(&s);
  float xv2[N];
  fill_floats(xv2, N, 2);
  OK(gkrt_graph_write_tensor(s.g, s.x, xv2, sizeof xv2));
  float back[N];
  OK(gkrt_graph_read_tensor(s.g, s.x, back, sizeof back));
  CHECK(memcmp(back, xv2, sizeof back) == 0);
  gkrt_graph_info info = info_of(s.g);
  CHECK_EQ_U64(info.finalized, 1);
  /* The released handle is refused, not used. */
  FAILS(gkrt_runtime_run(s.rt, s.g), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_stats(s.rt, &(gkrt_stats){0}), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_release(s.rt), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_graph_create(s.rt, &(gkrt_graph *){NULL}), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_kernel_builtin(s.rt, GKRT_BUILTIN_ADD, &(gkrt_kernel *){NULL}), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  OK(gkrt_kernel_release(s.scale));
  OK(gkrt_kernel_release(s.relu));
  check_y(&s); /* the output from the run is still there */
  OK(gkrt_graph_release(s.g)); /* the last owner: the runtime goes with it */
  FAILS(gkrt_graph_release(s.g), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_kernel_release(s.scale), GKRT_STATUS_INVALID_ARGUMENT, "kernel");

  /* --- The runtime released before the graph is even finalized: kernels and graph carry on
   * building with it. --- */
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor gx = add_tensor(g, 64, GKRT_TENSOR_INPUT, "gx");
  OK(gkrt_runtime_release(rt));
  gkrt_tensor gy = add_tensor(g, 64, GKRT_TENSOR_OUTPUT, "gy");
  gkrt_tensor gz = add_tensor(g, 64, GKRT_TENSOR_OUTPUT, "gz");
  OK(add_node(g, relu, &gx, 1, gy, NULL, 0));
  const float one = 1.0f;
  OK(add_node(g, fill, NULL, 0, gz, &one, 4));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_graph_finalize(g));
  float v16[16], r16[16];
  fill_floats(v16, 16, 3);
  OK(gkrt_graph_write_tensor(g, gx, v16, 64));
  OK(gkrt_graph_read_tensor(g, gx, r16, 64));
  CHECK(memcmp(v16, r16, 64) == 0);
  FAILS(gkrt_graph_read_tensor(g, gy, r16, 64), GKRT_STATUS_INVALID_STATE, "gy"); /* never run */
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(fill)); /* the last owner */
  FAILS(gkrt_kernel_release(fill), GKRT_STATUS_INVALID_ARGUMENT, "kernel");

  /* --- Every order of releasing runtime, graph and two kernels. --- */
  int perms = 0;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 4; c++)
        for (int d = 0; d < 4; d++) {
          if (a == b || a == c || a == d || b == c || b == d || c == d) continue;
          const int order[4] = {a, b, c, d};
          build(&s, 100 + (uint32_t)perms, perms % 2 == 0); /* half of them never ran */
          if (perms % 2 == 0) check_y(&s);
          int rt_alive = 1;
          for (int i = 0; i < 4; i++) {
            switch (order[i]) {
              case 0:
                OK(gkrt_runtime_release(s.rt));
                rt_alive = 0;
                break;
              case 1:
                OK(gkrt_graph_release(s.g));
                if (rt_alive) CHECK_EQ_U64(allocated_bytes(s.rt), 0); /* its memory is back */
                break;
              case 2: OK(gkrt_kernel_release(s.scale)); break;
              case 3: OK(gkrt_kernel_release(s.relu)); break;
            }
          }
          FAILS(gkrt_runtime_release(s.rt), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
          FAILS(gkrt_graph_release(s.g), GKRT_STATUS_INVALID_ARGUMENT, "graph");
          FAILS(gkrt_kernel_release(s.scale), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
          FAILS(gkrt_kernel_release(s.relu), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
          perms++;
        }
  CHECK_EQ_U64(perms, 24);

  /* --- Two graphs sharing a kernel, released interleaved with it and the runtime. --- */
  rt = test_runtime(0);
  gkrt_kernel *shared = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_graph *g1, *g2;
  OK(gkrt_graph_create(rt, &g1));
  OK(gkrt_graph_create(rt, &g2));
  gkrt_tensor x1 = add_tensor(g1, 64, GKRT_TENSOR_INPUT, "x1"), y1 = add_tensor(g1, 64, GKRT_TENSOR_OUTPUT, "y1");
  gkrt_tensor x2 = add_tensor(g2, 64, GKRT_TENSOR_INPUT, "x2"), y2 = add_tensor(g2, 64, GKRT_TENSOR_OUTPUT, "y2");
  OK(add_node(g1, shared, &x1, 1, y1, NULL, 0));
  OK(add_node(g2, shared, &x2, 1, y2, NULL, 0));
  OK(gkrt_graph_finalize(g1));
  OK(gkrt_graph_finalize(g2));
  OK(gkrt_graph_write_tensor(g1, x1, v16, 64));
  OK(gkrt_graph_write_tensor(g2, x2, v16, 64));
  OK(gkrt_runtime_run(rt, g1));
  OK(gkrt_kernel_release(shared));
  OK(gkrt_runtime_run(rt, g2)); /* the kernel lives on in g2 */
  float w16[16];
  for (int i = 0; i < 16; i++) w16[i] = v16[i] > 0.0f ? v16[i] : 0.0f;
  OK(gkrt_graph_read_tensor(g2, y2, r16, 64));
  CHECK_BITS(r16, w16, 16);
  OK(gkrt_graph_release(g1));
  OK(gkrt_runtime_run(rt, g2));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  OK(gkrt_graph_read_tensor(g2, y2, r16, 64));
  CHECK_BITS(r16, w16, 16);
  OK(gkrt_graph_release(g2));
  FAILS(gkrt_graph_release(g1), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_release(g2), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_kernel_release(shared), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  FAILS(gkrt_runtime_release(rt), GKRT_STATUS_INVALID_ARGUMENT, "runtime");

  /* A fresh runtime works after all that. */
  rt = test_runtime(0);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_done("leak_release_order");
}
