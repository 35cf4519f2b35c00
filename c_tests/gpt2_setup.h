/*
 * What int_gpt2.c (f32) and int_gpt2_bf16.c share: the GPT-2 example's tiny configuration on
 * whatever backend GKRT_DEVICE picks, its training runs, and the check that every memory mode
 * gives the bits of dynamic mode without a limit.
 */
#ifndef GKRT_GPT2_SETUP_H
#define GKRT_GPT2_SETUP_H

#include <math.h>

#include "../examples_c/gpt2/model.h"
#include "test_util.h"

static const gpt2_config TINY = {2, 16, 2, 8, 2, 32};

typedef struct {
  gkrt_runtime *rt;
  gpt2_kernels ks;
  gpt2_model *m;
} setup;

/* A runtime, kernels of opt->dtype, and the built model. */
static inline setup make(uint32_t mode, uint64_t limit, const gpt2_options *opt) {
  setup s;
  s.rt = runtime_with(GKRT_DEVICE_AUTO, mode, limit, 0, 1);
  gkrt_device_kind dev;
  OK(gkrt_runtime_device(s.rt, &dev));
  if ((dev == GKRT_DEVICE_CUDA ? gpt2_kernels_cuda(s.rt, opt->dtype, &s.ks) : gpt2_kernels_host(s.rt, opt->dtype, &s.ks)) !=
      0) {
    fprintf(stderr, "kernels could not be made\n");
    exit(1);
  }
  s.m = calloc(1, sizeof *s.m);
  if (!s.m || gpt2_build(s.rt, &s.ks, &TINY, opt, s.m) != 0) {
    fprintf(stderr, "gpt2_build failed\n");
    exit(1);
  }
  return s;
}

static inline void done(setup *s) {
  OK(gkrt_graph_release(s->m->graph));
  gpt2_kernels_release(&s->ks);
  CHECK_RUNTIME_WORKS(s->rt);
  OK(gkrt_runtime_release(s->rt));
  free(s->m);
}

static inline float run_loss(setup *s) {
  float loss;
  if (gpt2_step(s->rt, s->m, 1, &loss) != 0) exit(1);
  return loss;
}

/* Runs `steps` steps (lr 1e-2, weight decay 0.01); returns the losses, and the final master
 * weights in `w_out`. */
static inline void train(gpt2_dtype dtype, uint32_t mode, uint64_t limit, int recompute, uint32_t steps,
                         const float *w0, const int32_t *tok, const int32_t *tg, float *losses, float *w_out,
                         gkrt_stats *st) {
  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.lr = 1e-2f;
  opt.weight_decay = 0.01f;
  opt.recompute = recompute;
  opt.dtype = dtype;
  setup s = make(mode, limit, &opt);
  if (gpt2_upload(s.m, w0, tok, tg) != 0) exit(1);
  for (uint32_t t = 1; t <= steps; t++)
    if (gpt2_step(s.rt, s.m, t, &losses[t - 1]) != 0) exit(1);
  if (gpt2_download(s.m, w_out) != 0) exit(1);
  *st = stats_of(s.rt);
  done(&s);
}

enum { GPT2_TEST_STEPS = 15 };

/* Planned mode, and dynamic under 1/2 and 1/3 of the working set (swapping, with and without
 * recomputable nodes and products), train to the same losses `ref` and weights `w_ref` as
 * dynamic mode without a limit; the limited runs swapped and stayed under their limit. */
static inline void check_memory_modes(gpt2_dtype dtype, const float *w0, const int32_t *tok, const int32_t *tg,
                                      const float *ref, const float *w_ref, uint64_t nw) {
  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.dtype = dtype;
  setup probe = make(GKRT_MEMORY_DYNAMIC, 0, &opt);
  gkrt_graph_info info = info_of(probe.m->graph);
  done(&probe);
  const uint64_t ws = info.persistent_bytes + info.peak_transient_bytes;
  struct {
    const char *name;
    uint32_t mode;
    uint64_t limit;
    int recompute;
  } runs[] = {
      {"planned", GKRT_MEMORY_PLANNED, 0, 0},
      {"dynamic, 1/2 of the working set, recomputable nodes", GKRT_MEMORY_DYNAMIC, ws / 2, 1},
      {"dynamic, 1/3 of the working set", GKRT_MEMORY_DYNAMIC, ws / 3, 0},
      {"dynamic, 1/3 of the working set, recomputable nodes", GKRT_MEMORY_DYNAMIC, ws / 3, 1},
      {"dynamic, 1/3 of the working set, recomputable nodes and forward products", GKRT_MEMORY_DYNAMIC, ws / 3, 2},
      {"planned, 1/2 of the working set", GKRT_MEMORY_PLANNED, ws / 2, 1},
  };
  float got[GPT2_TEST_STEPS];
  float *w = alloc_floats(nw);
  gkrt_stats st;
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    memset(got, 0xff, sizeof got);
    train(dtype, runs[i].mode, runs[i].limit, runs[i].recompute, GPT2_TEST_STEPS, w0, tok, tg, got, w, &st);
    int same = memcmp(got, ref, sizeof got) == 0 && memcmp(w, w_ref, nw * 4) == 0;
    printf("%s: limit %llu B, swapped %llu B out, %llu tensors recomputed, peak reserved %llu B: %s\n", runs[i].name,
           (unsigned long long)runs[i].limit, (unsigned long long)st.swap_out_bytes,
           (unsigned long long)st.tensors_recomputed, (unsigned long long)st.peak_reserved_bytes,
           same ? "bit-identical" : "DIFFERENT");
    CHECK(same);
    if (runs[i].limit) {
      CHECK(st.swap_out_bytes > 0);
      CHECK(st.peak_reserved_bytes <= runs[i].limit);
    }
  }
  free(w);
}

#endif
