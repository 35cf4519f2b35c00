/*
 * api_limits_handles: running out of runtime handles. gkrt_torch_runtime hands out a new handle
 * to the process-wide runtime on every call, so taking handles until one is refused reaches the
 * cap (1,048,576 live runtime handles) cheaply. The refusal must be an ordinary
 * GKRT_STATUS_OUT_OF_MEMORY with a message, out untouched, and no panic text on stderr; every
 * handle taken still works; a new runtime is refused the same way while the handles are held;
 * graphs (other handles) can still be made; once one handle is released another can be taken;
 * after all are released, a fresh runtime works.
 */
#define _GNU_SOURCE
#include <time.h>
#include <unistd.h>

#include "test_util.h"

enum { CAP = 1 << 20, MAX_TRIES = CAP + 64 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* stderr goes into a temporary file while a call runs; returns 1 when the call printed panic
 * text there (echoing what it printed either way). */
static int saved_fd = -1;
static FILE *captured;

static void capture_stderr(void) {
  fflush(stderr);
  captured = tmpfile();
  saved_fd = dup(2);
  if (captured) dup2(fileno(captured), 2);
}

static int release_stderr_and_check_panic(void) {
  fflush(stderr);
  dup2(saved_fd, 2);
  close(saved_fd);
  int panicked = 0;
  if (captured) {
    char line[1024];
    rewind(captured);
    while (fgets(line, sizeof line, captured)) {
      fprintf(stderr, "  (stderr during the call) %s", line);
      if (strstr(line, "panick") || strstr(line, "RUST_BACKTRACE")) panicked = 1;
    }
    fclose(captured);
  }
  return panicked;
}

int main(void) {
  gkrt_runtime **h = malloc(MAX_TRIES * sizeof *h);
  CHECK(h != NULL);
  if (!h) return 1;
  gkrt_runtime *probe_rt = test_runtime(0); /* made before the cap, used after it */
  gkrt_kernel *relu = builtin_kernel(probe_rt, GKRT_BUILTIN_RELU);
  double t0 = now_s();
  size_t n = 0;
  gkrt_status st = GKRT_STATUS_OK;
  gkrt_runtime *sentinel = (gkrt_runtime *)(uintptr_t)0x5e47;
  for (; n < MAX_TRIES; n++) {
    h[n] = sentinel;
    if (n + 1 == MAX_TRIES || n >= CAP - 2) capture_stderr(); /* the calls near the cap */
    st = gkrt_torch_runtime(0, &h[n]);
    if (n + 1 == MAX_TRIES || n >= CAP - 2) {
      if (release_stderr_and_check_panic()) {
        fprintf(stderr, "gkrt_torch_runtime call %zu printed a panic to stderr\n", n);
        test_failures++;
      }
    }
    if (st != GKRT_STATUS_OK) break;
  }
  double took = now_s() - t0;
  printf("%zu runtime handles taken in %.2f s; the next: %s (%s)\n", n, took, gkrt_status_name(st), last_error());
  if (st == GKRT_STATUS_OK) {
    fprintf(stderr, "%d runtime handles were all given out: no cap\n", MAX_TRIES);
    test_failures++;
  } else {
    CHECK_EQ_U64(st, GKRT_STATUS_OUT_OF_MEMORY);
    CHECK(h[n] == sentinel);
    CHECK(gkrt_last_error_message(NULL, 0) > 0);
    MSG_HAS("handle");
    CHECK(n <= CAP);
    CHECK(n + 16 >= CAP); /* the cap is 2^20 live handles, less the few this test made itself */
  }
  size_t taken = n;

  if (st != GKRT_STATUS_OK) {
    /* A new runtime is refused the same way (it needs a handle), without a panic. */
    gkrt_runtime *r = sentinel;
    capture_stderr();
    gkrt_status cst = gkrt_runtime_create(NULL, &r);
    if (release_stderr_and_check_panic()) {
      fprintf(stderr, "gkrt_runtime_create at the cap printed a panic to stderr\n");
      test_failures++;
    }
    CHECK_EQ_U64(cst, GKRT_STATUS_OUT_OF_MEMORY);
    CHECK(r == sentinel);
    if (cst == GKRT_STATUS_OK) OK(gkrt_runtime_release(r));

    /* The handles given out work: the first, the last. */
    gkrt_stats s;
    OK(gkrt_runtime_stats(h[0], &s));
    OK(gkrt_runtime_stats(h[taken - 1], &s));
    /* A runtime made before the cap still makes graphs and runs them. */
    CHECK_RUNTIME_WORKS(probe_rt);

    /* One released, one more can be taken; and again refused after that. */
    OK(gkrt_runtime_release(h[taken / 2]));
    gkrt_runtime *again = sentinel;
    OK(gkrt_torch_runtime(0, &again));
    CHECK(again != h[taken / 2]); /* keys are never reused */
    h[taken / 2] = again;
    gkrt_runtime *over = sentinel;
    FAILS(gkrt_torch_runtime(0, &over), GKRT_STATUS_OUT_OF_MEMORY, "");
    CHECK(over == sentinel);
  }

  /* Release them all. */
  t0 = now_s();
  for (size_t i = 0; i < taken; i++) OK(gkrt_runtime_release(h[i]));
  printf("released them in %.2f s\n", now_s() - t0);
  FAILS(gkrt_runtime_release(h[0]), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  free(h);

  /* Handles are available again: a fresh runtime works. */
  gkrt_runtime *rt = test_runtime(0);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  OK(gkrt_kernel_release(relu));
  OK(gkrt_runtime_release(probe_rt));
  return test_done("api_limits_handles");
}
