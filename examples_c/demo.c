/*
 * gkrt demo: a residual MLP step built from built-in kernels, run on the GPU when there is one
 * and on the host backend otherwise (GKRT_DEVICE=host|cuda|auto to choose). It prints the result,
 * a check against the same arithmetic in plain C, and the memory statistics: peak allocated
 * against what the intermediates would take without reference-count freeing.
 */
#include "mlp.h"

#include <math.h>

int main(void) {
  printf("gkrt %s\n", gkrt_version());
  gkrt_config cfg;
  MLP_TRY(gkrt_config_init(&cfg));
  cfg.log_level = 3; /* info: says which backend was picked and why */
  gkrt_runtime *rt;
  MLP_TRY(gkrt_runtime_create(&cfg, &rt));
  gkrt_device_kind dev;
  MLP_TRY(gkrt_runtime_device(rt, &dev));
  printf("backend: %s\n", dev == GKRT_DEVICE_CUDA ? "CUDA GPU" : "host (CPU model of a GPU)");

  mlp m;
  if (mlp_build(rt, &m)) return 1;

  static float x[MLP_B * MLP_D], w1[MLP_D * MLP_H], w2[MLP_H * MLP_H], w3[MLP_H * MLP_O];
  static float y[MLP_B * MLP_O], g[MLP_B * MLP_H], y_ref[MLP_B * MLP_O], g_ref[MLP_B * MLP_H];
  mlp_fill_random(x, MLP_B * MLP_D, 1);
  mlp_fill_random(w1, MLP_D * MLP_H, 2);
  mlp_fill_random(w2, MLP_H * MLP_H, 3);
  mlp_fill_random(w3, MLP_H * MLP_O, 4);
  MLP_TRY(gkrt_graph_write_tensor(m.graph, m.x, x, sizeof x));
  MLP_TRY(gkrt_graph_write_tensor(m.graph, m.w1, w1, sizeof w1));
  MLP_TRY(gkrt_graph_write_tensor(m.graph, m.w2, w2, sizeof w2));
  MLP_TRY(gkrt_graph_write_tensor(m.graph, m.w3, w3, sizeof w3));

  gkrt_stats before, after;
  MLP_TRY(gkrt_runtime_stats(rt, &before));
  MLP_TRY(gkrt_runtime_reset_peak_stats(rt));
  MLP_TRY(gkrt_runtime_run(rt, m.graph));
  MLP_TRY(gkrt_runtime_stats(rt, &after));
  MLP_TRY(gkrt_graph_read_tensor(m.graph, m.y, y, sizeof y));
  MLP_TRY(gkrt_graph_read_tensor(m.graph, m.g, g, sizeof g));

  mlp_reference(x, w1, w2, w3, y_ref, g_ref);
  size_t mismatches = 0;
  double max_diff = 0;
  for (size_t i = 0; i < MLP_B * MLP_O; i++) {
    double d = fabs((double)y[i] - y_ref[i]);
    if (d > max_diff) max_diff = d;
    mismatches += memcmp(&y[i], &y_ref[i], sizeof(float)) != 0;
  }
  for (size_t i = 0; i < MLP_B * MLP_H; i++) {
    double d = fabs((double)g[i] - g_ref[i]);
    if (d > max_diff) max_diff = d;
    mismatches += memcmp(&g[i], &g_ref[i], sizeof(float)) != 0;
  }

  printf("y[0..4]   = %.6f %.6f %.6f %.6f\n", y[0], y[1], y[2], y[3]);
  printf("g[0..4]   = %.6f %.6f %.6f %.6f\n", g[0], g[1], g[2], g[3]);
  printf("check against plain C: %zu of %d values differ (max |diff| %.3g)  -> %s\n", mismatches,
         MLP_B * MLP_O + MLP_B * MLP_H, max_diff, mismatches == 0 ? "OK, bit-exact" : "MISMATCH");

  gkrt_graph_info info;
  MLP_TRY(gkrt_graph_get_info(m.graph, &info));
  printf("memory: persistent %llu B; intermediates would total %llu B; peak allocated during the run %llu B above "
         "the %llu B held before (%.0f%% of the total, computed peak %llu B)\n",
         (unsigned long long)info.persistent_bytes, (unsigned long long)m.intermediate_bytes,
         (unsigned long long)(after.peak_allocated_bytes - before.allocated_bytes),
         (unsigned long long)before.allocated_bytes,
         100.0 * (double)(after.peak_allocated_bytes - before.allocated_bytes) / (double)m.intermediate_bytes,
         (unsigned long long)info.peak_transient_bytes);
  printf("pool: %llu B allocated after the run = the graph's persistent tensors (inputs, parameters and the "
         "outputs the run produced: %llu B), no intermediate left; reserved %llu B; %llu allocs / %llu frees; "
         "%llu nodes run\n",
         (unsigned long long)after.allocated_bytes, (unsigned long long)info.persistent_bytes,
         (unsigned long long)after.reserved_bytes, (unsigned long long)after.alloc_count,
         (unsigned long long)after.free_count, (unsigned long long)after.nodes_launched);
  if (after.allocated_bytes != info.persistent_bytes) {
    printf("MEMORY CHECK FAILED: something besides the persistent tensors is still allocated\n");
    mismatches++;
  }

  MLP_TRY(gkrt_graph_release(m.graph));
  MLP_TRY(gkrt_runtime_release(rt));
  return mismatches == 0 ? 0 : 1;
}
