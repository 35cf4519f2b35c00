/*
 * int_queue: the device data queue. A producer thread pushes batches (two buffers: data and a
 * label), alternating pinned and pageable, with random pauses, while the main thread runs a
 * graph that pops them (synchronous and asynchronous runs, dynamic and planned mode,
 * capacities 1 and 3, host-backend jitter): every batch arrives once, in order, bit-exact, and
 * the statistics count them. A run that fails leaves its batch for the next. Timeouts on a full
 * and an empty queue, close while a push and a pop wait (both wake and fail), draining a closed
 * queue, push after close, and the errors of gkrt_graph_add_queue_pop (another runtime, sizes,
 * kinds, before finalize), each naming the queue or tensor.
 */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "dev_mem.h"
#include "test_util.h"

enum { N = 512, DATA = N * 4, LABEL = 16, BATCHES = 120 };

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void batch_of(int k, float *data, uint32_t *label) {
  fill_floats(data, N, 1000u + (uint32_t)k);
  for (int i = 0; i < 4; i++) label[i] = (uint32_t)k * 4u + (uint32_t)i;
}

typedef struct {
  gkrt_queue *q;
  int batches;
  unsigned seed;
  int max_pause_us;
  int failures;
} producer_args;

static void *producer(void *p) {
  producer_args *a = p;
  float data[N];
  uint32_t label[4];
  for (int k = 0; k < a->batches; k++) {
    batch_of(k, data, label);
    const void *bufs[2] = {data, label};
    if (a->max_pause_us) usleep((unsigned)(rand_r(&a->seed) % (unsigned)a->max_pause_us));
    if (gkrt_queue_push(a->q, bufs, 2, (uint32_t)(k % 2), 20000) != GKRT_STATUS_OK) a->failures++;
    /* The caller may reuse its buffers at once: scribble over them. */
    memset(data, 0xAB, sizeof data);
  }
  return NULL;
}

static gkrt_runtime *jittery_runtime(gkrt_memory_mode mode) {
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.memory_mode = mode;
  cfg.host_jitter_us = 50;
  cfg.log_level = 1;
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(&cfg, &rt));
  return rt;
}

/* x, lbl (inputs the queue fills) -> y = copy(x), lbl_out = copy(lbl). */
typedef struct {
  gkrt_graph *g;
  gkrt_tensor x, lbl, y, lbl_out, mid;
} consumer;

static consumer make_consumer(gkrt_runtime *rt, gkrt_kernel *copy) {
  consumer c;
  OK(gkrt_graph_create(rt, &c.g));
  c.x = add_tensor(c.g, DATA, GKRT_TENSOR_INPUT, "x_in");
  c.lbl = add_tensor(c.g, LABEL, GKRT_TENSOR_INPUT, "label_in");
  c.mid = add_tensor(c.g, DATA, GKRT_TENSOR_INTERMEDIATE, "mid_t");
  c.y = add_tensor(c.g, DATA, GKRT_TENSOR_OUTPUT, "y_out");
  c.lbl_out = add_tensor(c.g, LABEL, GKRT_TENSOR_OUTPUT, "label_out");
  OK(add_node(c.g, copy, &c.x, 1, c.mid, NULL, 0));
  OK(add_node(c.g, copy, &c.mid, 1, c.y, NULL, 0));
  OK(add_node(c.g, copy, &c.lbl, 1, c.lbl_out, NULL, 0));
  OK(gkrt_graph_finalize(c.g));
  return c;
}

static void check_batch(consumer *c, int k) {
  float data[N], got[N];
  uint32_t label[4], got_label[4];
  batch_of(k, data, label);
  OK(gkrt_graph_read_tensor(c->g, c->y, got, DATA));
  OK(gkrt_graph_read_tensor(c->g, c->lbl_out, got_label, LABEL));
  CHECK_BITS(got, data, N);
  if (memcmp(got_label, label, LABEL) != 0) {
    fprintf(stderr, "batch %d: label %u, expected %u\n", k, got_label[0], label[0]);
    test_failures++;
  }
}

static void stream_of_batches(gkrt_memory_mode mode, size_t capacity, int async) {
  gkrt_runtime *rt = jittery_runtime(mode);
  gkrt_kernel *copy = builtin_kernel(rt, GKRT_BUILTIN_COPY);
  const uint64_t sizes[2] = {DATA, LABEL};
  gkrt_queue *q = NULL;
  OK(gkrt_queue_create(rt, "batches", capacity, sizes, 2, 20000, &q));
  consumer c = make_consumer(rt, copy);
  gkrt_tensor pops[2] = {c.x, c.lbl};
  OK(gkrt_graph_add_queue_pop(c.g, q, pops, 2));
  uint64_t base = 0;

  producer_args pa = {q, BATCHES, 7u + (unsigned)capacity, 400, 0};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, producer, &pa) == 0);
  unsigned seed = 99;
  for (int k = 0; k < BATCHES; k++) {
    usleep(rand_r(&seed) % 400);
    if (async) {
      OK(gkrt_runtime_run_async(rt, c.g, NULL));
      OK(gkrt_graph_wait(rt, c.g));
    } else {
      OK(gkrt_runtime_run(rt, c.g));
    }
    check_batch(&c, k);
    /* After the first run (outputs, arena): no pool memory per batch. */
    if (k == 0) base = allocated_bytes(rt);
    CHECK_EQ_U64(allocated_bytes(rt), base);
  }
  pthread_join(th, NULL);
  CHECK_EQ_U64(pa.failures, 0);
  gkrt_queue_stats st;
  OK(gkrt_queue_get_stats(q, &st));
  CHECK_EQ_U64(st.pushes, BATCHES);
  CHECK_EQ_U64(st.pops, BATCHES);
  CHECK_EQ_U64(st.bytes_pushed, (uint64_t)BATCHES * (DATA + LABEL));
  CHECK(st.push_wait_ns + st.pop_wait_ns > 0);

  /* Empty now: a pop waits for a batch, up to the timeout (a short queue for that). */
  gkrt_queue *q2 = NULL;
  OK(gkrt_queue_create(rt, "short_wait", 1, sizes, 2, 50, &q2));
  consumer c2 = make_consumer(rt, copy);
  gkrt_tensor pops2[2] = {c2.x, c2.lbl};
  OK(gkrt_graph_add_queue_pop(c2.g, q2, pops2, 2));
  double t0 = now_ms();
  FAILS(gkrt_runtime_run(rt, c2.g), GKRT_STATUS_INVALID_STATE, "timed out");
  MSG_HAS("short_wait");
  CHECK(now_ms() - t0 >= 45.0);
  FAILS(gkrt_runtime_run_async(rt, c2.g, NULL), GKRT_STATUS_INVALID_STATE, "timed out");
  /* Full: a push waits for room, up to its timeout. */
  float data[N];
  uint32_t label[4];
  batch_of(0, data, label);
  const void *bufs[2] = {data, label};
  OK(gkrt_queue_push(q2, bufs, 2, 0, 0));
  t0 = now_ms();
  FAILS(gkrt_queue_push(q2, bufs, 2, 0, 50), GKRT_STATUS_INVALID_STATE, "timed out");
  CHECK(now_ms() - t0 >= 45.0);
  OK(gkrt_runtime_run(rt, c2.g));
  check_batch(&c2, 0);
  OK(gkrt_graph_release(c2.g));
  OK(gkrt_queue_release(q2));

  OK(gkrt_queue_close(q));
  OK(gkrt_queue_release(q)); /* the graph keeps it alive */
  FAILS(gkrt_runtime_run(rt, c.g), GKRT_STATUS_INVALID_STATE, "closed");
  OK(gkrt_graph_release(c.g));
  OK(gkrt_kernel_release(copy));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

/* --- Close while a push and a pop wait: both wake and fail. --- */
typedef struct {
  gkrt_runtime *rt;
  gkrt_graph *g;
  gkrt_queue *q;
  gkrt_status status;
  double waited_ms;
  char msg[256];
} waiter;

static void *wait_pop(void *p) {
  waiter *w = p;
  double t0 = now_ms();
  w->status = gkrt_runtime_run(w->rt, w->g);
  w->waited_ms = now_ms() - t0;
  gkrt_last_error_message(w->msg, sizeof w->msg);
  return NULL;
}

static void *wait_push(void *p) {
  waiter *w = p;
  static float data[N];
  static uint32_t label[4];
  const void *bufs[2] = {data, label};
  double t0 = now_ms();
  w->status = gkrt_queue_push(w->q, bufs, 2, 1, 10000);
  w->waited_ms = now_ms() - t0;
  gkrt_last_error_message(w->msg, sizeof w->msg);
  return NULL;
}

static void close_while_waiting(void) {
  gkrt_runtime *rt = jittery_runtime(GKRT_MEMORY_DYNAMIC);
  gkrt_kernel *copy = builtin_kernel(rt, GKRT_BUILTIN_COPY);
  const uint64_t sizes[2] = {DATA, LABEL};
  gkrt_queue *empty = NULL, *full = NULL;
  OK(gkrt_queue_create(rt, "empty_q", 2, sizes, 2, 10000, &empty));
  OK(gkrt_queue_create(rt, "full_q", 1, sizes, 2, 10000, &full));
  consumer c = make_consumer(rt, copy);
  gkrt_tensor pops[2] = {c.x, c.lbl};
  OK(gkrt_graph_add_queue_pop(c.g, empty, pops, 2));
  float data[N];
  uint32_t label[4];
  batch_of(5, data, label);
  const void *bufs[2] = {data, label};
  OK(gkrt_queue_push(full, bufs, 2, 1, 0));

  waiter popper = {rt, c.g, empty, GKRT_STATUS_OK, 0, {0}}, pusher = {rt, NULL, full, GKRT_STATUS_OK, 0, {0}};
  pthread_t t1, t2;
  CHECK(pthread_create(&t1, NULL, wait_pop, &popper) == 0);
  CHECK(pthread_create(&t2, NULL, wait_push, &pusher) == 0);
  usleep(100 * 1000);
  OK(gkrt_queue_close(empty));
  OK(gkrt_queue_close(full));
  OK(gkrt_queue_close(full)); /* twice is fine */
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  CHECK_EQ_U64(popper.status, GKRT_STATUS_INVALID_STATE);
  CHECK_EQ_U64(pusher.status, GKRT_STATUS_INVALID_STATE);
  CHECK(strstr(popper.msg, "closed") && strstr(popper.msg, "empty_q"));
  CHECK(strstr(pusher.msg, "closed") && strstr(pusher.msg, "full_q"));
  CHECK(popper.waited_ms >= 90.0 && popper.waited_ms < 5000.0);
  CHECK(pusher.waited_ms >= 90.0 && pusher.waited_ms < 5000.0);
  /* Push after close fails; the closed queue still gives up what it holds, then fails. */
  FAILS(gkrt_queue_push(full, bufs, 2, 0, 0), GKRT_STATUS_INVALID_STATE, "closed");
  consumer c2 = make_consumer(rt, copy);
  gkrt_tensor pops2[2] = {c2.x, c2.lbl};
  OK(gkrt_graph_add_queue_pop(c2.g, full, pops2, 2));
  OK(gkrt_runtime_run(rt, c2.g));
  check_batch(&c2, 5);
  FAILS(gkrt_runtime_run(rt, c2.g), GKRT_STATUS_INVALID_STATE, "closed");
  gkrt_queue_stats st;
  OK(gkrt_queue_get_stats(full, &st));
  CHECK_EQ_U64(st.pushes, 1);
  CHECK_EQ_U64(st.pops, 1);
  CHECK(st.push_wait_ns >= 90000000ull);
  OK(gkrt_queue_get_stats(empty, &st));
  CHECK(st.pop_wait_ns >= 90000000ull);

  OK(gkrt_graph_release(c.g));
  OK(gkrt_graph_release(c2.g));
  OK(gkrt_queue_release(empty));
  OK(gkrt_queue_release(full));
  OK(gkrt_kernel_release(copy));
  CHECK_EQ_U64(allocated_bytes(rt), 0);
  OK(gkrt_runtime_release(rt));
}

/* --- A failed run leaves its batch at the head; errors of add_queue_pop. --- */
static volatile int fail_cb = 0;
static int32_t maybe_fail(const gkrt_callback_args *a, void *user) {
  (void)user;
  float v[N];
  if (cbdev_read(a, a->inputs[0], v, DATA)) return 95;
  if (cbdev_write(a, a->outputs[0], v, DATA)) return 94;
  return fail_cb ? 13 : 0;
}

static void failures_and_errors(void) {
  gkrt_runtime *rt = jittery_runtime(GKRT_MEMORY_DYNAMIC);
  cbdev_init(rt);
  gkrt_kernel *copy = builtin_kernel(rt, GKRT_BUILTIN_COPY), *cb = NULL;
  OK(gkrt_kernel_from_callback(rt, maybe_fail, NULL, &cb));
  const uint64_t sizes[2] = {DATA, LABEL};
  gkrt_queue *q = NULL;
  FAILS(gkrt_queue_create(rt, "bad", 0, sizes, 2, 10, &q), GKRT_STATUS_INVALID_ARGUMENT, "capacity");
  const uint64_t zero[2] = {DATA, 0};
  FAILS(gkrt_queue_create(rt, "bad", 2, zero, 2, 10, &q), GKRT_STATUS_INVALID_ARGUMENT, "buffer 1");
  FAILS(gkrt_queue_create(rt, "bad", 2, NULL, 2, 10, &q), GKRT_STATUS_INVALID_ARGUMENT, "sizes");
  FAILS(gkrt_queue_create(rt, "bad", 2, sizes, 2, 10, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  OK(gkrt_queue_create(rt, "fq", 2, sizes, 2, 1000, &q));

  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, DATA, GKRT_TENSOR_INPUT, "x_in");
  gkrt_tensor lbl = add_tensor(g, LABEL, GKRT_TENSOR_INPUT, "label_in");
  gkrt_tensor small = add_tensor(g, 2 * LABEL, GKRT_TENSOR_INPUT, "small_in");
  gkrt_tensor mid = add_tensor(g, DATA, GKRT_TENSOR_INTERMEDIATE, "mid_t");
  gkrt_tensor y = add_tensor(g, DATA, GKRT_TENSOR_OUTPUT, "y_out");
  gkrt_tensor lbl_out = add_tensor(g, LABEL, GKRT_TENSOR_OUTPUT, "label_out");
  OK(add_node(g, cb, &x, 1, mid, NULL, 0));
  OK(add_node(g, copy, &mid, 1, y, NULL, 0));
  OK(add_node(g, copy, &lbl, 1, lbl_out, NULL, 0));
  gkrt_tensor pops[2] = {x, lbl};
  FAILS(gkrt_graph_add_queue_pop(g, q, pops, 2), GKRT_STATUS_INVALID_STATE, "finalize");
  OK(gkrt_graph_finalize(g));
  FAILS(gkrt_graph_add_queue_pop(g, q, pops, 1), GKRT_STATUS_INVALID_ARGUMENT, "fq");
  gkrt_tensor wrong_size[2] = {x, small};
  FAILS(gkrt_graph_add_queue_pop(g, q, wrong_size, 2), GKRT_STATUS_INVALID_ARGUMENT, "small_in");
  gkrt_tensor inter[2] = {mid, lbl};
  FAILS(gkrt_graph_add_queue_pop(g, q, inter, 2), GKRT_STATUS_INVALID_ARGUMENT, "mid_t");
  gkrt_tensor outp[2] = {x, lbl_out};
  FAILS(gkrt_graph_add_queue_pop(g, q, outp, 2), GKRT_STATUS_INVALID_ARGUMENT, "label_out");
  FAILS(gkrt_graph_add_queue_pop(g, NULL, pops, 2), GKRT_STATUS_INVALID_ARGUMENT, "queue");
  gkrt_runtime *rt2 = jittery_runtime(GKRT_MEMORY_DYNAMIC);
  gkrt_queue *foreign = NULL;
  OK(gkrt_queue_create(rt2, "other_rt_q", 1, sizes, 2, 10, &foreign));
  FAILS(gkrt_graph_add_queue_pop(g, foreign, pops, 2), GKRT_STATUS_INVALID_ARGUMENT, "other_rt_q");
  MSG_HAS("another runtime");
  OK(gkrt_queue_release(foreign));
  OK(gkrt_runtime_release(rt2));
  OK(gkrt_graph_add_queue_pop(g, q, pops, 2));
  FAILS(gkrt_graph_add_queue_pop(g, q, pops, 2), GKRT_STATUS_INVALID_ARGUMENT, "already");

  float data[N];
  uint32_t label[4];
  const void *bufs[2] = {data, label}, *null_bufs[2] = {data, NULL};
  FAILS(gkrt_queue_push(q, bufs, 1, 0, 0), GKRT_STATUS_INVALID_ARGUMENT, "fq");
  FAILS(gkrt_queue_push(q, null_bufs, 2, 0, 0), GKRT_STATUS_INVALID_ARGUMENT, "buffer 1");
  for (int k = 0; k < 2; k++) {
    batch_of(k, data, label);
    OK(gkrt_queue_push(q, bufs, 2, 0, 0));
  }
  fail_cb = 1;
  FAILS(gkrt_runtime_run(rt, g), GKRT_STATUS_CALLBACK_FAILED, "13");
  fail_cb = 0;
  consumer view = {g, x, lbl, y, lbl_out, mid};
  OK(gkrt_runtime_run(rt, g)); /* batch 0 again: the failed run left it */
  check_batch(&view, 0);
  OK(gkrt_runtime_run(rt, g));
  check_batch(&view, 1);
  gkrt_queue_stats st;
  OK(gkrt_queue_get_stats(q, &st));
  CHECK_EQ_U64(st.pops, 2);
  FAILS(gkrt_queue_get_stats(q, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  OK(gkrt_queue_release(q));
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(copy));
  OK(gkrt_kernel_release(cb));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

int main(void) {
  stream_of_batches(GKRT_MEMORY_DYNAMIC, 3, 0);
  stream_of_batches(GKRT_MEMORY_DYNAMIC, 1, 1);
  stream_of_batches(GKRT_MEMORY_PLANNED, 1, 0);
  stream_of_batches(GKRT_MEMORY_PLANNED, 3, 1);
  close_while_waiting();
  failures_and_errors();
  return test_done("int_queue");
}
