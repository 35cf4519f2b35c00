/*
 * int_collectives: collective graph nodes on the host backend's model of a communicator, with
 * 2, 4 and 8 ranks as threads (one runtime each, jitter on):
 *   - every collective (all-reduce out of place and in place, reduce, reduce-scatter, with
 *     sum/prod/min/max/avg; all-gather; broadcast; send/receive) over f32, f16, bf16 and i32,
 *     against a plain-C reference (values chosen so every result is exact in every type);
 *   - a node after a collective that does not touch its tensors runs while the collective waits
 *     for a slow rank, and the node that reads its output runs after (timed with callbacks);
 *   - a sequence mismatch and a failing rank give errors (GKRT_STATUS_PEER_FAILED), not hangs;
 *     the runtimes still work afterwards and a new communicator runs;
 *   - bad nodes are refused with messages; planned mode runs collectives (one rank: the identity).
 * On CUDA (GKRT_DEVICE=cuda) the communicators are NCCL's: every collective runs on one rank (GPU
 * 0) and, when a second GPU opens, on two ranks (GPUs 0 and 1) against the same references
 * (send/receive needs two ranks); two ranks on one GPU, which NCCL refuses, fail at join within
 * the timeout instead of hanging. It prints "int_collectives: NCCL ..." saying which ran; without
 * libnccl the only check is the status and message (UNSUPPORTED naming the names searched).
 */
#define _GNU_SOURCE
#include "test_util.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define COUNT 37
#define MAX_RANKS 8

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Set when GKRT_DEVICE=cuda made the runtimes CUDA ones: rank r then runs on GPU r. */
static int on_cuda;

static gkrt_runtime *rank_runtime_on(uint32_t ordinal) {
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_HOST;
  cfg.device_ordinal = ordinal;
  cfg.host_jitter_us = 20;
  cfg.log_level = 1;
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(&cfg, &rt));
  return rt;
}

static gkrt_runtime *rank_runtime(void) { return rank_runtime_on(0); }

/* --- values and their encodings: small integers and binary fractions, exact in every type --- */

static double value(uint32_t rank, uint32_t i) { return (double)((rank * 3 + i) % 5) - 2.0; }

static size_t elem_size(gkrt_dtype t) { return t == GKRT_DTYPE_F16 || t == GKRT_DTYPE_BF16 ? 2 : 4; }

/* An exactly representable value in type `t` (no rounding needed). */
static void encode(gkrt_dtype t, double v, unsigned char *out) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (t == GKRT_DTYPE_F32) {
    memcpy(out, &f, 4);
  } else if (t == GKRT_DTYPE_I32) {
    int32_t x = (int32_t)v;
    memcpy(out, &x, 4);
  } else if (t == GKRT_DTYPE_BF16) {
    uint16_t h = (uint16_t)(bits >> 16);
    memcpy(out, &h, 2);
  } else {
    uint16_t h = (uint16_t)((bits >> 16) & 0x8000);
    int exp = (int)((bits >> 23) & 0xff);
    if (exp != 0) h |= (uint16_t)(((exp - 127 + 15) << 10) | ((bits & 0x7fffff) >> 13));
    memcpy(out, &h, 2);
  }
}

static void fill(gkrt_dtype t, uint32_t rank, size_t count, unsigned char *out) {
  for (size_t i = 0; i < count; i++) encode(t, value(rank, (uint32_t)i), out + i * elem_size(t));
}

/* The reduction of element i over ranks 0..n-1, in double (exact for these values). */
static double reduce_ref(gkrt_reduce_op op, uint32_t n, uint32_t first_rank, uint32_t i, gkrt_dtype t) {
  double acc = value(first_rank, i);
  for (uint32_t r = 1; r < n; r++) {
    double b = value(first_rank + r, i);
    if (op == GKRT_REDUCE_SUM || op == GKRT_REDUCE_AVG) acc += b;
    if (op == GKRT_REDUCE_PROD) acc *= b;
    if (op == GKRT_REDUCE_MIN && b < acc) acc = b;
    if (op == GKRT_REDUCE_MAX && b > acc) acc = b;
  }
  if (op == GKRT_REDUCE_AVG) {
    if (t == GKRT_DTYPE_I32) {
      int32_t s = (int32_t)acc;
      acc = (double)(s / (int32_t)n);
    } else {
      acc /= n;
    }
  }
  return acc;
}

struct rank_arg {
  uint32_t rank, nranks;
  gkrt_unique_id id;
  void *extra;
};

static void run_ranks(uint32_t n, void *(*body)(void *), void *extra) {
  gkrt_runtime *rt = rank_runtime();
  struct rank_arg args[MAX_RANKS];
  pthread_t threads[MAX_RANKS];
  gkrt_unique_id id;
  OK(gkrt_comm_get_unique_id(rt, &id));
  OK(gkrt_runtime_release(rt));
  for (uint32_t r = 0; r < n; r++) {
    args[r].rank = r;
    args[r].nranks = n;
    args[r].id = id;
    args[r].extra = extra;
    CHECK(pthread_create(&threads[r], NULL, body, &args[r]) == 0);
  }
  for (uint32_t r = 0; r < n; r++) CHECK(pthread_join(threads[r], NULL) == 0);
}

static gkrt_tensor tensor(gkrt_graph *g, uint64_t bytes, gkrt_tensor_kind kind) {
  gkrt_tensor t;
  OK(gkrt_graph_add_tensor(g, bytes, kind, NULL, &t));
  return t;
}

static gkrt_status coll(gkrt_graph *g, gkrt_comm *c, gkrt_collective k, gkrt_reduce_op op, uint32_t root,
                        gkrt_dtype t, const gkrt_tensor *in, size_t nin, const gkrt_tensor *out, size_t nout) {
  return gkrt_graph_add_collective(g, c, k, op, root, t, in, nin, out, nout, NULL);
}

static void check_bytes(const unsigned char *got, const unsigned char *want, size_t len, const char *what,
                        uint32_t rank, gkrt_dtype t, int op) {
  if (memcmp(got, want, len) != 0) {
    fprintf(stderr, "rank %u: %s (dtype %u, op %d) differs from the reference\n", rank, what, t, op);
    test_failures++;
  }
}

/* ---------------- every collective ---------------- */

static void *every_collective(void *p) {
  struct rank_arg *a = p;
  uint32_t r = a->rank, n = a->nranks;
  gkrt_runtime *rt = rank_runtime_on(on_cuda ? r : 0);
  gkrt_comm *c;
  OK(gkrt_comm_init_rank(rt, &a->id, r, n, 20000, &c));
  /* Rank 1 is the broadcast's root where there is one. */
  const uint32_t root = n > 1 ? 1 : 0;
  const gkrt_dtype types[4] = {GKRT_DTYPE_F32, GKRT_DTYPE_F16, GKRT_DTYPE_BF16, GKRT_DTYPE_I32};
  for (int ti = 0; ti < 4; ti++) {
    gkrt_dtype t = types[ti];
    size_t es = elem_size(t), bytes = COUNT * es;
    gkrt_graph *g;
    OK(gkrt_graph_create(rt, &g));
    gkrt_tensor x = tensor(g, bytes, GKRT_TENSOR_INPUT);
    gkrt_tensor big = tensor(g, bytes * n, GKRT_TENSOR_INPUT);
    gkrt_tensor ar[5], inplace[5], red[5], rs[5];
    for (int op = 0; op < 5; op++) {
      ar[op] = tensor(g, bytes, GKRT_TENSOR_OUTPUT);
      inplace[op] = tensor(g, bytes, GKRT_TENSOR_PARAMETER);
      red[op] = tensor(g, bytes, GKRT_TENSOR_OUTPUT);
      rs[op] = tensor(g, bytes, GKRT_TENSOR_OUTPUT);
      OK(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, op, 0, t, &x, 1, &ar[op], 1));
      OK(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, op, 0, t, &inplace[op], 1, &inplace[op], 1));
      OK(coll(g, c, GKRT_COLLECTIVE_REDUCE, op, n - 1, t, &x, 1, &red[op], 1));
      OK(coll(g, c, GKRT_COLLECTIVE_REDUCE_SCATTER, op, 0, t, &big, 1, &rs[op], 1));
    }
    gkrt_tensor ag = tensor(g, bytes * n, GKRT_TENSOR_OUTPUT);
    OK(coll(g, c, GKRT_COLLECTIVE_ALL_GATHER, 0, 0, t, &x, 1, &ag, 1));
    gkrt_tensor b = tensor(g, bytes, GKRT_TENSOR_PARAMETER);
    OK(coll(g, c, GKRT_COLLECTIVE_BROADCAST, 0, root, t, &b, 1, &b, 1));
    /* A ring: even ranks send first, odd ranks receive first (NCCL would deadlock otherwise). A
     * single rank has no ring: its send to itself would wait for a receive in the same group. */
    /* (One rank has no ring, and an output nothing writes is refused at finalize.) */
    gkrt_tensor got = n > 1 ? tensor(g, bytes, GKRT_TENSOR_OUTPUT) : 0;
    uint32_t next = (r + 1) % n, prev = (r + n - 1) % n;
    if (n == 1) {
      /* no ring */
    } else if (r % 2 == 0) {
      OK(coll(g, c, GKRT_COLLECTIVE_SEND, 0, next, t, &x, 1, NULL, 0));
      OK(coll(g, c, GKRT_COLLECTIVE_RECV, 0, prev, t, NULL, 0, &got, 1));
    } else {
      OK(coll(g, c, GKRT_COLLECTIVE_RECV, 0, prev, t, NULL, 0, &got, 1));
      OK(coll(g, c, GKRT_COLLECTIVE_SEND, 0, next, t, &x, 1, NULL, 0));
    }
    OK(gkrt_graph_finalize(g));

    unsigned char *mine = malloc(bytes), *mine_big = malloc(bytes * n), *want = malloc(bytes * n),
                  *out = malloc(bytes * n);
    fill(t, r, COUNT, mine);
    /* big: rank r's element j is value(r + 10, j). */
    for (size_t j = 0; j < COUNT * n; j++) encode(t, value(r + 10, (uint32_t)j), mine_big + j * es);
    OK(gkrt_graph_write_tensor(g, x, mine, bytes));
    OK(gkrt_graph_write_tensor(g, big, mine_big, bytes * n));
    for (int op = 0; op < 5; op++) OK(gkrt_graph_write_tensor(g, inplace[op], mine, bytes));
    OK(gkrt_graph_write_tensor(g, b, mine, bytes));
    OK(gkrt_runtime_run(rt, g));

    for (int op = 0; op < 5; op++) {
      for (uint32_t i = 0; i < COUNT; i++) encode(t, reduce_ref(op, n, 0, i, t), want + i * es);
      OK(gkrt_graph_read_tensor(g, ar[op], out, bytes));
      check_bytes(out, want, bytes, "all-reduce", r, t, op);
      OK(gkrt_graph_read_tensor(g, inplace[op], out, bytes));
      check_bytes(out, want, bytes, "in-place all-reduce", r, t, op);
      if (r == n - 1) {
        OK(gkrt_graph_read_tensor(g, red[op], out, bytes));
        check_bytes(out, want, bytes, "reduce", r, t, op);
      }
      /* Reduce-scatter: slice r of the reduction of every rank's big input. */
      for (uint32_t i = 0; i < COUNT; i++) {
        uint32_t j = r * COUNT + i;
        double acc = value(10, j);
        for (uint32_t k = 1; k < n; k++) {
          double v = value(10 + k, j);
          if (op == GKRT_REDUCE_SUM || op == GKRT_REDUCE_AVG) acc += v;
          if (op == GKRT_REDUCE_PROD) acc *= v;
          if (op == GKRT_REDUCE_MIN && v < acc) acc = v;
          if (op == GKRT_REDUCE_MAX && v > acc) acc = v;
        }
        if (op == GKRT_REDUCE_AVG) acc = t == GKRT_DTYPE_I32 ? (double)((int32_t)acc / (int32_t)n) : acc / n;
        encode(t, acc, want + i * es);
      }
      OK(gkrt_graph_read_tensor(g, rs[op], out, bytes));
      check_bytes(out, want, bytes, "reduce-scatter", r, t, op);
    }
    for (uint32_t k = 0; k < n; k++) fill(t, k, COUNT, want + k * bytes);
    OK(gkrt_graph_read_tensor(g, ag, out, bytes * n));
    check_bytes(out, want, bytes * n, "all-gather", r, t, -1);
    fill(t, root, COUNT, want);
    OK(gkrt_graph_read_tensor(g, b, out, bytes));
    check_bytes(out, want, bytes, "broadcast", r, t, -1);
    if (n > 1) {
      fill(t, prev, COUNT, want);
      OK(gkrt_graph_read_tensor(g, got, out, bytes));
      check_bytes(out, want, bytes, "send/recv", r, t, -1);
    }
    free(mine);
    free(mine_big);
    free(want);
    free(out);
    OK(gkrt_graph_release(g));
  }
  OK(gkrt_comm_release(c));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return NULL;
}

/* ---------------- overlap ---------------- */

struct stamp {
  double at;
  int sleep_ms;
};

/* Copies input 0 to output 0 (same size), after sleeping, and notes when it ran. */
static int32_t copy_cb(const gkrt_callback_args *args, void *user) {
  struct stamp *s = user;
  if (s->sleep_ms) usleep((useconds_t)s->sleep_ms * 1000);
  memcpy(args->outputs[0].ptr, args->inputs[0].ptr, args->outputs[0].size);
  s->at = now_ms();
  return 0;
}

struct overlap_result {
  int late_ms;
  double late_done, independent, dependent;
  float y[MAX_RANKS][COUNT];
};

static void *overlap(void *p) {
  struct rank_arg *a = p;
  struct overlap_result *res = a->extra;
  uint32_t r = a->rank, n = a->nranks;
  gkrt_runtime *rt = rank_runtime();
  gkrt_comm *c;
  OK(gkrt_comm_init_rank(rt, &a->id, r, n, 20000, &c));
  struct stamp produce = {0, r == 1 ? res->late_ms : 0}, independent = {0, 0}, dependent = {0, 0};
  gkrt_kernel *kp, *ki, *kd;
  OK(gkrt_kernel_from_callback(rt, copy_cb, &produce, &kp));
  OK(gkrt_kernel_from_callback(rt, copy_cb, &independent, &ki));
  OK(gkrt_kernel_from_callback(rt, copy_cb, &dependent, &kd));
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = tensor(g, COUNT * 4, GKRT_TENSOR_INPUT), h = tensor(g, COUNT * 4, GKRT_TENSOR_INTERMEDIATE);
  gkrt_tensor y = tensor(g, COUNT * 4, GKRT_TENSOR_INTERMEDIATE), z = tensor(g, COUNT * 4, GKRT_TENSOR_OUTPUT);
  gkrt_tensor w = tensor(g, COUNT * 4, GKRT_TENSOR_OUTPUT);
  OK(gkrt_graph_add_kernel(g, kp, &x, 1, &h, 1, NULL, 0, NULL, NULL));
  OK(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_SUM, 0, GKRT_DTYPE_F32, &h, 1, &y, 1));
  OK(gkrt_graph_add_kernel(g, ki, &x, 1, &z, 1, NULL, 0, NULL, NULL)); /* touches neither h nor y */
  OK(gkrt_graph_add_kernel(g, kd, &y, 1, &w, 1, NULL, 0, NULL, NULL)); /* reads the result */
  OK(gkrt_graph_finalize(g));
  float in[COUNT];
  for (int i = 0; i < COUNT; i++) in[i] = (float)(r * 100 + i);
  OK(gkrt_graph_write_tensor(g, x, in, sizeof in));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, w, res->y[r], sizeof res->y[r]));
  if (r == 0) {
    res->independent = independent.at;
    res->dependent = dependent.at;
  } else {
    res->late_done = produce.at;
  }
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(kp));
  OK(gkrt_kernel_release(ki));
  OK(gkrt_kernel_release(kd));
  OK(gkrt_comm_release(c));
  OK(gkrt_runtime_release(rt));
  return NULL;
}

/* ---------------- failures ---------------- */

struct failure_result {
  gkrt_status status[MAX_RANKS];
  char message[MAX_RANKS][1024];
  double waited_ms[MAX_RANKS];
  int mode; /* 0: different counts; 1: rank 1's run fails before its collective */
};

static void *failing(void *p) {
  struct rank_arg *a = p;
  struct failure_result *res = a->extra;
  uint32_t r = a->rank, n = a->nranks;
  gkrt_runtime *rt = rank_runtime();
  gkrt_comm *c;
  OK(gkrt_comm_init_rank(rt, &a->id, r, n, 20000, &c));
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  uint64_t count = res->mode == 0 && r == 1 ? 8 : 4;
  gkrt_tensor x = tensor(g, count * 4, GKRT_TENSOR_INPUT), y = tensor(g, count * 4, GKRT_TENSOR_OUTPUT);
  OK(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_SUM, 0, GKRT_DTYPE_F32, &x, 1, &y, 1));
  OK(gkrt_graph_finalize(g));
  float in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  /* Mode 1: rank 1 never writes its input, so its run fails before anything is queued. */
  if (!(res->mode == 1 && r == 1)) OK(gkrt_graph_write_tensor(g, x, in, count * 4));
  double start = now_ms();
  res->status[r] = gkrt_runtime_run(rt, g);
  res->waited_ms[r] = now_ms() - start;
  /* This thread's own last error (common.h's last_error() shares one buffer between threads). */
  gkrt_last_error_message(res->message[r], sizeof res->message[r]);
  /* The graph and runtime stay usable; the communicator is aborted for good. */
  OK(gkrt_graph_write_tensor(g, x, in, count * 4));
  char again[1024];
  gkrt_status st = gkrt_runtime_run(rt, g);
  gkrt_last_error_message(again, sizeof again);
  CHECK_EQ_U64(st, GKRT_STATUS_PEER_FAILED);
  CHECK(strstr(again, "aborted") != NULL);
  OK(gkrt_graph_release(g));
  OK(gkrt_comm_release(c));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return NULL;
}

/* ---------------- bad nodes ---------------- */

static void bad_nodes(void) {
  gkrt_runtime *rt = rank_runtime(), *other = rank_runtime();
  gkrt_unique_id id;
  gkrt_comm *c, *c_other;
  OK(gkrt_comm_get_unique_id(rt, &id));
  OK(gkrt_comm_init_rank(rt, &id, 0, 1, 0, &c));
  OK(gkrt_comm_get_unique_id(other, &id));
  OK(gkrt_comm_init_rank(other, &id, 0, 1, 0, &c_other));
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = tensor(g, 64, GKRT_TENSOR_INPUT), x2 = tensor(g, 64, GKRT_TENSOR_INPUT);
  gkrt_tensor y = tensor(g, 64, GKRT_TENSOR_OUTPUT), odd = tensor(g, 6, GKRT_TENSOR_INPUT);
  gkrt_tensor two[2] = {x, x2};
  /* Fused inputs need as many outputs; persistent tensors do not fuse. */
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, GKRT_DTYPE_F32, two, 2, &y, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "takes 2 input(s) and 2 output(s)");
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, GKRT_DTYPE_F32, two, 2, two, 2), GKRT_STATUS_INVALID_ARGUMENT,
        "not an intermediate");
  FAILS(coll(g, c, 7, 0, 0, GKRT_DTYPE_F32, &x, 1, &y, 1), GKRT_STATUS_INVALID_ARGUMENT, "not a gkrt_collective");
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, 5, 0, GKRT_DTYPE_F32, &x, 1, &y, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "not a gkrt_reduce_op");
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, 4, &x, 1, &y, 1), GKRT_STATUS_INVALID_ARGUMENT, "not a gkrt_dtype");
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, GKRT_DTYPE_F32, &odd, 1, &y, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "not a whole number");
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, GKRT_DTYPE_F16, &x, 1, &odd, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "output has 6 bytes");
  FAILS(coll(g, c, GKRT_COLLECTIVE_BROADCAST, 0, 3, GKRT_DTYPE_F32, &x, 1, &y, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "root 3");
  FAILS(coll(g, c, GKRT_COLLECTIVE_SEND, 0, 0, GKRT_DTYPE_F32, &x, 1, NULL, 0), GKRT_STATUS_INVALID_ARGUMENT, "itself");
  gkrt_tensor y2 = tensor(g, 64, GKRT_TENSOR_INTERMEDIATE);
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_GATHER, 0, 0, GKRT_DTYPE_F32, &y, 1, &y2, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "read before any node writes it");
  FAILS(coll(g, c_other, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, GKRT_DTYPE_F32, &x, 1, &y, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "another runtime");
  FAILS(coll(g, NULL, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, GKRT_DTYPE_F32, &x, 1, &y, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "NULL");
  gkrt_tensor p = tensor(g, 64, GKRT_TENSOR_PARAMETER);
  FAILS(coll(g, c, GKRT_COLLECTIVE_ALL_GATHER, 0, 0, GKRT_DTYPE_F32, &p, 1, &p, 1), GKRT_STATUS_INVALID_ARGUMENT,
        "in place is for");
  uint32_t node = 99;
  OK(gkrt_graph_add_collective(g, c, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_MAX, 0, GKRT_DTYPE_I32, &x, 1, &y, 1,
                               &node));
  CHECK_EQ_U64(node, 0);
  FAILS(gkrt_graph_set_node_recomputable(g, 0, 1), GKRT_STATUS_INVALID_ARGUMENT, "collective");
  OK(gkrt_graph_finalize(g));
  /* One rank: the reduction is the input itself. */
  int32_t in[16], out[16];
  for (int i = 0; i < 16; i++) in[i] = i * 7 - 30;
  OK(gkrt_graph_write_tensor(g, x, in, sizeof in));
  /* Collectives run only synchronously (a failing rank aborts before it waits). */
  FAILS(gkrt_runtime_run_async(rt, g, NULL), GKRT_STATUS_INVALID_STATE, "only synchronously");
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, out, sizeof out));
  CHECK(memcmp(in, out, sizeof in) == 0);
  OK(gkrt_graph_release(g));
  /* The graph keeps its communicator: released handle first, graph after, still runs. */
  OK(gkrt_graph_create(rt, &g));
  x = tensor(g, 64, GKRT_TENSOR_INPUT);
  y = tensor(g, 64, GKRT_TENSOR_OUTPUT);
  OK(coll(g, c, GKRT_COLLECTIVE_BROADCAST, 0, 0, GKRT_DTYPE_F32, &x, 1, &y, 1));
  OK(gkrt_comm_release(c));
  OK(gkrt_graph_set_collective_buckets(g, 1 << 20, 0));
  OK(gkrt_graph_finalize(g));
  FAILS(gkrt_graph_set_collective_buckets(g, 1 << 20, 25 << 20), GKRT_STATUS_INVALID_STATE, "bucket sizes apply at finalize");
  OK(gkrt_graph_write_tensor(g, x, in, sizeof in));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, out, sizeof out));
  CHECK(memcmp(in, out, sizeof in) == 0);
  OK(gkrt_graph_release(g));
  OK(gkrt_comm_release(c_other));
  OK(gkrt_runtime_release(other));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));

  /* Planned mode: the arena holds the collective's tensors until its event; one rank's
   * all-reduce is the identity. Run repeatedly with new inputs (on CUDA the second run would
   * capture and the rest replay; the host backend has no capture, so every run goes through
   * the executor again). */
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_HOST;
  cfg.memory_mode = GKRT_MEMORY_PLANNED;
  cfg.log_level = 1;
  OK(gkrt_runtime_create(&cfg, &rt));
  OK(gkrt_comm_get_unique_id(rt, &id));
  OK(gkrt_comm_init_rank(rt, &id, 0, 1, 0, &c));
  OK(gkrt_graph_create(rt, &g));
  x = tensor(g, 64, GKRT_TENSOR_INPUT);
  y = tensor(g, 64, GKRT_TENSOR_OUTPUT);
  OK(coll(g, c, GKRT_COLLECTIVE_ALL_REDUCE, 0, 0, GKRT_DTYPE_F32, &x, 1, &y, 1));
  OK(gkrt_graph_finalize(g));
  for (int run = 0; run < 5; run++) {
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) in[i] += 1;
    memset(out, 0, sizeof out);
    OK(gkrt_graph_write_tensor(g, x, in, sizeof in));
    OK(gkrt_runtime_run(rt, g));
    OK(gkrt_graph_read_tensor(g, y, out, sizeof out));
    CHECK(memcmp(in, out, sizeof in) == 0);
  }
  OK(gkrt_graph_release(g));
  OK(gkrt_comm_release(c));
  OK(gkrt_runtime_release(rt));
}

/* ---------------- NCCL (GKRT_DEVICE=cuda) ---------------- */

struct dup_arg {
  gkrt_unique_id id;
  uint32_t rank;
  gkrt_status status;
  char message[512];
};

static void *join_gpu0(void *p) {
  struct dup_arg *a = p;
  gkrt_runtime *rt = rank_runtime_on(0);
  gkrt_comm *c = NULL;
  a->status = gkrt_comm_init_rank(rt, &a->id, a->rank, 2, 20000, &c);
  gkrt_last_error_message(a->message, sizeof a->message);
  if (a->status == GKRT_STATUS_OK) OK(gkrt_comm_release(c));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return NULL;
}

static void nccl_checks(gkrt_runtime *probe) {
  gkrt_unique_id id;
  gkrt_status st = gkrt_comm_get_unique_id(probe, &id);
  if (st == GKRT_STATUS_UNSUPPORTED) {
    /* No libnccl: the message names what was searched. */
    CHECK(strstr(last_error(), "libnccl.so") != NULL);
    printf("int_collectives: NCCL missing (%s)\n", last_error());
    return;
  }
  OK(st);
  run_ranks(1, every_collective, NULL);
  printf("int_collectives: NCCL collectives checked on 1 rank\n");
  /* A second GPU, if there is one: two ranks, one per GPU. */
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.device_ordinal = 1;
  cfg.log_level = 0;
  gkrt_runtime *second = NULL;
  if (gkrt_runtime_create(&cfg, &second) == GKRT_STATUS_OK) {
    OK(gkrt_runtime_release(second));
    run_ranks(2, every_collective, NULL);
    printf("int_collectives: NCCL collectives checked on 2 ranks (GPUs 0 and 1)\n");
  }
  /* Two ranks on GPU 0: NCCL refuses duplicate GPUs; both joins fail within the timeout. */
  struct dup_arg args[2];
  pthread_t threads[2];
  OK(gkrt_comm_get_unique_id(probe, &id));
  double t0 = now_ms();
  for (uint32_t r = 0; r < 2; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].id = id;
    args[r].rank = r;
    CHECK(pthread_create(&threads[r], NULL, join_gpu0, &args[r]) == 0);
  }
  for (uint32_t r = 0; r < 2; r++) CHECK(pthread_join(threads[r], NULL) == 0);
  double took = now_ms() - t0;
  for (uint32_t r = 0; r < 2; r++) {
    CHECK(args[r].status != GKRT_STATUS_OK);
    CHECK(args[r].message[0] != 0);
    printf("int_collectives: two ranks on GPU 0, rank %u: %s: %s\n", r, gkrt_status_name(args[r].status),
           args[r].message);
  }
  CHECK(took < 20000 + 10000);
  printf("int_collectives: two ranks on GPU 0 refused after %.0f ms\n", took);
}

int main(void) {
  gkrt_runtime *probe = runtime_with(GKRT_DEVICE_HOST, GKRT_MEMORY_DYNAMIC, 0, 0, 1);
  if (!test_on_host(probe)) {
    on_cuda = 1;
    nccl_checks(probe);
    OK(gkrt_runtime_release(probe));
    return test_done("int_collectives");
  }
  OK(gkrt_runtime_release(probe));

  const uint32_t sizes[3] = {2, 4, 8};
  for (int i = 0; i < 3; i++) run_ranks(sizes[i], every_collective, NULL);

  /* Overlap: rank 1 reaches the collective late (longer under a sanitizer or valgrind, which
   * slow everything else down). Rank 0's node that does not touch the collective's tensors runs
   * before rank 1 has even produced its contribution; the node that reads the result after. */
  static struct overlap_result ov;
  ov.late_ms = getenv("GKRT_TEST_NO_RSS") ? 3000 : 300;
  run_ranks(2, overlap, &ov);
  CHECK(ov.independent > 0 && ov.dependent > 0 && ov.late_done > 0);
  CHECK(ov.independent < ov.late_done);
  CHECK(ov.dependent > ov.late_done);
  for (int i = 0; i < COUNT; i++) {
    float want = (float)(0 * 100 + i) + (float)(1 * 100 + i);
    CHECK(ov.y[0][i] == want && ov.y[1][i] == want);
  }

  /* A mismatch: the first run's digest exchange finds it before any real collective; both
   * ranks fail, each naming its own node and the other's (index and count). */
  static struct failure_result fr;
  memset(&fr, 0, sizeof fr);
  fr.mode = 0;
  run_ranks(2, failing, &fr);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_U64(fr.status[r], GKRT_STATUS_PEER_FAILED);
    if (strstr(fr.message[r], "issue different collectives") == NULL) fprintf(stderr, "rank %d: %s\n", r, fr.message[r]);
    CHECK(strstr(fr.message[r], "issue different collectives") != NULL);
    CHECK(strstr(fr.message[r], "collective 0 on the communicator") != NULL);
    CHECK(strstr(fr.message[r], "this rank's is node 0") != NULL);
    CHECK(strstr(fr.message[r], r == 0 ? "x4)" : "x8)") != NULL);
    CHECK(strstr(fr.message[r], r == 0 ? "its node 0 is a different collective (of 8 elements)"
                                       : "its node 0 is a different collective (of 4 elements)") != NULL);
  }
  /* A failing rank: its own error; the other fails at once with PEER_FAILED (not its 20 s
   * timeout). */
  memset(&fr, 0, sizeof fr);
  fr.mode = 1;
  run_ranks(2, failing, &fr);
  CHECK_EQ_U64(fr.status[1], GKRT_STATUS_INVALID_STATE);
  CHECK_EQ_U64(fr.status[0], GKRT_STATUS_PEER_FAILED);
  CHECK(strstr(fr.message[0], "rank 1 aborted") != NULL);
  CHECK(fr.waited_ms[0] < 10000.0);
  if (fr.status[0] != GKRT_STATUS_PEER_FAILED || strstr(fr.message[0], "rank 1 aborted") == NULL)
    fprintf(stderr, "rank 0: %s\n", fr.message[0]);

  bad_nodes();
  return test_done("int_collectives");
}
