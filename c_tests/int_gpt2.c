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
#include "gpt2_setup.h"

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

int main(void) {
  gpt2_model *layout = calloc(1, sizeof *layout);
  if (!layout) return 1;
  gpt2_layout(&TINY, layout);
  const uint64_t nw = layout->num_weights, bt = (uint64_t)TINY.batch * TINY.seq;
  float *w0 = alloc_floats(nw), *w_ref = alloc_floats(nw);
  int32_t tok[64], tg[64];
  CHECK(bt <= 64);
  gpt2_make_batch(&TINY, 7, tok, tg);

  /* Larger weights than GPT-2's 0.02 make every gradient large enough to check. */
  gpt2_init_weights(layout, 7, 0.3f, w0);
  check_gradients(w0, tok, tg);
  check_causal(w0, tok, tg);

  /* --- Training, and the same steps under every memory mode. --- */
  gpt2_init_weights(layout, 7, 0.02f, w0);
  float ref[GPT2_TEST_STEPS];
  gkrt_stats st;
  train(GPT2_F32, GKRT_MEMORY_DYNAMIC, 0, 0, GPT2_TEST_STEPS, w0, tok, tg, ref, w_ref, &st);
  printf("losses: first %.4f, last %.4f (ln vocab %.4f)\n", ref[0], ref[GPT2_TEST_STEPS - 1], log((double)TINY.vocab));
  CHECK(fabs(ref[0] - log((double)TINY.vocab)) < 0.3);
  CHECK(ref[GPT2_TEST_STEPS - 1] < 0.6f * ref[0]);
  CHECK(memcmp(w_ref, w0, nw * 4) != 0);
  CHECK_EQ_U64(st.swap_out_bytes, 0);
  check_memory_modes(GPT2_F32, w0, tok, tg, ref, w_ref, nw);
  free(w0);
  free(w_ref);
  free(layout);
  return test_done("int_gpt2");
}
