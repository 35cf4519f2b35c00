/* Shared by the GPU benchmarks: checked CUDA driver calls, the chain kernel's parameters and
 * reading its PTX (gkrt calls, clocks and the median come from bench_host.h). */
#ifndef GKRT_BENCH_UTIL_H
#define GKRT_BENCH_UTIL_H

#include "bench_host.h"
#include <cuda.h>

#define CU(call)                                                               \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      const char *n_;                                                          \
      cuGetErrorName(r_, &n_);                                                 \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, n_);     \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Device 0's primary context (the one gkrt uses), retained and current on this thread, for a
 * bench's own CUDA calls; returns the device (for cuDevicePrimaryCtxRelease). */
static inline CUdevice use_primary_context(void) {
  CUdevice dev;
  CUcontext ctx;
  CU(cuInit(0));
  CU(cuDeviceGet(&dev, 0));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  return dev;
}

/* The parameters of benches/chain_kernel.cu's axpb kernel (out = a*in + b over n floats). */
typedef struct {
  float a, b;
  unsigned n;
} axpb_params;

/* The whole file at `path`, NUL-terminated (the PTX a bench loads); exits on failure. */
static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(n + 1);
  if (fread(buf, 1, n, f) != (size_t)n) exit(1);
  buf[n] = 0;
  fclose(f);
  return buf;
}

#endif
