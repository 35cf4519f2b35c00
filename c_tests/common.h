/*
 * Helpers for the C tests: checks that print where and why they failed, and runtime creation
 * that honours GKRT_DEVICE (so the same tests run on the host backend and on a GPU).
 */
#ifndef GKRT_TEST_COMMON_H
#define GKRT_TEST_COMMON_H

#include <gkrt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures = 0;

static const char *last_error(void) {
  static char buf[1024];
  gkrt_last_error_message(buf, sizeof buf);
  return buf;
}

/* A call that must succeed. */
#define OK(call)                                                                                     \
  do {                                                                                               \
    gkrt_status st_ = (call);                                                                        \
    if (st_ != GKRT_STATUS_OK) {                                                                     \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, gkrt_status_name(st_),    \
              last_error());                                                                         \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

/* A call that must fail with `status`, and whose message must contain `needle` (NULL: any). */
#define FAILS(call, status, needle)                                                                  \
  do {                                                                                               \
    gkrt_status st_ = (call);                                                                        \
    if (st_ != (status)) {                                                                           \
      fprintf(stderr, "%s:%d: %s -> %s, expected %s (%s)\n", __FILE__, __LINE__, #call,              \
              gkrt_status_name(st_), gkrt_status_name(status), last_error());                        \
      test_failures++;                                                                               \
    } else if ((needle) != NULL && strstr(last_error(), (needle)) == NULL) {                         \
      fprintf(stderr, "%s:%d: %s: message \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__,     \
              #call, last_error(), (const char *)(needle));                                          \
      test_failures++;                                                                               \
    }                                                                                                \
  } while (0)

#define CHECK(cond)                                                                                  \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                       \
      test_failures++;                                                                               \
    }                                                                                                \
  } while (0)

#define CHECK_EQ_U64(a, b)                                                                           \
  do {                                                                                               \
    unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);                   \
    if (a_ != b_) {                                                                                  \
      fprintf(stderr, "%s:%d: %s == %llu, expected %s == %llu\n", __FILE__, __LINE__, #a, a_, #b, b_); \
      test_failures++;                                                                               \
    }                                                                                                \
  } while (0)

/* Ends a test: prints a summary line and returns the exit code. */
static int test_done(const char *name) {
  if (test_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

/* A runtime with the given memory limit (0 = default); GKRT_DEVICE picks the backend. Tests set a
 * little jitter on the host backend so missing stream ordering shows up. */
static gkrt_runtime *test_runtime(uint64_t memory_limit) {
  gkrt_config cfg;
  OK(gkrt_config_init(&cfg));
  cfg.memory_limit = memory_limit;
  cfg.host_jitter_us = 20;
  cfg.log_level = 1;
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(&cfg, &rt));
  return rt;
}

static int test_on_host(gkrt_runtime *rt) {
  gkrt_device_kind k;
  OK(gkrt_runtime_device(rt, &k));
  return k == GKRT_DEVICE_HOST;
}

#endif
