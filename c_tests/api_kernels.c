/*
 * api_kernels: gkrt_kernel_builtin (every id; unknown ids), gkrt_kernel_from_callback (NULL
 * callback), gkrt_kernel_from_ptx / _from_cubin / _from_source (argument checks on every
 * backend; UNSUPPORTED naming the function on the host backend; on CUDA: a PTX kernel and two
 * CUDA-source kernels load and compute the right numbers, with parameters and a workspace in
 * the documented order; a params blob shorter than the kernel's struct is INVALID_ARGUMENT;
 * compile and load errors are in neg_kernel_load.c), and
 * gkrt_kernel_release (NULL, twice, wrong kind; a released kernel stays alive in its graphs).
 */
#include "test_util.h"

static int32_t noop_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  return 0;
}

/* out[i] = in[i] + p.add for i < p.n. */
static const char *ADD_ONE_SRC =
    "struct Params { float add; unsigned int n; };\n"
    "extern \"C\" __global__ void add_one(float* in, float* out, Params p) {\n"
    "  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < p.n) out[i] = in[i] + p.add;\n"
    "}\n"
    /* A workspace comes after the outputs: ws[i] = 2 * in[i]; out[i] = ws[i] + p.add. */
    "extern \"C\" __global__ void via_workspace(const float* in, float* out, float* ws, Params p) {\n"
    "  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < p.n) { ws[i] = __fmul_rn(2.0f, in[i]); out[i] = __fadd_rn(ws[i], p.add); }\n"
    "}\n";

/* out[0] = in[0] + 1.0f, in hand-written PTX. */
static const char *PTX_ADD_ONE =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry ptx_add_one(.param .u64 in_ptr, .param .u64 out_ptr)\n"
    "{\n"
    "  .reg .b64 %rd<5>;\n"
    "  .reg .f32 %f<3>;\n"
    "  ld.param.u64 %rd1, [in_ptr];\n"
    "  ld.param.u64 %rd2, [out_ptr];\n"
    "  cvta.to.global.u64 %rd3, %rd1;\n"
    "  cvta.to.global.u64 %rd4, %rd2;\n"
    "  ld.global.f32 %f1, [%rd3];\n"
    "  add.rn.f32 %f2, %f1, 0f3F800000;\n"
    "  st.global.f32 [%rd4], %f2;\n"
    "  ret;\n"
    "}\n";

typedef struct {
  float add;
  uint32_t n;
} params_t;

/* Runs `k` as x (n floats) -> y (n floats) with `params`, optional workspace; returns y. */
static void run_device_kernel(gkrt_runtime *rt, gkrt_kernel *k, const float *x, float *y, uint32_t n,
                              const void *params, size_t params_size, uint64_t workspace) {
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor tx = add_tensor(g, n * 4ull, GKRT_TENSOR_INPUT, "dev_x");
  gkrt_tensor ty = add_tensor(g, n * 4ull, GKRT_TENSOR_OUTPUT, "dev_y");
  gkrt_launch l = {{(n + 127) / 128, 1, 1}, {128, 1, 1}, 0, params, params_size};
  OK(gkrt_graph_add_kernel(g, k, &tx, 1, &ty, 1, &workspace, workspace ? 1 : 0, &l, NULL));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_write_tensor(g, tx, x, n * 4ull));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, ty, y, n * 4ull));
  OK(gkrt_graph_release(g));
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_runtime *rt2 = test_runtime(0);
  const int on_host = test_on_host(rt);
  gkrt_kernel *k = (gkrt_kernel *)(uintptr_t)0x5e47, *const sentinel = (gkrt_kernel *)(uintptr_t)0x5e47;

  /* --- Built-ins: every id creates a distinct kernel; unknown ids do not. --- */
  const gkrt_builtin ids[] = {GKRT_BUILTIN_FILL,  GKRT_BUILTIN_COPY,      GKRT_BUILTIN_ADD,   GKRT_BUILTIN_SCALE,
                              GKRT_BUILTIN_RELU,  GKRT_BUILTIN_RELU_GRAD, GKRT_BUILTIN_MATMUL};
  gkrt_kernel *bk[7];
  for (int i = 0; i < 7; i++) {
    CHECK_EQ_U64(ids[i], i);
    bk[i] = NULL;
    OK(gkrt_kernel_builtin(rt, ids[i], &bk[i]));
    CHECK(bk[i] != NULL);
    for (int j = 0; j < i; j++) CHECK(bk[i] != bk[j]);
  }
  const gkrt_builtin bad_ids[] = {7, 8, 1000, 0xFFFFFFFFu};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    FAILS(gkrt_kernel_builtin(rt, bad_ids[i], &k), GKRT_STATUS_INVALID_ARGUMENT, "built");
    MSG_HAS_U64(bad_ids[i]);
    CHECK(k == sentinel);
  }
  FAILS(gkrt_kernel_builtin(NULL, GKRT_BUILTIN_ADD, &k), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_kernel_builtin((gkrt_runtime *)bk[0], GKRT_BUILTIN_ADD, &k), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  CHECK(k == sentinel);

  /* --- Callbacks. --- */
  FAILS(gkrt_kernel_from_callback(rt, NULL, NULL, &k), GKRT_STATUS_INVALID_ARGUMENT, "callback");
  FAILS(gkrt_kernel_from_callback(rt, noop_cb, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_kernel_from_callback(NULL, noop_cb, NULL, &k), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  CHECK(k == sentinel);
  gkrt_kernel *cb = NULL;
  OK(gkrt_kernel_from_callback(rt, noop_cb, (void *)&k, &cb));
  CHECK(cb != NULL);

  /* --- Device code: argument checks come first, on every backend. --- */
  const uint8_t image[16] = {1, 2, 3, 4};
  FAILS(gkrt_kernel_from_ptx(rt, NULL, "f", &k), GKRT_STATUS_INVALID_ARGUMENT, "ptx");
  FAILS(gkrt_kernel_from_ptx(rt, PTX_ADD_ONE, NULL, &k), GKRT_STATUS_INVALID_ARGUMENT, "name");
  FAILS(gkrt_kernel_from_ptx(rt, PTX_ADD_ONE, "ptx_add_one", NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_kernel_from_ptx(NULL, PTX_ADD_ONE, "ptx_add_one", &k), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_kernel_from_cubin(rt, NULL, 16, "f", &k), GKRT_STATUS_INVALID_ARGUMENT, "image");
  FAILS(gkrt_kernel_from_cubin(rt, image, 0, "f", &k), GKRT_STATUS_INVALID_ARGUMENT, "image");
  FAILS(gkrt_kernel_from_cubin(rt, image, sizeof image, NULL, &k), GKRT_STATUS_INVALID_ARGUMENT, "name");
  FAILS(gkrt_kernel_from_cubin(rt, image, sizeof image, "f", NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_kernel_from_source(rt, NULL, "add_one", NULL, 0, &k), GKRT_STATUS_INVALID_ARGUMENT, "source");
  FAILS(gkrt_kernel_from_source(rt, ADD_ONE_SRC, NULL, NULL, 0, &k), GKRT_STATUS_INVALID_ARGUMENT, "name");
  FAILS(gkrt_kernel_from_source(rt, ADD_ONE_SRC, "add_one", NULL, 2, &k), GKRT_STATUS_INVALID_ARGUMENT, "options");
  MSG_HAS_U64(2);
  const char *null_option[2] = {"--fmad=false", NULL};
  FAILS(gkrt_kernel_from_source(rt, ADD_ONE_SRC, "add_one", null_option, 2, &k), GKRT_STATUS_INVALID_ARGUMENT,
        "option");
  FAILS(gkrt_kernel_from_source(rt, ADD_ONE_SRC, "add_one", NULL, 0, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  CHECK(k == sentinel);

  if (on_host) {
    /* --- The host backend runs no device code: UNSUPPORTED, naming the function. --- */
    FAILS(gkrt_kernel_from_ptx(rt, PTX_ADD_ONE, "ptx_add_one", &k), GKRT_STATUS_UNSUPPORTED, "ptx_add_one");
    FAILS(gkrt_kernel_from_cubin(rt, image, sizeof image, "cubin_fn", &k), GKRT_STATUS_UNSUPPORTED, "cubin_fn");
    FAILS(gkrt_kernel_from_source(rt, ADD_ONE_SRC, "add_one", NULL, 0, &k), GKRT_STATUS_UNSUPPORTED, "add_one");
    CHECK(k == sentinel);
  } else {
    /* --- CUDA: CUDA source compiled by NVRTC, with and without options. --- */
    enum { N = 1000 };
    float x[N], y[N], want[N];
    fill_floats(x, N, 5);
    gkrt_kernel *add_one = NULL, *add_one_again = NULL, *via_ws = NULL;
    OK(gkrt_kernel_from_source(rt, ADD_ONE_SRC, "add_one", NULL, 0, &add_one));
    const char *opts[1] = {"--fmad=false"};
    OK(gkrt_kernel_from_source(rt, ADD_ONE_SRC, "add_one", opts, 1, &add_one_again));
    OK(gkrt_kernel_from_source(rt, ADD_ONE_SRC, "via_workspace", NULL, 0, &via_ws));
    CHECK(add_one != add_one_again);
    params_t p = {1.5f, N};
    run_device_kernel(rt, add_one, x, y, N, &p, sizeof p, 0);
    for (int i = 0; i < N; i++) want[i] = x[i] + 1.5f;
    CHECK_BITS(y, want, N);
    p.add = -3.25f;
    run_device_kernel(rt, add_one_again, x, y, N, &p, sizeof p, 0);
    for (int i = 0; i < N; i++) want[i] = x[i] + -3.25f;
    CHECK_BITS(y, want, N);
    /* Only the first n elements: the parameter struct really arrives. */
    p.add = 1.0f;
    p.n = N / 2;
    gkrt_graph *g;
    OK(gkrt_graph_create(rt, &g));
    gkrt_tensor tx = add_tensor(g, N * 4, GKRT_TENSOR_INPUT, "px"), ty = add_tensor(g, N * 4, GKRT_TENSOR_PARAMETER, "py");
    gkrt_launch l = {{(N + 127) / 128, 1, 1}, {128, 1, 1}, 0, &p, sizeof p};
    OK(gkrt_graph_add_kernel(g, add_one, &tx, 1, &ty, 1, NULL, 0, &l, NULL));
    OK(gkrt_graph_finalize(g));
    float zeros[N];
    memset(zeros, 0, sizeof zeros);
    OK(gkrt_graph_write_tensor(g, tx, x, sizeof x));
    OK(gkrt_graph_write_tensor(g, ty, zeros, sizeof zeros));
    OK(gkrt_runtime_run(rt, g));
    OK(gkrt_graph_read_tensor(g, ty, y, sizeof y));
    for (int i = 0; i < N; i++) want[i] = i < N / 2 ? x[i] + 1.0f : 0.0f;
    CHECK_BITS(y, want, N);
    OK(gkrt_graph_release(g));
    /* A workspace pointer comes after the outputs, the params struct last. */
    p.add = 0.5f;
    p.n = N;
    run_device_kernel(rt, via_ws, x, y, N, &p, sizeof p, N * 4);
    for (int i = 0; i < N; i++) want[i] = 2.0f * x[i] + 0.5f;
    CHECK_BITS(y, want, N);

    /* --- A params blob shorter than the kernel's struct: INVALID_ARGUMENT (when the node is
     * added or when it runs), naming the kernel; never a launch that reads past the blob. --- */
    OK(gkrt_graph_create(rt, &g));
    tx = add_tensor(g, N * 4, GKRT_TENSOR_INPUT, "short_x");
    ty = add_tensor(g, N * 4, GKRT_TENSOR_OUTPUT, "short_y");
    const float only_add = 1.0f;
    gkrt_launch short_l = {{(N + 127) / 128, 1, 1}, {128, 1, 1}, 0, &only_add, sizeof only_add};
    gkrt_status st = gkrt_graph_add_kernel(g, add_one, &tx, 1, &ty, 1, NULL, 0, &short_l, NULL);
    if (st == GKRT_STATUS_OK) {
      OK(gkrt_graph_finalize(g));
      OK(gkrt_graph_write_tensor(g, tx, x, sizeof x));
      uint64_t before = allocated_bytes(rt);
      st = gkrt_runtime_run(rt, g);
      CHECK_EQ_U64(allocated_bytes(rt), before + 4096); /* only the output's memory */
    }
    if (st != GKRT_STATUS_INVALID_ARGUMENT)
      fprintf(stderr, "short params blob: %s (%s)\n", gkrt_status_name(st), last_error());
    CHECK_EQ_U64(st, GKRT_STATUS_INVALID_ARGUMENT);
    MSG_HAS("add_one");
    OK(gkrt_graph_release(g));
    CHECK_RUNTIME_WORKS(rt);

    /* --- Hand-written PTX. --- */
    gkrt_kernel *ptx = NULL;
    OK(gkrt_kernel_from_ptx(rt, PTX_ADD_ONE, "ptx_add_one", &ptx));
    float one_x = -2.75f, one_y = 0;
    OK(gkrt_graph_create(rt, &g));
    tx = add_tensor(g, 4, GKRT_TENSOR_INPUT, "one_x");
    ty = add_tensor(g, 4, GKRT_TENSOR_OUTPUT, "one_y");
    OK(gkrt_graph_add_kernel(g, ptx, &tx, 1, &ty, 1, NULL, 0, NULL, NULL));
    OK(gkrt_graph_finalize(g));
    OK(gkrt_graph_write_tensor(g, tx, &one_x, 4));
    OK(gkrt_runtime_run(rt, g));
    OK(gkrt_graph_read_tensor(g, ty, &one_y, 4));
    CHECK(one_y == -1.75f);
    OK(gkrt_graph_release(g));

    /* Compile and load errors (bad source, bad PTX, a bad image, a missing function) are in
     * neg_kernel_load.c: they fail driver calls on purpose, which sanitizer runs skip. */

    /* --- Device kernels belong to their runtime too. --- */
    gkrt_graph *g2;
    OK(gkrt_graph_create(rt2, &g2));
    tx = add_tensor(g2, 4, GKRT_TENSOR_INPUT, "x2");
    ty = add_tensor(g2, 4, GKRT_TENSOR_OUTPUT, "y2");
    FAILS(gkrt_graph_add_kernel(g2, ptx, &tx, 1, &ty, 1, NULL, 0, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
    OK(gkrt_graph_release(g2));
    OK(gkrt_kernel_release(add_one));
    OK(gkrt_kernel_release(add_one_again));
    OK(gkrt_kernel_release(via_ws));
    OK(gkrt_kernel_release(ptx));
  }
  CHECK_RUNTIME_WORKS(rt);

  /* --- Release: a kernel released before its graphs finalize and run stays alive in them. --- */
  gkrt_graph *ga, *gb;
  OK(gkrt_graph_create(rt, &ga));
  OK(gkrt_graph_create(rt, &gb));
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_tensor ax = add_tensor(ga, 64, GKRT_TENSOR_INPUT, "ax"), ay = add_tensor(ga, 64, GKRT_TENSOR_OUTPUT, "ay");
  gkrt_tensor bx = add_tensor(gb, 64, GKRT_TENSOR_INPUT, "bx"), by = add_tensor(gb, 64, GKRT_TENSOR_OUTPUT, "by");
  OK(add_node(ga, relu, &ax, 1, ay, NULL, 0));
  OK(add_node(gb, relu, &bx, 1, by, NULL, 0));
  OK(gkrt_kernel_release(relu));
  FAILS(gkrt_kernel_release(relu), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  FAILS(add_node(ga, relu, &ax, 1, ay, NULL, 0), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  OK(gkrt_graph_finalize(ga));
  OK(gkrt_graph_finalize(gb));
  float v[16], r[16], want16[16];
  fill_floats(v, 16, 77);
  for (int i = 0; i < 16; i++) want16[i] = v[i] > 0.0f ? v[i] : 0.0f;
  OK(gkrt_graph_write_tensor(ga, ax, v, 64));
  OK(gkrt_graph_write_tensor(gb, bx, v, 64));
  OK(gkrt_runtime_run(rt, ga));
  OK(gkrt_runtime_run(rt, gb));
  OK(gkrt_graph_read_tensor(ga, ay, r, 64));
  CHECK_BITS(r, want16, 16);
  OK(gkrt_graph_read_tensor(gb, by, r, 64));
  CHECK_BITS(r, want16, 16);
  OK(gkrt_graph_release(ga));
  OK(gkrt_graph_release(gb));

  OK(gkrt_kernel_release(NULL));
  FAILS(gkrt_kernel_release((gkrt_kernel *)rt), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_kernel_release((gkrt_kernel *)(uintptr_t)0xdeadbeef0ull), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  for (int i = 0; i < 7; i++) {
    OK(gkrt_kernel_release(bk[i]));
    FAILS(gkrt_kernel_release(bk[i]), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  }
  OK(gkrt_kernel_release(cb));
  FAILS(gkrt_kernel_release(cb), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  CHECK_RUNTIME_WORKS(rt);
  CHECK_RUNTIME_WORKS(rt2);
  OK(gkrt_runtime_release(rt));
  OK(gkrt_runtime_release(rt2));
  return test_done("api_kernels");
}
