/*
 * Builds the GPT-2 training step's graph (model.h) from the node kinds of ops.h, and moves its
 * weights, batch and loss between the host and gkrt.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

int gpt2_check(gkrt_status st, const char *what) {
  if (st == GKRT_STATUS_OK) return 0;
  char msg[1024];
  gkrt_last_error_message(msg, sizeof msg);
  fprintf(stderr, "%s failed: %s: %s\n", what, gkrt_status_name(st), msg);
  return 1;
}

int gpt2_config_check(const gpt2_config *c) {
  const char *why = NULL;
  if (!c->layers || !c->channels || !c->heads || !c->seq || !c->batch || !c->vocab)
    why = "every size must be at least 1";
  else if (c->layers > GPT2_MAX_LAYERS)
    why = "too many layers (at most 256)";
  else if (c->channels % c->heads)
    why = "heads must divide channels";
  else if ((uint64_t)c->batch * c->seq * 4 * c->channels >= (1ull << 31) ||
           (uint64_t)c->batch * c->heads * c->seq * c->seq >= (1ull << 31) ||
           (uint64_t)c->batch * c->seq * c->vocab >= (1ull << 31) ||
           (uint64_t)c->vocab * c->channels >= (1ull << 31))
    why = "batch x seq x (4 channels, heads x seq, vocab) and vocab x channels must stay under 2^31 elements";
  if (why) fprintf(stderr, "bad size: %s\n", why);
  return why != NULL;
}

void gpt2_default_options(gpt2_options *o) {
  memset(o, 0, sizeof *o);
  o->lr = 3e-4f;
  o->beta1 = 0.9f;
  o->beta2 = 0.95f;
  o->eps = 1e-8f;
  o->weight_decay = 0.0f;
}

static void add_param(gpt2_model *m, const char *name, uint64_t count) {
  gpt2_param *p = &m->params[m->num_params++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->offset = m->num_weights;
  p->count = count;
  m->num_weights += count;
}

void gpt2_layout(const gpt2_config *cfg, gpt2_model *m) {
  const uint64_t C = cfg->channels;
  m->cfg = *cfg;
  m->num_params = 0;
  m->num_weights = 0;
  add_param(m, "wte", (uint64_t)cfg->vocab * C);
  add_param(m, "wpe", (uint64_t)cfg->seq * C);
  for (uint32_t l = 0; l < cfg->layers; l++) {
    char n[24];
    snprintf(n, sizeof n, "h%u.ln1", l);
    add_param(m, n, 2 * C);
    snprintf(n, sizeof n, "h%u.qkv", l);
    add_param(m, n, 3 * C * C + 3 * C);
    snprintf(n, sizeof n, "h%u.proj", l);
    add_param(m, n, C * C + C);
    snprintf(n, sizeof n, "h%u.ln2", l);
    add_param(m, n, 2 * C);
    snprintf(n, sizeof n, "h%u.fc", l);
    add_param(m, n, 4 * C * C + 4 * C);
    snprintf(n, sizeof n, "h%u.fcproj", l);
    add_param(m, n, 4 * C * C + C);
  }
  add_param(m, "lnf", 2 * C);
}

/* --- Graph building --- */

typedef struct {
  gkrt_graph *g;
  const gpt2_kernels *ks;
  const gpt2_options *opt;
  gpt2_model *m;
  uint32_t act;    /* bytes per element of activation tensors (ops.h): 4, or 2 for bf16 */
  char prefix[24]; /* node names: "h3.attn.softmax" */
} builder;

/* A tensor of `count` elements of `size` bytes. */
static int tensor_of(builder *b, uint64_t count, uint32_t size, gkrt_tensor_kind kind, const char *name,
                     gkrt_tensor *out) {
  char full[96];
  snprintf(full, sizeof full, "%s%s", b->prefix, name);
  GPT2_TRY(gkrt_graph_add_tensor(b->g, count * size, kind, full, out));
  return 0;
}

/* An activation tensor (the model's element type). */
static int tensor(builder *b, uint64_t count, gkrt_tensor_kind kind, const char *name, gkrt_tensor *out) {
  return tensor_of(b, count, b->act, kind, name, out);
}

/* Recompute levels (gpt2_options.recompute): which nodes are declared recomputable. */
enum { RECOMPUTE_EW = 1, RECOMPUTE_PRODUCTS = 2 }; /* element-wise and row-wise nodes; forward products */

/* A node of kind `op`; `recomputable` (0, or a RECOMPUTE_* level) declares it recomputable when
 * the options' level reaches it. */
static int node(builder *b, gpt2_op op, const char *name, const gkrt_tensor *in, size_t nin, const gkrt_tensor *out,
                size_t nout, const void *params, size_t params_size, int recomputable) {
  gkrt_launch l;
  gpt2_launch_dims(op, params, &l);
  l.params = params;
  l.params_size = params_size;
  uint32_t id;
  GPT2_TRY(gkrt_graph_add_kernel(b->g, b->ks->k[op], in, nin, out, nout, NULL, 0, &l, &id));
  char full[96];
  snprintf(full, sizeof full, "%s%s", b->prefix, name);
  GPT2_TRY(gkrt_graph_set_node_name(b->g, id, full));
  if (recomputable && b->opt->recompute >= recomputable) GPT2_TRY(gkrt_graph_set_node_recomputable(b->g, id, 1));
  return 0;
}

/* One-output node with a new intermediate activation of `count` elements. */
static int op1(builder *b, gpt2_op op, const char *name, const gkrt_tensor *in, size_t nin, uint64_t count,
               const void *params, size_t params_size, int recomputable, gkrt_tensor *out) {
  if (tensor(b, count, GKRT_TENSOR_INTERMEDIATE, name, out)) return 1;
  return node(b, op, name, in, nin, out, 1, params, params_size, recomputable);
}

/* The same with an f32 output whatever the model's type (layer-norm statistics and partial sums). */
static int op1_f32(builder *b, gpt2_op op, const char *name, const gkrt_tensor *in, size_t nin, uint64_t count,
                   const void *params, size_t params_size, int recomputable, gkrt_tensor *out) {
  if (tensor_of(b, count, 4, GKRT_TENSOR_INTERMEDIATE, name, out)) return 1;
  return node(b, op, name, in, nin, out, 1, params, params_size, recomputable);
}

static gemm_op gemm(uint32_t ta, uint32_t tb, uint32_t m, uint32_t n, uint32_t k, uint32_t a_in, uint64_t a_off,
                    uint32_t lda, uint32_t b_in, uint64_t b_off, uint32_t ldb, uint64_t c_off, uint32_t ldc,
                    float alpha, float beta) {
  gemm_op o;
  memset(&o, 0, sizeof o);
  o.trans_a = ta, o.trans_b = tb, o.m = m, o.n = n, o.k = k;
  o.a_in = a_in, o.a_off = a_off, o.lda = lda;
  o.b_in = b_in, o.b_off = b_off, o.ldb = ldb;
  o.c_off = c_off, o.ldc = ldc;
  o.alpha = alpha, o.beta = beta;
  o.batch = 1;
  return o;
}

/* A product node with a new output; forward products may be declared recomputable. */
static int gemm_node(builder *b, const char *name, const gkrt_tensor *in, size_t nin, uint64_t floats, p_gemm *p,
                     int forward, gkrt_tensor *out) {
  return op1(b, OP_GEMM, name, in, nin, floats, p, sizeof *p, forward ? RECOMPUTE_PRODUCTS : 0, out);
}

/* y[BT,OC] = x[BT,IC]·Wᵀ + b, with W and b packed in `wb`. */
static int linear(builder *b, const char *name, gkrt_tensor x, gkrt_tensor wb, uint32_t ic, uint32_t oc,
                  gkrt_tensor *y) {
  const uint32_t bt = b->m->cfg.batch * b->m->cfg.seq;
  gkrt_tensor in[3] = {x, wb, b->m->ones};
  p_gemm p = {2, {gemm(0, 0, oc, bt, 1, 1, (uint64_t)oc * ic, oc, 2, 0, 1, 0, oc, 1.0f, 0.0f),
                  gemm(1, 0, oc, bt, ic, 1, 0, ic, 0, 0, ic, 0, oc, 1.0f, 1.0f)}};
  return gemm_node(b, name, in, 3, (uint64_t)bt * oc, &p, 1, y);
}

/* A gradient tensor: an intermediate, or an output when the graph exposes gradients. */
static gkrt_tensor_kind grad_kind(const builder *b) {
  return b->opt->grads_as_outputs ? GKRT_TENSOR_OUTPUT : GKRT_TENSOR_INTERMEDIATE;
}

/* dx = dy·W, and the packed gradient of (W, b): dW = dyᵀ·x, db = column sums of dy. */
static int linear_bwd(builder *b, const char *name, gkrt_tensor dy, gkrt_tensor x, gkrt_tensor wb, uint32_t ic,
                      uint32_t oc, gkrt_tensor *dx, gkrt_tensor *dwb) {
  const uint32_t bt = b->m->cfg.batch * b->m->cfg.seq;
  char n[48];
  snprintf(n, sizeof n, "%s.dx", name);
  gkrt_tensor in_dx[2] = {dy, wb};
  p_gemm pdx = {1, {gemm(0, 0, ic, bt, oc, 1, 0, ic, 0, 0, oc, 0, ic, 1.0f, 0.0f)}};
  if (gemm_node(b, n, in_dx, 2, (uint64_t)bt * ic, &pdx, 0, dx)) return 1;
  snprintf(n, sizeof n, "%s.dw", name);
  gkrt_tensor in_dw[3] = {x, dy, b->m->ones};
  p_gemm pdw = {2, {gemm(0, 1, ic, oc, bt, 0, 0, ic, 1, 0, oc, 0, ic, 1.0f, 0.0f),
                    gemm(0, 0, oc, 1, bt, 1, 0, oc, 2, 0, bt, (uint64_t)oc * ic, oc, 1.0f, 0.0f)}};
  if (tensor(b, (uint64_t)oc * ic + oc, grad_kind(b), n, dwb)) return 1;
  return node(b, OP_GEMM, n, in_dw, 3, dwb, 1, &pdw, sizeof pdw, 0);
}

static gpt2_param *param(builder *b, uint32_t index) { return &b->m->params[index]; }

/* The packed (weight, bias) gradient of a layer norm: partial sums over chunks of rows, then
 * their sum. `in` = (dy, x, stats). */
static int ln_grad(builder *b, const char *name, const gkrt_tensor *in, gkrt_tensor *dwb) {
  const uint32_t bt = b->m->cfg.batch * b->m->cfg.seq, c = b->m->cfg.channels;
  p_chunks pc = {bt, c, bt < 32 ? bt : 32}, ps = {pc.chunks, 2 * c, pc.chunks};
  gkrt_tensor parts;
  char n[48];
  snprintf(n, sizeof n, "%s.parts", name);
  if (op1_f32(b, OP_LN_BWD_WB, n, in, 3, 2ull * c * pc.chunks, &pc, sizeof pc, 0, &parts)) return 1;
  if (tensor(b, 2ull * c, grad_kind(b), name, dwb)) return 1;
  return node(b, OP_SUM_CHUNKS, name, &parts, 1, dwb, 1, &ps, sizeof ps, 0);
}

/* The parameter's gradient is complete: in a training step its AdamW node comes next. */
static int finish_grad(builder *b, uint32_t index, gkrt_tensor grad) {
  gpt2_param *p = param(b, index);
  p->grad = grad;
  if (b->opt->grads_as_outputs) return 0;
  p_adam pa = {(uint32_t)p->count, b->opt->lr, b->opt->beta1, b->opt->beta2, b->opt->eps, b->opt->weight_decay};
  gkrt_tensor in[5] = {grad, b->m->step, p->w, p->m, p->v};
  gkrt_tensor out[4] = {p->w, p->m, p->v, p->wc}; /* bf16: the compute copy too */
  char n[40];
  snprintf(n, sizeof n, "adamw.%s", p->name);
  char saved[24];
  memcpy(saved, b->prefix, sizeof saved);
  b->prefix[0] = 0;
  int r = node(b, OP_ADAMW, n, in, 5, out, b->m->dtype == GPT2_BF16 ? 4 : 3, &pa, sizeof pa, 0);
  memcpy(b->prefix, saved, sizeof saved);
  return r;
}


/* What the backward pass needs of a layer's forward. */
typedef struct {
  gkrt_tensor x, s1, h1, qkvp, p, y, x2, s2, h2, f, g;
} layer_saved;

#define TRY(x)           \
  do {                   \
    if (x) return 1;     \
  } while (0)

static int layer_forward(builder *b, uint32_t l, gkrt_tensor x, layer_saved *s, gkrt_tensor *out) {
  const gpt2_config *c = &b->m->cfg;
  const uint32_t C = c->channels, H = c->heads, T = c->seq, D = C / H, BT = c->batch * T, BH = c->batch * H;
  const uint64_t bhtd = (uint64_t)BH * T * D;
  const uint32_t base = 2 + 6 * l; /* ln1, qkv, proj, ln2, fc, fcproj */
  const float scale = 1.0f / sqrtf((float)D);
  snprintf(b->prefix, sizeof b->prefix, "h%u.", l);
  s->x = x;
  p_rows rows = {BT, C};
  TRY(op1_f32(b, OP_LN_STATS, "ln1.stats", &x, 1, 2ull * BT, &rows, sizeof rows, RECOMPUTE_EW, &s->s1));
  gkrt_tensor ln1_in[3] = {x, s->s1, param(b, base)->wc};
  TRY(op1(b, OP_LN_APPLY, "ln1", ln1_in, 3, (uint64_t)BT * C, &rows, sizeof rows, RECOMPUTE_EW, &s->h1));
  gkrt_tensor qkv;
  TRY(linear(b, "attn.qkv", s->h1, param(b, base + 1)->wc, C, 3 * C, &qkv));
  p_perm split3 = {c->batch, T, 3, H, D};
  TRY(op1(b, OP_SPLIT_HEADS, "attn.split", &qkv, 1, 3 * bhtd, &split3, sizeof split3, RECOMPUTE_EW, &s->qkvp));
  /* S = scale · Q·Kᵀ per (batch, head) */
  p_gemm ps = {1, {gemm(1, 0, T, T, D, 0, bhtd, D, 0, 0, D, 0, T, scale, 0.0f)}};
  ps.ops[0].batch = BH, ps.ops[0].stride_a = (uint64_t)T * D, ps.ops[0].stride_b = (uint64_t)T * D;
  ps.ops[0].stride_c = (uint64_t)T * T;
  gkrt_tensor sc;
  TRY(gemm_node(b, "attn.scores", &s->qkvp, 1, (uint64_t)BH * T * T, &ps, 1, &sc));
  p_rows att_rows = {BH * T, T};
  TRY(op1(b, OP_SOFTMAX, "attn.softmax", &sc, 1,
           (uint64_t)BH * T * T, &att_rows, sizeof att_rows, RECOMPUTE_EW, &s->p));
  /* Y = P·V */
  p_gemm pv = {1, {gemm(0, 0, D, T, T, 1, 2 * bhtd, D, 0, 0, T, 0, D, 1.0f, 0.0f)}};
  pv.ops[0].batch = BH, pv.ops[0].stride_a = (uint64_t)T * D, pv.ops[0].stride_b = (uint64_t)T * T;
  pv.ops[0].stride_c = (uint64_t)T * D;
  gkrt_tensor pv_in[2] = {s->p, s->qkvp}, yp;
  TRY(gemm_node(b, "attn.pv", pv_in, 2, bhtd, &pv, 1, &yp));
  p_perm merge1 = {c->batch, T, 1, H, D};
  TRY(op1(b, OP_MERGE_HEADS, "attn.merge", &yp, 1, bhtd, &merge1, sizeof merge1, RECOMPUTE_EW, &s->y));
  gkrt_tensor ao;
  TRY(linear(b, "attn.proj", s->y, param(b, base + 2)->wc, C, C, &ao));
  p_n nc = {BT * C}, n4c = {BT * 4 * C};
  gkrt_tensor r1[2] = {x, ao};
  TRY(op1(b, OP_ADD, "res1", r1, 2, (uint64_t)BT * C, &nc, sizeof nc, RECOMPUTE_EW, &s->x2));
  TRY(op1_f32(b, OP_LN_STATS, "ln2.stats", &s->x2, 1, 2ull * BT, &rows, sizeof rows, RECOMPUTE_EW, &s->s2));
  gkrt_tensor ln2_in[3] = {s->x2, s->s2, param(b, base + 3)->wc};
  TRY(op1(b, OP_LN_APPLY, "ln2", ln2_in, 3, (uint64_t)BT * C, &rows, sizeof rows, RECOMPUTE_EW, &s->h2));
  TRY(linear(b, "mlp.fc", s->h2, param(b, base + 4)->wc, C, 4 * C, &s->f));
  TRY(op1(b, OP_GELU, "mlp.gelu", &s->f, 1, (uint64_t)BT * 4 * C, &n4c, sizeof n4c, RECOMPUTE_EW, &s->g));
  gkrt_tensor mo;
  TRY(linear(b, "mlp.proj", s->g, param(b, base + 5)->wc, 4 * C, C, &mo));
  gkrt_tensor r2[2] = {s->x2, mo};
  return op1(b, OP_ADD, "res2", r2, 2, (uint64_t)BT * C, &nc, sizeof nc, RECOMPUTE_EW, out);
}

/* dx: the gradient at the layer's output; *dx_in receives it at the layer's input. */
static int layer_backward(builder *b, uint32_t l, const layer_saved *s, gkrt_tensor dx, gkrt_tensor *dx_in) {
  const gpt2_config *c = &b->m->cfg;
  const uint32_t C = c->channels, H = c->heads, T = c->seq, D = C / H, BT = c->batch * T, BH = c->batch * H;
  const uint64_t bhtd = (uint64_t)BH * T * D;
  const uint32_t base = 2 + 6 * l;
  const float scale = 1.0f / sqrtf((float)D);
  snprintf(b->prefix, sizeof b->prefix, "h%u.", l);
  p_rows rows = {BT, C};
  p_n n4c = {BT * 4 * C};

  /* MLP */
  gkrt_tensor dg, dfcproj, df, dh2, dfc, dx2, dln2;
  TRY(linear_bwd(b, "mlp.proj.bwd", dx, s->g, param(b, base + 5)->wc, 4 * C, C, &dg, &dfcproj));
  TRY(finish_grad(b, base + 5, dfcproj));
  gkrt_tensor gb_in[2] = {dg, s->f};
  TRY(op1(b, OP_GELU_BWD, "mlp.gelu.bwd", gb_in, 2, (uint64_t)BT * 4 * C, &n4c, sizeof n4c, RECOMPUTE_EW, &df));
  TRY(linear_bwd(b, "mlp.fc.bwd", df, s->h2, param(b, base + 4)->wc, C, 4 * C, &dh2, &dfc));
  TRY(finish_grad(b, base + 4, dfc));
  gkrt_tensor ln2b[5] = {dh2, s->x2, s->s2, param(b, base + 3)->wc, dx};
  TRY(op1(b, OP_LN_BWD_DX_RES, "ln2.bwd", ln2b, 5, (uint64_t)BT * C, &rows, sizeof rows, 0, &dx2));
  TRY(ln_grad(b, "ln2.grad", ln2b, &dln2));
  TRY(finish_grad(b, base + 3, dln2));

  /* Attention */
  gkrt_tensor dy, dproj, dyp, dp, ds, dqkvp, dqkv, dh1, dqkvw, dx1, dln1;
  TRY(linear_bwd(b, "attn.proj.bwd", dx2, s->y, param(b, base + 2)->wc, C, C, &dy, &dproj));
  TRY(finish_grad(b, base + 2, dproj));
  p_perm split1 = {c->batch, T, 1, H, D}, merge3 = {c->batch, T, 3, H, D};
  TRY(op1(b, OP_SPLIT_HEADS, "attn.merge.bwd", &dy, 1, bhtd, &split1, sizeof split1, RECOMPUTE_EW, &dyp));
  /* dP = dY·Vᵀ */
  p_gemm pdp = {1, {gemm(1, 0, T, T, D, 1, 2 * bhtd, D, 0, 0, D, 0, T, 1.0f, 0.0f)}};
  pdp.ops[0].batch = BH, pdp.ops[0].stride_a = (uint64_t)T * D, pdp.ops[0].stride_b = (uint64_t)T * D;
  pdp.ops[0].stride_c = (uint64_t)T * T;
  gkrt_tensor dp_in[2] = {dyp, s->qkvp};
  TRY(gemm_node(b, "attn.pv.bwd_p", dp_in, 2, (uint64_t)BH * T * T, &pdp, 0, &dp));
  p_rows att_rows = {BH * T, T};
  gkrt_tensor sb_in[2] = {dp, s->p};
  TRY(op1(b, OP_SOFTMAX_BWD, "attn.softmax.bwd", sb_in, 2,
           (uint64_t)BH * T * T, &att_rows, sizeof att_rows, RECOMPUTE_EW, &ds));
  /* inputs: dS, qkvp, dY, P. dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dY, into [3,B,H,T,D]. */
  p_gemm pq = {3,
               {gemm(0, 0, D, T, T, 1, bhtd, D, 0, 0, T, 0, D, scale, 0.0f),
                gemm(0, 1, D, T, T, 1, 0, D, 0, 0, T, bhtd, D, scale, 0.0f),
                gemm(0, 1, D, T, T, 2, 0, D, 3, 0, T, 2 * bhtd, D, 1.0f, 0.0f)}};
  for (int i = 0; i < 3; i++) {
    pq.ops[i].batch = BH, pq.ops[i].stride_a = (uint64_t)T * D, pq.ops[i].stride_b = (uint64_t)T * T;
    pq.ops[i].stride_c = (uint64_t)T * D;
  }
  gkrt_tensor dq_in[4] = {ds, s->qkvp, dyp, s->p};
  TRY(gemm_node(b, "attn.bwd_qkv", dq_in, 4, 3 * bhtd, &pq, 0, &dqkvp));
  TRY(op1(b, OP_MERGE_HEADS, "attn.split.bwd", &dqkvp, 1, 3 * bhtd, &merge3, sizeof merge3, RECOMPUTE_EW, &dqkv));
  TRY(linear_bwd(b, "attn.qkv.bwd", dqkv, s->h1, param(b, base + 1)->wc, C, 3 * C, &dh1, &dqkvw));
  TRY(finish_grad(b, base + 1, dqkvw));
  gkrt_tensor ln1b[5] = {dh1, s->x, s->s1, param(b, base)->wc, dx2};
  TRY(op1(b, OP_LN_BWD_DX_RES, "ln1.bwd", ln1b, 5, (uint64_t)BT * C, &rows, sizeof rows, 0, &dx1));
  TRY(ln_grad(b, "ln1.grad", ln1b, &dln1));
  TRY(finish_grad(b, base, dln1));
  *dx_in = dx1;
  return 0;
}

int gpt2_build(gkrt_runtime *rt, const gpt2_kernels *ks, const gpt2_config *cfg, const gpt2_options *opt,
               gpt2_model *m) {
  if (gpt2_config_check(cfg)) return 1;
  if (ks->dtype != opt->dtype) {
    fprintf(stderr, "gpt2_build: the kernels were made for %s, the options ask for %s\n",
            ks->dtype == GPT2_BF16 ? "bf16" : "f32", opt->dtype == GPT2_BF16 ? "bf16" : "f32");
    return 1;
  }
  gpt2_layout(cfg, m);
  m->dtype = opt->dtype;
  const uint32_t C = cfg->channels, T = cfg->seq, BT = cfg->batch * T, V = cfg->vocab, L = cfg->layers;
  builder b = {NULL, ks, opt, m, opt->dtype == GPT2_BF16 ? 2 : 4, ""};
  GPT2_TRY(gkrt_graph_create(rt, &b.g));
  m->graph = b.g;
  for (uint32_t i = 0; i < m->num_params; i++) {
    gpt2_param *p = &m->params[i];
    char n[40];
    TRY(tensor_of(&b, p->count, 4, GKRT_TENSOR_PARAMETER, p->name, &p->w));
    snprintf(n, sizeof n, "%s.adam_m", p->name);
    TRY(tensor_of(&b, p->count, 4, GKRT_TENSOR_PARAMETER, n, &p->m));
    snprintf(n, sizeof n, "%s.adam_v", p->name);
    TRY(tensor_of(&b, p->count, 4, GKRT_TENSOR_PARAMETER, n, &p->v));
    p->wc = p->w;
    snprintf(n, sizeof n, "%s.bf16", p->name);
    if (m->dtype == GPT2_BF16) TRY(tensor(&b, p->count, GKRT_TENSOR_PARAMETER, n, &p->wc));
  }
  TRY(tensor_of(&b, BT, 4, GKRT_TENSOR_INPUT, "tokens", &m->tokens));
  TRY(tensor_of(&b, BT, 4, GKRT_TENSOR_INPUT, "targets", &m->targets));
  TRY(tensor_of(&b, BT, 4, GKRT_TENSOR_INPUT, "token_order", &m->tok_order));
  TRY(tensor_of(&b, BT + 1, 4, GKRT_TENSOR_INPUT, "token_start", &m->tok_start));
  TRY(tensor_of(&b, BT, 4, GKRT_TENSOR_INPUT, "token_of_segment", &m->tok_token));
  TRY(tensor(&b, BT, GKRT_TENSOR_INPUT, "ones", &m->ones));
  TRY(tensor_of(&b, 1, 4, GKRT_TENSOR_INPUT, "adam_step", &m->step));
  TRY(tensor_of(&b, 1, 4, GKRT_TENSOR_OUTPUT, "loss", &m->loss));

  /* Forward */
  p_dims dims = {BT, T, C, V};
  gkrt_tensor x, emb_in[3] = {m->tokens, param(&b, 0)->wc, param(&b, 1)->wc};
  TRY(op1(&b, OP_EMBED, "embed", emb_in, 3, (uint64_t)BT * C, &dims, sizeof dims, 0, &x));
  layer_saved *saved = calloc(L, sizeof *saved);
  if (!saved) return 1;
  int failed = 0;
  for (uint32_t l = 0; l < L && !failed; l++) failed = layer_forward(&b, l, x, &saved[l], &x);
  b.prefix[0] = 0;
  const uint32_t lnf = m->num_params - 1;
  p_rows rows = {BT, C}, ce = {BT, V};
  gkrt_tensor sf, hf, logits, losses, dlogits, dhf, dwte, dx, dlnf, dwpe;
  if (!failed) {
    failed = op1_f32(&b, OP_LN_STATS, "lnf.stats", &x, 1, 2ull * BT, &rows, sizeof rows, RECOMPUTE_EW, &sf);
    gkrt_tensor lnf_in[3] = {x, sf, param(&b, lnf)->wc};
    failed = failed || op1(&b, OP_LN_APPLY, "lnf", lnf_in, 3, (uint64_t)BT * C, &rows, sizeof rows, RECOMPUTE_EW, &hf);
    /* logits = hf·wteᵀ (tied embedding, no bias) */
    gkrt_tensor lg_in[2] = {hf, param(&b, 0)->wc};
    p_gemm pl = {1, {gemm(1, 0, V, BT, C, 1, 0, C, 0, 0, C, 0, V, 1.0f, 0.0f)}};
    failed = failed || gemm_node(&b, "logits", lg_in, 2, (uint64_t)BT * V, &pl, 1, &logits);
    gkrt_tensor ce_in[2] = {logits, m->targets};
    if (!failed) failed = tensor_of(&b, BT, 4, grad_kind(&b), "loss.rows", &losses);
    failed = failed || node(&b, OP_CE_ROWS, "loss.rows", ce_in, 2, &losses, 1, &ce, sizeof ce, 0);
    m->losses = losses;
    p_n nbt = {BT};
    failed = failed || node(&b, OP_MEAN, "loss", &losses, 1, &m->loss, 1, &nbt, sizeof nbt, 0);

    /* Backward */
    failed = failed || op1(&b, OP_CE_BWD, "loss.bwd", ce_in, 2, (uint64_t)BT * V, &ce, sizeof ce, 0, &dlogits);
    gkrt_tensor dh_in[2] = {dlogits, param(&b, 0)->wc};
    p_gemm pdh = {1, {gemm(0, 0, C, BT, V, 1, 0, C, 0, 0, V, 0, C, 1.0f, 0.0f)}};
    failed = failed || gemm_node(&b, "logits.bwd_x", dh_in, 2, (uint64_t)BT * C, &pdh, 0, &dhf);
    gkrt_tensor dw_in[2] = {hf, dlogits};
    p_gemm pdw = {1, {gemm(0, 1, C, V, BT, 0, 0, C, 1, 0, V, 0, C, 1.0f, 0.0f)}};
    if (!failed) failed = tensor(&b, (uint64_t)V * C, grad_kind(&b), "logits.bwd_w", &dwte);
    failed = failed || node(&b, OP_GEMM, "logits.bwd_w", dw_in, 2, &dwte, 1, &pdw, sizeof pdw, 0);
    gkrt_tensor lnfb[4] = {dhf, x, sf, param(&b, lnf)->wc};
    failed = failed || op1(&b, OP_LN_BWD_DX, "lnf.bwd", lnfb, 4, (uint64_t)BT * C, &rows, sizeof rows, 0, &dx);
    failed = failed || ln_grad(&b, "lnf.grad", lnfb, &dlnf);
    failed = failed || finish_grad(&b, lnf, dlnf);
  }
  for (uint32_t l = L; l-- > 0 && !failed;) failed = layer_backward(&b, l, &saved[l], dx, &dx);
  free(saved);
  b.prefix[0] = 0;
  if (failed) return 1;
  gkrt_tensor wte_in[5] = {dx, m->tok_order, m->tok_start, m->tok_token, dwte};
  TRY(node(&b, OP_EMBED_BWD_WTE, "embed.bwd_wte", wte_in, 5, &dwte, 1, &dims, sizeof dims, 0));
  TRY(finish_grad(&b, 0, dwte));
  if (tensor(&b, (uint64_t)T * C, grad_kind(&b), "embed.bwd_wpe", &dwpe)) return 1;
  TRY(node(&b, OP_EMBED_BWD_WPE, "embed.bwd_wpe", &dx, 1, &dwpe, 1, &dims, sizeof dims, 0));
  TRY(finish_grad(&b, 1, dwpe));
  GPT2_TRY(gkrt_graph_finalize(b.g));
  return 0;
}

/* --- Data --- */

static uint64_t rng_next(uint64_t *s) {
  /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) { return ((rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static float rng_normal(uint64_t *s) {
  double u1 = rng_uniform(s), u2 = rng_uniform(s);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void gpt2_init_weights(const gpt2_model *m, uint64_t seed, float std, float *w) {
  const uint64_t C = m->cfg.channels;
  const float proj_std = std / sqrtf(2.0f * (float)m->cfg.layers);
  uint64_t s = seed;
  for (uint32_t i = 0; i < m->num_params; i++) {
    const gpt2_param *p = &m->params[i];
    float *v = w + p->offset;
    const char *kind = strchr(p->name, '.') ? strchr(p->name, '.') + 1 : p->name;
    if (!strcmp(kind, "ln1") || !strcmp(kind, "ln2") || !strcmp(kind, "lnf")) {
      for (uint64_t j = 0; j < p->count; j++) v[j] = j < C ? 1.0f : 0.0f;
      continue;
    }
    /* Matrices first, then (for linears) the bias. */
    uint64_t matrix = p->count;
    float sd = std;
    if (!strcmp(kind, "qkv")) matrix = 3 * C * C;
    if (!strcmp(kind, "proj")) matrix = C * C, sd = proj_std;
    if (!strcmp(kind, "fc")) matrix = 4 * C * C;
    if (!strcmp(kind, "fcproj")) matrix = 4 * C * C, sd = proj_std;
    for (uint64_t j = 0; j < p->count; j++) v[j] = j < matrix ? sd * rng_normal(&s) : 0.0f;
  }
}

void gpt2_make_batch(const gpt2_config *cfg, uint64_t seed, int32_t *tokens, int32_t *targets) {
  uint64_t s = seed ^ 0x5EED5EEDull;
  for (uint32_t b = 0; b < cfg->batch; b++) {
    int32_t prev = (int32_t)(rng_next(&s) % cfg->vocab);
    for (uint32_t t = 0; t < cfg->seq; t++) {
      int32_t next = (int32_t)(rng_next(&s) % cfg->vocab);
      tokens[b * cfg->seq + t] = prev;
      targets[b * cfg->seq + t] = next;
      prev = next;
    }
  }
}

/* The batch's positions grouped by token for the embedding's backward (a counting sort, so each
 * token's positions stay ascending): order, each segment's start (B·T + 1 entries, empty
 * segments at the end) and token. */
static int write_token_segments(const gpt2_model *m, const int32_t *tokens) {
  const uint32_t bt = m->cfg.batch * m->cfg.seq, v = m->cfg.vocab;
  int32_t *count = calloc((size_t)v + 1, 4), *order = malloc((size_t)bt * 4);
  int32_t *start = malloc(((size_t)bt + 1) * 4), *token = calloc(bt, 4);
  int failed = !count || !order || !start || !token;
  for (uint32_t i = 0; i < bt && !failed; i++) {
    if (tokens[i] < 0 || (uint32_t)tokens[i] >= v) {
      fprintf(stderr, "token %d at position %u is outside the vocabulary (%u)\n", tokens[i], i, v);
      failed = 1;
    } else {
      count[tokens[i] + 1]++;
    }
  }
  if (!failed) {
    uint32_t segs = 0;
    for (uint32_t t = 0; t < v; t++) {
      if (count[t + 1]) token[segs] = (int32_t)t, start[segs++] = count[t];
      count[t + 1] += count[t]; /* count[t]: where token t's positions begin */
    }
    for (uint32_t s = segs; s <= bt; s++) start[s] = (int32_t)bt;
    for (uint32_t i = 0; i < bt; i++) order[count[tokens[i]]++] = (int32_t)i;
    failed = gpt2_check(gkrt_graph_write_tensor(m->graph, m->tok_order, order, (size_t)bt * 4), "write order") ||
             gpt2_check(gkrt_graph_write_tensor(m->graph, m->tok_start, start, ((size_t)bt + 1) * 4), "write starts") ||
             gpt2_check(gkrt_graph_write_tensor(m->graph, m->tok_token, token, (size_t)bt * 4), "write tokens");
  }
  free(count), free(order), free(start), free(token);
  return failed;
}

int gpt2_upload(const gpt2_model *m, const float *w, const int32_t *tokens, const int32_t *targets) {
  const uint64_t bt = (uint64_t)m->cfg.batch * m->cfg.seq;
  uint64_t largest = bt;
  for (uint32_t i = 0; i < m->num_params; i++)
    if (m->params[i].count > largest) largest = m->params[i].count;
  const int bf = m->dtype == GPT2_BF16;
  float *buf = calloc(largest, sizeof(float));
  uint16_t *half = bf ? malloc(largest * sizeof(uint16_t)) : NULL;
  if (!buf || (bf && !half)) {
    free(buf);
    return 1;
  }
  int failed = 0;
  for (uint32_t i = 0; i < m->num_params && !failed; i++) {
    const gpt2_param *p = &m->params[i];
    failed = gpt2_check(gkrt_graph_write_tensor(m->graph, p->w, w + p->offset, p->count * 4), "write weights") ||
             gpt2_check(gkrt_graph_write_tensor(m->graph, p->m, buf, p->count * 4), "write adam m") ||
             gpt2_check(gkrt_graph_write_tensor(m->graph, p->v, buf, p->count * 4), "write adam v");
    if (bf && !failed) {
      for (uint64_t j = 0; j < p->count; j++) half[j] = gpt2_f32_to_bf16(w[p->offset + j]);
      failed = gpt2_check(gkrt_graph_write_tensor(m->graph, p->wc, half, p->count * 2), "write bf16 weights");
    }
  }
  for (uint64_t i = 0; i < bt; i++) buf[i] = 1.0f;
  if (bf)
    for (uint64_t i = 0; i < bt; i++) half[i] = gpt2_f32_to_bf16(1.0f);
  if (!failed)
    failed = gpt2_check(gkrt_graph_write_tensor(m->graph, m->ones, bf ? (void *)half : (void *)buf, bt * (bf ? 2 : 4)),
                        "write ones") ||
             gpt2_write_batch(m, tokens, targets);
  free(buf);
  free(half);
  return failed;
}

int gpt2_write_batch(const gpt2_model *m, const int32_t *tokens, const int32_t *targets) {
  const uint64_t bt = (uint64_t)m->cfg.batch * m->cfg.seq;
  for (uint64_t i = 0; i < bt; i++)
    if (targets[i] < 0 || (uint32_t)targets[i] >= m->cfg.vocab) {
      fprintf(stderr, "target %d at position %llu is outside the vocabulary (%u)\n", targets[i],
              (unsigned long long)i, m->cfg.vocab);
      return 1;
    }
  return write_token_segments(m, tokens) ||
         gpt2_check(gkrt_graph_write_tensor(m->graph, m->tokens, tokens, bt * 4), "write tokens") ||
         gpt2_check(gkrt_graph_write_tensor(m->graph, m->targets, targets, bt * 4), "write targets");
}

int gpt2_step(gkrt_runtime *rt, const gpt2_model *m, uint32_t t, float *loss) {
  float step = (float)t;
  GPT2_TRY(gkrt_graph_write_tensor(m->graph, m->step, &step, 4));
  GPT2_TRY(gkrt_runtime_run(rt, m->graph));
  GPT2_TRY(gkrt_graph_read_tensor(m->graph, m->loss, loss, 4));
  return 0;
}

int gpt2_download(const gpt2_model *m, float *w) {
  for (uint32_t i = 0; i < m->num_params; i++) {
    const gpt2_param *p = &m->params[i];
    GPT2_TRY(gkrt_graph_read_tensor(m->graph, p->w, w + p->offset, p->count * 4));
  }
  return 0;
}

int gpt2_read_grads(const gpt2_model *m, float *g) {
  if (m->dtype != GPT2_BF16) {
    for (uint32_t i = 0; i < m->num_params; i++) {
      const gpt2_param *p = &m->params[i];
      GPT2_TRY(gkrt_graph_read_tensor(m->graph, p->grad, g + p->offset, p->count * 4));
    }
    return 0;
  }
  uint16_t *half = malloc(m->num_weights * sizeof(uint16_t));
  if (!half) return 1;
  int failed = 0;
  for (uint32_t i = 0; i < m->num_params && !failed; i++) {
    const gpt2_param *p = &m->params[i];
    failed = gpt2_check(gkrt_graph_read_tensor(m->graph, p->grad, half + p->offset, p->count * 2), "read grads");
  }
  for (uint64_t j = 0; j < m->num_weights && !failed; j++) g[j] = gpt2_bf16_to_f32(half[j]);
  free(half);
  return failed;
}
