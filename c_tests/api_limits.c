/*
 * api_limits: every size and count the API takes, at and past its limits. Tensor sizes near
 * 2^64; tensor reads and writes whose size is near 2^64; workspaces of 2^48 bytes, and so many
 * of them that their sum passes 2^64; matrix products whose m·k·4 or m·n·4 wraps in 64 bits;
 * fills of the largest tensor; gkrt_malloc and gkrt_torch_alloc near 2^64; a memory limit of
 * 2^64 - 1; launch parameter blobs and node input, output and workspace counts far larger than
 * any real node's; a node index of 2^32 - 1; and a released runtime handle whose home a new
 * runtime took over (refused at once, not after that runtime's run). Every refusal is an error
 * status with a message naming the figures, out-parameters stay untouched, nothing leaks, and
 * the runtime keeps working. Counts no honest caller can pass (arrays past PTRDIFF_MAX bytes)
 * are in api_limits_counts; running out of handles is api_limits_handles.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "test_util.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t noop_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  return 0;
}

/* add_kernel expecting `status`, with node_out and the graph's node count left as they were. */
#define ADD_FAILS(g, k, in, nin, out, nout, ws, nws, launch, status, needle)                         \
  do {                                                                                               \
    uint32_t node_ = 0xabcdu;                                                                        \
    uint64_t nodes_before_ = info_of(g).num_nodes;                                                   \
    FAILS(gkrt_graph_add_kernel((g), (k), (in), (nin), (out), (nout), (ws), (nws), (launch), &node_), \
          (status), (needle));                                                                       \
    CHECK_EQ_U64(node_, 0xabcdu);                                                                    \
    CHECK_EQ_U64(info_of(g).num_nodes, nodes_before_);                                               \
  } while (0)

/* --- Tensor sizes near 2^64, and reads and writes of sizes near 2^64. --- */
static void tensor_sizes(gkrt_runtime *rt) {
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  const uint64_t bad[] = {0,
                          (1ull << 48) + 1,
                          1ull << 49,
                          1ull << 63,
                          (1ull << 63) + 1,
                          UINT64_MAX - 255,
                          UINT64_MAX - 1,
                          UINT64_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (gkrt_tensor_kind kind = GKRT_TENSOR_INPUT; kind <= GKRT_TENSOR_OUTPUT; kind++) {
      gkrt_tensor t = 0x5e47;
      FAILS(gkrt_graph_add_tensor(g, bad[i], kind, "limit_t", &t), GKRT_STATUS_INVALID_ARGUMENT, "limit_t");
      MSG_HAS_U64(bad[i]);
      CHECK_EQ_U64(t, 0x5e47);
    }
  }
  CHECK_EQ_U64(info_of(g).num_tensors, 0);
  /* The extremes that are allowed: 1 byte and 2^48 bytes (no memory until written or run). */
  gkrt_tensor one = add_tensor(g, 1, GKRT_TENSOR_INPUT, "one_byte");
  gkrt_tensor max_in = add_tensor(g, 1ull << 48, GKRT_TENSOR_INPUT, "max_in");
  CHECK(one != max_in);
  CHECK_EQ_U64(allocated_bytes(rt), 0);

  /* Reads and writes whose size does not match, up to 2^64 - 1: refused before the buffer is
   * touched (the buffer here is 64 bytes; sizes past it are never read or written). */
  unsigned char buf[64];
  const size_t sizes[] = {0, 2, 64, (1ull << 48) - 1, (1ull << 48) + 1, (size_t)PTRDIFF_MAX,
                          (size_t)PTRDIFF_MAX + 1, SIZE_MAX - 255, SIZE_MAX};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    memset(buf, 0xC5, sizeof buf);
    FAILS(gkrt_graph_write_tensor(g, one, buf, sizes[i]), GKRT_STATUS_INVALID_ARGUMENT, "one_byte");
    MSG_HAS_U64(sizes[i]);
    FAILS(gkrt_graph_read_tensor(g, one, buf, sizes[i]), GKRT_STATUS_INVALID_ARGUMENT, "one_byte");
    MSG_HAS_U64(sizes[i]);
    for (size_t j = 0; j < sizeof buf; j++) CHECK(buf[j] == 0xC5);
  }
  /* The 1-byte tensor round-trips; the 2^48-byte one was never written, so a read of its exact
   * size is refused for that (the buffer is not touched: the check comes first). */
  unsigned char b1 = 0x7E, back = 0;
  OK(gkrt_graph_write_tensor(g, one, &b1, 1));
  OK(gkrt_graph_read_tensor(g, one, &back, 1));
  CHECK_EQ_U64(back, 0x7E);
  CHECK_EQ_U64(allocated_bytes(rt), 256);
  OK(gkrt_graph_release(g));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
}

/* --- Workspaces at the limit, and a node whose workspaces sum past 2^64. --- */
static void workspaces(gkrt_runtime *rt) {
  gkrt_kernel *cb = NULL;
  OK(gkrt_kernel_from_callback(rt, noop_cb, NULL, &cb));
  const float one = 1.0f;
  gkrt_launch fill_launch = {{1, 1, 1}, {1, 1, 1}, 0, &one, sizeof one};
  gkrt_kernel *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL);

  /* One workspace of 2^48 bytes: a valid node, which no budget can run. Either finalize says so
   * (an error naming the size) or the run fails with OUT_OF_MEMORY naming the node; the graph
   * and runtime stay usable either way. */
  {
    gkrt_graph *g;
    OK(gkrt_graph_create(rt, &g));
    gkrt_tensor y = add_tensor(g, 64, GKRT_TENSOR_OUTPUT, "ws_y");
    OK(gkrt_graph_add_kernel(g, fill, NULL, 0, &y, 1, NULL, 0, &fill_launch, NULL));
    const uint64_t ws = 1ull << 48;
    uint32_t node = 0xabcd;
    OK(gkrt_graph_add_kernel(g, cb, &y, 1, NULL, 0, &ws, 1, NULL, &node));
    CHECK_EQ_U64(node, 1);
    gkrt_status st = gkrt_graph_finalize(g);
    if (st == GKRT_STATUS_OK) {
      FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_OUT_OF_MEMORY, "node 1");
      MSG_HAS_U64(ws);
      /* Again: the failed run left nothing behind that makes the second one different. */
      FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_OUT_OF_MEMORY, "node 1");
    } else {
      CHECK(st == GKRT_STATUS_OUT_OF_MEMORY || st == GKRT_STATUS_INVALID_ARGUMENT);
      MSG_HAS_U64(ws);
      CHECK_EQ_U64(info_of(g).finalized, 0);
      FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_INVALID_STATE, "");
    }
    OK(gkrt_graph_release(g));
    CHECK_EQ_U64(allocated_bytes(rt), 0);
    CHECK_RUNTIME_WORKS(rt);
  }

  /* 65,536 workspaces of 2^48 bytes: 2^64 bytes in all, which wraps to 0 in 64 bits. Refused by
   * add_kernel or by finalize (INVALID_ARGUMENT, or OUT_OF_MEMORY as a budget), with a message
   * giving the figures; a failed finalize leaves the graph unfinalized, so a run is refused
   * and nothing is executed. Then the same with one workspace fewer (no wrap, still far past
   * any budget) and with 65,537 (wraps past 2^48). */
  enum { NWS = 65537 };
  uint64_t *ws = malloc(NWS * sizeof *ws);
  CHECK(ws != NULL);
  if (!ws) return;
  for (size_t i = 0; i < NWS; i++) ws[i] = 1ull << 48;
  const size_t counts[] = {65536, 65535, 65537};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t n = counts[c];
    int wraps = n != 65535;
    gkrt_graph *g;
    OK(gkrt_graph_create(rt, &g));
    gkrt_tensor x = add_tensor(g, 64, GKRT_TENSOR_INPUT, "wsum_x");
    gkrt_tensor y = add_tensor(g, 64, GKRT_TENSOR_OUTPUT, "wsum_y");
    float xv[16] = {0};
    OK(gkrt_graph_write_tensor(g, x, xv, sizeof xv));
    uint64_t launched_before = stats_of(rt).nodes_launched;
    uint32_t node = 0xabcd;
    gkrt_status st = gkrt_graph_add_kernel(g, cb, &x, 1, &y, 1, ws, n, NULL, &node);
    int refused = 0;
    if (st != GKRT_STATUS_OK) {
      if (st != GKRT_STATUS_INVALID_ARGUMENT && st != GKRT_STATUS_OUT_OF_MEMORY) {
        fprintf(stderr, "%d workspaces of 2^48: add_kernel -> %s (%s)\n", (int)n, gkrt_status_name(st),
                last_error());
        test_failures++;
      }
      CHECK_EQ_U64(node, 0xabcd);
      MSG_HAS("workspace");
      CHECK_EQ_U64(info_of(g).num_nodes, 0);
      refused = 1;
    } else {
      st = gkrt_graph_finalize(g);
      if (st != GKRT_STATUS_OK) {
        if (st != GKRT_STATUS_INVALID_ARGUMENT && st != GKRT_STATUS_OUT_OF_MEMORY) {
          fprintf(stderr, "%d workspaces of 2^48: finalize -> %s (%s)\n", (int)n, gkrt_status_name(st),
                  last_error());
          test_failures++;
        }
        MSG_HAS_NODE(0);
        MSG_HAS_U64(1ull << 48);
        CHECK_EQ_U64(info_of(g).finalized, 0);
        FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_INVALID_STATE, "");
        refused = 1;
      } else if (wraps) {
        fprintf(stderr,
                "%d workspaces of 2^48 bytes (sum wraps in 64 bits): accepted by add_kernel and finalize "
                "(peak_transient_bytes %llu)\n",
                (int)n, (unsigned long long)info_of(g).peak_transient_bytes);
        test_failures++;
      }
    }
    if (!refused) {
      /* Only the non-wrapping count may get this far: its run must fail cleanly. */
      FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_OUT_OF_MEMORY, "node 0");
    }
    /* Whatever happened, the callback never ran and nothing stayed allocated but x (which a
     * swapping graph may have sent to the host). */
    CHECK_EQ_U64(stats_of(rt).nodes_launched, launched_before);
    CHECK(allocated_bytes(rt) <= 256);
    OK(gkrt_graph_release(g));
    CHECK_EQ_U64(allocated_bytes(rt), 0);
  }
  free(ws);
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(fill));
  CHECK_RUNTIME_WORKS(rt);
}

/* --- Matrix products whose byte counts wrap in 64 bits. --- */
static void matmul_limits(gkrt_runtime *rt) {
  gkrt_kernel *mm = builtin_kernel(rt, GKRT_BUILTIN_MATMUL);
  /* 3,037,000,500^2 * 4 = 36,893,488,148,001,000,000 = 581,896,768 mod 2^64. */
  const uint32_t w = 3037000500u;
  const uint64_t wrapped = 581896768ull;
  CHECK_EQ_U64((uint64_t)w * w * 4, wrapped);
  struct {
    uint32_t m, n, k;
    uint64_t a, b, c; /* the tensors' sizes: what the wrapped products would match */
  } cases[] = {
      {w, w, w, wrapped, wrapped, wrapped},                          /* every product wraps */
      {w, w, 1, (uint64_t)w * 4, (uint64_t)w * 4, wrapped},          /* only m·n wraps */
      {w, 1, w, wrapped, (uint64_t)w * 4, (uint64_t)w * 4},          /* only m·k wraps */
      {1, w, w, (uint64_t)w * 4, wrapped, (uint64_t)w * 4},          /* only k·n wraps */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gkrt_graph *g;
    OK(gkrt_graph_create(rt, &g));
    gkrt_tensor a = add_tensor(g, cases[i].a, GKRT_TENSOR_INPUT, "mm_a");
    gkrt_tensor b = add_tensor(g, cases[i].b, GKRT_TENSOR_INPUT, "mm_b");
    gkrt_tensor c = add_tensor(g, cases[i].c, GKRT_TENSOR_OUTPUT, "mm_c");
    const uint32_t mnk[3] = {cases[i].m, cases[i].n, cases[i].k};
    gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, mnk, sizeof mnk};
    gkrt_tensor ab[2] = {a, b};
    ADD_FAILS(g, mm, ab, 2, &c, 1, NULL, 0, &l, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
    MSG_HAS_NODE(0);
    MSG_HAS_U64(w);
    /* The graph is still usable: a right-sized product goes in and runs. */
    gkrt_tensor sa = add_tensor(g, 2 * 3 * 4, GKRT_TENSOR_INPUT, "sa");
    gkrt_tensor sb = add_tensor(g, 3 * 2 * 4, GKRT_TENSOR_INPUT, "sb");
    gkrt_tensor sc = add_tensor(g, 2 * 2 * 4, GKRT_TENSOR_OUTPUT, "sc");
    const uint32_t small[3] = {2, 2, 3};
    gkrt_launch sl = {{1, 1, 1}, {1, 1, 1}, 0, small, sizeof small};
    gkrt_tensor sab[2] = {sa, sb};
    uint32_t node = 0xabcd;
    OK(gkrt_graph_add_kernel(g, mm, sab, 2, &sc, 1, NULL, 0, &sl, &node));
    CHECK_EQ_U64(node, 0);
    /* c is an output nobody writes now: finalize names it. */
    FAILS(gkrt_graph_finalize(g), GKRT_STATUS_INVALID_ARGUMENT, "mm_c");
    OK(gkrt_graph_release(g));
  }
  /* The largest products that do not wrap are accepted (checked at add time; no memory). */
  {
    gkrt_graph *g;
    OK(gkrt_graph_create(rt, &g));
    const uint32_t m = UINT32_MAX;
    gkrt_tensor a = add_tensor(g, (uint64_t)m * 4, GKRT_TENSOR_INPUT, "tall_a");
    gkrt_tensor b = add_tensor(g, 4, GKRT_TENSOR_INPUT, "tall_b");
    gkrt_tensor c = add_tensor(g, (uint64_t)m * 4, GKRT_TENSOR_OUTPUT, "tall_c");
    const uint32_t mnk[3] = {m, 1, 1};
    gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, mnk, sizeof mnk};
    gkrt_tensor ab[2] = {a, b};
    OK(gkrt_graph_add_kernel(g, mm, ab, 2, &c, 1, NULL, 0, &l, NULL));
    /* 2^23 x 2^23 floats: exactly 2^48 bytes, the largest tensor. */
    gkrt_tensor sq = add_tensor(g, 1ull << 48, GKRT_TENSOR_PARAMETER, "sq_a");
    gkrt_tensor sq2 = add_tensor(g, 1ull << 48, GKRT_TENSOR_INTERMEDIATE, "sq_c");
    const uint32_t big[3] = {1u << 23, 1u << 23, 1u << 23};
    gkrt_launch bl = {{1, 1, 1}, {1, 1, 1}, 0, big, sizeof big};
    gkrt_tensor sqsq[2] = {sq, sq};
    OK(gkrt_graph_add_kernel(g, mm, sqsq, 2, &sq2, 1, NULL, 0, &bl, NULL));
    /* ... and with m, n, k of 2^32 - 1 (every product past 2^48): refused. */
    const uint32_t all_max[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};
    gkrt_launch ml = {{1, 1, 1}, {1, 1, 1}, 0, all_max, sizeof all_max};
    ADD_FAILS(g, mm, ab, 2, &c, 1, NULL, 0, &ml, GKRT_STATUS_INVALID_ARGUMENT, "matmul");
    OK(gkrt_graph_release(g));
  }
  OK(gkrt_kernel_release(mm));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
}

/* --- Fills of the largest tensors: accepted, and the run fails cleanly for want of memory. --- */
static void fill_limits(gkrt_runtime *rt) {
  const float v = 3.0f;
  gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &v, sizeof v};
  /* Under the default limit, and under a limit of 2^64 - 1 (more than the device has). */
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.memory_limit = UINT64_MAX;
  cfg.log_level = 1;
  gkrt_runtime *huge = NULL;
  OK(gkrt_runtime_create(&cfg, &huge));
  gkrt_runtime *rts[2] = {rt, huge};
  for (int r = 0; r < 2; r++) {
    gkrt_kernel *fill = builtin_kernel(rts[r], GKRT_BUILTIN_FILL), *copy = builtin_kernel(rts[r], GKRT_BUILTIN_COPY);
    const uint64_t sizes[] = {1ull << 48, (1ull << 48) - 4, 1ull << 47};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      gkrt_graph *g;
      OK(gkrt_graph_create(rts[r], &g));
      gkrt_tensor big = add_tensor(g, sizes[i], GKRT_TENSOR_INTERMEDIATE, "big_fill");
      gkrt_tensor out = add_tensor(g, sizes[i], GKRT_TENSOR_OUTPUT, "big_out");
      OK(gkrt_graph_add_kernel(g, fill, NULL, 0, &big, 1, NULL, 0, &l, NULL));
      OK(gkrt_graph_add_kernel(g, copy, &big, 1, &out, 1, NULL, 0, NULL, NULL));
      gkrt_status st = gkrt_graph_finalize(g);
      if (st == GKRT_STATUS_OK) {
        FAILS(gkrt_runtime_run(rts[r], g), GKRT_STATUS_OUT_OF_MEMORY, "node 0");
        MSG_HAS("big_fill");
        MSG_HAS_U64(sizes[i]);
        /* The output was never produced. */
        unsigned char b[4];
        FAILS(gkrt_graph_read_tensor(g, out, b, sizes[i]), GKRT_STATUS_INVALID_STATE, "big_out");
      } else {
        CHECK(st == GKRT_STATUS_OUT_OF_MEMORY);
        MSG_HAS_U64(sizes[i]);
        FAILS(gkrt_runtime_run(rts[r], g), GKRT_STATUS_INVALID_STATE, "");
      }
      OK(gkrt_graph_release(g));
      CHECK_EQ_U64(allocated_bytes(rts[r]), 0);
    }
    OK(gkrt_kernel_release(fill));
    OK(gkrt_kernel_release(copy));
    CHECK_RUNTIME_WORKS(rts[r]);
  }
  CHECK_EQ_U64(stats_of(huge).memory_limit, UINT64_MAX);
  OK(gkrt_runtime_release(huge));
}

/* --- Raw allocations near 2^64: OUT_OF_MEMORY (or INVALID_ARGUMENT), never a wrapped size. --- */
static void raw_limits(gkrt_runtime *rt) {
  const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 255, SIZE_MAX - 256, (size_t)1 << 63,
                          (size_t)PTRDIFF_MAX, (1ull << 48) + 1, (16ull << 30) + 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *p = (void *)(uintptr_t)0x5e47;
    gkrt_status st = gkrt_malloc(rt, sizes[i], NULL, &p);
    if (st != GKRT_STATUS_OUT_OF_MEMORY && st != GKRT_STATUS_INVALID_ARGUMENT) {
      fprintf(stderr, "gkrt_malloc(%zu) -> %s (%s)\n", sizes[i], gkrt_status_name(st), last_error());
      test_failures++;
      if (st == GKRT_STATUS_OK) OK(gkrt_free(rt, p, NULL));
      continue;
    }
    MSG_HAS_U64(sizes[i]);
    CHECK(p == (void *)(uintptr_t)0x5e47);
    CHECK_EQ_U64(allocated_bytes(rt), 0);
  }
  /* The PyTorch entry point: NULL for every such size, with the reason kept as the last error. */
  for (size_t i = 0; i < 4; i++) {
    void *p = gkrt_torch_alloc(sizes[i], 0, NULL);
    CHECK(p == NULL);
    CHECK(gkrt_last_error_message(NULL, 0) > 0);
  }
  CHECK(gkrt_torch_alloc(64, -1, NULL) == NULL);
  CHECK(gkrt_torch_alloc(64, INT32_MAX, NULL) == NULL);
  CHECK(gkrt_torch_alloc(0, 0, NULL) == NULL);
  gkrt_torch_free(NULL, SIZE_MAX, 0, NULL);
  CHECK_RUNTIME_WORKS(rt);
}

/* --- Launch parameter blobs, and node input, output and workspace counts, far past what a real
 * node uses: either they work (and the callback sees exactly what was given) or they are refused
 * cleanly. --- */
typedef struct {
  size_t inputs, outputs, workspaces, params_size;
  unsigned char first, last;
  int calls;
} seen_args;

static int32_t record_cb(const gkrt_callback_args *args, void *user) {
  seen_args *s = user;
  s->inputs = args->num_inputs;
  s->outputs = args->num_outputs;
  s->workspaces = args->num_workspaces;
  s->params_size = args->params_size;
  if (args->params_size) {
    s->first = ((const unsigned char *)args->params)[0];
    s->last = ((const unsigned char *)args->params)[args->params_size - 1];
  }
  s->calls++;
  return 0;
}

static void blobs_and_counts(gkrt_runtime *rt) {
  seen_args seen;
  memset(&seen, 0, sizeof seen);
  gkrt_kernel *cb = NULL;
  OK(gkrt_kernel_from_callback(rt, record_cb, &seen, &cb));
  gkrt_kernel *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL), *scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, 16, GKRT_TENSOR_INPUT, "blob_x");
  gkrt_tensor y = add_tensor(g, 16, GKRT_TENSOR_OUTPUT, "blob_y");

  /* A built-in given a blob of the wrong size, large or huge: refused, naming the size. */
  enum { BLOB = 1 << 20 };
  unsigned char *blob = malloc(BLOB);
  CHECK(blob != NULL);
  if (!blob) return;
  fill_bytes(blob, BLOB, 5);
  const size_t wrong[] = {0, 3, 5, 8, 4096, BLOB};
  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
    gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, wrong[i] ? blob : NULL, wrong[i]};
    ADD_FAILS(g, fill, NULL, 0, &y, 1, NULL, 0, &l, GKRT_STATUS_INVALID_ARGUMENT, "fill");
    MSG_HAS_U64(wrong[i]);
    ADD_FAILS(g, scale, &x, 1, &y, 1, NULL, 0, &l, GKRT_STATUS_INVALID_ARGUMENT, "scale");
  }
  /* Launch dimensions at 2^32 - 1 (the host backend ignores them; a device may refuse). */
  gkrt_launch maxdims = {{UINT32_MAX, UINT32_MAX, UINT32_MAX}, {UINT32_MAX, UINT32_MAX, UINT32_MAX}, UINT32_MAX, NULL, 0};
  gkrt_status st = gkrt_graph_add_kernel(g, cb, &x, 1, NULL, 0, NULL, 0, &maxdims, NULL);
  CHECK(st == GKRT_STATUS_OK || st == GKRT_STATUS_INVALID_ARGUMENT || st == GKRT_STATUS_UNSUPPORTED);
  int maxdims_node = st == GKRT_STATUS_OK;

  /* A callback node with a 1 MiB blob, 20,000 inputs (one tensor read over and over), 4,096
   * outputs and 10,000 small workspaces: accepted, and the callback sees every count and the
   * blob's bytes; the blob was copied at add time (changing it afterwards changes nothing). */
  enum { NIN = 20000, NOUT = 4096, NWS = 10000 };
  gkrt_tensor *ins = malloc(NIN * sizeof *ins), *outs = malloc(NOUT * sizeof *outs);
  uint64_t *ws = malloc(NWS * sizeof *ws);
  CHECK(ins && outs && ws);
  if (!ins || !outs || !ws) return;
  for (size_t i = 0; i < NIN; i++) ins[i] = x;
  for (size_t i = 0; i < NOUT; i++) outs[i] = add_tensor(g, 4, GKRT_TENSOR_INTERMEDIATE, NULL);
  for (size_t i = 0; i < NWS; i++) ws[i] = 1 + (i % 512);
  gkrt_launch bl = {{1, 1, 1}, {1, 1, 1}, 0, blob, BLOB};
  const unsigned char first = blob[0], last = blob[BLOB - 1];
  uint32_t node = 0xabcd;
  OK(gkrt_graph_add_kernel(g, cb, ins, NIN, outs, NOUT, ws, NWS, &bl, &node));
  CHECK_EQ_U64(node, maxdims_node ? 1 : 0);
  blob[0] ^= 0xFF;
  blob[BLOB - 1] ^= 0xFF;
  /* y is an output: something must write it. */
  const float one = 1.0f;
  gkrt_launch fl = {{1, 1, 1}, {1, 1, 1}, 0, &one, sizeof one};
  OK(gkrt_graph_add_kernel(g, fill, NULL, 0, &y, 1, NULL, 0, &fl, NULL));
  OK(gkrt_graph_finalize(g));
  float xv[4] = {1, 2, 3, 4};
  OK(gkrt_graph_write_tensor(g, x, xv, sizeof xv));
  OK(gkrt_runtime_run(rt, g));
  CHECK_EQ_U64(seen.calls, 1 + maxdims_node);
  CHECK_EQ_U64(seen.inputs, NIN);
  CHECK_EQ_U64(seen.outputs, NOUT);
  CHECK_EQ_U64(seen.workspaces, NWS);
  CHECK_EQ_U64(seen.params_size, BLOB);
  CHECK_EQ_U64(seen.first, first);
  CHECK_EQ_U64(seen.last, last);
  OK(gkrt_graph_release(g));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  free(ins);
  free(outs);
  free(ws);
  free(blob);

  /* A node index of 2^32 - 1, and one just past the last node. */
  OK(gkrt_graph_create(rt, &g));
  y = add_tensor(g, 16, GKRT_TENSOR_OUTPUT, "rc_y");
  OK(gkrt_graph_add_kernel(g, fill, NULL, 0, &y, 1, NULL, 0, &fl, NULL));
  FAILS(gkrt_graph_set_node_recomputable(g, UINT32_MAX, 1), GKRT_STATUS_INVALID_ARGUMENT, "node");
  MSG_HAS_U64(UINT32_MAX);
  FAILS(gkrt_graph_set_node_recomputable(g, 1, 1), GKRT_STATUS_INVALID_ARGUMENT, "node");
  OK(gkrt_graph_set_node_recomputable(g, 0, INT32_MIN)); /* any non-zero value means yes */
  OK(gkrt_graph_release(g));

  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(fill));
  OK(gkrt_kernel_release(scale));
  CHECK_RUNTIME_WORKS(rt);
}

/* --- Odd values of the small functions. --- */
static void small_functions(void) {
  CHECK_EQ_STR(gkrt_status_name(INT32_MIN), "GKRT_STATUS_UNKNOWN");
  CHECK_EQ_STR(gkrt_status_name(INT32_MAX), "GKRT_STATUS_UNKNOWN");
  CHECK_EQ_STR(gkrt_status_name(-1), "GKRT_STATUS_UNKNOWN");
  CHECK_EQ_STR(gkrt_status_name(11), "GKRT_STATUS_UNKNOWN");
  /* A failure, then its message into buffers of 1 and 2 bytes: NUL-terminated, nothing past. */
  FAILS(gkrt_runtime_synchronize(NULL), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  size_t full = gkrt_last_error_message(NULL, 0);
  CHECK(full > 1);
  char b[4] = {'x', 'x', 'x', 'x'};
  CHECK_EQ_U64(gkrt_last_error_message(b, 1), full);
  CHECK(b[0] == 0 && b[1] == 'x');
  CHECK_EQ_U64(gkrt_last_error_message(b, 2), full);
  CHECK(b[1] == 0 && b[2] == 'x');
  CHECK_EQ_U64(gkrt_last_error_message(b, 0), full);
}

/* --- A released runtime handle whose home a new runtime has taken over: refused at once, even
 * while the new runtime is busy with a run (the stale handle must not wait for it). --- */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int entered, go;
} gate;

static int32_t gate_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  gate *gt = user;
  pthread_mutex_lock(&gt->mu);
  gt->entered = 1;
  pthread_cond_broadcast(&gt->cv);
  /* Wait for the main thread, but never forever: 3 s, then give up. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 3;
  while (!gt->go && pthread_cond_timedwait(&gt->cv, &gt->mu, &until) == 0) {
  }
  pthread_mutex_unlock(&gt->mu);
  return 0;
}

typedef struct {
  gkrt_runtime *rt;
  gkrt_graph *g;
  gkrt_status st;
} run_job;

static void *run_thread(void *p) {
  run_job *j = p;
  j->st = gkrt_runtime_run(j->rt, j->g);
  return NULL;
}

static void stale_runtime_handle(void) {
  gkrt_runtime *old = test_runtime(0);
  OK(gkrt_runtime_release(old));
  gkrt_runtime *fresh = test_runtime(0); /* likely takes the home `old` had */
  CHECK(fresh != old);
  printf("stale handle %p, new runtime %p\n", (void *)old, (void *)fresh);
  gate gt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  gkrt_kernel *cb = NULL;
  OK(gkrt_kernel_from_callback(fresh, gate_cb, &gt, &cb));
  gkrt_graph *g;
  OK(gkrt_graph_create(fresh, &g));
  gkrt_tensor x = add_tensor(g, 16, GKRT_TENSOR_INPUT, "gate_x");
  OK(gkrt_graph_add_kernel(g, cb, &x, 1, NULL, 0, NULL, 0, NULL, NULL));
  OK(gkrt_graph_finalize(g));
  float xv[4] = {0};
  OK(gkrt_graph_write_tensor(g, x, xv, sizeof xv));
  run_job job = {fresh, g, GKRT_STATUS_INTERNAL};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, run_thread, &job) == 0);
  pthread_mutex_lock(&gt.mu);
  while (!gt.entered) pthread_cond_wait(&gt.cv, &gt.mu);
  pthread_mutex_unlock(&gt.mu);

  /* The new runtime is inside its run now. Every call on the stale handle is refused at once. */
  double t0 = now_s();
  gkrt_stats s;
  memset(&s, 0xAB, sizeof s);
  FAILS(gkrt_runtime_stats(old, &s), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  CHECK_EQ_U64(s.allocated_bytes, 0xABABABABABABABABull);
  gkrt_device_kind kind = 77;
  FAILS(gkrt_runtime_device(old, &kind), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  CHECK_EQ_U64(kind, 77);
  void *p = (void *)(uintptr_t)0x5e47;
  FAILS(gkrt_malloc(old, 256, NULL, &p), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  CHECK(p == (void *)(uintptr_t)0x5e47);
  FAILS(gkrt_free(old, (void *)(uintptr_t)0x1000, NULL), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  gkrt_graph *g2 = (gkrt_graph *)(uintptr_t)0x5e47;
  FAILS(gkrt_graph_create(old, &g2), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  CHECK(g2 == (gkrt_graph *)(uintptr_t)0x5e47);
  FAILS(gkrt_runtime_synchronize(old), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_runtime_release(old), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  double waited = now_s() - t0;
  if (waited > 1.0) {
    fprintf(stderr, "calls on a released runtime handle waited %.2f s for another runtime's run\n", waited);
    test_failures++;
  }
  pthread_mutex_lock(&gt.mu);
  gt.go = 1;
  pthread_cond_broadcast(&gt.cv);
  pthread_mutex_unlock(&gt.mu);
  pthread_join(t, NULL);
  OK(job.st);
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(cb));
  CHECK_RUNTIME_WORKS(fresh);
  OK(gkrt_runtime_release(fresh));
}

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  test_util_uses_();
  tensor_sizes(rt);
  workspaces(rt);
  matmul_limits(rt);
  fill_limits(rt);
  /* Raw allocations under a limit no device reaches past: 16 GiB + 1 must fail everywhere. */
  gkrt_runtime *limited = test_runtime(1ull << 30);
  raw_limits(limited);
  OK(gkrt_runtime_release(limited));
  blobs_and_counts(rt);
  small_functions();
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  OK(gkrt_runtime_release(rt));
  stale_runtime_handle();
  return test_done("api_limits");
}
