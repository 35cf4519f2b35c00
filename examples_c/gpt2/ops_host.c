/*
 * CPU implementations of the GPT-2 example's node kinds (ops.h), as host callbacks: the host
 * backend runs them on its stream thread with host pointers. Each loop runs in one fixed order,
 * so a run gives the same bits whatever gkrt's memory mode, limit or swap plan.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"

#define IN(i) ((const float *)a->inputs[i].ptr)
#define IN_I32(i) ((const int32_t *)a->inputs[i].ptr)
#define OUT(i) ((float *)a->outputs[i].ptr)
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

void gpt2_cpu_gemm(const gemm_op *op, const float *a, const float *b, float *c) {
  for (uint32_t z = 0; z < op->batch; z++) {
    const float *A = a + op->a_off + z * op->stride_a;
    const float *B = b + op->b_off + z * op->stride_b;
    float *C = c + op->c_off + z * op->stride_c;
    for (uint32_t j = 0; j < op->n; j++)
      for (uint32_t i = 0; i < op->m; i++) {
        float acc = 0.0f;
        for (uint32_t q = 0; q < op->k; q++) {
          float av = op->trans_a ? A[q + (size_t)i * op->lda] : A[i + (size_t)q * op->lda];
          float bv = op->trans_b ? B[j + (size_t)q * op->ldb] : B[q + (size_t)j * op->ldb];
          acc += av * bv;
        }
        float *dst = &C[i + (size_t)j * op->ldc];
        *dst = op->alpha * acc + (op->beta != 0.0f ? op->beta * *dst : 0.0f);
      }
  }
}

static void ln_stats(const gkrt_callback_args *a) {
  P(p_rows);
  const float *x = IN(0);
  float *s = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    const float *row = x + (size_t)r * p->cols;
    float mean = 0.0f, var = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) mean += row[c];
    mean /= (float)p->cols;
    for (uint32_t c = 0; c < p->cols; c++) var += (row[c] - mean) * (row[c] - mean);
    var /= (float)p->cols;
    s[2 * r] = mean;
    s[2 * r + 1] = 1.0f / sqrtf(var + 1e-5f);
  }
}

static void ln_apply(const gkrt_callback_args *a) {
  P(p_rows);
  const float *x = IN(0), *s = IN(1), *w = IN(2), *bias = IN(2) + p->cols;
  float *y = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++)
    for (uint32_t c = 0; c < p->cols; c++) {
      size_t i = (size_t)r * p->cols + c;
      y[i] = (x[i] - s[2 * r]) * s[2 * r + 1] * w[c] + bias[c];
    }
}

/* [B,T,P,H,D] <-> [P,B,H,T,D] */
static void permute(const gkrt_callback_args *a, int split) {
  P(p_perm);
  const float *x = IN(0);
  float *y = OUT(0);
  for (uint32_t b = 0; b < p->b; b++)
    for (uint32_t t = 0; t < p->t; t++)
      for (uint32_t q = 0; q < p->parts; q++)
        for (uint32_t h = 0; h < p->h; h++)
          for (uint32_t d = 0; d < p->d; d++) {
            size_t btph = ((((size_t)b * p->t + t) * p->parts + q) * p->h + h) * p->d + d;
            size_t pbht = ((((size_t)q * p->b + b) * p->h + h) * p->t + t) * p->d + d;
            if (split)
              y[pbht] = x[btph];
            else
              y[btph] = x[pbht];
          }
}

static void softmax(const gkrt_callback_args *a) {
  P(p_rows);
  const float *s = IN(0);
  float *out = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    const float *row = s + (size_t)r * p->cols;
    float *o = out + (size_t)r * p->cols;
    uint32_t last = r % p->cols; /* the row's position t: columns after it are masked */
    float mx = -INFINITY, sum = 0.0f;
    for (uint32_t c = 0; c <= last; c++) mx = row[c] > mx ? row[c] : mx;
    for (uint32_t c = 0; c <= last; c++) {
      o[c] = expf(row[c] - mx);
      sum += o[c];
    }
    for (uint32_t c = 0; c < p->cols; c++) o[c] = c <= last ? o[c] / sum : 0.0f;
  }
}

static void softmax_bwd(const gkrt_callback_args *a) {
  P(p_rows);
  const float *dp = IN(0), *pr = IN(1);
  float *ds = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    size_t o = (size_t)r * p->cols;
    float dot = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) dot += dp[o + c] * pr[o + c];
    for (uint32_t c = 0; c < p->cols; c++) ds[o + c] = pr[o + c] * (dp[o + c] - dot);
  }
}

static void ce_rows(const gkrt_callback_args *a) {
  P(p_rows);
  const float *lg = IN(0);
  const int32_t *tg = IN_I32(1);
  float *loss = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    const float *row = lg + (size_t)r * p->cols;
    float mx = -INFINITY, sum = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) mx = row[c] > mx ? row[c] : mx;
    for (uint32_t c = 0; c < p->cols; c++) sum += expf(row[c] - mx);
    loss[r] = logf(sum) + mx - row[tg[r]];
  }
}

static void ce_bwd(const gkrt_callback_args *a) {
  P(p_rows);
  const float *lg = IN(0);
  const int32_t *tg = IN_I32(1);
  float *d = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    const float *row = lg + (size_t)r * p->cols;
    float *drow = d + (size_t)r * p->cols;
    float mx = -INFINITY, sum = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) mx = row[c] > mx ? row[c] : mx;
    for (uint32_t c = 0; c < p->cols; c++) sum += expf(row[c] - mx);
    for (uint32_t c = 0; c < p->cols; c++) {
      float prob = expf(row[c] - mx) / sum;
      drow[c] = (prob - ((int32_t)c == tg[r] ? 1.0f : 0.0f)) / (float)p->rows;
    }
  }
}

static void ln_bwd_dx(const gkrt_callback_args *a, int res) {
  P(p_rows);
  const float *dy = IN(0), *x = IN(1), *s = IN(2), *w = IN(3), *dres = res ? IN(4) : NULL;
  float *dx = OUT(0);
  for (uint32_t r = 0; r < p->rows; r++) {
    size_t o = (size_t)r * p->cols;
    float mean = s[2 * r], rstd = s[2 * r + 1], dmean = 0.0f, dnorm_norm = 0.0f;
    for (uint32_t c = 0; c < p->cols; c++) {
      float norm = (x[o + c] - mean) * rstd, dnorm = dy[o + c] * w[c];
      dmean += dnorm;
      dnorm_norm += dnorm * norm;
    }
    dmean /= (float)p->cols;
    dnorm_norm /= (float)p->cols;
    for (uint32_t c = 0; c < p->cols; c++) {
      float norm = (x[o + c] - mean) * rstd, dnorm = dy[o + c] * w[c];
      float v = rstd * (dnorm - dmean - norm * dnorm_norm);
      dx[o + c] = res ? dres[o + c] + v : v;
    }
  }
}

static void ln_bwd_wb(const gkrt_callback_args *a) {
  P(p_chunks);
  const float *dy = IN(0), *x = IN(1), *s = IN(2);
  const uint32_t per = p->rows / p->chunks;
  for (uint32_t k = 0; k < p->chunks; k++) {
    float *dw = OUT(0) + (size_t)k * 2 * p->cols, *db = dw + p->cols;
    const uint32_t end = k + 1 == p->chunks ? p->rows : (k + 1) * per;
    for (uint32_t c = 0; c < p->cols; c++) {
      float sw = 0.0f, sb = 0.0f;
      for (uint32_t r = k * per; r < end; r++) {
        size_t i = (size_t)r * p->cols + c;
        sw += dy[i] * (x[i] - s[2 * r]) * s[2 * r + 1];
        sb += dy[i];
      }
      dw[c] = sw;
      db[c] = sb;
    }
  }
}

static void adamw(const gkrt_callback_args *a) {
  P(p_adam);
  const float *g = IN(0), t = IN(1)[0];
  float *w = OUT(0), *m = OUT(1), *v = OUT(2);
  float bc1 = 1.0f - powf(p->beta1, t), bc2 = 1.0f - powf(p->beta2, t);
  for (uint32_t i = 0; i < p->n; i++) {
    w[i] = w[i] * (1.0f - p->lr * p->weight_decay);
    m[i] = p->beta1 * m[i] + (1.0f - p->beta1) * g[i];
    v[i] = p->beta2 * v[i] + (1.0f - p->beta2) * g[i] * g[i];
    float denom = sqrtf(v[i]) / sqrtf(bc2) + p->eps;
    w[i] = w[i] - (p->lr / bc1) * (m[i] / denom);
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

static int32_t host_op(const gkrt_callback_args *a, void *user) {
  gpt2_op op = (gpt2_op)(intptr_t)user;
  if (op >= OP_COUNT || a->params_size != PARAM_SIZE[op] || !a->params) return 2;
  switch (op) {
    case OP_EMBED: {
      P(p_dims);
      const int32_t *tok = IN_I32(0);
      for (uint32_t i = 0; i < p->bt; i++)
        for (uint32_t c = 0; c < p->c; c++)
          OUT(0)[(size_t)i * p->c + c] = IN(1)[(size_t)tok[i] * p->c + c] + IN(2)[(size_t)(i % p->t) * p->c + c];
      return 0;
    }
    case OP_LN_STATS: ln_stats(a); return 0;
    case OP_LN_APPLY: ln_apply(a); return 0;
    case OP_SPLIT_HEADS: permute(a, 1); return 0;
    case OP_MERGE_HEADS: permute(a, 0); return 0;
    case OP_SOFTMAX: softmax(a); return 0;
    case OP_SOFTMAX_BWD: softmax_bwd(a); return 0;
    case OP_ADD: {
      P(p_n);
      for (uint32_t i = 0; i < p->n; i++) OUT(0)[i] = IN(0)[i] + IN(1)[i];
      return 0;
    }
    case OP_GELU: {
      P(p_n);
      for (uint32_t i = 0; i < p->n; i++) OUT(0)[i] = gelu(IN(0)[i]);
      return 0;
    }
    case OP_GELU_BWD: {
      P(p_n);
      for (uint32_t i = 0; i < p->n; i++) OUT(0)[i] = IN(0)[i] * gelu_grad(IN(1)[i]);
      return 0;
    }
    case OP_CE_ROWS: ce_rows(a); return 0;
    case OP_MEAN: {
      P(p_n);
      float sum = 0.0f;
      for (uint32_t i = 0; i < p->n; i++) sum += IN(0)[i];
      OUT(0)[0] = sum / (float)p->n;
      return 0;
    }
    case OP_CE_BWD: ce_bwd(a); return 0;
    case OP_LN_BWD_DX: ln_bwd_dx(a, 0); return 0;
    case OP_LN_BWD_DX_RES: ln_bwd_dx(a, 1); return 0;
    case OP_LN_BWD_WB: ln_bwd_wb(a); return 0;
    case OP_EMBED_BWD_WTE: {
      P(p_dims);
      const int32_t *order = IN_I32(1), *start = IN_I32(2), *token = IN_I32(3);
      if (OUT(0) != IN(4)) memcpy(OUT(0), IN(4), (size_t)p->v * p->c * sizeof(float));
      for (uint32_t s = 0; s < p->bt && start[s] < start[s + 1]; s++)
        for (uint32_t c = 0; c < p->c; c++) {
          float *dst = &OUT(0)[(size_t)token[s] * p->c + c];
          for (int32_t j = start[s]; j < start[s + 1]; j++) *dst += IN(0)[(size_t)order[j] * p->c + c];
        }
      return 0;
    }
    case OP_EMBED_BWD_WPE: {
      P(p_dims);
      for (uint32_t t = 0; t < p->t; t++)
        for (uint32_t c = 0; c < p->c; c++) {
          float sum = 0.0f;
          for (uint32_t i = t; i < p->bt; i += p->t) sum += IN(0)[(size_t)i * p->c + c];
          OUT(0)[(size_t)t * p->c + c] = sum;
        }
      return 0;
    }
    case OP_ADAMW: adamw(a); return 0;
    case OP_SUM_CHUNKS: {
      P(p_chunks);
      for (uint32_t c = 0; c < p->cols; c++) {
        float sum = 0.0f;
        for (uint32_t k = 0; k < p->chunks; k++) sum += IN(0)[(size_t)k * p->cols + c];
        OUT(0)[c] = sum;
      }
      return 0;
    }
    case OP_GEMM: {
      P(p_gemm);
      if (p->count > GEMM_MAX_OPS) return 1;
      for (uint32_t i = 0; i < p->count; i++) {
        if (p->ops[i].a_in >= a->num_inputs || p->ops[i].b_in >= a->num_inputs) return 1;
        gpt2_cpu_gemm(&p->ops[i], IN(p->ops[i].a_in), IN(p->ops[i].b_in), OUT(0));
      }
      return 0;
    }
    case OP_COUNT: break;
  }
  return 1;
}

int gpt2_kernels_host(gkrt_runtime *rt, gpt2_kernels *out) {
  memset(out, 0, sizeof *out);
  for (int op = 0; op < OP_COUNT; op++) {
    gkrt_status st = gkrt_kernel_from_callback(rt, host_op, (void *)(intptr_t)op, &out->k[op]);
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
