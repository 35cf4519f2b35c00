/* The tracer's cost per node (gkrt_runtime_trace_begin .. _end): a run of a chain of small
 * built-in nodes (relu / scale on 4 KiB, dynamic mode: every node goes through the executor,
 * nothing is replayed), timed on the host from the call to its return, untraced and traced.
 *
 * Rounds alternate: `runs` untraced runs, then `runs` traced runs inside one trace (begun before
 * and ended after them, outside the timing: ending writes the JSON). Per round the median run of
 * each; over the rounds the medians of those. Printed: µs per run, ns per node untraced and
 * traced, and what tracing adds per node. The step here is nothing but per-node overhead, so the
 * figure is the tracer's own cost, not a fraction of a realistic step (benches/swap_chain's
 * SWAP_TRACE measures that). Runs on whichever backend GKRT_DEVICE picks. Usage:
 *   trace_cost [nodes (256)] [runs per round (20)] [rounds (9)] */
#include "bench_host.h"

/* Median ns of `runs` runs of `g`. */
static double runs_ns(gkrt_runtime *rt, gkrt_graph *g, int runs, double *scratch) {
  for (int i = 0; i < runs; i++) {
    double t0 = now_ns();
    GK(gkrt_runtime_run(rt, g));
    scratch[i] = now_ns() - t0;
  }
  return median(scratch, runs);
}

int main(int argc, char **argv) {
  int nodes = argc > 1 ? atoi(argv[1]) : 256;
  int runs = argc > 2 ? atoi(argv[2]) : 20;
  int rounds = argc > 3 ? atoi(argv[3]) : 9;
  if (nodes < 2 || runs < 1 || rounds < 1) {
    fprintf(stderr, "usage: trace_cost [nodes >= 2] [runs >= 1] [rounds >= 1]\n");
    return 2;
  }
  const char *trace_path = getenv("TRACE_COST_JSON") ? getenv("TRACE_COST_JSON") : "/tmp/gkrt_trace_cost.json";
  gkrt_config cfg;
  GK(gkrt_config_init(&cfg));
  cfg.log_level = 1;
  gkrt_runtime *rt;
  GK(gkrt_runtime_create(&cfg, &rt));
  gkrt_graph *g;
  GK(gkrt_graph_create(rt, &g));
  gkrt_kernel *relu, *scale;
  GK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &relu));
  GK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_SCALE, &scale));
  const uint64_t bytes = 4096;
  gkrt_tensor x, prev;
  GK(gkrt_graph_add_tensor(g, bytes, GKRT_TENSOR_INPUT, "x", &x));
  prev = x;
  const float alpha = 0.5f;
  for (int i = 0; i < nodes; i++) {
    gkrt_tensor next;
    GK(gkrt_graph_add_tensor(g, bytes, i == nodes - 1 ? GKRT_TENSOR_OUTPUT : GKRT_TENSOR_INTERMEDIATE, NULL, &next));
    gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &alpha, sizeof alpha};
    GK(gkrt_graph_add_kernel(g, i % 2 ? scale : relu, &prev, 1, &next, 1, NULL, 0, i % 2 ? &l : NULL, NULL));
    prev = next;
  }
  GK(gkrt_graph_finalize(g));
  float *data = calloc(bytes / 4, sizeof(float));
  GK(gkrt_graph_write_tensor(g, x, data, bytes));
  free(data);
  double *scratch = malloc(runs * sizeof *scratch);
  double *off = malloc(rounds * sizeof *off), *on = malloc(rounds * sizeof *on);
  /* Warm-up: the pool's segments, the profile's events (created at the first traced run). */
  runs_ns(rt, g, runs, scratch);
  GK(gkrt_runtime_trace_begin(rt));
  runs_ns(rt, g, 2, scratch);
  GK(gkrt_runtime_trace_end(rt, trace_path));
  for (int r = 0; r < rounds; r++) {
    off[r] = runs_ns(rt, g, runs, scratch);
    GK(gkrt_runtime_trace_begin(rt));
    on[r] = runs_ns(rt, g, runs, scratch);
    GK(gkrt_runtime_trace_end(rt, trace_path));
  }
  double m_off = median(off, rounds), m_on = median(on, rounds);
  gkrt_device_kind dev;
  GK(gkrt_runtime_device(rt, &dev));
  printf("trace cost (%s backend, %d nodes, medians of %d rounds of %d runs): run untraced %.1f us, traced %.1f us; "
         "per node %.0f ns untraced, %.0f ns traced: tracing adds %.0f ns per node (traced/untraced %.3f)\n",
         dev == GKRT_DEVICE_CUDA ? "cuda" : "host", nodes, rounds, runs, m_off / 1e3, m_on / 1e3, m_off / nodes,
         m_on / nodes, (m_on - m_off) / nodes, m_on / m_off);
  free(scratch);
  free(off);
  free(on);
  GK(gkrt_kernel_release(relu));
  GK(gkrt_kernel_release(scale));
  GK(gkrt_graph_release(g));
  GK(gkrt_runtime_release(rt));
  return 0;
}
