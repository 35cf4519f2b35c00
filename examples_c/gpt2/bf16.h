/*
 * bf16 on the host: the upper half of an f32. Rounding is to nearest, ties to even (NaN stays a
 * quiet NaN) — the same bit operations as the CUDA kernels' st() (ops_cuda.c) and PyTorch's
 * float -> bfloat16, so the host backend rounds exactly where and how the GPU kernels do.
 */
#ifndef GPT2_BF16_H
#define GPT2_BF16_H

#include <stdint.h>
#include <string.h>

static inline float gpt2_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t gpt2_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN: keep it quiet */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#endif
