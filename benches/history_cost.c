/* The cost of recording the pool's history (gkrt_runtime_record_history), per event.
 *
 * A loop of gkrt_malloc / gkrt_free pairs (sizes cycling over 256 B .. 1 MiB, 8 live at a time)
 * runs with recording off and on, alternating, `rounds` times each. A pair records 3 events
 * (alloc, free_requested, free_completed), so the cost per event is
 * (ns per pair on - ns per pair off) / 3. Medians over the rounds; the goal is <= 100 ns.
 * Runs on whichever backend GKRT_DEVICE picks (the GPU run uses cuda). Usage:
 *   history_cost [pairs per round (200000)] [rounds (7)] */
#include "bench_host.h"

/* ns per alloc+free pair over `pairs` pairs. */
static double pairs_ns(gkrt_runtime *rt, long pairs) {
  void *live[8] = {0};
  double t0 = now_ns();
  for (long i = 0; i < pairs; i++) {
    int slot = (int)(i & 7);
    if (live[slot]) GK(gkrt_free(rt, live[slot], NULL));
    size_t size = (size_t)256 << (i % 13); /* 256 B .. 1 MiB */
    GK(gkrt_malloc(rt, size, NULL, &live[slot]));
  }
  for (int s = 0; s < 8; s++)
    if (live[s]) GK(gkrt_free(rt, live[s], NULL));
  return (now_ns() - t0) / pairs;
}

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 200000;
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  if (pairs < 1 || rounds < 1 || rounds > 100) {
    fprintf(stderr, "usage: history_cost [pairs >= 1] [rounds 1..100]\n");
    return 2;
  }
  gkrt_config cfg;
  GK(gkrt_config_init(&cfg));
  cfg.memory_limit = 1ull << 30;
  gkrt_runtime *rt;
  GK(gkrt_runtime_create(&cfg, &rt));
  pairs_ns(rt, pairs / 4 + 1); /* warm: segments or pages in place */
  double off[100], on[100], per_event[100];
  for (int r = 0; r < rounds; r++) {
    GK(gkrt_runtime_record_history(rt, 0));
    off[r] = pairs_ns(rt, pairs);
    GK(gkrt_runtime_record_history(rt, 1u << 16)); /* the ring wraps: the steady state */
    on[r] = pairs_ns(rt, pairs);
    per_event[r] = (on[r] - off[r]) / 3;
  }
  GK(gkrt_runtime_record_history(rt, 0));
  qsort(off, rounds, sizeof *off, cmp_double);
  qsort(on, rounds, sizeof *on, cmp_double);
  qsort(per_event, rounds, sizeof *per_event, cmp_double);
  gkrt_device_kind kind;
  GK(gkrt_runtime_device(rt, &kind));
  printf("history_cost on %s: %ld pairs x %d rounds; ns per alloc+free pair: off %.1f, on %.1f (medians); "
         "recording per event: median %.1f ns (min %.1f, max %.1f); goal <= 100 ns\n",
         kind == GKRT_DEVICE_CUDA ? "cuda" : "host", pairs, rounds, off[rounds / 2], on[rounds / 2],
         per_event[rounds / 2], per_event[0], per_event[rounds - 1]);
  GK(gkrt_runtime_release(rt));
  return 0;
}
