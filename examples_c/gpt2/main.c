/*
 * gkrt_gpt2: trains GPT-2 (model.h) on a fixed synthetic batch with gkrt, on the GPU when there is
 * one (cuBLAS + NVRTC kernels) and on the host backend otherwise (GKRT_DEVICE=host|cuda|auto).
 * Prints the loss each step and one RESULT line (step time, memory, swapping figures, runs the pool
 * placed by the plan of the run before).
 *
 *   gkrt_gpt2 [--layers 2] [--channels 64] [--heads 4] [--seq 32] [--batch 4] [--vocab 256]
 *             [--steps 10] [--mode dynamic|planned] [--limit BYTES[K|M|G]] [--limit-frac F]
 *             [--recompute 0|1|2] [--lr 3e-4] [--weight-decay 0] [--seed 1] [--init-std 0.02]
 *             [--dump-weights FILE] [--dtype f32|bf16] [--log-level 0..5]
 *
 * --limit-frac F: the memory limit is F times the step's working set (persistent bytes plus the
 * transient peak, from gkrt_graph_get_info on an unlimited runtime). --dump-weights writes the
 * configuration, the initial weights and the batch for benches/gpt2_torch.py (format below).
 * --dtype bf16: mixed precision (model.h says what is bf16 and what stays f32); the dump holds the
 * f32 master weights either way. --log-level: gkrt_config.log_level of the runtimes (default 2,
 * warnings; 3 prints a swapping graph's plan and the timeline model's estimate of its step).
 *
 * Dump format (little-endian): "GPT2GKRT", u32 version (1), u32 layers, channels, heads, seq, batch,
 * vocab, f32 lr, beta1, beta2, eps, weight_decay, then every parameter as f32 in model.h's order,
 * then tokens and targets as i32 [batch·seq] each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

typedef struct {
  gpt2_config cfg;
  gpt2_options opt;
  uint32_t steps, mode, log_level;
  uint64_t limit, seed;
  double limit_frac;
  float init_std;
  const char *dump;
} args;

static int parse_bytes(const char *s, uint64_t *out) {
  char *end;
  double v = strtod(s, &end);
  double mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
  if (*end == 'i') end++;
  if (*end == 'B') end++;
  if (*end || v < 0) return 1;
  *out = (uint64_t)(v * mul);
  return 0;
}

static int parse_args(int argc, char **argv, args *a) {
  a->cfg = (gpt2_config){2, 64, 4, 32, 4, 256};
  gpt2_default_options(&a->opt);
  a->steps = 10, a->mode = GKRT_MEMORY_DYNAMIC, a->limit = 0, a->seed = 1, a->limit_frac = 0, a->dump = NULL;
  a->init_std = 0.02f;
  a->log_level = 2;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "%s needs a value\n", k);
      return 1;
    }
    i++;
    uint32_t *u = !strcmp(k, "--layers") ? &a->cfg.layers
                  : !strcmp(k, "--channels") ? &a->cfg.channels
                  : !strcmp(k, "--heads") ? &a->cfg.heads
                  : !strcmp(k, "--seq") ? &a->cfg.seq
                  : !strcmp(k, "--batch") ? &a->cfg.batch
                  : !strcmp(k, "--vocab") ? &a->cfg.vocab
                  : !strcmp(k, "--steps") ? &a->steps
                  : !strcmp(k, "--log-level") ? &a->log_level
                  : NULL;
    if (u) {
      char *end;
      unsigned long x = strtoul(v, &end, 10);
      if (*end || x > 0xFFFFFFFFul) {
        fprintf(stderr, "%s: not a count: %s\n", k, v);
        return 1;
      }
      *u = (uint32_t)x;
    } else if (!strcmp(k, "--mode")) {
      if (!strcmp(v, "dynamic")) a->mode = GKRT_MEMORY_DYNAMIC;
      else if (!strcmp(v, "planned")) a->mode = GKRT_MEMORY_PLANNED;
      else {
        fprintf(stderr, "--mode: dynamic or planned, not %s\n", v);
        return 1;
      }
    } else if (!strcmp(k, "--limit")) {
      if (parse_bytes(v, &a->limit)) {
        fprintf(stderr, "--limit: not a size: %s\n", v);
        return 1;
      }
    } else if (!strcmp(k, "--limit-frac")) {
      a->limit_frac = atof(v);
      if (a->limit_frac <= 0) {
        fprintf(stderr, "--limit-frac: must be > 0: %s\n", v);
        return 1;
      }
    } else if (!strcmp(k, "--recompute")) {
      a->opt.recompute = atoi(v);
      if (a->opt.recompute < 0 || a->opt.recompute > 2 || strspn(v, "012") != strlen(v)) {
        fprintf(stderr, "--recompute: 0, 1 or 2, not %s\n", v);
        return 1;
      }
    }
    else if (!strcmp(k, "--lr")) a->opt.lr = (float)atof(v);
    else if (!strcmp(k, "--weight-decay")) a->opt.weight_decay = (float)atof(v);
    else if (!strcmp(k, "--seed")) a->seed = strtoull(v, NULL, 10);
    else if (!strcmp(k, "--init-std")) a->init_std = (float)atof(v);
    else if (!strcmp(k, "--dump-weights")) a->dump = v;
    else if (!strcmp(k, "--dtype")) {
      if (!strcmp(v, "f32")) a->opt.dtype = GPT2_F32;
      else if (!strcmp(v, "bf16")) a->opt.dtype = GPT2_BF16;
      else {
        fprintf(stderr, "--dtype: f32 or bf16, not %s\n", v);
        return 1;
      }
    } else {
      fprintf(stderr, "unknown option %s (see the top of examples_c/gpt2/main.c)\n", k);
      return 1;
    }
  }
  if (!a->steps) {
    fprintf(stderr, "--steps must be at least 1\n");
    return 1;
  }
  if (a->log_level > 5) {
    fprintf(stderr, "--log-level: 0..5, not %u\n", a->log_level);
    return 1;
  }
  return gpt2_config_check(&a->cfg);
}

static int dump(const char *path, const args *a, const gpt2_model *m, const float *w, const int32_t *tok,
                const int32_t *tg) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    return 1;
  }
  const uint32_t hdr[7] = {1, a->cfg.layers, a->cfg.channels, a->cfg.heads, a->cfg.seq, a->cfg.batch, a->cfg.vocab};
  const float hp[5] = {a->opt.lr, a->opt.beta1, a->opt.beta2, a->opt.eps, a->opt.weight_decay};
  const size_t bt = (size_t)a->cfg.batch * a->cfg.seq;
  int ok = fwrite("GPT2GKRT", 1, 8, f) == 8 && fwrite(hdr, 4, 7, f) == 7 && fwrite(hp, 4, 5, f) == 5 &&
           fwrite(w, 4, m->num_weights, f) == m->num_weights && fwrite(tok, 4, bt, f) == bt &&
           fwrite(tg, 4, bt, f) == bt;
  ok = (fclose(f) == 0) && ok;
  if (!ok) fprintf(stderr, "%s: write failed\n", path);
  return !ok;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static int make_runtime(const args *a, uint64_t limit, gkrt_runtime **rt, gpt2_kernels *ks) {
  gkrt_config cfg;
  GPT2_TRY(gkrt_config_init(&cfg));
  cfg.memory_mode = a->mode;
  cfg.memory_limit = limit;
  cfg.log_level = a->log_level;
  GPT2_TRY(gkrt_runtime_create(&cfg, rt));
  gkrt_device_kind dev;
  GPT2_TRY(gkrt_runtime_device(*rt, &dev));
  int r = dev == GKRT_DEVICE_CUDA ? gpt2_kernels_cuda(*rt, a->opt.dtype, ks) : gpt2_kernels_host(*rt, a->opt.dtype, ks);
  if (r) r |= gpt2_check(gkrt_runtime_release(*rt), "gkrt_runtime_release");
  return r;
}

/* Persistent bytes plus the transient peak, from a graph on an unlimited runtime. */
static int working_set(const args *a, gpt2_model *m, uint64_t *out) {
  gkrt_runtime *rt;
  gpt2_kernels ks;
  if (make_runtime(a, 0, &rt, &ks)) return 1;
  int r = gpt2_build(rt, &ks, &a->cfg, &a->opt, m);
  gkrt_graph_info info;
  if (!r) r = gpt2_check(gkrt_graph_get_info(m->graph, &info), "gkrt_graph_get_info");
  if (!r) *out = info.persistent_bytes + info.peak_transient_bytes;
  r |= gpt2_check(gkrt_graph_release(m->graph), "gkrt_graph_release");
  gpt2_kernels_release(&ks);
  r |= gpt2_check(gkrt_runtime_release(rt), "gkrt_runtime_release");
  return r;
}

int main(int argc, char **argv) {
  args a;
  if (parse_args(argc, argv, &a)) return 2;
  gpt2_model *m = calloc(1, sizeof *m);
  if (!m) return 1;
  uint64_t limit = a.limit;
  if (a.limit_frac > 0) {
    uint64_t ws = 0;
    if (working_set(&a, m, &ws)) return 1;
    limit = (uint64_t)(a.limit_frac * (double)ws);
  }
  gkrt_runtime *rt;
  gpt2_kernels ks;
  if (make_runtime(&a, limit, &rt, &ks)) return 1;
  gkrt_device_kind dev;
  GPT2_TRY(gkrt_runtime_device(rt, &dev));
  double t0 = now_ms();
  if (gpt2_build(rt, &ks, &a.cfg, &a.opt, m)) return 1;
  double build_ms = now_ms() - t0;
  gkrt_graph_info info;
  GPT2_TRY(gkrt_graph_get_info(m->graph, &info));
  const size_t bt = (size_t)a.cfg.batch * a.cfg.seq;
  float *w = malloc(m->num_weights * sizeof(float));
  int32_t *tok = malloc(bt * 4), *tg = malloc(bt * 4);
  double *times = calloc(a.steps, sizeof(double));
  if (!w || !tok || !tg || !times) return 1;
  gpt2_init_weights(m, a.seed, a.init_std, w);
  gpt2_make_batch(&a.cfg, a.seed, tok, tg);
  if (a.dump && dump(a.dump, &a, m, w, tok, tg)) return 1;
  const char *dtype = a.opt.dtype == GPT2_BF16 ? "bf16" : "f32";
  printf("gpt2: %s %s, layers %u channels %u heads %u seq %u batch %u vocab %u: %llu parameters, %llu nodes; "
         "%s mode, limit %llu B, recompute %d; working set %llu B (persistent %llu + transient peak %llu)\n",
         dev == GKRT_DEVICE_CUDA ? "CUDA" : "host backend", dtype, a.cfg.layers, a.cfg.channels, a.cfg.heads, a.cfg.seq,
         a.cfg.batch, a.cfg.vocab, (unsigned long long)m->num_weights, (unsigned long long)info.num_nodes,
         a.mode == GKRT_MEMORY_PLANNED ? "planned" : "dynamic", (unsigned long long)limit, a.opt.recompute,
         (unsigned long long)(info.persistent_bytes + info.peak_transient_bytes),
         (unsigned long long)info.persistent_bytes, (unsigned long long)info.peak_transient_bytes);
  if (gpt2_upload(m, w, tok, tg)) return 1;
  /* The counters after the first STEADY_FROM steps: a swapping graph's first two runs time
   * the default plan and the third is the tuned plan's first (it maps its pages), so the
   * steps after it are the steady ones. */
  enum { STEADY_FROM = 3 };
  gkrt_stats st0;
  memset(&st0, 0, sizeof st0);
  for (uint32_t s = 1; s <= a.steps; s++) {
    float loss;
    double start = now_ms();
    if (gpt2_step(rt, m, s, &loss)) return 1;
    times[s - 1] = now_ms() - start;
    printf("step %u loss %.9g time_ms %.3f\n", s, loss, times[s - 1]);
    fflush(stdout);
    if (s == STEADY_FROM) GPT2_TRY(gkrt_runtime_stats(rt, &st0));
  }
  gkrt_stats st;
  GPT2_TRY(gkrt_runtime_stats_sized(rt, &st, sizeof st));
  /* What a swapping step spent beyond its nodes, per step (all steps): for reading a limited
   * run's ratio (fallback evictions and the pool's waits for the device are not in the plan). */
  /* copy_wait_ms is 0 unless the runtime times its waits on copies (GKRT_EXEC_TIME_STALLS=1). */
  printf("SWAPSTATS evictions=%.1f pool_device_waits=%.1f copy_wait_ms=%.2f recomputed=%.1f page_maps=%.1f\n",
         (double)st.evictions / a.steps, (double)st.pool_device_waits / a.steps, st.copy_wait_ns / 1e6 / a.steps,
         (double)st.tensors_recomputed / a.steps, (double)st.page_map_count / a.steps);
  if (a.steps > STEADY_FROM) {
    /* The same per steady step (the ones after the tuned plan's first): a plan whose dry run
     * maps no page and never waits should show 0 and 0 here. */
    const double n = a.steps - STEADY_FROM;
    printf("SWAPSTATS_STEADY steps=%u evictions=%.1f pool_device_waits=%.1f copy_wait_ms=%.2f recomputed=%.1f "
           "page_maps=%.1f\n",
           a.steps - STEADY_FROM, (double)(st.evictions - st0.evictions) / n,
           (double)(st.pool_device_waits - st0.pool_device_waits) / n, (st.copy_wait_ns - st0.copy_wait_ns) / 1e6 / n,
           (double)(st.tensors_recomputed - st0.tensors_recomputed) / n,
           (double)(st.page_map_count - st0.page_map_count) / n);
  }
  /* The first two steps are warm-up (a swapping graph times both to pick its plan after the
   * second, on each node's warmer time). */
  uint32_t skip = a.steps > 2 ? 2 : a.steps - 1;
  qsort(times + skip, a.steps - skip, sizeof(double), cmp_double);
  double median = times[skip + (a.steps - skip) / 2];
  printf("RESULT device=%s layers=%u channels=%u heads=%u seq=%u batch=%u vocab=%u mode=%s recompute=%d "
         "limit=%llu working_set=%llu persistent=%llu peak_transient=%llu step_ms=%.3f peak_reserved=%llu "
         "peak_allocated=%llu swap_out=%llu swap_in=%llu recomputed=%llu nodes=%llu build_ms=%.1f dtype=%s "
         "epochs_followed=%llu epochs_left=%llu\n",
         dev == GKRT_DEVICE_CUDA ? "cuda" : "host", a.cfg.layers, a.cfg.channels, a.cfg.heads, a.cfg.seq,
         a.cfg.batch, a.cfg.vocab, a.mode == GKRT_MEMORY_PLANNED ? "planned" : "dynamic", a.opt.recompute,
         (unsigned long long)limit, (unsigned long long)(info.persistent_bytes + info.peak_transient_bytes),
         (unsigned long long)info.persistent_bytes, (unsigned long long)info.peak_transient_bytes, median,
         (unsigned long long)st.peak_reserved_bytes, (unsigned long long)st.peak_allocated_bytes,
         (unsigned long long)st.swap_out_bytes, (unsigned long long)st.swap_in_bytes,
         (unsigned long long)st.tensors_recomputed, (unsigned long long)info.num_nodes, build_ms, dtype,
         (unsigned long long)st.pool_epochs_followed, (unsigned long long)st.pool_epochs_left);
  GPT2_TRY(gkrt_graph_release(m->graph));
  gpt2_kernels_release(&ks);
  GPT2_TRY(gkrt_runtime_release(rt));
  free(w), free(tok), free(tg), free(times), free(m);
  return 0;
}
