/*
 * A GPT-2 training step as one gkrt graph: token and position embeddings, per layer a pre-norm
 * block (layer norm, causal self-attention with explicit Q·Kᵀ, mask + softmax and P·V, GELU MLP,
 * residuals), a final layer norm, logits against the tied token embedding, the mean
 * cross-entropy loss, the whole backward pass and an AdamW update of every parameter. Each
 * operation is one node (ops.h); each parameter's AdamW node comes right after its gradient is
 * complete, so a gradient lives only until its update.
 *
 * Element types (the choice for bf16, with ops.h's list of what is always f32): with GPT2_F32
 * everything is f32. With GPT2_BF16 (mixed precision) each parameter has an f32 master copy and
 * f32 AdamW moments, and a bf16 compute copy that every other node reads (AdamW rewrites it from
 * the master after each update); activations, their gradients and parameter gradients are bf16;
 * layer-norm statistics, softmax and cross-entropy arithmetic, the losses and the optimizer's
 * arithmetic are f32. Every kernel computes in f32 and rounds once where it stores bf16.
 *
 * Parameters (master copies f32, row-major), in this order (also the order of --dump-weights):
 *   wte [V,C], wpe [T,C], then per layer: ln1 [2C] (weight, bias), qkv [3C·C + 3C] (W [3C,C] then
 *   bias), proj [C·C + C], ln2 [2C], fc [4C·C + 4C], fcproj [C·4C + C]; then lnf [2C].
 * A linear layer computes y = x·Wᵀ + b, as torch.nn.Linear does.
 */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <gkrt.h>
#include <stdint.h>

#include "ops.h"

typedef struct {
  uint32_t layers, channels, heads, seq, batch, vocab;
} gpt2_config;

typedef struct {
  int recompute;        /* recomputable nodes: 0 none, 1 the element-wise and row-wise ones (layer
                           norms, head split/merge, softmax, GELU, residual adds, their gradients
                           where they qualify), 2 also the forward matrix products */
  int grads_as_outputs; /* gradients and per-position losses become output tensors and no
                           optimizer runs (tests) */
  gpt2_dtype dtype;     /* element type of activations, gradients and compute copies (the
                           kernels must be made for the same one) */
  float lr, beta1, beta2, eps, weight_decay;
} gpt2_options;

enum { GPT2_MAX_LAYERS = 256, GPT2_MAX_PARAMS = 3 + 6 * GPT2_MAX_LAYERS };

typedef struct {
  char name[24];
  uint64_t offset, count; /* in the flat list of all weights, in floats */
  gkrt_tensor w, m, v, grad;
  gkrt_tensor wc; /* the compute copy the network reads: w itself in f32, bf16 otherwise */
} gpt2_param;

typedef struct {
  gpt2_config cfg;
  gpt2_dtype dtype;
  gkrt_graph *graph;
  gkrt_tensor tokens, targets, ones, step, loss;
  gkrt_tensor tok_order, tok_start, tok_token; /* the batch's positions grouped by token */
  gkrt_tensor losses; /* per position [B·T]; an output with grads_as_outputs */
  uint32_t num_params;
  uint64_t num_weights; /* floats over all parameters */
  gpt2_param params[GPT2_MAX_PARAMS];
} gpt2_model;

/* 0 when the sizes are usable (heads divide channels, each at least 1, limits on products);
 * otherwise prints why. */
int gpt2_config_check(const gpt2_config *cfg);
/* The parameter list (names, offsets, counts) without a graph. */
void gpt2_layout(const gpt2_config *cfg, gpt2_model *m);
/* Builds and finalizes the step's graph on `rt` (m is filled; m->graph owned by the caller). */
int gpt2_build(gkrt_runtime *rt, const gpt2_kernels *ks, const gpt2_config *cfg, const gpt2_options *opt,
               gpt2_model *m);
void gpt2_default_options(gpt2_options *opt);

/* GPT-2's initialisation with a fixed seed: weights N(0, std), output projections
 * N(0, std/sqrt(2L)), biases 0, layer-norm weights 1. `w` holds m->num_weights floats. */
void gpt2_init_weights(const gpt2_model *m, uint64_t seed, float std, float *w);
/* A synthetic batch: B·(T+1) random tokens; inputs are the first T of each row, targets the
 * last T (next-token prediction). */
void gpt2_make_batch(const gpt2_config *cfg, uint64_t seed, int32_t *tokens, int32_t *targets);

/* Writes the weights (their compute copies too, and zero optimizer state), the batch and the
 * constant inputs. */
int gpt2_upload(const gpt2_model *m, const float *w, const int32_t *tokens, const int32_t *targets);
/* Writes a batch: tokens, targets and the tokens' positions grouped for the embedding's backward
 * (always write tokens through here). Tokens and targets must lie in [0, vocab). */
int gpt2_write_batch(const gpt2_model *m, const int32_t *tokens, const int32_t *targets);
/* Runs one step (AdamW step number `t`, from 1) and reads the loss. */
int gpt2_step(gkrt_runtime *rt, const gpt2_model *m, uint32_t t, float *loss);
/* Reads every parameter (after steps: the updated weights) into `w`. */
int gpt2_download(const gpt2_model *m, float *w);
/* Reads the gradients into `g` (a graph built with grads_as_outputs, after a run), widened to
 * f32 when they are bf16. */
int gpt2_read_grads(const gpt2_model *m, float *g);

/* Prints a failed call's status and message; returns 1 on failure. */
int gpt2_check(gkrt_status st, const char *what);
#define GPT2_TRY(call)                              \
  do {                                              \
    if (gpt2_check((call), #call)) return 1;        \
  } while (0)

#endif
