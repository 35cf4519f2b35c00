/*
 * int_callback: host callbacks. A callback node between built-ins receives the right number of
 * inputs, outputs and workspaces with the right sizes, distinct non-overlapping buffers, its
 * parameter bytes (copied when the node was added), its node index, its user data and a
 * non-NULL stream; on the CUDA backend it is called on the thread running gkrt_runtime_run. It
 * also computes — reads its input, writes its output and workspaces (on CUDA through the driver,
 * on its stream: cb_device.h) — and the result, checked after the run, proves it ran in stream
 * order between the built-ins. A callback
 * that reports failure gives CALLBACK_FAILED naming its node; afterwards allocated bytes are
 * back to the baseline, the same graph runs again once the callback succeeds, and other graphs
 * on the runtime run correctly.
 */
#include <pthread.h>

#include "cb_device.h"
#include "test_util.h"

enum { N = 1000, BYTES = N * 4, WS0 = 100, WS1 = 4096, MAX_CALLS = 64 };

typedef struct {
  float add;
  uint32_t tag;
} cb_params;

typedef struct {
  uint32_t magic;
  int32_t fail; /* what to return (the outputs are written all the same) */
  int calls;
  uint32_t nodes[MAX_CALLS];
  size_t num_inputs, num_outputs, num_workspaces;
  gkrt_buffer in[4], out[4], ws[4];
  unsigned char params[64];
  const void *params_ptr;
  size_t params_size;
  void *stream;
  pthread_t thread;
  int ws_ok;
} record;

static void record_args(record *r, const gkrt_callback_args *a) {
  if (r->calls < MAX_CALLS) r->nodes[r->calls] = a->node;
  r->calls++;
  r->num_inputs = a->num_inputs;
  r->num_outputs = a->num_outputs;
  r->num_workspaces = a->num_workspaces;
  for (size_t i = 0; i < a->num_inputs && i < 4; i++) r->in[i] = a->inputs[i];
  for (size_t i = 0; i < a->num_outputs && i < 4; i++) r->out[i] = a->outputs[i];
  for (size_t i = 0; i < a->num_workspaces && i < 4; i++) r->ws[i] = a->workspaces[i];
  r->params_ptr = a->params;
  r->params_size = a->params_size;
  memset(r->params, 0, sizeof r->params);
  if (a->params && a->params_size <= sizeof r->params) memcpy(r->params, a->params, a->params_size);
  r->stream = a->stream;
  r->thread = pthread_self();
}

/* Host copies of a callback's buffers (the largest is N floats). */
static float cb_in[N], cb_out[N];

/* inputs (a, x), output b, workspaces (WS0, WS1): b[i] = a[i] + params.add. */
static int32_t compute_cb(const gkrt_callback_args *args, void *user) {
  record *r = user;
  if (r->magic != 0xCA11BAC4u) return 99;
  record_args(r, args);
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_workspaces != 2 ||
      args->params_size != sizeof(cb_params) || args->outputs[0].size > sizeof cb_out)
    return 98;
  cb_params p;
  memcpy(&p, args->params, sizeof p);
  size_t n = args->outputs[0].size / 4;
  /* The workspaces are writable scratch of at least their size. */
  unsigned char last = 0, first = 0;
  if (cbdev_fill(args, args->workspaces[0], 0xA5) || cbdev_fill(args, args->workspaces[1], 0x5A)) return 97;
  const gkrt_buffer ws0_last = {(char *)args->workspaces[0].ptr + args->workspaces[0].size - 1, 1};
  if (cbdev_read(args, ws0_last, &last, 1) || cbdev_read(args, args->workspaces[1], &first, 1)) return 96;
  r->ws_ok = last == 0xA5 && first == 0x5A;
  if (cbdev_read(args, args->inputs[0], cb_in, n * 4)) return 95;
  for (size_t i = 0; i < n; i++) cb_out[i] = cb_in[i] + p.add;
  if (cbdev_write(args, args->outputs[0], cb_out, n * 4)) return 94;
  return r->fail;
}

/* No parameters. With no inputs: out[i] = i; with one input: out[i] = in[i] + 100. */
static int32_t seq_cb(const gkrt_callback_args *args, void *user) {
  record *r = user;
  record_args(r, args);
  if (args->num_outputs != 1 || args->num_inputs > 1 || args->outputs[0].size > sizeof cb_out) return 98;
  size_t n = args->outputs[0].size / 4;
  if (args->num_inputs == 1 && cbdev_read(args, args->inputs[0], cb_in, n * 4)) return 95;
  for (size_t i = 0; i < n; i++) cb_out[i] = args->num_inputs == 0 ? (float)i : cb_in[i] + 100.0f;
  if (cbdev_write(args, args->outputs[0], cb_out, n * 4)) return 94;
  return r->fail;
}

static int overlaps(gkrt_buffer a, gkrt_buffer b) {
  uintptr_t a0 = (uintptr_t)a.ptr, b0 = (uintptr_t)b.ptr;
  return a0 < b0 + b.size && b0 < a0 + a.size;
}

static float relu_ref(float v) { return v > 0.0f ? v : 0.0f; }

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  const int host = test_on_host(rt);
  const pthread_t main_thread = pthread_self();
  gkrt_kernel *scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE), *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_kernel *copy = builtin_kernel(rt, GKRT_BUILTIN_COPY);
  static record rec, seq, frec;
  rec.magic = frec.magic = 0xCA11BAC4u;
  cbdev_init(rt);
  gkrt_kernel *cb = NULL, *cb_seq = NULL, *cb_fail = NULL;
  OK(gkrt_kernel_from_callback(rt, compute_cb, &rec, &cb));
  OK(gkrt_kernel_from_callback(rt, seq_cb, &seq, &cb_seq));
  OK(gkrt_kernel_from_callback(rt, compute_cb, &frec, &cb_fail));
  const uint64_t base = allocated_bytes(rt);

  /* --- x -> scale 2 -> a; callback(a, x) -> b with two workspaces; relu(b) -> y. --- */
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, BYTES, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor a = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, "a");
  gkrt_tensor b = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, "b");
  gkrt_tensor y = add_tensor(g, BYTES, GKRT_TENSOR_OUTPUT, "y");
  const float two = 2.0f;
  OK(add_node(g, scale, &x, 1, a, &two, 4));
  cb_params p = {0.75f, 0xC0FFEEu};
  const cb_params p_orig = p;
  gkrt_launch l = {{3, 2, 1}, {32, 1, 1}, 0, &p, sizeof p};
  gkrt_tensor ax[2] = {a, x};
  const uint64_t ws[2] = {WS0, WS1};
  uint32_t cb_node = 0;
  OK(gkrt_graph_add_kernel(g, cb, ax, 2, &b, 1, ws, 2, &l, &cb_node));
  CHECK_EQ_U64(cb_node, 1);
  p.add = 99.0f; /* parameters are copied at add time */
  p.tag = 0;
  OK(add_node(g, relu, &b, 1, y, NULL, 0));
  OK(gkrt_graph_finalize(g));
  CHECK_EQ_U64(rec.calls, 0); /* nothing runs before gkrt_runtime_run */

  float xv[N], yv[N], want[N];
  for (int run = 0; run < 10; run++) {
    fill_floats(xv, N, 500 + run);
    OK(gkrt_graph_write_tensor(g, x, xv, BYTES));
    OK(gkrt_runtime_run(rt, g));
    CHECK_EQ_U64(rec.calls, run + 1); /* exactly once per run */
    CHECK_EQ_U64(rec.nodes[run], cb_node);
    OK(gkrt_graph_read_tensor(g, y, yv, BYTES));
    for (int i = 0; i < N; i++) want[i] = relu_ref(two * xv[i] + p_orig.add);
    CHECK_BITS(yv, want, N);
    CHECK(rec.ws_ok);
  }
  CHECK_EQ_U64(rec.num_inputs, 2);
  CHECK_EQ_U64(rec.num_outputs, 1);
  CHECK_EQ_U64(rec.num_workspaces, 2);
  CHECK_EQ_U64(rec.in[0].size, BYTES);
  CHECK_EQ_U64(rec.in[1].size, BYTES);
  CHECK_EQ_U64(rec.out[0].size, BYTES);
  CHECK_EQ_U64(rec.ws[0].size, WS0);
  CHECK_EQ_U64(rec.ws[1].size, WS1);
  gkrt_buffer all[5] = {rec.in[0], rec.in[1], rec.out[0], rec.ws[0], rec.ws[1]};
  for (int i = 0; i < 5; i++) {
    CHECK(all[i].ptr != NULL);
    for (int j = 0; j < i; j++)
      if (overlaps(all[i], all[j])) {
        fprintf(stderr, "callback buffers %d and %d overlap\n", j, i);
        CHECK(!overlaps(all[i], all[j]));
      }
  }
  CHECK_EQ_U64(rec.params_size, sizeof(cb_params));
  CHECK(rec.params_ptr != NULL);
  CHECK(memcmp(rec.params, &p_orig, sizeof p_orig) == 0);
  CHECK(rec.stream != NULL);
  if (!host) CHECK(pthread_equal(rec.thread, main_thread)); /* CUDA: on the run's thread */

  /* --- No parameters: params NULL, size 0; one callback kernel used by two nodes. --- */
  gkrt_graph *g2;
  OK(gkrt_graph_create(rt, &g2));
  gkrt_tensor o1 = add_tensor(g2, 64, GKRT_TENSOR_OUTPUT, "o1");
  gkrt_tensor o2 = add_tensor(g2, 64, GKRT_TENSOR_INTERMEDIATE, "o2");
  gkrt_tensor o3 = add_tensor(g2, 64, GKRT_TENSOR_OUTPUT, "o3");
  OK(gkrt_graph_add_kernel(g2, cb_seq, NULL, 0, &o1, 1, NULL, 0, NULL, NULL)); /* node 0 */
  OK(add_node(g2, copy, &o1, 1, o2, NULL, 0));                                 /* node 1 */
  OK(gkrt_graph_add_kernel(g2, cb_seq, &o2, 1, &o3, 1, NULL, 0, NULL, NULL));   /* node 2 */
  OK(gkrt_graph_finalize(g2));
  OK(gkrt_runtime_run(rt, g2));
  CHECK_EQ_U64(seq.calls, 2);
  CHECK_EQ_U64(seq.nodes[0], 0);
  CHECK_EQ_U64(seq.nodes[1], 2);
  CHECK(seq.params_ptr == NULL);
  CHECK_EQ_U64(seq.params_size, 0);
  CHECK_EQ_U64(seq.num_inputs, 1);
  CHECK_EQ_U64(seq.num_outputs, 1);
  CHECK_EQ_U64(seq.num_workspaces, 0);
  CHECK(seq.stream != NULL);
  {
    float o[16], ow[16];
    OK(gkrt_graph_read_tensor(g2, o1, o, sizeof o));
    for (int i = 0; i < 16; i++) ow[i] = (float)i;
    CHECK_BITS(o, ow, 16);
    OK(gkrt_graph_read_tensor(g2, o3, o, sizeof o));
    for (int i = 0; i < 16; i++) ow[i] = (float)i + 100.0f;
    CHECK_BITS(o, ow, 16);
  }

  /* --- A callback that fails, on a graph's first run: CALLBACK_FAILED naming the node; the
   * output was not produced; the transient memory is back. --- */
  gkrt_graph *gf;
  OK(gkrt_graph_create(rt, &gf));
  gkrt_tensor fx = add_tensor(gf, BYTES, GKRT_TENSOR_INPUT, "fx");
  gkrt_tensor fa = add_tensor(gf, BYTES, GKRT_TENSOR_INTERMEDIATE, "fa");
  gkrt_tensor fb = add_tensor(gf, BYTES, GKRT_TENSOR_INTERMEDIATE, "fb");
  gkrt_tensor fy = add_tensor(gf, BYTES, GKRT_TENSOR_OUTPUT, "fy");
  const float three = 3.0f;
  OK(add_node(gf, relu, &fx, 1, fa, NULL, 0));
  OK(add_node(gf, scale, &fa, 1, fa, &three, 4));
  gkrt_tensor fax[2] = {fa, fx};
  uint32_t fail_node = 0;
  gkrt_launch lf = {{1, 1, 1}, {1, 1, 1}, 0, &p_orig, sizeof p_orig};
  OK(gkrt_graph_add_kernel(gf, cb_fail, fax, 2, &fb, 1, ws, 2, &lf, &fail_node));
  CHECK_EQ_U64(fail_node, 2);
  OK(add_node(gf, relu, &fb, 1, fy, NULL, 0));
  OK(gkrt_graph_finalize(gf));
  fill_floats(xv, N, 900);
  OK(gkrt_graph_write_tensor(gf, fx, xv, BYTES));
  uint64_t before = allocated_bytes(rt);
  frec.fail = 7;
  FAILS(gkrt_runtime_run(rt, gf), GKRT_STATUS_CALLBACK_FAILED, "node 2");
  CHECK_EQ_U64(frec.calls, 1);
  uint64_t after = allocated_bytes(rt);
  if (!(after == before || after == before + 4096))
    fprintf(stderr, "after a failed first run: allocated %llu, before %llu\n", (unsigned long long)after,
            (unsigned long long)before);
  CHECK(after == before || after == before + 4096); /* at most the output's memory stays */
  FAILS(gkrt_graph_read_tensor(gf, fy, yv, BYTES), GKRT_STATUS_INVALID_STATE, "fy");

  /* Once the callback succeeds the same graph runs, and later failures (any non-zero value)
   * leave allocated bytes exactly where they were. */
  frec.fail = 0;
  OK(gkrt_runtime_run(rt, gf));
  CHECK_EQ_U64(frec.calls, 2);
  OK(gkrt_graph_read_tensor(gf, fy, yv, BYTES));
  for (int i = 0; i < N; i++) want[i] = relu_ref(three * relu_ref(xv[i]) + p_orig.add);
  CHECK_BITS(yv, want, N);
  const int32_t codes[] = {1, -1, 0x7fffffff};
  for (size_t c = 0; c < sizeof codes / sizeof codes[0]; c++) {
    frec.fail = codes[c];
    int calls = frec.calls;
    OK(gkrt_runtime_reset_peak_stats(rt));
    before = allocated_bytes(rt);
    FAILS(gkrt_runtime_run(rt, gf), GKRT_STATUS_CALLBACK_FAILED, "node 2");
    CHECK_EQ_U64(frec.calls, calls + 1); /* no node runs twice */
    CHECK_EQ_U64(allocated_bytes(rt), before);
    OK(gkrt_runtime_synchronize(rt)); /* the failure was reported once, not left pending */
  }
  frec.fail = 0;
  fill_floats(xv, N, 901);
  OK(gkrt_graph_write_tensor(gf, fx, xv, BYTES));
  OK(gkrt_runtime_run(rt, gf));
  OK(gkrt_graph_read_tensor(gf, fy, yv, BYTES));
  for (int i = 0; i < N; i++) want[i] = relu_ref(three * relu_ref(xv[i]) + p_orig.add);
  CHECK_BITS(yv, want, N);

  /* The first graph still runs right on this runtime, and so does a fresh one. */
  int calls = rec.calls;
  fill_floats(xv, N, 77);
  OK(gkrt_graph_write_tensor(g, x, xv, BYTES));
  OK(gkrt_runtime_run(rt, g));
  CHECK_EQ_U64(rec.calls, calls + 1);
  OK(gkrt_graph_read_tensor(g, y, yv, BYTES));
  for (int i = 0; i < N; i++) want[i] = relu_ref(two * xv[i] + p_orig.add);
  CHECK_BITS(yv, want, N);
  CHECK_RUNTIME_WORKS(rt);

  OK(gkrt_graph_release(g));
  OK(gkrt_graph_release(g2));
  OK(gkrt_graph_release(gf));
  CHECK_EQ_U64(allocated_bytes(rt), base);
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(cb_seq));
  OK(gkrt_kernel_release(cb_fail));
  OK(gkrt_kernel_release(scale));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(copy));
  OK(gkrt_runtime_release(rt));
  return test_done("int_callback");
}
