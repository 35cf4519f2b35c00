/*
 * int_threads: one runtime shared by several threads. Each thread builds its own graph (with its
 * own kernel as well as kernels shared by all) and runs it many times with fresh inputs while
 * the others run theirs; every result is bit-exact. All threads also run one shared graph
 * concurrently (calls on one graph are serialised; the result is always complete). The last
 * error is per thread: each thread's failure text survives the other threads' failures. At the
 * end the run counter adds up and allocated bytes return to the baseline.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "test_util.h"

enum { THREADS = 6, ITER = 25, SN = 2048 };

static gkrt_runtime *rt;
static gkrt_kernel *k_scale, *k_add;
static gkrt_graph *shared_g;
static gkrt_tensor shared_y;
static float shared_want[SN];
static pthread_barrier_t barrier;

typedef struct {
  int id;
  int failures; /* checks failed in this thread */
  int runs;
} worker;

#define TCHECK(w, cond)                                                                              \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      fprintf(stderr, "%s:%d: thread %d: check failed: %s\n", __FILE__, __LINE__, (w)->id, #cond);   \
      (w)->failures++;                                                                               \
    }                                                                                                \
  } while (0)

static void error_round(worker *w, int round) {
  char name[64], msg[1024];
  snprintf(name, sizeof name, "thread_%d_round_%d_tensor", w->id, round);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor t;
  TCHECK(w, gkrt_graph_add_tensor(g, 0, GKRT_TENSOR_INPUT, name, &t) == GKRT_STATUS_INVALID_ARGUMENT);
  pthread_barrier_wait(&barrier); /* every thread has failed by now */
  gkrt_last_error_message(msg, sizeof msg);
  TCHECK(w, strstr(msg, name) != NULL);
  for (int other = 0; other < THREADS; other++) {
    char other_name[64];
    snprintf(other_name, sizeof other_name, "thread_%d_round_%d_tensor", other, round);
    if (other != w->id) TCHECK(w, strstr(msg, other_name) == NULL);
  }
  OK(gkrt_graph_release(g));
  pthread_barrier_wait(&barrier);
}

static void *work(void *arg) {
  worker *w = arg;
  error_round(w, 0);

  /* Own graph: a = (id + 1) * x; c = a + x; y = relu(c) (own kernel). */
  const size_t n = 500 + 37 * (size_t)w->id;
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, n * 4, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor a = add_tensor(g, n * 4, GKRT_TENSOR_INTERMEDIATE, "a");
  gkrt_tensor c = add_tensor(g, n * 4, GKRT_TENSOR_INTERMEDIATE, "c");
  gkrt_tensor y = add_tensor(g, n * 4, GKRT_TENSOR_OUTPUT, "y");
  const float alpha = (float)(w->id + 1);
  OK(add_node(g, k_scale, &x, 1, a, &alpha, 4));
  gkrt_tensor ax[2] = {a, x};
  OK(add_node(g, k_add, ax, 2, c, NULL, 0));
  OK(add_node(g, relu, &c, 1, y, NULL, 0));
  OK(gkrt_graph_finalize(g));
  float *xv = alloc_floats(n), *yv = alloc_floats(n), *want = alloc_floats(n), *sy = alloc_floats(SN);
  for (int it = 0; it < ITER; it++) {
    fill_floats(xv, n, 1000u * (uint32_t)w->id + (uint32_t)it);
    OK(gkrt_graph_write_tensor(g, x, xv, n * 4));
    OK(gkrt_runtime_run(rt, g));
    w->runs++;
    OK(gkrt_graph_read_tensor(g, y, yv, n * 4));
    for (size_t i = 0; i < n; i++) {
      float s = alpha * xv[i] + xv[i];
      want[i] = s > 0.0f ? s : 0.0f;
    }
    if (memcmp(yv, want, n * 4) != 0) {
      fprintf(stderr, "thread %d: wrong result in iteration %d\n", w->id, it);
      w->failures++;
    }
    if (it % 5 == 0) {
      /* Interleave runs of the shared graph. */
      OK(gkrt_runtime_run(rt, shared_g));
      w->runs++;
      OK(gkrt_graph_read_tensor(shared_g, shared_y, sy, SN * 4));
      if (memcmp(sy, shared_want, SN * 4) != 0) {
        fprintf(stderr, "thread %d: wrong shared result\n", w->id);
        w->failures++;
      }
    }
  }
  error_round(w, 1);
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(relu));
  free(xv);
  free(yv);
  free(want);
  free(sy);
  return NULL;
}

int main(void) {
  rt = test_runtime(0);
  k_scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  k_add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  const uint64_t base = allocated_bytes(rt);

  /* The shared graph: y = -3 * x + x, x fixed. */
  OK(gkrt_graph_create(rt, &shared_g));
  gkrt_tensor sx = add_tensor(shared_g, SN * 4, GKRT_TENSOR_INPUT, "sx");
  gkrt_tensor sa = add_tensor(shared_g, SN * 4, GKRT_TENSOR_INTERMEDIATE, "sa");
  shared_y = add_tensor(shared_g, SN * 4, GKRT_TENSOR_OUTPUT, "sy");
  const float m3 = -3.0f;
  OK(add_node(shared_g, k_scale, &sx, 1, sa, &m3, 4));
  gkrt_tensor sax[2] = {sa, sx};
  OK(add_node(shared_g, k_add, sax, 2, shared_y, NULL, 0));
  OK(gkrt_graph_finalize(shared_g));
  static float sxv[SN];
  fill_floats(sxv, SN, 4242);
  for (int i = 0; i < SN; i++) shared_want[i] = m3 * sxv[i] + sxv[i];
  OK(gkrt_graph_write_tensor(shared_g, sx, sxv, sizeof sxv));

  /* The main thread's own last error, set before the workers start. */
  gkrt_tensor t;
  FAILS(gkrt_graph_add_tensor(shared_g, 16, GKRT_TENSOR_INPUT, "main_thread_tensor", &t), GKRT_STATUS_INVALID_STATE,
        "final");
  char main_msg[1024];
  gkrt_last_error_message(main_msg, sizeof main_msg);

  gkrt_stats before = stats_of(rt);
  pthread_barrier_init(&barrier, NULL, THREADS);
  pthread_t th[THREADS];
  worker ws[THREADS];
  for (int i = 0; i < THREADS; i++) {
    ws[i] = (worker){i, 0, 0};
    CHECK(pthread_create(&th[i], NULL, work, &ws[i]) == 0);
  }
  int total_runs = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    test_failures += ws[i].failures;
    total_runs += ws[i].runs;
  }
  pthread_barrier_destroy(&barrier);
  CHECK_EQ_U64(total_runs, THREADS * (ITER + 5));
  CHECK_EQ_U64(stats_of(rt).runs - before.runs, total_runs);
  /* The workers' failures did not touch the main thread's last error. */
  CHECK_EQ_STR(last_error(), main_msg);

  OK(gkrt_graph_release(shared_g));
  CHECK_EQ_U64(allocated_bytes(rt), base);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_kernel_release(k_scale));
  OK(gkrt_kernel_release(k_add));
  OK(gkrt_runtime_release(rt));
  return test_done("int_threads");
}
