/*
 * CPU implementations of the GPT-2 example's node kinds (ops.h), as host callbacks: the host
 * backend runs them on its stream thread with host pointers. Each loop runs in one fixed order,
 * so a run gives the same bits whatever gkrt's memory mode, limit or swap plan.
 *
 * Activation tensors (ops.h) are read and written through at() and put(): f32 as it is, or bf16
 * widened to f32 on reading and rounded (bf16.h) on storing. Arithmetic is in f32 either way,
 * with the same expressions, so the f32 path is exactly what it was before bf16 existed.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bf16.h"
#include "ops.h"

/* f32-only tensors (statistics, losses, partial sums, AdamW's state). */
#define IN(i) ((const float *)a->inputs[i].ptr)
#define IN_I32(i) ((const int32_t *)a->inputs[i].ptr)
#define OUT(i) ((float *)a->outputs[i].ptr)

/* An activation tensor: its pointer and whether it holds bf16. */
typedef struct {
  void *p;
  int bf;
} act;
#define AIN(i) ((act){(void *)a->inputs[i].ptr, bf})
#define AOUT(i) ((act){a->outputs[i].ptr, bf})

static inline float at(act t, size_t i) {
  return t.bf ? gpt2_bf16_to_f32(((const uint16_t *)t.p)[i]) : ((const float *)t.p)[i];
}
static inline void put(act t, size_t i, float v) {
  if (t.bf)
    ((uint16_t *)t.p)[i] = gpt2_f32_to_bf16(v);
  else
    ((float *)t.p)[i] = v;
}

/* The node's parameters, copied (gkrt's parameter bytes carry no alignment promise); host_op
 * has checked their size. */
#define P(type)      \
  type p_;           \
  memcpy(&p_, a->params, sizeof p_); \
  const type *p = &p_

static float gelu(float x) {
  const float s = 0.7978845608028654f; /* sqrt(2/pi) */
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(s * (x + cube)));
}

static float gelu_grad(float x) {
  const float s = 0.7978845608028654f;
  float cube = 0.044715f * x * x * x;
  float t = tanhf(s * (x + cube));
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * s * (1.0f + 3.0f * 0.044715f * x * x);
}

void gpt2_cpu_gemm(const gemm_op *op, gpt2_dtype dtype, const void *a, const void *b, void *c) {
  const int bf = dtype == GPT2_BF16;
  for (uint32_t z = 0; z < op->batch; z++) {
    const act A = {(void *)a, bf}, B = {(void *)b, bf}, C = {c, bf};
    const size_t ao = op->a_off + z * op->stride_a, bo = op->b_off + z * op->stride_b;
    const size_t co = op->c_off + z * op->stride_c;
    for (uint32_t j = 0; j < op->n; j++)
      for (uint32_t i = 0; i < op->m; i++) {
        float acc = 0.0f;
        for (uint32_t q = 0; q < op->k; q++) {
          float av = at(A, ao + (op->trans_a ? q + (size_t)i * op->lda : i + (size_t)q * op->lda));
          float bv = at(B, bo + (op->trans_b ? j + (size_t)q * op->ldb : q + (size_t)j * op->ldb));
          acc += av * bv;
        }
        const size_t dst = co + i + (size_t)j * op->ldc;
        put(C, dst, op->alpha * acc + (op->beta != 0.0f ? op->beta * at(C, dst) : 0.0f));
      }
  }
}

static void ln_stats(const gkrt_callback_args *a, int bf) {
  P(p_rows);
  const act x = AIN(0);
  float *s = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    const size_t row = (size_t)r * p->cols;
    float mean = 0.0f, var = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) mean += at(x, row + c);
    mean /= (float)p->cols;
    for (uint32_t c = 0; c < p->cols; c++) var += (at(x, row + c) - mean) * (at(x, row + c) - mean);
    var /= (float)p->cols;
    s[2 * r] = mean;
    s[2 * r + 1] = 1.0f / sqrtf(var + 1e-5f);
  }
}

static void ln_apply(const gkrt_callback_args *a, int bf) {
  P(p_rows);
  const act x = AIN(0), wb = AIN(2), y = AOUT(0);
  const float *s = IN(1);
  for (uint32_t r = 0; r < p->rows; r++)
    for (uint32_t c = 0; c < p->cols; c++) {
      size_t i = (size_t)r * p->cols + c;
      put(y, i, (at(x, i) - s[2 * r]) * s[2 * r + 1] * at(wb, c) + at(wb, p->cols + c));
    }
}

/* [B,T,P,H,D] <-> [P,B,H,T,D] */
static void permute(const gkrt_callback_args *a, int bf, int split) {
  P(p_perm);
  const act x = AIN(0), y = AOUT(0);
  for (uint32_t b = 0; b < p->b; b++)
    for (uint32_t t = 0; t < p->t; t++)
      for (uint32_t q = 0; q < p->parts; q++)
        for (uint32_t h = 0; h < p->h; h++)
          for (uint32_t d = 0; d < p->d; d++) {
            size_t btph = ((((size_t)b * p->t + t) * p->parts + q) * p->h + h) * p->d + d;
            size_t pbht = ((((size_t)q * p->b + b) * p->h + h) * p->t + t) * p->d + d;
            if (split)
              put(y, pbht, at(x, btph));
            else
              put(y, btph, at(x, pbht));
          }
}

static void softmax(const gkrt_callback_args *a, int bf) {
  P(p_rows);
  const act s = AIN(0), out = AOUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    const size_t row = (size_t)r * p->cols;
    uint32_t last = r % p->cols; /* the row's position t: columns after it are masked */
    float mx = -INFINITY, sum = 0.0f;
    for (uint32_t c = 0; c <= last; c++) mx = at(s, row + c) > mx ? at(s, row + c) : mx;
    for (uint32_t c = 0; c <= last; c++) sum += expf(at(s, row + c) - mx);
    for (uint32_t c = 0; c < p->cols; c++) put(out, row + c, c <= last ? expf(at(s, row + c) - mx) / sum : 0.0f);
  }
}

static void softmax_bwd(const gkrt_callback_args *a, int bf) {
  P(p_rows);
  const act dp = AIN(0), pr = AIN(1), ds = AOUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    size_t o = (size_t)r * p->cols;
    float dot = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) dot += at(dp, o + c) * at(pr, o + c);
    for (uint32_t c = 0; c < p->cols; c++) put(ds, o + c, at(pr, o + c) * (at(dp, o + c) - dot));
  }
}

/* The row's max and sum of exp(v - max). */
static void row_softmax_terms(act lg, size_t o, uint32_t cols, float *mx_out, float *sum_out) {
  float mx = -INFINITY, sum = 0.0f;
  for (uint32_t c = 0; c < cols; c++) mx = at(lg, o + c) > mx ? at(lg, o + c) : mx;
  for (uint32_t c = 0; c < cols; c++) sum += expf(at(lg, o + c) - mx);
  *mx_out = mx;
  *sum_out = sum;
}

static void ce_rows(const gkrt_callback_args *a, int bf) {
  P(p_rows);
  const act lg = AIN(0);
  const int32_t *tg = IN_I32(1);
  float *loss = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    const size_t o = (size_t)r * p->cols;
    float mx, sum;
    row_softmax_terms(lg, o, p->cols, &mx, &sum);
    loss[r] = logf(sum) + mx - at(lg, o + (size_t)tg[r]);
  }
}

static void ce_bwd(const gkrt_callback_args *a, int bf) {
  P(p_rows);
  const act lg = AIN(0), d = AOUT(0);
  const int32_t *tg = IN_I32(1);
  for (uint32_t r = 0; r < p->rows; r++) {
    const size_t o = (size_t)r * p->cols;
    float mx, sum;
    row_softmax_terms(lg, o, p->cols, &mx, &sum);
    for (uint32_t c = 0; c < p->cols; c++) {
      float prob = expf(at(lg, o + c) - mx) / sum;
      put(d, o + c, (prob - ((int32_t)c == tg[r] ? 1.0f : 0.0f)) / (float)p->rows);
    }
  }
}

static void ln_bwd_dx(const gkrt_callback_args *a, int bf, int res) {
  P(p_rows);
  const act dy = AIN(0), x = AIN(1), w = AIN(3), dx = AOUT(0);
  const act dres = res ? AIN(4) : (act){NULL, bf};
  const float *s = IN(2);
  for (uint32_t r = 0; r < p->rows; r++) {
    size_t o = (size_t)r * p->cols;
    float mean = s[2 * r], rstd = s[2 * r + 1], dmean = 0.0f, dnorm_norm = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) {
      float norm = (at(x, o + c) - mean) * rstd, dnorm = at(dy, o + c) * at(w, c);
      dmean += dnorm;
      dnorm_norm += dnorm * norm;
    }
    dmean /= (float)p->cols;
    dnorm_norm /= (float)p->cols;
    for (uint32_t c = 0; c < p->cols; c++) {
      float norm = (at(x, o + c) - mean) * rstd, dnorm = at(dy, o + c) * at(w, c);
      float v = rstd * (dnorm - dmean - norm * dnorm_norm);
      put(dx, o + c, res ? at(dres, o + c) + v : v);
    }
  }
}

static void ln_bwd_wb(const gkrt_callback_args *a, int bf) {
  P(p_chunks);
  const act dy = AIN(0), x = AIN(1);
  const float *s = IN(2);
  const uint32_t per = p->rows / p->chunks;
  for (uint32_t k = 0; k < p->chunks; k++) {
    float *dw = OUT(0) + (size_t)k * 2 * p->cols, *db = dw + p->cols;
    const uint32_t end = k + 1 == p->chunks ? p->rows : (k + 1) * per;
    for (uint32_t c = 0; c < p->cols; c++) {
      float sw = 0.0f, sb = 0.0f;
      for (uint32_t r = k * per; r < end; r++) {
        size_t i = (size_t)r * p->cols + c;
        sw += at(dy, i) * (at(x, i) - s[2 * r]) * s[2 * r + 1];
        sb += at(dy, i);
      }
      dw[c] = sw;
      db[c] = sb;
    }
  }
}

/* Master weights and moments in f32; with a 4th output, the updated weights' compute copy. */
static void adamw(const gkrt_callback_args *a, int bf) {
  P(p_adam);
  const act g = AIN(0);
  const float t = IN(1)[0];
  float *w = OUT(0), *m = OUT(1), *v = OUT(2);
  float bc1 = 1.0f - powf(p->beta1, t), bc2 = 1.0f - powf(p->beta2, t);
  for (uint32_t i = 0; i < p->n; i++) {
    const float gi = at(g, i);
    w[i] = w[i] * (1.0f - p->lr * p->weight_decay);
    m[i] = p->beta1 * m[i] + (1.0f - p->beta1) * gi;
    v[i] = p->beta2 * v[i] + (1.0f - p->beta2) * gi * gi;
    float denom = sqrtf(v[i]) / sqrtf(bc2) + p->eps;
    w[i] = w[i] - (p->lr / bc1) * (m[i] / denom);
  }
  if (a->num_outputs == 4) {
    const act copy = AOUT(3);
    for (uint32_t i = 0; i < p->n; i++) put(copy, i, w[i]);
  }
}

/* The parameter struct each kind takes (ops.h). */
static const size_t PARAM_SIZE[OP_COUNT] = {
    [OP_EMBED] = sizeof(p_dims),        [OP_LN_STATS] = sizeof(p_rows),       [OP_LN_APPLY] = sizeof(p_rows),
    [OP_SPLIT_HEADS] = sizeof(p_perm),  [OP_MERGE_HEADS] = sizeof(p_perm),    [OP_SOFTMAX] = sizeof(p_rows),
    [OP_SOFTMAX_BWD] = sizeof(p_rows),  [OP_ADD] = sizeof(p_n),               [OP_GELU] = sizeof(p_n),
    [OP_GELU_BWD] = sizeof(p_n),        [OP_CE_ROWS] = sizeof(p_rows),        [OP_MEAN] = sizeof(p_n),
    [OP_CE_BWD] = sizeof(p_rows),       [OP_LN_BWD_DX] = sizeof(p_rows),      [OP_LN_BWD_DX_RES] = sizeof(p_rows),
    [OP_LN_BWD_WB] = sizeof(p_chunks),  [OP_EMBED_BWD_WTE] = sizeof(p_dims),  [OP_EMBED_BWD_WPE] = sizeof(p_dims),
    [OP_ADAMW] = sizeof(p_adam),        [OP_GEMM] = sizeof(p_gemm),           [OP_SUM_CHUNKS] = sizeof(p_chunks),
};

/* The callback's user value: the op, and the element type above its low byte. */
#define HOST_USER(op, dtype) ((void *)(intptr_t)((op) | ((dtype) << 8)))

static int32_t host_op(const gkrt_callback_args *a, void *user) {
  const gpt2_op op = (gpt2_op)((intptr_t)user & 0xff);
  const gpt2_dtype dtype = (gpt2_dtype)((intptr_t)user >> 8);
  const int bf = dtype == GPT2_BF16;
  if (op >= OP_COUNT || a->params_size != PARAM_SIZE[op] || !a->params) return 2;
  switch (op) {
    case OP_EMBED: {
      P(p_dims);
      const int32_t *tok = IN_I32(0);
      const act wte = AIN(1), wpe = AIN(2), x = AOUT(0);
      for (uint32_t i = 0; i < p->bt; i++)
        for (uint32_t c = 0; c < p->c; c++)
          put(x, (size_t)i * p->c + c, at(wte, (size_t)tok[i] * p->c + c) + at(wpe, (size_t)(i % p->t) * p->c + c));
      return 0;
    }
    case OP_LN_STATS: ln_stats(a, bf); return 0;
    case OP_LN_APPLY: ln_apply(a, bf); return 0;
    case OP_SPLIT_HEADS: permute(a, bf, 1); return 0;
    case OP_MERGE_HEADS: permute(a, bf, 0); return 0;
    case OP_SOFTMAX: softmax(a, bf); return 0;
    case OP_SOFTMAX_BWD: softmax_bwd(a, bf); return 0;
    case OP_ADD: {
      P(p_n);
      const act x = AIN(0), y = AIN(1), out = AOUT(0);
      for (uint32_t i = 0; i < p->n; i++) put(out, i, at(x, i) + at(y, i));
      return 0;
    }
    case OP_GELU: {
      P(p_n);
      const act x = AIN(0), out = AOUT(0);
      for (uint32_t i = 0; i < p->n; i++) put(out, i, gelu(at(x, i)));
      return 0;
    }
    case OP_GELU_BWD: {
      P(p_n);
      const act dy = AIN(0), x = AIN(1), out = AOUT(0);
      for (uint32_t i = 0; i < p->n; i++) put(out, i, at(dy, i) * gelu_grad(at(x, i)));
      return 0;
    }
    case OP_CE_ROWS: ce_rows(a, bf); return 0;
    case OP_MEAN: {
      P(p_n);
      float sum = 0.0f;
      for (uint32_t i = 0; i < p->n; i++) sum += IN(0)[i];
      OUT(0)[0] = sum / (float)p->n;
      return 0;
    }
    case OP_CE_BWD: ce_bwd(a, bf); return 0;
    case OP_LN_BWD_DX: ln_bwd_dx(a, bf, 0); return 0;
    case OP_LN_BWD_DX_RES: ln_bwd_dx(a, bf, 1); return 0;
    case OP_LN_BWD_WB: ln_bwd_wb(a, bf); return 0;
    case OP_EMBED_BWD_WTE: {
      P(p_dims);
      const int32_t *order = IN_I32(1), *start = IN_I32(2), *token = IN_I32(3);
      const act dx = AIN(0), out = AOUT(0);
      if (a->outputs[0].ptr != a->inputs[4].ptr)
        memcpy(a->outputs[0].ptr, a->inputs[4].ptr, (size_t)p->v * p->c * (bf ? 2 : 4));
      /* Each entry summed in f32 and stored once. */
      for (uint32_t s = 0; s < p->bt && start[s] < start[s + 1]; s++)
        for (uint32_t c = 0; c < p->c; c++) {
          const size_t dst = (size_t)token[s] * p->c + c;
          float acc = at(out, dst);
          for (int32_t j = start[s]; j < start[s + 1]; j++) acc += at(dx, (size_t)order[j] * p->c + c);
          put(out, dst, acc);
        }
      return 0;
    }
    case OP_EMBED_BWD_WPE: {
      P(p_dims);
      const act dx = AIN(0), out = AOUT(0);
      for (uint32_t t = 0; t < p->t; t++)
        for (uint32_t c = 0; c < p->c; c++) {
          float sum = 0.0f;
          for (uint32_t i = t; i < p->bt; i += p->t) sum += at(dx, (size_t)i * p->c + c);
          put(out, (size_t)t * p->c + c, sum);
        }
      return 0;
    }
    case OP_ADAMW: adamw(a, bf); return 0;
    case OP_SUM_CHUNKS: {
      P(p_chunks);
      const act out = AOUT(0);
      for (uint32_t c = 0; c < p->cols; c++) {
        float sum = 0.0f;
        for (uint32_t k = 0; k < p->chunks; k++) sum += IN(0)[(size_t)k * p->cols + c];
        put(out, c, sum);
      }
      return 0;
    }
    case OP_GEMM: {
      P(p_gemm);
      if (p->count > GEMM_MAX_OPS) return 1;
      for (uint32_t i = 0; i < p->count; i++) {
        if (p->ops[i].a_in >= a->num_inputs || p->ops[i].b_in >= a->num_inputs) return 1;
        gpt2_cpu_gemm(&p->ops[i], dtype, a->inputs[p->ops[i].a_in].ptr, a->inputs[p->ops[i].b_in].ptr,
                      a->outputs[0].ptr);
      }
      return 0;
    }
    case OP_COUNT: break;
  }
  return 1;
}

int gpt2_kernels_host(gkrt_runtime *rt, gpt2_dtype dtype, gpt2_kernels *out) {
  memset(out, 0, sizeof *out);
  out->dtype = dtype;
  for (int op = 0; op < OP_COUNT; op++) {
    gkrt_status st = gkrt_kernel_from_callback(rt, host_op, HOST_USER(op, (int)dtype), &out->k[op]);
    if (st != GKRT_STATUS_OK) {
      fprintf(stderr, "gkrt_kernel_from_callback: %s\n", gkrt_status_name(st));
      gpt2_kernels_release(out);
      return 1;
    }
  }
  return 0;
}

void gpt2_kernels_release(gpt2_kernels *ks) {
  for (int op = 0; op < OP_COUNT; op++) {
    if (ks->k[op] && gkrt_kernel_release(ks->k[op]) != GKRT_STATUS_OK) fprintf(stderr, "kernel release failed\n");
    ks->k[op] = NULL;
  }
}
