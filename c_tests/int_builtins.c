/*
 * int_builtins: every built-in (fill, copy, add, scale, relu, relu_grad, matmul) against a plain
 * C reference, bit-exact (memcmp), on inputs with negatives, +0.0, -0.0 and subnormals, over
 * sizes that are and are not multiples of a block; matmul on odd shapes; in-place nodes (output
 * == input) on parameters (whose updates persist across runs) and on intermediates.
 */
#include "test_util.h"

static gkrt_runtime *rt;
static gkrt_kernel *kern[7];

static float relu_ref(float v) { return v > 0.0f ? v : 0.0f; }

/* One node: inputs (host data) -> one output; returns the output in `out`. */
static void run_node(gkrt_builtin b, const float *const *ins, const uint64_t *in_bytes, size_t nin,
                     void *out, uint64_t out_bytes, const void *params, size_t psize) {
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor t_in[2];
  for (size_t i = 0; i < nin; i++) t_in[i] = add_tensor(g, in_bytes[i], GKRT_TENSOR_INPUT, i ? "in1" : "in0");
  gkrt_tensor t_out = add_tensor(g, out_bytes, GKRT_TENSOR_OUTPUT, "out");
  OK(add_node(g, kern[b], t_in, nin, t_out, params, psize));
  OK(gkrt_graph_finalize(g));
  for (size_t i = 0; i < nin; i++) OK(gkrt_graph_write_tensor(g, t_in[i], ins[i], in_bytes[i]));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, t_out, out, out_bytes));
  OK(gkrt_graph_release(g));
}

static void check_elementwise(size_t n, uint32_t seed) {
  const uint64_t bytes = n * 4;
  float *a = alloc_floats(n), *b = alloc_floats(n), *y = alloc_floats(n), *want = alloc_floats(n);
  fill_floats(a, n, seed);
  fill_floats(b, n, seed + 1);
  const float *in1[1] = {a}, *in2[2] = {a, b};
  const uint64_t sz2[2] = {bytes, bytes};

  /* fill */
  const float fills[] = {3.25f, -0.0f, 0.0f, -1e-40f /* subnormal */, -123456.789f};
  for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
    memset(y, 0x7F, bytes);
    run_node(GKRT_BUILTIN_FILL, NULL, NULL, 0, y, bytes, &fills[f], 4);
    for (size_t i = 0; i < n; i++) want[i] = fills[f];
    CHECK_BITS(y, want, n);
  }
  /* add */
  run_node(GKRT_BUILTIN_ADD, in2, sz2, 2, y, bytes, NULL, 0);
  for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
  CHECK_BITS(y, want, n);
  /* scale: zero alpha turns negatives into -0.0; a tiny alpha makes subnormals. */
  const float alphas[] = {-1.5f, 0.0f, -0.0f, 1e-30f, 3.0f, 1.0f};
  for (size_t s = 0; s < sizeof alphas / sizeof alphas[0]; s++) {
    run_node(GKRT_BUILTIN_SCALE, in1, sz2, 1, y, bytes, &alphas[s], 4);
    for (size_t i = 0; i < n; i++) want[i] = alphas[s] * a[i];
    CHECK_BITS(y, want, n);
  }
  /* relu: -0.0 becomes +0.0 */
  run_node(GKRT_BUILTIN_RELU, in1, sz2, 1, y, bytes, NULL, 0);
  for (size_t i = 0; i < n; i++) want[i] = relu_ref(a[i]);
  CHECK_BITS(y, want, n);
  /* relu_grad(grad = a, x = b) */
  run_node(GKRT_BUILTIN_RELU_GRAD, in2, sz2, 2, y, bytes, NULL, 0);
  for (size_t i = 0; i < n; i++) want[i] = b[i] > 0.0f ? a[i] : 0.0f;
  CHECK_BITS(y, want, n);
  free(a);
  free(b);
  free(y);
  free(want);
}

static void check_copy(size_t bytes, uint32_t seed) {
  unsigned char *src = malloc(bytes), *dst = malloc(bytes);
  fill_bytes(src, bytes, seed);
  memset(dst, 0, bytes);
  const float *ins[1] = {(const float *)src};
  const uint64_t sz[1] = {bytes};
  run_node(GKRT_BUILTIN_COPY, ins, sz, 1, dst, bytes, NULL, 0);
  CHECK(memcmp(src, dst, bytes) == 0);
  free(src);
  free(dst);
}

static void check_matmul(uint32_t m, uint32_t n, uint32_t k, uint32_t seed) {
  float *a = alloc_floats((size_t)m * k), *b = alloc_floats((size_t)k * n);
  float *c = alloc_floats((size_t)m * n), *want = alloc_floats((size_t)m * n);
  fill_floats(a, (size_t)m * k, seed);
  fill_floats(b, (size_t)k * n, seed + 7);
  const float *ins[2] = {a, b};
  const uint64_t sz[2] = {(uint64_t)m * k * 4, (uint64_t)k * n * 4};
  const uint32_t dims[3] = {m, n, k};
  run_node(GKRT_BUILTIN_MATMUL, ins, sz, 2, c, (uint64_t)m * n * 4, dims, sizeof dims);
  for (uint32_t i = 0; i < m; i++)
    for (uint32_t j = 0; j < n; j++) {
      float acc = 0.0f;
      for (uint32_t p = 0; p < k; p++) {
        float prod = a[(size_t)i * k + p] * b[(size_t)p * n + j];
        acc = acc + prod;
      }
      want[(size_t)i * n + j] = acc;
    }
  if (memcmp(c, want, (size_t)m * n * 4) != 0) fprintf(stderr, "matmul m=%u n=%u k=%u differs:\n", m, n, k);
  CHECK_BITS(c, want, (size_t)m * n);
  free(a);
  free(b);
  free(c);
  free(want);
}

/* In place on parameters: relu(p) -> p, scale(q, 2) -> q, add(p, q) -> p; run twice, the
 * updates persist. */
static void check_in_place_parameters(void) {
  enum { N = 777 };
  float p0[N], q0[N], p[N], q[N], got[N];
  fill_floats(p0, N, 41);
  fill_floats(q0, N, 42);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor tp = add_tensor(g, sizeof p, GKRT_TENSOR_PARAMETER, "p");
  gkrt_tensor tq = add_tensor(g, sizeof q, GKRT_TENSOR_PARAMETER, "q");
  const float two = 2.0f;
  OK(add_node(g, kern[GKRT_BUILTIN_RELU], &tp, 1, tp, NULL, 0));
  OK(add_node(g, kern[GKRT_BUILTIN_SCALE], &tq, 1, tq, &two, 4));
  gkrt_tensor pq[2] = {tp, tq};
  OK(add_node(g, kern[GKRT_BUILTIN_ADD], pq, 2, tp, NULL, 0));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_write_tensor(g, tp, p0, sizeof p0));
  OK(gkrt_graph_write_tensor(g, tq, q0, sizeof q0));
  memcpy(p, p0, sizeof p);
  memcpy(q, q0, sizeof q);
  for (int run = 0; run < 2; run++) {
    OK(gkrt_runtime_run(rt, g));
    for (int i = 0; i < N; i++) {
      p[i] = relu_ref(p[i]);
      q[i] = two * q[i];
      p[i] = p[i] + q[i];
    }
    OK(gkrt_graph_read_tensor(g, tp, got, sizeof got));
    CHECK_BITS(got, p, N);
    OK(gkrt_graph_read_tensor(g, tq, got, sizeof got));
    CHECK_BITS(got, q, N);
  }
  OK(gkrt_graph_release(g));
}

/* In place on an intermediate: copy(x) -> m, relu(m) -> m, scale(m, -0.5) -> m, add(m, m) -> m,
 * relu_grad(m, x) -> m, copy(m) -> y. */
static void check_in_place_intermediate(void) {
  enum { N = 1031 };
  float x[N], y[N], want[N];
  fill_floats(x, N, 51);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor tx = add_tensor(g, sizeof x, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor tm = add_tensor(g, sizeof x, GKRT_TENSOR_INTERMEDIATE, "m");
  gkrt_tensor ty = add_tensor(g, sizeof y, GKRT_TENSOR_OUTPUT, "y");
  const float alpha = -0.5f;
  OK(add_node(g, kern[GKRT_BUILTIN_COPY], &tx, 1, tm, NULL, 0));
  OK(add_node(g, kern[GKRT_BUILTIN_RELU], &tm, 1, tm, NULL, 0));
  OK(add_node(g, kern[GKRT_BUILTIN_SCALE], &tm, 1, tm, &alpha, 4));
  gkrt_tensor mm[2] = {tm, tm}, mx[2] = {tm, tx};
  OK(add_node(g, kern[GKRT_BUILTIN_ADD], mm, 2, tm, NULL, 0));
  OK(add_node(g, kern[GKRT_BUILTIN_RELU_GRAD], mx, 2, tm, NULL, 0));
  OK(add_node(g, kern[GKRT_BUILTIN_COPY], &tm, 1, ty, NULL, 0));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_write_tensor(g, tx, x, sizeof x));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, ty, y, sizeof y));
  for (int i = 0; i < N; i++) {
    float m = relu_ref(x[i]);
    m = alpha * m;
    m = m + m;
    want[i] = x[i] > 0.0f ? m : 0.0f;
  }
  CHECK_BITS(y, want, N);
  OK(gkrt_graph_release(g));
}

int main(void) {
  rt = test_runtime(0);
  for (int b = 0; b < 7; b++) kern[b] = builtin_kernel(rt, (gkrt_builtin)b);
  const uint64_t base = allocated_bytes(rt);

  const size_t sizes[] = {1, 7, 64, 256, 1000, 4099, 65537};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_elementwise(sizes[i], 100 + (uint32_t)i);
  const size_t copy_sizes[] = {1, 3, 4, 1001, 4096, 65539};
  for (size_t i = 0; i < sizeof copy_sizes / sizeof copy_sizes[0]; i++) check_copy(copy_sizes[i], 200 + (uint32_t)i);

  const uint32_t shapes[][3] = {{1, 1, 1},   {7, 5, 3},    {33, 65, 17}, {16, 16, 16}, {17, 15, 16},
                                {1, 300, 1}, {130, 1, 257}, {64, 17, 300}, {2, 3, 1000}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    check_matmul(shapes[i][0], shapes[i][1], shapes[i][2], 300 + (uint32_t)i);

  check_in_place_parameters();
  check_in_place_intermediate();

  CHECK_EQ_U64(allocated_bytes(rt), base);
  for (int b = 0; b < 7; b++) OK(gkrt_kernel_release(kern[b]));
  OK(gkrt_runtime_release(rt));
  return test_done("int_builtins");
}
