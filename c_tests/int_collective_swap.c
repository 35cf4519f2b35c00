/*
 * Swapping around collectives through the C API (host backend's communicator model, 2 and 4
 * ranks as threads, jitter on; with GKRT_DEVICE=cuda, one NCCL rank on GPU 0): a data-parallel step whose memory limit is half its working set
 * makes a swap plan at gkrt_graph_finalize (no longer GKRT_STATUS_UNSUPPORTED), swaps (the
 * runtime's swap counters are non-zero), and after three steps every rank's weights are
 * bit-identical to the same ranks' run without a limit. Gradients are all-reduced (average, in
 * place) in buckets of one and then two, so single collectives and a fused block both meet the
 * swap plan. Every rank ends with nothing allocated and releases everything (the sanitizer and
 * valgrind jobs check for leaks).
 *
 * The step, per rank: a_i = relu(a_{i-1} + w_i) for 4 layers; d = a_L - target; backward from
 * the last layer: g_i = relu_grad(d, z_i), d = copy(g_i) for the layer below, all-reduce(g_i);
 * then w_next_i = w_i + (-lr) * g_i, copied back into w_i by the host after each step.
 */
#define _GNU_SOURCE
#include "test_util.h"

#include <pthread.h>

#define N (1u << 17) /* elements per tensor: 512 KiB */
#define LAYERS 4
#define STEPS 3
#define MAX_RANKS 4

static float value(uint32_t seed, uint32_t i) { return (float)((i * 37u + seed * 101u) % 251u) / 64.0f - 1.9f; }

struct rank_arg {
  uint32_t rank, nranks;
  gkrt_unique_id id;
  uint64_t limit;
  /* Out: the weights after the steps, and the swap counters. */
  float *weights; /* LAYERS * N */
  uint64_t swapped_out, swapped_in;
};

static gkrt_tensor tensor(gkrt_graph *g, gkrt_tensor_kind kind) {
  gkrt_tensor t;
  OK(gkrt_graph_add_tensor(g, N * 4, kind, NULL, &t));
  return t;
}

static void node(gkrt_graph *g, gkrt_kernel *k, const gkrt_tensor *in, size_t n_in, gkrt_tensor out,
                 const void *params, size_t params_size) {
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, params, params_size};
  OK(gkrt_graph_add_kernel(g, k, in, n_in, &out, 1, NULL, 0, &launch, NULL));
}

/* The step's graph and its kernels on `rt` over `comm` (finalized). */
struct step {
  gkrt_graph *g;
  gkrt_kernel *kernels[5];
  gkrt_tensor x, target_neg, w[LAYERS], w_next[LAYERS];
};

static void build(gkrt_runtime *rt, gkrt_comm *comm, struct step *s) {
  gkrt_kernel *add, *relu, *relu_grad, *copy, *scale;
  OK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, &add));
  OK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &relu));
  OK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU_GRAD, &relu_grad));
  OK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_COPY, &copy));
  OK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_SCALE, &scale));
  s->kernels[0] = add, s->kernels[1] = relu, s->kernels[2] = relu_grad, s->kernels[3] = copy;
  s->kernels[4] = scale;
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  s->g = g;
  /* Buckets of one gradient, then two: single collectives and a fused block. */
  OK(gkrt_graph_set_collective_buckets(g, N * 4, 2 * N * 4));
  s->x = tensor(g, GKRT_TENSOR_INPUT);
  s->target_neg = tensor(g, GKRT_TENSOR_INPUT);
  gkrt_tensor z[LAYERS], grad[LAYERS];
  for (int i = 0; i < LAYERS; i++) s->w[i] = tensor(g, GKRT_TENSOR_PARAMETER);
  for (int i = 0; i < LAYERS; i++) s->w_next[i] = tensor(g, GKRT_TENSOR_OUTPUT);
  gkrt_tensor act = s->x;
  for (int i = 0; i < LAYERS; i++) {
    z[i] = tensor(g, GKRT_TENSOR_INTERMEDIATE);
    gkrt_tensor next = tensor(g, GKRT_TENSOR_INTERMEDIATE);
    gkrt_tensor in[2] = {act, s->w[i]};
    node(g, add, in, 2, z[i], NULL, 0);
    node(g, relu, &z[i], 1, next, NULL, 0);
    act = next;
  }
  gkrt_tensor d = tensor(g, GKRT_TENSOR_INTERMEDIATE);
  gkrt_tensor err_in[2] = {act, s->target_neg};
  node(g, add, err_in, 2, d, NULL, 0);
  for (int i = LAYERS - 1; i >= 0; i--) {
    grad[i] = tensor(g, GKRT_TENSOR_INTERMEDIATE);
    gkrt_tensor in[2] = {d, z[i]};
    node(g, relu_grad, in, 2, grad[i], NULL, 0);
    if (i > 0) {
      d = tensor(g, GKRT_TENSOR_INTERMEDIATE);
      node(g, copy, &grad[i], 1, d, NULL, 0);
    }
    OK(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_AVG, 0, GKRT_DTYPE_F32,
                                 &grad[i], 1, &grad[i], 1, NULL));
  }
  const float minus_lr = -0.125f;
  for (int i = 0; i < LAYERS; i++) {
    gkrt_tensor u = tensor(g, GKRT_TENSOR_INTERMEDIATE);
    node(g, scale, &grad[i], 1, u, &minus_lr, sizeof minus_lr);
    gkrt_tensor in[2] = {s->w[i], u};
    node(g, add, in, 2, s->w_next[i], NULL, 0);
  }
  OK(gkrt_graph_finalize(g));
}

static void release(struct step *s) {
  OK(gkrt_graph_release(s->g));
  for (size_t k = 0; k < sizeof s->kernels / sizeof *s->kernels; k++) OK(gkrt_kernel_release(s->kernels[k]));
}

static gkrt_runtime *host_runtime(uint64_t limit) {
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_HOST;
  cfg.host_jitter_us = 20;
  cfg.memory_limit = limit;
  cfg.log_level = 1;
  gkrt_runtime *rt;
  OK(gkrt_runtime_create(&cfg, &rt));
  return rt;
}

static void *rank_main(void *p) {
  struct rank_arg *a = p;
  gkrt_runtime *rt = host_runtime(a->limit);
  gkrt_comm *comm;
  OK(gkrt_comm_init_rank(rt, &a->id, a->rank, a->nranks, 20000, &comm));
  struct step s;
  build(rt, comm, &s);
  gkrt_graph *g = s.g;
  float *buf = malloc(N * 4);
  CHECK(buf != NULL);
  for (uint32_t e = 0; e < N; e++) buf[e] = value(a->rank + 1, e);
  OK(gkrt_graph_write_tensor(g, s.x, buf, N * 4));
  for (uint32_t e = 0; e < N; e++) buf[e] = -0.5f * value(77, e);
  OK(gkrt_graph_write_tensor(g, s.target_neg, buf, N * 4));
  for (int i = 0; i < LAYERS; i++) {
    for (uint32_t e = 0; e < N; e++) buf[e] = value(1000 + (uint32_t)i, e);
    OK(gkrt_graph_write_tensor(g, s.w[i], buf, N * 4));
  }
  for (int step = 0; step < STEPS; step++) {
    OK(gkrt_runtime_run(rt, g));
    for (int i = 0; i < LAYERS; i++) {
      OK(gkrt_graph_read_tensor(g, s.w_next[i], buf, N * 4));
      OK(gkrt_graph_write_tensor(g, s.w[i], buf, N * 4));
    }
  }
  for (int i = 0; i < LAYERS; i++) OK(gkrt_graph_read_tensor(g, s.w[i], a->weights + (size_t)i * N, N * 4));
  gkrt_stats st;
  OK(gkrt_runtime_stats(rt, &st));
  a->swapped_out = st.swap_out_bytes;
  a->swapped_in = st.swap_in_bytes;
  release(&s);
  OK(gkrt_comm_release(comm));
  OK(gkrt_runtime_stats(rt, &st));
  CHECK(st.allocated_bytes == 0);
  OK(gkrt_runtime_release(rt));
  free(buf);
  return NULL;
}

/* Trains on `n` ranks under `limit` (0: none); `args` receive each rank's results. */
static void train(uint32_t n, uint64_t limit, struct rank_arg *args) {
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_HOST;
  gkrt_runtime *rt;
  OK(gkrt_runtime_create(&cfg, &rt));
  gkrt_unique_id id;
  OK(gkrt_comm_get_unique_id(rt, &id));
  OK(gkrt_runtime_release(rt));
  pthread_t threads[MAX_RANKS];
  for (uint32_t r = 0; r < n; r++) {
    args[r].rank = r;
    args[r].nranks = n;
    args[r].id = id;
    args[r].limit = limit;
    args[r].weights = malloc((size_t)LAYERS * N * 4);
    CHECK(args[r].weights != NULL);
    CHECK(pthread_create(&threads[r], NULL, rank_main, &args[r]) == 0);
  }
  for (uint32_t r = 0; r < n; r++) CHECK(pthread_join(threads[r], NULL) == 0);
}

int main(void) {
  /* The limit: half the step's working set (persistent bytes and transient peak, from
   * gkrt_graph_get_info on one rank's graph), in whole 2 MiB segments. */
  gkrt_runtime *probe = host_runtime(0);
  gkrt_unique_id id;
  /* With GKRT_DEVICE=cuda the ranks are NCCL's, one per GPU: one rank on GPU 0 (NCCL refuses
   * two ranks on one GPU), and nothing to check without libnccl. */
  const int on_cuda = !test_on_host(probe);
  gkrt_status got = gkrt_comm_get_unique_id(probe, &id);
  if (on_cuda && got == GKRT_STATUS_UNSUPPORTED) {
    printf("int_collective_swap: NCCL missing (%s): skipped\n", last_error());
    OK(gkrt_runtime_release(probe));
    return test_done("int_collective_swap");
  }
  OK(got);
  gkrt_comm *one;
  OK(gkrt_comm_init_rank(probe, &id, 0, 1, 20000, &one));
  struct step s;
  build(probe, one, &s);
  gkrt_graph_info info;
  OK(gkrt_graph_get_info(s.g, &info));
  release(&s);
  OK(gkrt_comm_release(one));
  OK(gkrt_runtime_release(probe));
  const uint64_t working_set = info.persistent_bytes + info.peak_transient_bytes;
  const uint64_t limit = working_set / 2 / (2u << 20) * (2u << 20);
  CHECK(limit >= info.min_memory_limit && limit < working_set);
  for (uint32_t n = on_cuda ? 1 : 2; n <= (on_cuda ? 1u : MAX_RANKS); n *= 2) {
    struct rank_arg free_run[MAX_RANKS], tight[MAX_RANKS];
    train(n, 0, free_run);
    train(n, limit, tight);
    for (uint32_t r = 0; r < n; r++) {
      CHECK(free_run[r].swapped_out == 0 && free_run[r].swapped_in == 0);
      if (tight[r].swapped_out == 0 || tight[r].swapped_in == 0) {
        fprintf(stderr, "rank %u of %u: nothing swapped under a limit of %" PRIu64 " bytes\n", r, n, limit);
        return 1;
      }
      /* Bit-identical to the unlimited run and to rank 0 (the averaged gradients are). */
      CHECK(memcmp(tight[r].weights, free_run[r].weights, (size_t)LAYERS * N * 4) == 0);
      CHECK(memcmp(tight[r].weights, tight[0].weights, (size_t)LAYERS * N * 4) == 0);
    }
    /* The steps moved the weights: the comparison is not of untouched inputs. */
    CHECK(free_run[0].weights[0] != value(1000, 0) || free_run[0].weights[1] != value(1000, 1));
    for (uint32_t r = 0; r < n; r++) {
      free(free_run[r].weights);
      free(tight[r].weights);
    }
    printf("int_collective_swap: %u ranks swapped (rank 0: %" PRIu64 " bytes out, %" PRIu64
           " in) with weights bit-identical to the unlimited run\n",
           n, tight[0].swapped_out, tight[0].swapped_in);
  }
  return test_done("int_collective_swap");
}
