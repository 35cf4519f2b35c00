/*
 * CUDA implementations of the GPT-2 example's node kinds (ops.h): CUDA-source kernels that gkrt
 * compiles with NVRTC; matrix products are cuBLAS calls from a host callback (blas_cuda.c).
 *
 * Every kernel is deterministic (no atomics; every sum in a fixed order), so two runs of a step
 * give the same bits whatever the memory mode, limit or swap plan. The launch geometry of each
 * kind lives here beside its kernel (gpt2_launch_dims).
 *
 * One source for both element types: the NVRTC option -DGPT2_ACT_BF16=0|1 picks act_t, the type of
 * activation tensors (ops.h); ld()/st() read one as f32 and store an f32 into one (bf16: rounded
 * to nearest even, as bf16.h on the host). All arithmetic is f32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* The source is one macro argument: no preprocessor lines inside, and the structs mirror ops.h. */
#define GPT2_CUDA(...) #__VA_ARGS__
static const char *const SRC = GPT2_CUDA(
/* act_t: the element type of activation tensors, picked by the option -DGPT2_ACT_BF16=0|1. */
template <bool bf16> struct act_of { typedef float type; };
template <> struct act_of<true> { typedef unsigned short type; };
typedef act_of<GPT2_ACT_BF16 != 0>::type act_t;
__device__ __forceinline__ float ld(const float *p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ void st(float *p, unsigned long long i, float v) { p[i] = v; }
__device__ __forceinline__ float ld(const unsigned short *p, unsigned long long i) {
  return __uint_as_float((unsigned)p[i] << 16);
}
/* To nearest, ties to even; a NaN stays a quiet NaN (bf16.h does the same on the host). */
__device__ __forceinline__ void st(unsigned short *p, unsigned long long i, float v) {
  unsigned u = __float_as_uint(v);
  p[i] = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                          : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct p_n { unsigned n; };
struct p_rows { unsigned rows, cols; };
struct p_dims { unsigned bt, t, c, v; };
struct p_perm { unsigned b, t, parts, h, d; };
struct p_chunks { unsigned rows, cols, chunks; };
struct p_adam { unsigned n; float lr, beta1, beta2, eps, weight_decay; };

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Block of 256 threads: the sum (or max) of v over the block, the same on every thread. */
__device__ float block_reduce(float v, int is_max) {
  __shared__ float part[8];
  __shared__ float total;
  v = is_max ? warp_max(v) : warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = part[0];
    for (int i = 1; i < 8; i++) t = is_max ? fmaxf(t, part[i]) : t + part[i];
    total = t;
  }
  __syncthreads();
  float r = total;
  __syncthreads();
  return r;
}
__device__ float gelu(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + cube)));
}
__device__ float gelu_grad(float x) {
  float cube = 0.044715f * x * x * x;
  float t = tanhf(0.7978845608028654f * (x + cube));
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}
/* Grid-stride loops in 32 bits: gpt2_config_check keeps every tensor under 2^31 elements, and
 * 32-bit division (index arithmetic) costs far less than 64-bit on the GPU. */
__device__ unsigned gid() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ unsigned gstride() { return gridDim.x * blockDim.x; }

extern "C" __global__ void g_embed(const int *tok, const act_t *wte, const act_t *wpe, act_t *x, p_dims p) {
  for (unsigned i = gid(); i < p.bt * p.c; i += gstride()) {
    unsigned r = i / p.c, c = i % p.c;
    st(x, i, ld(wte, (unsigned long long)tok[r] * p.c + c) + ld(wpe, (r % p.t) * p.c + c));
  }
}

extern "C" __global__ void g_ln_stats(const act_t *x, float *s, p_rows p) {
  unsigned r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= p.rows) return;
  const act_t *row = x + (unsigned long long)r * p.cols;
  float sum = 0.0f;
  for (unsigned c = lane; c < p.cols; c += 32) sum += ld(row, c);
  float mean = warp_sum(sum) / p.cols;
  float var = 0.0f;
  for (unsigned c = lane; c < p.cols; c += 32) var += (ld(row, c) - mean) * (ld(row, c) - mean);
  var = warp_sum(var) / p.cols;
  if (lane == 0) { s[2 * r] = mean; s[2 * r + 1] = rsqrtf(var + 1e-5f); }
}

extern "C" __global__ void g_ln_apply(const act_t *x, const float *s, const act_t *wb, act_t *y, p_rows p) {
  for (unsigned i = gid(); i < p.rows * p.cols; i += gstride()) {
    unsigned r = i / p.cols, c = i % p.cols;
    st(y, i, (ld(x, i) - s[2 * r]) * s[2 * r + 1] * ld(wb, c) + ld(wb, p.cols + c));
  }
}

/* Permutations copy elements as they are (any act_t). */
extern "C" __global__ void g_split_heads(const act_t *x, act_t *y, p_perm p) {
  unsigned n = p.b * p.t * p.parts * p.h * p.d;
  for (unsigned i = gid(); i < n; i += gstride()) {
    unsigned d = i % p.d, rest = i / p.d;
    unsigned t = rest % p.t; rest /= p.t;
    unsigned h = rest % p.h; rest /= p.h;
    unsigned b = rest % p.b, q = rest / p.b;
    y[i] = x[(((b * p.t + t) * p.parts + q) * p.h + h) * p.d + d];
  }
}

extern "C" __global__ void g_merge_heads(const act_t *x, act_t *y, p_perm p) {
  unsigned n = p.b * p.t * p.parts * p.h * p.d;
  for (unsigned i = gid(); i < n; i += gstride()) {
    unsigned d = i % p.d, rest = i / p.d;
    unsigned h = rest % p.h; rest /= p.h;
    unsigned q = rest % p.parts; rest /= p.parts;
    unsigned t = rest % p.t, b = rest / p.t;
    y[i] = x[(((q * p.b + b) * p.h + h) * p.t + t) * p.d + d];
  }
}

extern "C" __global__ void g_softmax(const act_t *s, act_t *out, p_rows p) {
  unsigned r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= p.rows) return;
  const act_t *row = s + (unsigned long long)r * p.cols;
  act_t *o = out + (unsigned long long)r * p.cols;
  unsigned last = r % p.cols;
  float mx = __int_as_float(0xff800000);
  for (unsigned c = lane; c <= last; c += 32) mx = fmaxf(mx, ld(row, c));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (unsigned c = lane; c <= last; c += 32) sum += expf(ld(row, c) - mx);
  sum = warp_sum(sum);
  for (unsigned c = lane; c < p.cols; c += 32) st(o, c, c <= last ? expf(ld(row, c) - mx) / sum : 0.0f);
}

extern "C" __global__ void g_softmax_bwd(const act_t *dp, const act_t *pr, act_t *ds, p_rows p) {
  unsigned r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= p.rows) return;
  unsigned long long o = (unsigned long long)r * p.cols;
  float dot = 0.0f;
  for (unsigned c = lane; c < p.cols; c += 32) dot += ld(dp, o + c) * ld(pr, o + c);
  dot = warp_sum(dot);
  for (unsigned c = lane; c < p.cols; c += 32) st(ds, o + c, ld(pr, o + c) * (ld(dp, o + c) - dot));
}

extern "C" __global__ void g_add(const act_t *a, const act_t *b, act_t *c, p_n p) {
  for (unsigned i = gid(); i < p.n; i += gstride()) st(c, i, ld(a, i) + ld(b, i));
}
extern "C" __global__ void g_gelu(const act_t *x, act_t *y, p_n p) {
  for (unsigned i = gid(); i < p.n; i += gstride()) st(y, i, gelu(ld(x, i)));
}
extern "C" __global__ void g_gelu_bwd(const act_t *dy, const act_t *x, act_t *dx, p_n p) {
  for (unsigned i = gid(); i < p.n; i += gstride()) st(dx, i, ld(dy, i) * gelu_grad(ld(x, i)));
}

/* One block of 256 per row. */
extern "C" __global__ void g_ce_rows(const act_t *lg, const int *tg, float *loss, p_rows p) {
  const act_t *row = lg + (unsigned long long)blockIdx.x * p.cols;
  float mx = __int_as_float(0xff800000);
  for (unsigned c = threadIdx.x; c < p.cols; c += 256) mx = fmaxf(mx, ld(row, c));
  mx = block_reduce(mx, 1);
  float sum = 0.0f;
  for (unsigned c = threadIdx.x; c < p.cols; c += 256) sum += expf(ld(row, c) - mx);
  sum = block_reduce(sum, 0);
  if (threadIdx.x == 0) loss[blockIdx.x] = logf(sum) + mx - ld(row, tg[blockIdx.x]);
}
extern "C" __global__ void g_ce_bwd(const act_t *lg, const int *tg, act_t *d, p_rows p) {
  unsigned long long o = (unsigned long long)blockIdx.x * p.cols;
  float mx = __int_as_float(0xff800000);
  for (unsigned c = threadIdx.x; c < p.cols; c += 256) mx = fmaxf(mx, ld(lg, o + c));
  mx = block_reduce(mx, 1);
  float sum = 0.0f;
  for (unsigned c = threadIdx.x; c < p.cols; c += 256) sum += expf(ld(lg, o + c) - mx);
  sum = block_reduce(sum, 0);
  int target = tg[blockIdx.x];
  for (unsigned c = threadIdx.x; c < p.cols; c += 256)
    st(d, o + c, (expf(ld(lg, o + c) - mx) / sum - ((int)c == target ? 1.0f : 0.0f)) / p.rows);
}
/* One block of 256. */
extern "C" __global__ void g_mean(const float *v, float *out, p_n p) {
  float sum = 0.0f;
  for (unsigned i = threadIdx.x; i < p.n; i += 256) sum += v[i];
  sum = block_reduce(sum, 0);
  if (threadIdx.x == 0) out[0] = sum / p.n;
}

__device__ void ln_bwd_row(const act_t *dy, const act_t *x, const float *s, const act_t *w, const act_t *dres,
                           act_t *dx, p_rows p) {
  unsigned r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= p.rows) return;
  unsigned long long o = (unsigned long long)r * p.cols;
  float mean = s[2 * r], rstd = s[2 * r + 1], dmean = 0.0f, dnn = 0.0f;
  for (unsigned c = lane; c < p.cols; c += 32) {
    float norm = (ld(x, o + c) - mean) * rstd, dnorm = ld(dy, o + c) * ld(w, c);
    dmean += dnorm;
    dnn += dnorm * norm;
  }
  dmean = warp_sum(dmean) / p.cols;
  dnn = warp_sum(dnn) / p.cols;
  for (unsigned c = lane; c < p.cols; c += 32) {
    float norm = (ld(x, o + c) - mean) * rstd, dnorm = ld(dy, o + c) * ld(w, c);
    float v = rstd * (dnorm - dmean - norm * dnn);
    st(dx, o + c, dres ? ld(dres, o + c) + v : v);
  }
}
extern "C" __global__ void g_ln_bwd_dx(const act_t *dy, const act_t *x, const float *s, const act_t *wb, act_t *dx,
                                       p_rows p) {
  ln_bwd_row(dy, x, s, wb, 0, dx, p);
}
extern "C" __global__ void g_ln_bwd_dx_res(const act_t *dy, const act_t *x, const float *s, const act_t *wb,
                                           const act_t *dres, act_t *dx, p_rows p) {
  ln_bwd_row(dy, x, s, wb, dres, dx, p);
}
/* Blocks of 32x8: 32 columns of one chunk of rows (blockIdx.y), 8 row groups summed in a fixed
 * order. */
extern "C" __global__ void g_ln_bwd_wb(const act_t *dy, const act_t *x, const float *s, float *parts, p_chunks p) {
  __shared__ float sw[8][32], sb[8][32];
  unsigned c = blockIdx.x * 32 + threadIdx.x, per = p.rows / p.chunks;
  unsigned end = blockIdx.y + 1 == p.chunks ? p.rows : (blockIdx.y + 1) * per;
  float *dwb = parts + (unsigned long long)blockIdx.y * 2 * p.cols;
  float aw = 0.0f, ab = 0.0f;
  if (c < p.cols)
    for (unsigned r = blockIdx.y * per + threadIdx.y; r < end; r += 8) {
      unsigned long long i = (unsigned long long)r * p.cols + c;
      aw += ld(dy, i) * (ld(x, i) - s[2 * r]) * s[2 * r + 1];
      ab += ld(dy, i);
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < p.cols) {
    for (int k = 1; k < 8; k++) { aw += sw[k][threadIdx.x]; ab += sb[k][threadIdx.x]; }
    dwb[c] = aw;
    dwb[p.cols + c] = ab;
  }
}

/* In place (`partial`, the logits' product's gradient, is `dwte`): a block per token present,
 * its positions added in ascending order. */
extern "C" __global__ void g_embed_bwd_wte(const act_t *dx, const int *order, const int *start, const int *token,
                                           const act_t *partial, act_t *dwte, p_dims p) {
  int from = start[blockIdx.x], to = start[blockIdx.x + 1];
  act_t *row = dwte + (unsigned long long)token[blockIdx.x] * p.c;
  for (unsigned c = threadIdx.x; c < p.c && from < to; c += blockDim.x) {
    float acc = ld(row, c);
    for (int j = from; j < to; j++) acc += ld(dx, (unsigned long long)order[j] * p.c + c);
    st(row, c, acc);
  }
}
extern "C" __global__ void g_embed_bwd_wpe(const act_t *dx, act_t *dwpe, p_dims p) {
  for (unsigned i = gid(); i < p.t * p.c; i += gstride()) {
    float sum = 0.0f;
    for (unsigned r = i / p.c, c = i % p.c; r < p.bt; r += p.t) sum += ld(dx, r * p.c + c);
    st(dwpe, i, sum);
  }
}

extern "C" __global__ void g_sum_chunks(const float *parts, act_t *out, p_chunks p) {
  for (unsigned i = gid(); i < p.cols; i += gstride()) {
    float sum = 0.0f;
    for (unsigned k = 0; k < p.chunks; k++) sum += parts[(unsigned long long)k * p.cols + i];
    st(out, i, sum);
  }
}

/* The update of one entry: master weight and moments in f32; returns the new weight. */
__device__ float adamw_one(float g, const float *w_in, const float *m_in, const float *v_in, float *w, float *m,
                           float *v, unsigned i, float bc1, float bc2, p_adam p) {
  float wi = w_in[i] * (1.0f - p.lr * p.weight_decay);
  float mi = p.beta1 * m_in[i] + (1.0f - p.beta1) * g;
  float vi = p.beta2 * v_in[i] + (1.0f - p.beta2) * g * g;
  float denom = sqrtf(vi) / sqrtf(bc2) + p.eps;
  float wn = wi - (p.lr / bc1) * (mi / denom);
  w[i] = wn;
  m[i] = mi;
  v[i] = vi;
  return wn;
}
extern "C" __global__ void g_adamw(const act_t *g, const float *step, const float *w_in, const float *m_in,
                                   const float *v_in, float *w, float *m, float *v, p_adam p) {
  float t = step[0];
  float bc1 = 1.0f - powf(p.beta1, t), bc2 = 1.0f - powf(p.beta2, t);
  for (unsigned i = gid(); i < p.n; i += gstride()) adamw_one(ld(g, i), w_in, m_in, v_in, w, m, v, i, bc1, bc2, p);
}
/* bf16: also rewrites the compute copy from the updated master weight. */
extern "C" __global__ void g_adamw_copy(const act_t *g, const float *step, const float *w_in, const float *m_in,
                                        const float *v_in, float *w, float *m, float *v, act_t *copy, p_adam p) {
  float t = step[0];
  float bc1 = 1.0f - powf(p.beta1, t), bc2 = 1.0f - powf(p.beta2, t);
  for (unsigned i = gid(); i < p.n; i += gstride())
    st(copy, i, adamw_one(ld(g, i), w_in, m_in, v_in, w, m, v, i, bc1, bc2, p));
}
);

const char *gpt2_cuda_source(void) { return SRC; }

const char *gpt2_adamw_kernel_name(gpt2_dtype dtype) { return dtype == GPT2_BF16 ? "g_adamw_copy" : "g_adamw"; }

static const char *const KERNEL_NAMES[OP_COUNT] = {
    [OP_EMBED] = "g_embed",
    [OP_LN_STATS] = "g_ln_stats",
    [OP_LN_APPLY] = "g_ln_apply",
    [OP_SPLIT_HEADS] = "g_split_heads",
    [OP_MERGE_HEADS] = "g_merge_heads",
    [OP_SOFTMAX] = "g_softmax",
    [OP_SOFTMAX_BWD] = "g_softmax_bwd",
    [OP_ADD] = "g_add",
    [OP_GELU] = "g_gelu",
    [OP_GELU_BWD] = "g_gelu_bwd",
    [OP_CE_ROWS] = "g_ce_rows",
    [OP_MEAN] = "g_mean",
    [OP_CE_BWD] = "g_ce_bwd",
    [OP_LN_BWD_DX] = "g_ln_bwd_dx",
    [OP_LN_BWD_DX_RES] = "g_ln_bwd_dx_res",
    [OP_LN_BWD_WB] = "g_ln_bwd_wb",
    [OP_EMBED_BWD_WTE] = "g_embed_bwd_wte",
    [OP_EMBED_BWD_WPE] = "g_embed_bwd_wpe",
    [OP_ADAMW] = "g_adamw", /* g_adamw_copy for bf16 (gpt2_adamw_kernel_name) */
    [OP_GEMM] = NULL, /* a cuBLAS callback */
    [OP_SUM_CHUNKS] = "g_sum_chunks",
};

static uint32_t blocks_for(uint64_t n, uint32_t per_block) {
  uint64_t b = (n + per_block - 1) / per_block;
  if (b > 65535u * 16u) b = 65535u * 16u; /* grid-stride loops cover the rest */
  return b ? (uint32_t)b : 1u;
}

void gpt2_launch_dims(gpt2_op op, const void *params, gkrt_launch *l) {
  l->grid[0] = l->grid[1] = l->grid[2] = 1;
  l->block[0] = 256;
  l->block[1] = l->block[2] = 1;
  l->shared_mem_bytes = 0;
  const p_rows *rows = params;
  const p_n *n = params;
  const p_dims *dims = params;
  const p_perm *perm = params;
  const p_chunks *chunks = params;
  switch (op) {
    case OP_EMBED: l->grid[0] = blocks_for((uint64_t)dims->bt * dims->c, 256); break;
    case OP_LN_STATS:
    case OP_SOFTMAX:
    case OP_SOFTMAX_BWD:
    case OP_LN_BWD_DX:
    case OP_LN_BWD_DX_RES: l->grid[0] = blocks_for(rows->rows, 8); break; /* a warp per row */
    case OP_LN_APPLY: l->grid[0] = blocks_for((uint64_t)rows->rows * rows->cols, 256); break;
    case OP_SPLIT_HEADS:
    case OP_MERGE_HEADS:
      l->grid[0] = blocks_for((uint64_t)perm->b * perm->t * perm->parts * perm->h * perm->d, 256);
      break;
    case OP_ADD:
    case OP_GELU:
    case OP_GELU_BWD:
    case OP_ADAMW: l->grid[0] = blocks_for(n->n, 256); break;
    case OP_CE_ROWS:
    case OP_CE_BWD: l->grid[0] = rows->rows; break; /* a block per row */
    case OP_MEAN: break;
    case OP_LN_BWD_WB:
      l->grid[0] = blocks_for(chunks->cols, 32);
      l->grid[1] = chunks->chunks;
      l->block[0] = 32;
      l->block[1] = 8;
      break;
    case OP_EMBED_BWD_WTE: l->grid[0] = dims->bt; break; /* a block per segment (at most B·T) */
    case OP_EMBED_BWD_WPE: l->grid[0] = blocks_for((uint64_t)dims->t * dims->c, 256); break;
    case OP_SUM_CHUNKS: l->grid[0] = blocks_for(chunks->cols, 256); break;
    case OP_GEMM:
    case OP_COUNT: l->block[0] = 1; break;
  }
}

int gpt2_kernels_cuda(gkrt_runtime *rt, gpt2_dtype dtype, gpt2_kernels *out) {
  memset(out, 0, sizeof *out);
  out->cuda = 1;
  out->dtype = dtype;
  for (int op = 0; op < OP_COUNT; op++) {
    const char *name = op == OP_ADAMW ? gpt2_adamw_kernel_name(dtype) : KERNEL_NAMES[op];
    if (!name) continue;
    const char *opts[] = {"-std=c++17", dtype == GPT2_BF16 ? "-DGPT2_ACT_BF16=1" : "-DGPT2_ACT_BF16=0"};
    gkrt_status st = gkrt_kernel_from_source(rt, SRC, name, opts, 2, &out->k[op]);
    if (st != GKRT_STATUS_OK) {
      char msg[4096];
      gkrt_last_error_message(msg, sizeof msg);
      fprintf(stderr, "compiling %s: %s: %s\n", name, gkrt_status_name(st), msg);
      gpt2_kernels_release(out);
      return 1;
    }
  }
  if (gpt2_gemm_kernel_cublas(rt, dtype, &out->k[OP_GEMM])) {
    gpt2_kernels_release(out);
    return 1;
  }
  return 0;
}
