/*
 * Host callbacks that really produce their outputs on either backend, so that no later kernel
 * reads memory the callback declared as written but left as it was (compute-sanitizer's
 * initcheck would report each such read, and hide real ones).
 *
 * On the host backend a callback's buffers are host memory, read and written in place. On CUDA
 * they are device memory and the callback gets the CUstream: these helpers copy through the
 * driver API, ordered on that stream, and wait for the copy (the header allows a callback to
 * synchronise its stream; graphs with callbacks are never captured). The driver is opened with
 * dlopen, so the tests build without a CUDA toolkit.
 *
 * Call cbdev_init(rt) once before the first run; cbdev_read / cbdev_write / cbdev_fill return 0
 * on success.
 */
#ifndef GKRT_TEST_CB_DEVICE_H
#define GKRT_TEST_CB_DEVICE_H

#include <dlfcn.h>

#include "common.h"

typedef int (*cbdev_dtoh_fn)(void *dst, unsigned long long src, size_t bytes, void *stream);
typedef int (*cbdev_htod_fn)(unsigned long long dst, const void *src, size_t bytes, void *stream);
typedef int (*cbdev_memset8_fn)(unsigned long long dst, unsigned char value, size_t n, void *stream);
typedef int (*cbdev_sync_fn)(void *stream);

static struct {
  int cuda; /* 1: CUDA buffers, through the driver; 0: host memory */
  cbdev_dtoh_fn dtoh;
  cbdev_htod_fn htod;
  cbdev_memset8_fn memset8;
  cbdev_sync_fn sync;
} cbdev;

static void *cbdev_sym_(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "cb_device.h: libcuda has no %s\n", name);
    exit(1);
  }
  return p;
}

static inline void cbdev_init(gkrt_runtime *rt) {
  cbdev.cuda = !test_on_host(rt);
  if (!cbdev.cuda || cbdev.dtoh) return;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "cb_device.h: cannot open libcuda: %s\n", dlerror());
    exit(1);
  }
  /* The _v2 entry points are what cuda.h's cuMemcpyDtoHAsync etc. name (64-bit CUdeviceptr). */
  cbdev.dtoh = (cbdev_dtoh_fn)cbdev_sym_(lib, "cuMemcpyDtoHAsync_v2");
  cbdev.htod = (cbdev_htod_fn)cbdev_sym_(lib, "cuMemcpyHtoDAsync_v2");
  cbdev.memset8 = (cbdev_memset8_fn)cbdev_sym_(lib, "cuMemsetD8Async");
  cbdev.sync = (cbdev_sync_fn)cbdev_sym_(lib, "cuStreamSynchronize");
}

static inline unsigned long long cbdev_ptr_(const void *p) { return (unsigned long long)(uintptr_t)p; }

/* Copies `bytes` from the start of buffer `b` to host memory `dst`. */
static inline int cbdev_read(const gkrt_callback_args *a, gkrt_buffer b, void *dst, size_t bytes) {
  if (bytes > b.size) return -1;
  if (!cbdev.cuda) {
    memcpy(dst, b.ptr, bytes);
    return 0;
  }
  if (cbdev.dtoh(dst, cbdev_ptr_(b.ptr), bytes, a->stream) != 0) return -2;
  return cbdev.sync(a->stream) != 0 ? -3 : 0;
}

/* Copies `bytes` of host memory `src` to the start of buffer `b`. */
static inline int cbdev_write(const gkrt_callback_args *a, gkrt_buffer b, const void *src, size_t bytes) {
  if (bytes > b.size) return -1;
  if (!cbdev.cuda) {
    memcpy(b.ptr, src, bytes);
    return 0;
  }
  if (cbdev.htod(cbdev_ptr_(b.ptr), src, bytes, a->stream) != 0) return -2;
  return cbdev.sync(a->stream) != 0 ? -3 : 0; /* `src` may be reused once this returns */
}

/* Sets every byte of buffer `b` to `value`. */
static inline int cbdev_fill(const gkrt_callback_args *a, gkrt_buffer b, unsigned char value) {
  if (!cbdev.cuda) {
    memset(b.ptr, value, b.size);
    return 0;
  }
  return cbdev.memset8(cbdev_ptr_(b.ptr), value, b.size, a->stream) != 0 ? -2 : 0;
}

#endif
