/*
 * Device memory the test owns, moved to and from host memory: on the host backend it is host
 * memory (memcpy); on CUDA the driver copies on the legacy default stream and waits (the tests
 * call these only while no gkrt work is queued).
 */
#ifndef GKRT_TEST_DEV_MEM_H
#define GKRT_TEST_DEV_MEM_H

#include "cb_device.h"

static inline void dev_put(void *dst, const void *src, size_t bytes) {
  if (!cbdev.cuda) {
    memcpy(dst, src, bytes);
  } else if (cbdev.htod(cbdev_ptr_(dst), src, bytes, NULL) != 0 || cbdev.sync(NULL) != 0) {
    fprintf(stderr, "dev_put: copy failed\n");
    exit(1);
  }
}

static inline void dev_get(void *dst, const void *src, size_t bytes) {
  if (!cbdev.cuda) {
    memcpy(dst, src, bytes);
  } else if (cbdev.dtoh(dst, cbdev_ptr_(src), bytes, NULL) != 0 || cbdev.sync(NULL) != 0) {
    fprintf(stderr, "dev_get: copy failed\n");
    exit(1);
  }
}

/* gkrt_malloc on the runtime's default stream, which must succeed. */
static inline void *dev_alloc(gkrt_runtime *rt, size_t bytes) {
  void *p = NULL;
  OK(gkrt_malloc(rt, bytes, NULL, &p));
  return p;
}

#endif
