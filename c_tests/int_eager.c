/*
 * int_eager: gkrt_launch_kernel, one kernel outside any graph. Every built-in on the caller's
 * device memory against the arithmetic written out here (bit-exact), a host callback with a
 * workspace from the pool (seen by the callback, returned in stream order: the next launch on
 * the stream gets the same block, and the pool is back to empty), PTX and CUDA source on CUDA;
 * stream order on a stream from gkrt_stream_create (a chain of launches, each reading the last
 * one's output, under host-backend jitter); a graph run asynchronously on that stream starts
 * after a slow callback queued there first; a callback's failure surfaces at the stream's
 * synchronisation; argument errors name the buffer or rule and queue nothing.
 */
#include <unistd.h>

#include "dev_mem.h"
#include "test_util.h"

enum { N = 96, BYTES = N * 4 };

static void *seen_ws = NULL;
static size_t seen_ws_size = 0;
static volatile int fail_cb = 0;

/* out = in + ws, where ws = in (written by the callback into its workspace first). */
static int32_t double_via_ws(const gkrt_callback_args *a, void *user) {
  (void)user;
  if (a->num_inputs != 1 || a->num_outputs != 1 || a->num_workspaces != 1 || a->node != UINT32_MAX) return 90;
  seen_ws = a->workspaces[0].ptr;
  seen_ws_size = a->workspaces[0].size;
  float v[N];
  if (cbdev_read(a, a->inputs[0], v, BYTES)) return 91;
  if (cbdev_write(a, a->workspaces[0], v, BYTES)) return 92;
  float w[N];
  if (cbdev_read(a, a->workspaces[0], w, BYTES)) return 93;
  for (int i = 0; i < N; i++) v[i] += w[i];
  if (cbdev_write(a, a->outputs[0], v, BYTES)) return 94;
  return fail_cb ? 77 : 0;
}

/* Sleeps, then writes 7.0 everywhere into its output. */
static int32_t slow_sevens(const gkrt_callback_args *a, void *user) {
  (void)user;
  usleep(30 * 1000);
  float v[N];
  for (int i = 0; i < N; i++) v[i] = 7.0f;
  return cbdev_write(a, a->outputs[0], v, BYTES) ? 94 : 0;
}

static gkrt_buffer buf(void *p, size_t n) {
  gkrt_buffer b = {p, n};
  return b;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  cbdev_init(rt);
  const int on_host = test_on_host(rt);
  void *s = NULL;
  OK(gkrt_stream_create(rt, &s));
  void *a = dev_alloc(rt, BYTES), *b = dev_alloc(rt, BYTES), *c = dev_alloc(rt, BYTES);
  float av[N], bv[N], got[N], want[N];
  for (int i = 0; i < N; i++) av[i] = (float)(i % 7) - 3.0f, bv[i] = (float)(i % 5) - 1.0f;
  dev_put(a, av, BYTES);
  dev_put(b, bv, BYTES);
  const uint64_t base = allocated_bytes(rt);

  /* --- Every built-in. --- */
  gkrt_kernel *k[7];
  for (int i = 0; i < 7; i++) k[i] = builtin_kernel(rt, (gkrt_builtin)i);
  gkrt_buffer in_a = buf(a, BYTES), ab[2] = {buf(a, BYTES), buf(b, BYTES)}, out_c = buf(c, BYTES);
  const float val = 2.5f;
  gkrt_launch with_val = {{1, 1, 1}, {1, 1, 1}, 0, &val, sizeof val};

  OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_FILL], s, NULL, 0, &out_c, 1, NULL, 0, &with_val));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, c, BYTES);
  for (int i = 0; i < N; i++) want[i] = 2.5f;
  CHECK_BITS(got, want, N);

  OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_COPY], s, &in_a, 1, &out_c, 1, NULL, 0, NULL));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, c, BYTES);
  CHECK_BITS(got, av, N);

  OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_ADD], NULL, ab, 2, &out_c, 1, NULL, 0, NULL));
  OK(gkrt_stream_synchronize(rt, NULL));
  dev_get(got, c, BYTES);
  for (int i = 0; i < N; i++) want[i] = av[i] + bv[i];
  CHECK_BITS(got, want, N);

  OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_SCALE], s, &in_a, 1, &out_c, 1, NULL, 0, &with_val));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, c, BYTES);
  for (int i = 0; i < N; i++) want[i] = av[i] * 2.5f;
  CHECK_BITS(got, want, N);

  OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_RELU], s, &in_a, 1, &out_c, 1, NULL, 0, NULL));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, c, BYTES);
  for (int i = 0; i < N; i++) want[i] = av[i] > 0.0f ? av[i] : 0.0f;
  CHECK_BITS(got, want, N);

  OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_RELU_GRAD], s, ab, 2, &out_c, 1, NULL, 0, NULL));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, c, BYTES);
  for (int i = 0; i < N; i++) want[i] = bv[i] > 0.0f ? av[i] : 0.0f;
  CHECK_BITS(got, want, N);

  { /* matmul: a as 8×12 times b as 12×8 into c's first 64 floats (integers: exact). */
    const uint32_t mnk[3] = {8, 8, 12};
    gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, mnk, sizeof mnk};
    gkrt_buffer mm_in[2] = {buf(a, 8 * 12 * 4), buf(b, 12 * 8 * 4)}, mm_out = buf(c, 64 * 4);
    OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_MATMUL], s, mm_in, 2, &mm_out, 1, NULL, 0, &l));
    OK(gkrt_stream_synchronize(rt, s));
    dev_get(got, c, 64 * 4);
    for (int i = 0; i < 8; i++)
      for (int j = 0; j < 8; j++) {
        float acc = 0.0f;
        for (int p = 0; p < 12; p++) acc += av[i * 12 + p] * bv[p * 8 + j];
        want[i * 8 + j] = acc;
      }
    CHECK_BITS(got, want, 64);
    /* In place is refused for matmul, as for a node. */
    gkrt_buffer mm_alias = buf(a, 64 * 4);
    FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_MATMUL], s, mm_in, 2, &mm_alias, 1, NULL, 0, &l),
          GKRT_STATUS_INVALID_ARGUMENT, "matmul");
  }

  /* --- A chain on one stream: each launch reads the last one's output (stream order). --- */
  dev_put(c, av, BYTES);
  gkrt_buffer cc[2] = {buf(c, BYTES), buf(a, BYTES)};
  for (int r = 0; r < 20; r++) OK(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_ADD], s, cc, 2, &out_c, 1, NULL, 0, NULL));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, c, BYTES);
  for (int i = 0; i < N; i++) want[i] = av[i] * 21.0f;
  CHECK_BITS(got, want, N);

  /* --- A callback with a workspace from the pool, returned in stream order. --- */
  gkrt_kernel *cb = NULL, *slow = NULL;
  OK(gkrt_kernel_from_callback(rt, double_via_ws, NULL, &cb));
  OK(gkrt_kernel_from_callback(rt, slow_sevens, NULL, &slow));
  const uint64_t ws = BYTES;
  OK(gkrt_launch_kernel(rt, cb, s, &in_a, 1, &out_c, 1, &ws, 1, NULL));
  OK(gkrt_stream_synchronize(rt, s));
  void *first_ws = seen_ws;
  CHECK(first_ws != NULL);
  CHECK_EQ_U64(seen_ws_size, BYTES);
  dev_get(got, c, BYTES);
  for (int i = 0; i < N; i++) want[i] = av[i] * 2.0f;
  CHECK_BITS(got, want, N);
  CHECK_EQ_U64(allocated_bytes(rt), base);
  /* Queued back to back, the second gets the block the first returned (same stream). */
  OK(gkrt_launch_kernel(rt, cb, s, &in_a, 1, &out_c, 1, &ws, 1, NULL));
  seen_ws = NULL;
  OK(gkrt_launch_kernel(rt, cb, s, &in_a, 1, &out_c, 1, &ws, 1, NULL));
  OK(gkrt_stream_synchronize(rt, s));
  CHECK(seen_ws == first_ws);
  CHECK_EQ_U64(allocated_bytes(rt), base);

  /* --- A failure on the device surfaces at the stream's synchronisation. --- */
  if (on_host) {
    fail_cb = 1;
    OK(gkrt_launch_kernel(rt, cb, s, &in_a, 1, &out_c, 1, &ws, 1, NULL));
    FAILS(gkrt_stream_synchronize(rt, s), GKRT_STATUS_CALLBACK_FAILED, "eager launch");
    MSG_HAS("77");
    fail_cb = 0;
    OK(gkrt_stream_synchronize(rt, s));
  }

  /* --- An asynchronous run on the stream starts after the eager work queued there first. --- */
  {
    gkrt_graph *g;
    OK(gkrt_graph_create(rt, &g));
    gkrt_tensor x = add_tensor(g, BYTES, GKRT_TENSOR_INPUT, "x_in");
    gkrt_tensor y = add_tensor(g, BYTES, GKRT_TENSOR_OUTPUT, "y_out");
    const float two = 2.0f;
    OK(add_node(g, k[GKRT_BUILTIN_SCALE], &x, 1, y, &two, sizeof two));
    OK(gkrt_graph_finalize(g));
    dev_put(b, bv, BYTES);
    OK(gkrt_graph_bind_tensor(g, x, b, BYTES));
    OK(gkrt_graph_bind_tensor(g, y, c, BYTES));
    gkrt_buffer out_b = buf(b, BYTES);
    OK(gkrt_launch_kernel(rt, slow, s, NULL, 0, &out_b, 1, NULL, 0, NULL)); /* b = 7 after 30 ms */
    OK(gkrt_runtime_run_async(rt, g, s));
    OK(gkrt_graph_wait(rt, g));
    dev_get(got, c, BYTES);
    for (int i = 0; i < N; i++) want[i] = 14.0f;
    CHECK_BITS(got, want, N);
    OK(gkrt_graph_release(g));
  }

  /* --- Device code (CUDA only: the host backend loads none). --- */
  if (!on_host) {
    static const char *SRC =
        "extern \"C\" __global__ void add_ws(const float* in, float* out, float* ws, unsigned int n) {\n"
        "  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < n) { ws[i] = in[i]; out[i] = __fadd_rn(ws[i], 1.0f); }\n"
        "}\n";
    gkrt_kernel *dk = NULL;
    OK(gkrt_kernel_from_source(rt, SRC, "add_ws", NULL, 0, &dk));
    const uint32_t n = N;
    gkrt_launch l = {{1, 1, 1}, {128, 1, 1}, 0, &n, sizeof n};
    OK(gkrt_launch_kernel(rt, dk, s, &in_a, 1, &out_c, 1, &ws, 1, &l));
    OK(gkrt_stream_synchronize(rt, s));
    dev_get(got, c, BYTES);
    for (int i = 0; i < N; i++) want[i] = av[i] + 1.0f;
    CHECK_BITS(got, want, N);
    OK(gkrt_kernel_release(dk));
  }

  /* --- Errors: named, nothing queued, the runtime usable. --- */
  dev_put(c, bv, BYTES);
  gkrt_buffer null_in = buf(NULL, BYTES), short_out = buf(c, BYTES - 4), zero = buf(a, 0);
  FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_COPY], s, &null_in, 1, &out_c, 1, NULL, 0, NULL),
        GKRT_STATUS_INVALID_ARGUMENT, "input 0 is NULL");
  FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_COPY], s, &in_a, 1, &short_out, 1, NULL, 0, NULL),
        GKRT_STATUS_INVALID_ARGUMENT, "copy");
  FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_COPY], s, &zero, 1, &out_c, 1, NULL, 0, NULL),
        GKRT_STATUS_INVALID_ARGUMENT, "input 0");
  FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_ADD], s, &in_a, 1, &out_c, 1, NULL, 0, NULL),
        GKRT_STATUS_INVALID_ARGUMENT, "add");
  FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_COPY], s, &in_a, 1, NULL, 0, NULL, 0, NULL),
        GKRT_STATUS_INVALID_ARGUMENT, "no outputs");
  FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_COPY], s, NULL, 1, &out_c, 1, NULL, 0, NULL),
        GKRT_STATUS_INVALID_ARGUMENT, "inputs");
  const uint64_t zero_ws = 0;
  FAILS(gkrt_launch_kernel(rt, cb, s, &in_a, 1, &out_c, 1, &zero_ws, 1, NULL), GKRT_STATUS_INVALID_ARGUMENT,
        "workspace 0");
  FAILS(gkrt_launch_kernel(rt, NULL, s, &in_a, 1, &out_c, 1, NULL, 0, NULL), GKRT_STATUS_INVALID_ARGUMENT,
        "kernel");
  if (on_host) {
    FAILS(gkrt_launch_kernel(rt, k[GKRT_BUILTIN_COPY], (void *)(uintptr_t)0x99, &in_a, 1, &out_c, 1, NULL, 0, NULL),
          GKRT_STATUS_INVALID_ARGUMENT, "stream");
  }
  gkrt_runtime *rt2 = test_runtime(0);
  gkrt_kernel *foreign = builtin_kernel(rt2, GKRT_BUILTIN_COPY);
  FAILS(gkrt_launch_kernel(rt, foreign, s, &in_a, 1, &out_c, 1, NULL, 0, NULL), GKRT_STATUS_INVALID_ARGUMENT,
        "another runtime");
  OK(gkrt_kernel_release(foreign));
  OK(gkrt_runtime_release(rt2));
  OK(gkrt_stream_synchronize(rt, s));
  dev_get(got, c, BYTES);
  CHECK_BITS(got, bv, N); /* nothing ran */
  CHECK_EQ_U64(allocated_bytes(rt), base);
  CHECK_RUNTIME_WORKS(rt);

  for (int i = 0; i < 7; i++) OK(gkrt_kernel_release(k[i]));
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(slow));
  OK(gkrt_free(rt, a, NULL));
  OK(gkrt_free(rt, b, NULL));
  OK(gkrt_free(rt, c, NULL));
  OK(gkrt_runtime_release(rt));
  return test_done("int_eager");
}
