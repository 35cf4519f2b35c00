/*
 * int_gpt2: the GPT-2 example (examples_c/gpt2/) on a tiny configuration, through the public C
 * API only, on whatever backend GKRT_DEVICE picks (CPU callbacks on the host backend; NVRTC
 * kernels and cuBLAS on CUDA).
 *  0. Causality: a token changed at position t leaves the losses before t and those of the
 *     other sequence bit-identical.
 *  1. Gradients: every parameter tensor's gradient, at its largest entry and at two others,
 *     against central finite differences of the loss (each a run of the same graph).
 *  2. Training: the first loss is about ln(vocab) and fifteen AdamW steps on the fixed batch
 *     bring it well down.
 *  3. Memory modes: planned, and dynamic under a memory limit of 1/2 and 1/3 of the working set
 *     (swapping, with and without recomputable nodes and products), give bit-identical losses and final
 *     parameters to dynamic mode without a limit; the limited runs swapped and stayed under
 *     their limit.
 */
#include <math.h>

#include "../examples_c/gpt2/model.h"
#include "test_util.h"

static const gpt2_config TINY = {2, 16, 2, 8, 2, 32};

typedef struct {
  gkrt_runtime *rt;
  gpt2_kernels ks;
  gpt2_model *m;
} setup;

static setup make(uint32_t mode, uint64_t limit, const gpt2_options *opt) {
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

static void done(setup *s) {
  OK(gkrt_graph_release(s->m->graph));
  gpt2_kernels_release(&s->ks);
  CHECK_RUNTIME_WORKS(s->rt);
  OK(gkrt_runtime_release(s->rt));
  free(s->m);
}

static float run_loss(setup *s) {
  float loss;
  if (gpt2_step(s->rt, s->m, 1, &loss) != 0) exit(1);
  return loss;
}

static void check_gradients(const float *w0, const int32_t *tok, const int32_t *tg) {
  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.grads_as_outputs = 1;
  setup s = make(GKRT_MEMORY_DYNAMIC, 0, &opt);
  const gpt2_model *m = s.m;
  float *w = alloc_floats(m->num_weights), *g = alloc_floats(m->num_weights);
  memcpy(w, w0, m->num_weights * 4);
  if (gpt2_upload(m, w, tok, tg) != 0) exit(1);
  run_loss(&s);
  if (gpt2_read_grads(m, g) != 0) exit(1);
  const float eps = 1e-2f;
  int checked = 0;
  double worst = 0;
  for (uint32_t pi = 0; pi < m->num_params; pi++) {
    const gpt2_param *p = &m->params[pi];
    uint64_t largest = 0;
    for (uint64_t j = 1; j < p->count; j++)
      if (fabsf(g[p->offset + j]) > fabsf(g[p->offset + largest])) largest = j;
    CHECK(fabsf(g[p->offset + largest]) > 1e-4f); /* every parameter gets a gradient */
    const uint64_t picks[3] = {largest, (largest + p->count / 3) % p->count, (largest + 2 * p->count / 3 + 1) % p->count};
    for (int k = 0; k < 3; k++) {
      float *x = &w[p->offset + picks[k]];
      const float saved = *x;
      *x = saved + eps;
      OK(gkrt_graph_write_tensor(m->graph, p->w, w + p->offset, p->count * 4));
      double up = run_loss(&s);
      *x = saved - eps;
      OK(gkrt_graph_write_tensor(m->graph, p->w, w + p->offset, p->count * 4));
      double down = run_loss(&s);
      *x = saved;
      OK(gkrt_graph_write_tensor(m->graph, p->w, w + p->offset, p->count * 4));
      double fd = (up - down) / (2.0 * eps), an = g[p->offset + picks[k]];
      /* f32 losses of about 3.5: their rounding puts about 1e-4 of noise on fd. */
      double err = fabs(fd - an) / (fabs(an) + 2e-3);
      if (err > worst) worst = err;
      if (err > 0.05) {
        fprintf(stderr, "gradient of %s[%llu]: analytic %.6g, finite difference %.6g\n", p->name,
                (unsigned long long)picks[k], an, fd);
        test_failures++;
      }
      checked++;
    }
  }
  printf("gradients: %d entries of %u tensors against finite differences, worst relative error %.3g\n", checked,
         m->num_params, worst);
  free(w);
  free(g);
  done(&s);
}

/* Causal attention, batch rows apart: changing the input token at position 5 of sequence 0
 * leaves the losses of its earlier positions and of sequence 1 bit-identical and changes
 * position 5's. */
static void check_causal(const float *w0, const int32_t *tok, const int32_t *tg) {
  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.grads_as_outputs = 1;
  setup s = make(GKRT_MEMORY_DYNAMIC, 0, &opt);
  const uint32_t T = TINY.seq, BT = TINY.batch * TINY.seq;
  float before[64], after[64];
  int32_t changed[64];
  if (gpt2_upload(s.m, w0, tok, tg) != 0) exit(1);
  run_loss(&s);
  OK(gkrt_graph_read_tensor(s.m->graph, s.m->losses, before, BT * 4));
  memcpy(changed, tok, BT * 4);
  changed[5] = (changed[5] + 1) % (int32_t)TINY.vocab;
  CHECK(gpt2_write_batch(s.m, changed, tg) == 0);
  run_loss(&s);
  OK(gkrt_graph_read_tensor(s.m->graph, s.m->losses, after, BT * 4));
  CHECK(memcmp(before, after, 5 * 4) == 0);       /* positions 0..4 of sequence 0 */
  CHECK(before[5] != after[5]);                   /* the position itself */
  CHECK(memcmp(before + T, after + T, T * 4) == 0); /* sequence 1 */
  done(&s);
}

/* Runs `steps` steps; returns the losses, and the final weights in `w_out`. */
static void train(uint32_t mode, uint64_t limit, int recompute, uint32_t steps, const float *w0, const int32_t *tok,
                  const int32_t *tg, float *losses, float *w_out, gkrt_stats *st) {
  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.lr = 1e-2f;
  opt.weight_decay = 0.01f;
  opt.recompute = recompute;
  setup s = make(mode, limit, &opt);
  if (gpt2_upload(s.m, w0, tok, tg) != 0) exit(1);
  for (uint32_t t = 1; t <= steps; t++)
    if (gpt2_step(s.rt, s.m, t, &losses[t - 1]) != 0) exit(1);
  if (gpt2_download(s.m, w_out) != 0) exit(1);
  *st = stats_of(s.rt);
  done(&s);
}

int main(void) {
  gpt2_model *layout = calloc(1, sizeof *layout);
  if (!layout) return 1;
  gpt2_layout(&TINY, layout);
  const uint64_t nw = layout->num_weights, bt = (uint64_t)TINY.batch * TINY.seq;
  float *w0 = alloc_floats(nw), *w_ref = alloc_floats(nw), *w = alloc_floats(nw);
  int32_t tok[64], tg[64];
  CHECK(bt <= 64);
  gpt2_make_batch(&TINY, 7, tok, tg);

  /* Larger weights than GPT-2's 0.02 make every gradient large enough to check. */
  gpt2_init_weights(layout, 7, 0.3f, w0);
  check_gradients(w0, tok, tg);
  check_causal(w0, tok, tg);

  /* --- Training, and the same steps under every memory mode. --- */
  gpt2_init_weights(layout, 7, 0.02f, w0);
  enum { STEPS = 15 };
  float ref[STEPS], got[STEPS];
  gkrt_stats st;
  train(GKRT_MEMORY_DYNAMIC, 0, 0, STEPS, w0, tok, tg, ref, w_ref, &st);
  printf("losses: first %.4f, last %.4f (ln vocab %.4f)\n", ref[0], ref[STEPS - 1], log((double)TINY.vocab));
  CHECK(fabs(ref[0] - log((double)TINY.vocab)) < 0.3);
  CHECK(ref[STEPS - 1] < 0.6f * ref[0]);
  CHECK(memcmp(w_ref, w0, nw * 4) != 0);
  CHECK_EQ_U64(st.swap_out_bytes, 0);

  /* The working set, from a graph on an unlimited runtime. */
  gpt2_options opt;
  gpt2_default_options(&opt);
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
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    memset(got, 0xff, sizeof got);
    train(runs[i].mode, runs[i].limit, runs[i].recompute, STEPS, w0, tok, tg, got, w, &st);
    int same = memcmp(got, ref, sizeof ref) == 0 && memcmp(w, w_ref, nw * 4) == 0;
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
  free(w0);
  free(w_ref);
  free(w);
  free(layout);
  return test_done("int_gpt2");
}
