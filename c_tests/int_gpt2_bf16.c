/*
 * int_gpt2_bf16: the GPT-2 example's mixed-precision step (--dtype bf16: bf16 activations,
 * gradients and compute copies; f32 master weights, AdamW state, statistics and losses) on the
 * tiny configuration of int_gpt2, on whatever backend GKRT_DEVICE picks.
 *  0. Rounding: bf16.h's rounding on ties, NaN and overflow; the compute copies the upload
 *     writes, and those AdamW rewrites after each step, are the master weights rounded.
 *  1. Gradients against the f32 graph (which int_gpt2 checks against finite differences) with
 *     the same weights and batch: per parameter tensor, the bf16 gradient's error relative to
 *     the f32 one (L2 norms) within bf16's precision; the losses close but not the same bits
 *     (bf16 arithmetic really ran). (The GPU's bf16 step against the host backend's, the
 *     reference, is scripts/gpu/run.sh gpt2's first comparison: GKRT_DEVICE sets every
 *     runtime of a process.)
 *  2. Training: fifteen AdamW steps bring the loss well down, step by step close to f32's curve.
 *  3. Memory modes: planned, and dynamic under 1/2 and 1/3 of the working set give the bits of
 *     dynamic mode without a limit, in bf16.
 *  4. Kernels made for f32 refused for a bf16 model, the runtime still usable.
 */
#include "../examples_c/gpt2/bf16.h"
#include "gpt2_setup.h"

static void check_rounding(const float *w0, const int32_t *tok, const int32_t *tg) {
  /* Ties go to the even neighbour; the rest to the nearest; NaN stays NaN; overflow is inf. */
  CHECK(gpt2_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(gpt2_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);             /* tie, down to even */
  CHECK(gpt2_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);             /* tie, up to even */
  CHECK(gpt2_f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3f81); /* above the tie */
  CHECK(gpt2_f32_to_bf16(-2.5f) == 0xc020);
  CHECK(gpt2_f32_to_bf16(3.4e38f) == 0x7f80);
  CHECK(isnan(gpt2_bf16_to_f32(gpt2_f32_to_bf16(NAN))));
  CHECK(gpt2_bf16_to_f32(0x3f81) == 1.0f + 1.0f / 128);

  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.dtype = GPT2_BF16;
  setup s = make(GKRT_MEMORY_DYNAMIC, 0, &opt);
  if (gpt2_upload(s.m, w0, tok, tg) != 0) exit(1);
  const gpt2_param *p = &s.m->params[2]; /* h0.ln1: weights 1, biases 0 */
  const gpt2_param *q = &s.m->params[3]; /* h0.qkv: random */
  uint16_t *h = calloc(q->count, 2);
  CHECK(h != NULL);
  OK(gkrt_graph_read_tensor(s.m->graph, q->wc, h, q->count * 2));
  int exact = 1;
  for (uint64_t j = 0; j < q->count; j++) exact &= h[j] == gpt2_f32_to_bf16(w0[q->offset + j]);
  CHECK(exact);
  OK(gkrt_graph_read_tensor(s.m->graph, p->wc, h, p->count * 2));
  CHECK(h[0] == 0x3f80 && h[p->count - 1] == 0);
  free(h);

  /* After AdamW steps every compute copy is its updated master weight, rounded. */
  float loss;
  for (uint32_t t = 1; t <= 2; t++) CHECK(gpt2_step(s.rt, s.m, t, &loss) == 0);
  float *w = alloc_floats(s.m->num_weights);
  uint16_t *c = calloc(s.m->num_weights, 2);
  CHECK(c != NULL);
  CHECK(gpt2_download(s.m, w) == 0);
  CHECK(memcmp(w, w0, s.m->num_weights * 4) != 0);
  uint64_t wrong = 0;
  for (uint32_t i = 0; i < s.m->num_params; i++) {
    const gpt2_param *r = &s.m->params[i];
    OK(gkrt_graph_read_tensor(s.m->graph, r->wc, c + r->offset, r->count * 2));
    for (uint64_t j = r->offset; j < r->offset + r->count; j++) wrong += c[j] != gpt2_f32_to_bf16(w[j]);
  }
  CHECK_EQ_U64(wrong, 0);
  free(w);
  free(c);
  done(&s);
}

/* The gradients and the loss of one run of the graph with gradients as outputs. */
static float grads_of(gpt2_dtype dtype, const float *w0, const int32_t *tok, const int32_t *tg, float *g) {
  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.grads_as_outputs = 1;
  opt.dtype = dtype;
  setup s = make(GKRT_MEMORY_DYNAMIC, 0, &opt);
  if (gpt2_upload(s.m, w0, tok, tg) != 0) exit(1);
  float loss = run_loss(&s);
  if (gpt2_read_grads(s.m, g) != 0) exit(1);
  done(&s);
  return loss;
}

/* The largest, over parameter tensors, relative L2 distance of `g` from `ref`; names the tensor. */
static double worst_relative(const gpt2_model *layout, const float *g, const float *ref, const char **name) {
  double worst = 0;
  for (uint32_t i = 0; i < layout->num_params; i++) {
    const gpt2_param *p = &layout->params[i];
    double diff = 0, norm = 0;
    for (uint64_t j = p->offset; j < p->offset + p->count; j++) {
      diff += ((double)g[j] - ref[j]) * ((double)g[j] - ref[j]);
      norm += (double)ref[j] * ref[j];
    }
    double rel = sqrt(diff / norm);
    if (!(rel <= worst)) worst = rel, *name = p->name; /* a NaN is the worst */
  }
  return worst;
}

static void check_gradients(const gpt2_model *layout, const float *w0, const int32_t *tok, const int32_t *tg) {
  const uint64_t nw = layout->num_weights;
  float *g32 = alloc_floats(nw), *g16 = alloc_floats(nw);
  float l32 = grads_of(GPT2_F32, w0, tok, tg, g32), l16 = grads_of(GPT2_BF16, w0, tok, tg, g16);
  printf("loss: f32 %.7f, bf16 %.7f\n", l32, l16);
  CHECK(l16 != l32);
  CHECK(fabsf(l16 - l32) < 1e-2f * l32);
  /* bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); a few dozen roundings in a
   * row, in a network with weights of std 0.3, stay within a few percent (host: 2.7%). */
  const char *name = "";
  double worst = worst_relative(layout, g16, g32, &name);
  printf("gradients: %u tensors against the f32 graph, worst relative L2 error %.3g (%s)\n", layout->num_params, worst,
         name);
  CHECK(worst < 0.05);
  free(g32);
  free(g16);
}

/* A model whose kernels were made for the other type: gpt2_build says so and fails. */
static void check_dtype_mismatch(void) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_AUTO, GKRT_MEMORY_DYNAMIC, 0, 0, 1);
  gkrt_device_kind dev;
  OK(gkrt_runtime_device(rt, &dev));
  gpt2_kernels ks;
  CHECK((dev == GKRT_DEVICE_CUDA ? gpt2_kernels_cuda(rt, GPT2_F32, &ks) : gpt2_kernels_host(rt, GPT2_F32, &ks)) == 0);
  gpt2_options opt;
  gpt2_default_options(&opt);
  opt.dtype = GPT2_BF16;
  gpt2_model *m = calloc(1, sizeof *m);
  CHECK(m != NULL);
  m->graph = NULL;
  CHECK(gpt2_build(rt, &ks, &TINY, &opt, m) != 0);
  CHECK(m->graph == NULL); /* refused before any graph was made */
  gpt2_kernels_release(&ks);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  free(m);
}

int main(void) {
  gpt2_model *layout = calloc(1, sizeof *layout);
  if (!layout) return 1;
  gpt2_layout(&TINY, layout);
  const uint64_t nw = layout->num_weights, bt = (uint64_t)TINY.batch * TINY.seq;
  float *w0 = alloc_floats(nw), *w_ref = alloc_floats(nw), *w32 = alloc_floats(nw);
  int32_t tok[64], tg[64];
  CHECK(bt <= 64);
  gpt2_make_batch(&TINY, 7, tok, tg);

  /* Large weights, as int_gpt2's finite differences use: every part of the network matters. */
  gpt2_init_weights(layout, 7, 0.3f, w0);
  check_rounding(w0, tok, tg);
  check_gradients(layout, w0, tok, tg);
  check_dtype_mismatch();

  gpt2_init_weights(layout, 7, 0.02f, w0);
  float ref[GPT2_TEST_STEPS], f32[GPT2_TEST_STEPS];
  gkrt_stats st;
  train(GPT2_BF16, GKRT_MEMORY_DYNAMIC, 0, 0, GPT2_TEST_STEPS, w0, tok, tg, ref, w_ref, &st);
  train(GPT2_F32, GKRT_MEMORY_DYNAMIC, 0, 0, GPT2_TEST_STEPS, w0, tok, tg, f32, w32, &st);
  double curve = 0;
  for (int i = 0; i < GPT2_TEST_STEPS; i++) curve = fmax(curve, fabs((double)ref[i] - f32[i]));
  printf("losses (bf16): first %.4f, last %.4f (ln vocab %.4f); f32: first %.4f, last %.4f; max |bf16 - f32| %.3g\n",
         ref[0], ref[GPT2_TEST_STEPS - 1], log((double)TINY.vocab), f32[0], f32[GPT2_TEST_STEPS - 1], curve);
  CHECK(fabs(ref[0] - log((double)TINY.vocab)) < 0.3);
  CHECK(ref[GPT2_TEST_STEPS - 1] < 0.6f * ref[0]);
  CHECK(curve < 0.05);
  CHECK(memcmp(w_ref, w0, nw * 4) != 0);
  check_memory_modes(GPT2_BF16, w0, tok, tg, ref, w_ref, nw);
  free(w0);
  free(w_ref);
  free(w32);
  free(layout);
  return test_done("int_gpt2_bf16");
}
