/*
 * gkrt_malloc / gkrt_free (raw pool use, stream-ordered on the default stream), gkrt_record_stream
 * and the PyTorch allocator entry points: round trips, reuse, statistics, bad input (NULL runtime /
 * out / pointer, unknown pointer, double free, zero size, over the limit), and several threads at
 * once. The same file runs on the host backend and, with GKRT_DEVICE=cuda, on a GPU (the
 * pointers are never dereferenced here). What a named stream orders is checked in
 * src/runtime/raw.rs's tests.
 */
#include "test_util.h"

#include <pthread.h>

#define MIB (1024ull * 1024ull)

static void *worker(void *arg) {
  gkrt_runtime *rt = (gkrt_runtime *)arg;
  for (int i = 0; i < 2000; i++) {
    void *p = NULL;
    size_t n = (size_t)(1 + (i * 7919) % (3 * MIB));
    if (gkrt_malloc(rt, n, NULL, &p) != GKRT_STATUS_OK || p == NULL) return (void *)1;
    if (gkrt_free(rt, p, NULL) != GKRT_STATUS_OK) return (void *)1;
  }
  return NULL;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(64 * MIB);
  void *p = NULL, *q = NULL, *r = NULL;

  /* Bad input: a clear status and message, nothing allocated. */
  FAILS(gkrt_malloc(NULL, 100, NULL, &p), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  FAILS(gkrt_malloc(rt, 100, NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_malloc(rt, 0, NULL, &p), GKRT_STATUS_INVALID_ARGUMENT, "0 bytes");
  CHECK(p == NULL);
  FAILS(gkrt_malloc(rt, 65 * MIB, NULL, &p), GKRT_STATUS_OUT_OF_MEMORY, "68157440");
  MSG_HAS("limit");
  CHECK(p == NULL);
  FAILS(gkrt_free(NULL, (void *)0x1000, NULL), GKRT_STATUS_INVALID_ARGUMENT, "NULL");

  /* Round trips: aligned, distinct, counted. */
  OK(gkrt_malloc(rt, 1000, NULL, &p));
  OK(gkrt_malloc(rt, 3 * MIB + 5, NULL, &q));
  OK(gkrt_malloc(rt, 1, NULL, &r));
  CHECK(p != NULL && q != NULL && r != NULL);
  CHECK(((uintptr_t)p | (uintptr_t)q | (uintptr_t)r) % 256 == 0);
  CHECK(p != q && q != r && p != r);
  gkrt_stats s;
  OK(gkrt_runtime_stats(rt, &s));
  CHECK_EQ_U64(s.allocated_bytes, 1024 + (3 * MIB + 256) + 256);
  CHECK(s.reserved_bytes >= s.allocated_bytes && s.reserved_bytes <= 64 * MIB);

  /* Freeing: NULL is a no-op; unknown, interior and double frees are errors that change nothing. */
  OK(gkrt_free(rt, NULL, NULL));
  FAILS(gkrt_free(rt, (char *)q + 256, NULL), GKRT_STATUS_INVALID_ARGUMENT, "not a live block");
  FAILS(gkrt_free(rt, (void *)0x1234, NULL), GKRT_STATUS_INVALID_ARGUMENT, "0x1234");
  OK(gkrt_free(rt, q, NULL));
  FAILS(gkrt_free(rt, q, NULL), GKRT_STATUS_INVALID_ARGUMENT, "already freed");
  OK(gkrt_runtime_stats(rt, &s));
  CHECK_EQ_U64(s.allocated_bytes, 1024 + 256);

  /* Stream-ordered reuse: the next allocation of that size on the same stream gets the block. */
  void *q2 = NULL;
  OK(gkrt_malloc(rt, 3 * MIB + 5, NULL, &q2));
  CHECK(q2 == q);
  /* Naming the streams a block is used on (record_stream): its own stream, or one twice, is no
   * change; bad input is named and changes nothing; the block then frees as before. */
  OK(gkrt_record_stream(rt, q2, NULL));
  OK(gkrt_record_stream(rt, q2, NULL));
  FAILS(gkrt_record_stream(NULL, q2, NULL), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  FAILS(gkrt_record_stream(rt, (char *)q2 + 256, NULL), GKRT_STATUS_INVALID_ARGUMENT,
        "not a live block");
  /* A made-up stream: only the host backend can tell (on CUDA, as in the driver, it is the
   * caller's to pass a real CUstream; a made-up one there would crash the free's wait). */
  if (test_on_host(rt)) {
    FAILS(gkrt_record_stream(rt, q2, (void *)0x1234), GKRT_STATUS_INVALID_ARGUMENT, "0x1234");
  }
  OK(gkrt_free(rt, q2, NULL));
  FAILS(gkrt_record_stream(rt, q2, NULL), GKRT_STATUS_INVALID_ARGUMENT, "not a live block");

  /* The budget holds across many blocks; what does not fit fails with numbers, then fits again
   * once memory is returned. */
  void *big[8];
  int n = 0;
  for (; n < 8; n++) {
    gkrt_status st = gkrt_malloc(rt, 12 * MIB, NULL, &big[n]);
    if (st != GKRT_STATUS_OK) {
      CHECK(st == GKRT_STATUS_OUT_OF_MEMORY);
      CHECK(mentions_u64(last_error(), 12 * MIB));
      break;
    }
  }
  CHECK(n >= 3 && n < 8);
  OK(gkrt_runtime_stats(rt, &s));
  CHECK(s.reserved_bytes <= 64 * MIB);
  for (int i = 0; i < n; i++) OK(gkrt_free(rt, big[i], NULL));
  OK(gkrt_malloc(rt, 40 * MIB, NULL, &big[0]));
  OK(gkrt_free(rt, big[0], NULL));

  /* Threads: the runtime is internally locked. */
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, rt);
  for (int i = 0; i < 4; i++) {
    void *ret = NULL;
    pthread_join(th[i], &ret);
    CHECK(ret == NULL);
  }

  OK(gkrt_free(rt, p, NULL));
  OK(gkrt_free(rt, r, NULL));
  OK(gkrt_runtime_stats(rt, &s));
  CHECK_EQ_U64(s.allocated_bytes, 0);
  uint64_t released = 0;
  OK(gkrt_runtime_release_cached(rt, &released));
  OK(gkrt_runtime_stats(rt, &s));
  CHECK(released > 0);
  CHECK_EQ_U64(s.reserved_bytes, 0);
  FAILS(gkrt_runtime_release_cached(NULL, NULL), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  OK(gkrt_runtime_release(rt));
  FAILS(gkrt_malloc(rt, 8, NULL, &p), GKRT_STATUS_INVALID_ARGUMENT, "not live");

  /* The PyTorch entry points, on the process-wide runtime of device 0. */
  CHECK(gkrt_torch_alloc(0, 0, NULL) == NULL);
  gkrt_torch_free(NULL, 0, 0, NULL);
  void *t = gkrt_torch_alloc(4096, 0, NULL);
  CHECK(t != NULL && (uintptr_t)t % 256 == 0);
  gkrt_runtime *shared = NULL;
  OK(gkrt_torch_runtime(0, &shared));
  OK(gkrt_runtime_stats(shared, &s));
  CHECK_EQ_U64(s.allocated_bytes, 4096);
  OK(gkrt_record_stream(shared, t, NULL));
  gkrt_torch_free(t, 4096, 0, NULL);
  OK(gkrt_runtime_stats(shared, &s));
  CHECK_EQ_U64(s.allocated_bytes, 0);
  CHECK(gkrt_torch_alloc(16, -1, NULL) == NULL);
  MSG_HAS("device -1");
  FAILS(gkrt_torch_runtime(0, NULL), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  OK(gkrt_runtime_release(shared));
  return test_done("api_raw_alloc");
}
