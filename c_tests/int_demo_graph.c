/*
 * int_demo_graph: the demo's residual MLP (examples_c/mlp.h) run three times — twice on the same
 * inputs, once on new ones — with both outputs bit-exact against mlp_reference every time; its
 * liveness figures (peak transient bytes worked out by hand below) and the pool's rise during a
 * run match, and allocated bytes return to their baseline after each run.
 */
#include "mlp.h"
#include "test_util.h"

static float x[MLP_B * MLP_D], w1[MLP_D * MLP_H], w2[MLP_H * MLP_H], w3[MLP_H * MLP_O];
static float y[MLP_B * MLP_O], g[MLP_B * MLP_H], y_ref[MLP_B * MLP_O], g_ref[MLP_B * MLP_H];

static void run_and_compare(gkrt_runtime *rt, mlp *m, uint64_t expected_peak) {
  memset(y, 0, sizeof y);
  memset(g, 0, sizeof g);
  gkrt_stats before = stats_of(rt);
  OK(gkrt_runtime_reset_peak_stats(rt));
  OK(gkrt_runtime_run(rt, m->graph));
  gkrt_stats after = stats_of(rt);
  OK(gkrt_graph_read_tensor(m->graph, m->y, y, sizeof y));
  OK(gkrt_graph_read_tensor(m->graph, m->g, g, sizeof g));
  mlp_reference(x, w1, w2, w3, y_ref, g_ref);
  CHECK_BITS(y, y_ref, MLP_B * MLP_O);
  CHECK_BITS(g, g_ref, MLP_B * MLP_H);
  CHECK_EQ_U64(after.allocated_bytes, before.allocated_bytes);
  CHECK_EQ_U64(after.peak_allocated_bytes - before.allocated_bytes, expected_peak);
  CHECK_EQ_U64(after.runs - before.runs, 1);
  CHECK_EQ_U64(after.nodes_launched - before.nodes_launched, 10);
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  const uint64_t base = allocated_bytes(rt);
  mlp m;
  CHECK(mlp_build(rt, &m) == 0);

  /* Liveness, by hand. Every intermediate is B x H floats = 64*256*4 = 65536 bytes ("U").
   *   node 0 fill      bias            live: bias                      1U
   *   node 1 matmul    h1 = x.W1       live: bias h1                   2U
   *   node 2 add       z1 = h1 + bias  live: bias h1 z1 = 3U, then h1, bias freed -> 1U
   *   node 3 relu      a1 = relu(z1)   live: z1 a1                     2U
   *   node 4 matmul    h2 = a1.W2      live: z1 a1 h2                  3U
   *   node 5 relu      a2 = relu(h2)   live: z1 a1 h2 a2 = 4U (peak), then h2 freed -> 3U
   *   node 6 add       r = a2 + a1     live: z1 a1 a2 r = 4U (not higher), then a2, a1 -> 2U
   *   node 7 matmul    y = r.W3        (y is an output) 2U
   *   node 8 relu_grad gz = (r, z1)    live: z1 r gz = 3U, then r, z1 freed -> 1U
   *   node 9 scale     g = 0.5 gz      (g is an output) 1U, then gz freed -> 0
   * Peak 4U = 262144 bytes, first reached at node 5; all 8 intermediates total 8U = 524288.
   * Persistent: x 64*128*4 = 32768, W1 128*256*4 = 131072, W2 256*256*4 = 262144,
   * W3 256*32*4 = 32768, y 64*32*4 = 8192, g 65536: 532480 bytes. */
  const uint64_t U = 65536;
  gkrt_graph_info info = info_of(m.graph);
  CHECK_EQ_U64(info.finalized, 1);
  CHECK_EQ_U64(info.num_nodes, 10);
  CHECK_EQ_U64(info.num_tensors, 14);
  CHECK_EQ_U64(info.peak_transient_bytes, 4 * U);
  CHECK_EQ_U64(info.peak_node, 5);
  CHECK_EQ_U64(info.transient_total_bytes, 8 * U);
  CHECK_EQ_U64(m.intermediate_bytes, 8 * U);
  CHECK_EQ_U64(info.persistent_bytes, 532480);

  mlp_fill_random(x, MLP_B * MLP_D, 1);
  mlp_fill_random(w1, MLP_D * MLP_H, 2);
  mlp_fill_random(w2, MLP_H * MLP_H, 3);
  mlp_fill_random(w3, MLP_H * MLP_O, 4);
  OK(gkrt_graph_write_tensor(m.graph, m.x, x, sizeof x));
  OK(gkrt_graph_write_tensor(m.graph, m.w1, w1, sizeof w1));
  OK(gkrt_graph_write_tensor(m.graph, m.w2, w2, sizeof w2));
  OK(gkrt_graph_write_tensor(m.graph, m.w3, w3, sizeof w3));

  /* First run: the outputs get their memory during it (after the transient peak, at nodes 7
   * and 9, when 2U and 1U are live: 2U + y + ... stays below 4U). */
  gkrt_stats s0 = stats_of(rt);
  OK(gkrt_runtime_reset_peak_stats(rt));
  OK(gkrt_runtime_run(rt, m.graph));
  gkrt_stats s1 = stats_of(rt);
  OK(gkrt_graph_read_tensor(m.graph, m.y, y, sizeof y));
  OK(gkrt_graph_read_tensor(m.graph, m.g, g, sizeof g));
  mlp_reference(x, w1, w2, w3, y_ref, g_ref);
  CHECK_BITS(y, y_ref, MLP_B * MLP_O);
  CHECK_BITS(g, g_ref, MLP_B * MLP_H);
  CHECK_EQ_U64(s1.allocated_bytes - s0.allocated_bytes, 8192 + 65536); /* y and g */
  CHECK_EQ_U64(s1.allocated_bytes - base, info.persistent_bytes);
  CHECK_EQ_U64(s1.peak_allocated_bytes - s0.allocated_bytes, 4 * U);

  /* Second run, same inputs; third run, new inputs and weights. */
  run_and_compare(rt, &m, 4 * U);
  mlp_fill_random(x, MLP_B * MLP_D, 11);
  mlp_fill_random(w2, MLP_H * MLP_H, 13);
  OK(gkrt_graph_write_tensor(m.graph, m.x, x, sizeof x));
  OK(gkrt_graph_write_tensor(m.graph, m.w2, w2, sizeof w2));
  run_and_compare(rt, &m, 4 * U);
  CHECK(memcmp(y, y_ref, sizeof y) == 0);

  OK(gkrt_graph_release(m.graph));
  CHECK_EQ_U64(allocated_bytes(rt), base);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_done("int_demo_graph");
}
