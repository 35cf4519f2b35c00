/*
 * int_refcount: reference-count freeing on a known graph — a chain, a diamond, a tensor read
 * twice by one node (and once more later), workspaces, and an intermediate written and never
 * read. The peak of live transient bytes is worked out by hand below; gkrt_graph_get_info must
 * report it, and a run must raise the pool's allocated bytes by exactly that much above what
 * was allocated before it, then return to that baseline. The allocation counts per run are
 * checked too, and every value is checked against plain C (so a tensor freed early, whose
 * memory went to a later tensor, shows up as a wrong number). A second graph checks rounding
 * to 256 bytes.
 */
#include "test_util.h"

enum { R = 8, D = 64, H = 128, O = 16, S = R * H }; /* S floats = 4096 bytes */

static void ref_matmul(const float *a, const float *b, float *c, int m, int n, int k) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int p = 0; p < k; p++) acc = acc + a[i * k + p] * b[p * n + j];
      c[i * n + j] = acc;
    }
}

static float relu_ref(float v) { return v > 0.0f ? v : 0.0f; }

typedef struct {
  gkrt_graph *g;
  gkrt_tensor x, w1, w2, k, y;
} known_graph;

static float xv[R * D], w1v[D * H], w2v[H * O];

static void reference(float *k, float *y) {
  static float a[S], e[S], f[S], h[S];
  ref_matmul(xv, w1v, a, R, H, D);
  for (int i = 0; i < S; i++) {
    float b = relu_ref(a[i]);
    float c = 0.5f * b;
    float d1 = relu_ref(c);
    float d2 = -0.25f * c;
    e[i] = d1 + d2;
    f[i] = e[i] + e[i];
    h[i] = e[i] + 7.0f;
    k[i] = f[i] + h[i];
  }
  ref_matmul(k, w2v, y, R, O, H);
}

static void check_outputs(known_graph *kg) {
  static float k[S], y[R * O], k_ref[S], y_ref[R * O];
  OK(gkrt_graph_read_tensor(kg->g, kg->k, k, sizeof k));
  OK(gkrt_graph_read_tensor(kg->g, kg->y, y, sizeof y));
  reference(k_ref, y_ref);
  CHECK_BITS(k, k_ref, S);
  CHECK_BITS(y, y_ref, R * O);
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *kmatmul = builtin_kernel(rt, GKRT_BUILTIN_MATMUL), *krelu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_kernel *kscale = builtin_kernel(rt, GKRT_BUILTIN_SCALE), *kadd = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  gkrt_kernel *kfill = builtin_kernel(rt, GKRT_BUILTIN_FILL);
  const uint64_t base = allocated_bytes(rt);
  const uint64_t base_requested = stats_of(rt).requested_bytes;

  known_graph kg;
  OK(gkrt_graph_create(rt, &kg.g));
  gkrt_graph *g = kg.g;
  kg.x = add_tensor(g, R * D * 4, GKRT_TENSOR_INPUT, "x");       /* 2048 */
  kg.w1 = add_tensor(g, D * H * 4, GKRT_TENSOR_PARAMETER, "w1"); /* 32768 */
  kg.w2 = add_tensor(g, H * O * 4, GKRT_TENSOR_PARAMETER, "w2"); /* 8192 */
  const gkrt_tensor_kind I = GKRT_TENSOR_INTERMEDIATE;
  gkrt_tensor a = add_tensor(g, S * 4, I, "a"), b = add_tensor(g, S * 4, I, "b"), c = add_tensor(g, S * 4, I, "c");
  gkrt_tensor d1 = add_tensor(g, S * 4, I, "d1"), d2 = add_tensor(g, S * 4, I, "d2"), e = add_tensor(g, S * 4, I, "e");
  gkrt_tensor f = add_tensor(g, S * 4, I, "f"), dead = add_tensor(g, 12288, I, "dead");
  gkrt_tensor gg = add_tensor(g, S * 4, I, "g"), h = add_tensor(g, S * 4, I, "h");
  kg.k = add_tensor(g, S * 4, GKRT_TENSOR_OUTPUT, "k"); /* 4096 */
  kg.y = add_tensor(g, R * O * 4, GKRT_TENSOR_OUTPUT, "y"); /* 512 */

  const uint32_t mm1[3] = {R, H, D}, mm2[3] = {R, O, H};
  const float half = 0.5f, quarter = -0.25f, one = 1.0f, seven = 7.0f;
  gkrt_tensor in2[2];
  gkrt_launch l_half = {{1, 1, 1}, {1, 1, 1}, 0, &half, 4};
  in2[0] = kg.x, in2[1] = kg.w1;
  OK(add_node(g, kmatmul, in2, 2, a, mm1, sizeof mm1));                                   /* n0 */
  OK(add_node(g, krelu, &a, 1, b, NULL, 0));                                              /* n1 */
  const uint64_t ws2[1] = {8192};
  OK(gkrt_graph_add_kernel(g, kscale, &b, 1, &c, 1, ws2, 1, &l_half, NULL));              /* n2 */
  OK(add_node(g, krelu, &c, 1, d1, NULL, 0));                                             /* n3 */
  OK(add_node(g, kscale, &c, 1, d2, &quarter, 4));                                        /* n4 */
  in2[0] = d1, in2[1] = d2;
  OK(add_node(g, kadd, in2, 2, e, NULL, 0));                                              /* n5 */
  in2[0] = e, in2[1] = e;
  const uint64_t ws6[2] = {1024, 512};
  OK(gkrt_graph_add_kernel(g, kadd, in2, 2, &f, 1, ws6, 2, NULL, NULL));                  /* n6 */
  OK(add_node(g, kfill, NULL, 0, dead, &one, 4));                                         /* n7 */
  OK(add_node(g, kfill, NULL, 0, gg, &seven, 4));                                         /* n8 */
  in2[0] = e, in2[1] = gg;
  OK(add_node(g, kadd, in2, 2, h, NULL, 0));                                              /* n9 */
  in2[0] = f, in2[1] = h;
  OK(add_node(g, kadd, in2, 2, kg.k, NULL, 0));                                           /* n10 */
  in2[0] = kg.k, in2[1] = kg.w2;
  OK(add_node(g, kmatmul, in2, 2, kg.y, mm2, sizeof mm2));                                /* n11 */
  OK(gkrt_graph_finalize(g));

  /* Live transient bytes per node (allocated before the node runs, freed right after the last
   * node that uses them; workspaces only during their node). S = 4096 bytes:
   *   n0  a                      4096
   *   n1  a b                    8192   -> a freed: 4096
   *   n2  b c + ws 8192          16384  -> b, ws freed: 4096
   *   n3  c d1                   8192
   *   n4  c d1 d2                12288  -> c freed: 8192
   *   n5  d1 d2 e                12288  -> d1, d2 freed: 4096
   *   n6  e f + ws 1024 + 512    9728   -> ws freed: 8192 (e is still needed by n9)
   *   n7  e f dead(12288)        20480  -> dead freed: 8192          <- the peak
   *   n8  e f g                  12288
   *   n9  e f g h                16384  -> e, g freed: 8192
   *   n10 f h (k is an output)   8192   -> f, h freed: 0
   *   n11 (y is an output)       0
   * Peak 20480 at node 7. Total of every intermediate and workspace: 9 * 4096 (a b c d1 d2 e
   * f g h) + 12288 (dead) + 8192 + 1024 + 512 (workspaces) = 58880. Persistent: x 2048 + w1 32768 + w2 8192 + k 4096 + y 512 =
   * 47616. */
  const uint64_t expected_peak = 20480;
  gkrt_graph_info info = info_of(g);
  CHECK_EQ_U64(info.num_nodes, 12);
  CHECK_EQ_U64(info.num_tensors, 15);
  CHECK_EQ_U64(info.peak_transient_bytes, expected_peak);
  CHECK_EQ_U64(info.peak_node, 7);
  CHECK_EQ_U64(info.transient_total_bytes, 58880);
  CHECK_EQ_U64(info.persistent_bytes, 47616);

  fill_floats(xv, R * D, 1);
  fill_floats(w1v, D * H, 2);
  fill_floats(w2v, H * O, 3);
  OK(gkrt_graph_write_tensor(g, kg.x, xv, sizeof xv));
  OK(gkrt_graph_write_tensor(g, kg.w1, w1v, sizeof w1v));
  OK(gkrt_graph_write_tensor(g, kg.w2, w2v, sizeof w2v));
  CHECK_EQ_U64(allocated_bytes(rt) - base, 2048 + 32768 + 8192);

  /* Run 1: the outputs k and y get their memory (at nodes 10 and 11, after the peak):
   * 10 intermediates + 3 workspaces + 2 outputs = 15 allocations, 13 frees. */
  gkrt_stats s0 = stats_of(rt);
  OK(gkrt_runtime_reset_peak_stats(rt));
  OK(gkrt_runtime_run(rt, g));
  gkrt_stats s1 = stats_of(rt);
  check_outputs(&kg);
  CHECK_EQ_U64(s1.allocated_bytes - base, info.persistent_bytes);
  CHECK_EQ_U64(s1.peak_allocated_bytes - s0.allocated_bytes, expected_peak);
  CHECK_EQ_U64(s1.alloc_count - s0.alloc_count, 15);
  CHECK_EQ_U64(s1.free_count - s0.free_count, 13);
  CHECK_EQ_U64(s1.last_run_pool_allocs, 15);

  /* Runs 2 and 3 (new inputs for run 3): exactly the computed peak above the baseline, and
   * back to the baseline after, 13 allocations and 13 frees each. */
  for (int run = 2; run <= 3; run++) {
    if (run == 3) {
      fill_floats(xv, R * D, 33);
      OK(gkrt_graph_write_tensor(g, kg.x, xv, sizeof xv));
    }
    OK(gkrt_runtime_reset_peak_stats(rt));
    gkrt_stats before = stats_of(rt);
    CHECK_EQ_U64(before.peak_allocated_bytes, before.allocated_bytes);
    OK(gkrt_runtime_run(rt, g));
    gkrt_stats after = stats_of(rt);
    CHECK_EQ_U64(after.peak_allocated_bytes - before.allocated_bytes, expected_peak);
    CHECK_EQ_U64(after.allocated_bytes, before.allocated_bytes);
    CHECK_EQ_U64(after.requested_bytes, before.requested_bytes);
    CHECK_EQ_U64(after.alloc_count - before.alloc_count, 13);
    CHECK_EQ_U64(after.free_count - before.free_count, 13);
    CHECK_EQ_U64(after.last_run_pool_allocs, 13);
    check_outputs(&kg);
  }

  /* --- Rounding: sizes that are not multiples of 256 count as their rounded size.
   *   n0  m1 = relu(x2)            m1 1000 -> 1024                    1024
   *   n1  m2 = 3 m1, ws 1 byte     m1 1024 + m2 1024 + ws 1 -> 256    2304  -> m1, ws freed
   *   n2  y2 = relu(m2)            (y2 is an output)                  1024  -> m2 freed
   * Peak 2304 at node 1; total 2304; persistent x2 + y2 = 1024 + 1024. --- */
  gkrt_graph *g2;
  OK(gkrt_graph_create(rt, &g2));
  gkrt_tensor x2 = add_tensor(g2, 1000, GKRT_TENSOR_INPUT, "x2");
  gkrt_tensor m1 = add_tensor(g2, 1000, I, "m1"), m2 = add_tensor(g2, 1000, I, "m2");
  gkrt_tensor y2 = add_tensor(g2, 1000, GKRT_TENSOR_OUTPUT, "y2");
  const float three = 3.0f;
  gkrt_launch l3 = {{1, 1, 1}, {1, 1, 1}, 0, &three, 4};
  const uint64_t ws1[1] = {1};
  OK(add_node(g2, krelu, &x2, 1, m1, NULL, 0));
  OK(gkrt_graph_add_kernel(g2, kscale, &m1, 1, &m2, 1, ws1, 1, &l3, NULL));
  OK(add_node(g2, krelu, &m2, 1, y2, NULL, 0));
  OK(gkrt_graph_finalize(g2));
  info = info_of(g2);
  CHECK_EQ_U64(info.peak_transient_bytes, 2304);
  CHECK_EQ_U64(info.peak_node, 1);
  CHECK_EQ_U64(info.transient_total_bytes, 2304);
  CHECK_EQ_U64(info.persistent_bytes, 2048);
  float x2v[250], y2v[250], y2w[250];
  fill_floats(x2v, 250, 9);
  OK(gkrt_graph_write_tensor(g2, x2, x2v, sizeof x2v));
  for (int run = 0; run < 2; run++) {
    OK(gkrt_runtime_reset_peak_stats(rt));
    gkrt_stats before = stats_of(rt);
    OK(gkrt_runtime_run(rt, g2));
    gkrt_stats after = stats_of(rt);
    uint64_t outputs = run == 0 ? 1024 : 0; /* y2 gets its memory in the first run */
    CHECK_EQ_U64(after.peak_allocated_bytes - before.allocated_bytes, 2304);
    CHECK_EQ_U64(after.allocated_bytes - before.allocated_bytes, outputs);
    OK(gkrt_graph_read_tensor(g2, y2, y2v, sizeof y2v));
    for (int i = 0; i < 250; i++) y2w[i] = relu_ref(three * relu_ref(x2v[i]));
    CHECK_BITS(y2v, y2w, 250);
  }

  /* Releasing the graphs gives everything back. */
  OK(gkrt_graph_release(g));
  OK(gkrt_graph_release(g2));
  CHECK_EQ_U64(allocated_bytes(rt), base);
  CHECK_EQ_U64(stats_of(rt).requested_bytes, base_requested);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_kernel_release(kmatmul));
  OK(gkrt_kernel_release(krelu));
  OK(gkrt_kernel_release(kscale));
  OK(gkrt_kernel_release(kadd));
  OK(gkrt_kernel_release(kfill));
  OK(gkrt_runtime_release(rt));
  return test_done("int_refcount");
}
