/*
 * gkrt_runtime_record_history / gkrt_runtime_dump_snapshot: bad input gets a status and a message
 * and leaves the runtime usable; a snapshot is a protocol-2 pickle naming its blocks' owners; the
 * history carries allocations, frees and out-of-memory failures once switched on, and nothing
 * before. (python/tests/test_snapshot.py loads the pickle and checks it against gkrt_stats.)
 * Runs on the host backend and, with GKRT_DEVICE=cuda, on a GPU.
 */
#include "test_util.h"

#include <unistd.h>

#define MIB (1024ull * 1024ull)

/* The file's bytes (NUL-terminated, *len set); NULL when it cannot be read. */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  *len = fread(buf, 1, (size_t)n, f);
  buf[*len] = 0;
  fclose(f);
  return buf;
}

/* True when `needle` occurs in the `len` bytes at `hay` (a pickle holds NULs). */
static int has(const char *hay, size_t len, const char *needle) {
  size_t m = strlen(needle);
  for (size_t i = 0; i + m <= len; i++)
    if (memcmp(hay + i, needle, m) == 0) return 1;
  return 0;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(16 * MIB);
  char path[] = "/tmp/gkrt_api_snapshot_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);

  FAILS(gkrt_runtime_record_history(NULL, 10), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  FAILS(gkrt_runtime_record_history(rt, 1ull << 40), GKRT_STATUS_INVALID_ARGUMENT, "1099511627776");
  FAILS(gkrt_runtime_dump_snapshot(NULL, path), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  FAILS(gkrt_runtime_dump_snapshot(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "path");
  FAILS(gkrt_runtime_dump_snapshot(rt, "/nonexistent-gkrt-dir/s.pickle"), GKRT_STATUS_INVALID_ARGUMENT,
        "/nonexistent-gkrt-dir/s.pickle");

  /* Before the history is on: blocks, but no events. */
  void *a = NULL, *b = NULL, *c = NULL;
  OK(gkrt_malloc(rt, 5000, NULL, &a));
  OK(gkrt_runtime_dump_snapshot(rt, path));
  size_t len = 0;
  char *bytes = slurp(path, &len);
  CHECK(bytes != NULL && len > 4);
  if (bytes) {
    CHECK((unsigned char)bytes[0] == 0x80 && bytes[1] == 2 && bytes[len - 1] == '.');
    CHECK(has(bytes, len, "segments") && has(bytes, len, "device_traces"));
    CHECK(has(bytes, len, "active_allocated") && has(bytes, len, "gkrt_malloc"));
    CHECK(!has(bytes, len, "free_requested"));
    free(bytes);
  }

  /* With the history on: an allocation, a free and an out-of-memory failure are recorded. */
  OK(gkrt_runtime_record_history(rt, 64));
  OK(gkrt_malloc(rt, 3000, NULL, &b));
  OK(gkrt_free(rt, b, NULL));
  FAILS(gkrt_malloc(rt, 64 * MIB, NULL, &c), GKRT_STATUS_OUT_OF_MEMORY, "limit");
  CHECK(c == NULL);
  OK(gkrt_runtime_dump_snapshot(rt, path));
  bytes = slurp(path, &len);
  CHECK(bytes != NULL);
  if (bytes) {
    CHECK(has(bytes, len, "free_requested") && has(bytes, len, "free_completed"));
    CHECK(has(bytes, len, "oom") && has(bytes, len, "device_free") && has(bytes, len, "time_us"));
    free(bytes);
  }

  /* Off again: the ring is dropped; the runtime still allocates. */
  OK(gkrt_runtime_record_history(rt, 0));
  OK(gkrt_runtime_dump_snapshot(rt, path));
  bytes = slurp(path, &len);
  CHECK(bytes != NULL);
  if (bytes) {
    CHECK(!has(bytes, len, "free_requested"));
    free(bytes);
  }
  OK(gkrt_free(rt, a, NULL));
  gkrt_stats s;
  OK(gkrt_runtime_stats(rt, &s));
  CHECK_EQ_U64(s.allocated_bytes, 0);
  unlink(path);
  OK(gkrt_runtime_release(rt));
  return test_done("api_snapshot");
}
