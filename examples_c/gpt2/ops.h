/*
 * The GPT-2 example's node kinds: what each reads, writes and takes as parameters. Every kind has
 * two implementations with the same meaning: a CPU callback (ops_host.c, the host backend and the
 * reference) and, on CUDA, a CUDA-source kernel gkrt compiles (ops_cuda.c) or, for matrix
 * products, a host callback calling cuBLAS on the node's stream.
 *
 * Parameter structs hold only 4-byte fields, so the CUDA kernels' by-value copies of them
 * (ops_cuda.c) have the same layout.
 *
 * Element types: the kernels of one runtime are made for one gpt2_dtype. "Activation" tensors
 * (marked act below: activations, their gradients, the parameters' compute copies, parameter
 * gradients, the ones vector) are of that type; with GPT2_BF16 they hold bf16 (bf16.h) and every
 * kernel computes in f32, rounding to bf16 (to nearest, ties to even) once, where it stores.
 * Always f32: layer-norm statistics, the per-chunk partial sums of layer-norm gradients, the
 * losses, the AdamW step number, and the master weights and AdamW moments. Tokens, targets and
 * the token grouping are int32. Matrix products take act inputs and output, accumulate in f32
 * and round the result alpha·op(A)op(B) + beta·C once.
 */
#ifndef GPT2_OPS_H
#define GPT2_OPS_H

#include <gkrt.h>
#include <stdint.h>

typedef enum { GPT2_F32 = 0, GPT2_BF16 = 1 } gpt2_dtype;

/* All act unless said (see above): "stats", "losses", "parts" and AdamW's param, m, v are f32. */
typedef enum {
  OP_EMBED,         /* (tokens, wte, wpe) -> x[BT,C]                              p_dims  */
  OP_LN_STATS,      /* (x) -> stats[rows,2] (mean, 1/std)                         p_rows  */
  OP_LN_APPLY,      /* (x, stats, wb[2C]) -> y                                    p_rows  */
  OP_SPLIT_HEADS,   /* (x[B,T,P,H,D]) -> y[P,B,H,T,D]                             p_perm  */
  OP_MERGE_HEADS,   /* (x[P,B,H,T,D]) -> y[B,T,P,H,D]                             p_perm  */
  OP_SOFTMAX,       /* (S[BH*T,T]) -> P, causal: column j > row's t masked        p_rows  */
  OP_SOFTMAX_BWD,   /* (dP, P) -> dS = P * (dP - sum(dP * P))                     p_rows  */
  OP_ADD,           /* (a, b) -> a + b                                            p_n     */
  OP_GELU,          /* (x) -> gelu_tanh(x)                                        p_n     */
  OP_GELU_BWD,      /* (dy, x) -> dy * gelu_tanh'(x)                              p_n     */
  OP_CE_ROWS,       /* (logits[BT,V], targets) -> loss per row [BT]               p_rows  */
  OP_MEAN,          /* (v[n]) -> mean [1]                                         p_n     */
  OP_CE_BWD,        /* (logits, targets) -> (softmax - onehot) / BT               p_rows  */
  OP_LN_BWD_DX,     /* (dy, x, stats, wb) -> dx                                   p_rows  */
  OP_LN_BWD_DX_RES, /* (dy, x, stats, wb, dres) -> dres + dx                      p_rows  */
  OP_LN_BWD_WB,     /* (dy, x, stats) -> per chunk of rows (dw, db): [chunks, 2C]  p_chunks */
  OP_EMBED_BWD_WTE, /* (dx, order, seg_start, seg_token, dwte) -> dwte += dx rows   p_dims
                       of each token's positions (a segment: order[seg_start[s]..
                       seg_start[s+1]], ascending), in place */
  OP_EMBED_BWD_WPE, /* (dx) -> dwpe[T,C], summed over the batch                   p_dims  */
  OP_ADAMW,         /* (grad, step, param, m, v) -> (param, m, v), in place       p_adam
                       (bf16: a 4th output, the param's bf16 compute copy) */
  OP_GEMM,          /* callback: a list of column-major (cuBLAS-style) products   p_gemm  */
  OP_SUM_CHUNKS,    /* (parts[chunks, cols]) -> [cols], chunks summed in order    p_chunks */
  OP_COUNT
} gpt2_op;

typedef struct { uint32_t n; } p_n;
typedef struct { uint32_t rows, cols; } p_rows;
typedef struct { uint32_t bt, t, c, v; } p_dims;
typedef struct { uint32_t b, t, parts, h, d; } p_perm;
/* Rows split into `chunks` equal ranges (the last takes the rest): column sums over many rows
 * run as parallel partial sums, then one fixed-order sum of the partials (OP_SUM_CHUNKS). */
typedef struct { uint32_t rows, cols, chunks; } p_chunks;
typedef struct { uint32_t n; float lr, beta1, beta2, eps, weight_decay; } p_adam;

/* C = alpha * op(A) op(B) + beta * C in column-major terms, batched with strides (elements).
 * A is input `a_in` at element offset a_off, B input `b_in`, C the node's output 0 at c_off. */
typedef struct {
  uint32_t trans_a, trans_b, m, n, k, lda, ldb, ldc, batch, a_in, b_in;
  float alpha, beta;
  uint64_t a_off, b_off, c_off, stride_a, stride_b, stride_c;
} gemm_op;

enum { GEMM_MAX_OPS = 3 };
typedef struct {
  uint32_t count;
  gemm_op ops[GEMM_MAX_OPS];
} p_gemm;

/* The kernels of one runtime, one per op, for one element type; `cuda` says which
 * implementation they are. */
typedef struct {
  gkrt_kernel *k[OP_COUNT];
  int cuda;
  gpt2_dtype dtype;
} gpt2_kernels;

/* Host backend: CPU callbacks. Returns 0 on success (messages on stderr otherwise). */
int gpt2_kernels_host(gkrt_runtime *rt, gpt2_dtype dtype, gpt2_kernels *out);
/* CUDA: NVRTC kernels and cuBLAS (opened with dlopen) callbacks. */
int gpt2_kernels_cuda(gkrt_runtime *rt, gpt2_dtype dtype, gpt2_kernels *out);
/* CUDA: the OP_GEMM kernel, a cuBLAS callback (blas_cuda.c): cublasSgemm for f32,
 * cublasGemmEx (bf16 in and out, f32 compute) for bf16. */
int gpt2_gemm_kernel_cublas(gkrt_runtime *rt, gpt2_dtype dtype, gkrt_kernel **out);
void gpt2_kernels_release(gpt2_kernels *ks);
/* The CUDA source of every kernel but OP_GEMM's, compiled with -DGPT2_ACT_BF16=0 or 1 for the element
 * type (dev/cuda_on_cpu.sh compiles it for the CPU). */
const char *gpt2_cuda_source(void);
/* The kernel of OP_ADAMW in that source (bf16 also writes the compute copy). */
const char *gpt2_adamw_kernel_name(gpt2_dtype dtype);
/* Grid and block for a node of kind `op` with parameters `params` (CUDA kernels; callbacks
 * ignore them). */
void gpt2_launch_dims(gpt2_op op, const void *params, gkrt_launch *l);

/* The CPU implementation of a column-major strided-batched product (also the reference); a, b
 * and c are float or, with GPT2_BF16, bf16 (uint16_t). */
void gpt2_cpu_gemm(const gemm_op *op, gpt2_dtype dtype, const void *a, const void *b, void *c);

#endif
