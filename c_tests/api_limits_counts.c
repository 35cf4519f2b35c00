/*
 * api_limits_counts: array counts and blob sizes that no honest caller can pass, because the
 * array would be larger than PTRDIFF_MAX bytes (no C object is): node input, output and
 * workspace counts, launch parameter blob sizes, cubin image sizes and NVRTC option counts near
 * 2^64. gkrt must refuse them (INVALID_ARGUMENT naming the count) without reading past the one
 * element the pointer really has, and without a panic or an abort. Each case runs in a child
 * process, so one that crashes does not hide the others; the parent reports every case.
 */
#define _GNU_SOURCE
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

static int32_t noop_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  return 0;
}

/* One case: a runtime and a graph with an input x and an output y; `which` picks the call. */
static int run_case(int which) {
  gkrt_runtime *rt = test_runtime(0);
  test_util_uses_();
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, 16, GKRT_TENSOR_INPUT, "cnt_x");
  gkrt_tensor y = add_tensor(g, 16, GKRT_TENSOR_OUTPUT, "cnt_y");
  gkrt_kernel *cb = NULL, *fill = builtin_kernel(rt, GKRT_BUILTIN_FILL), *add = builtin_kernel(rt, GKRT_BUILTIN_ADD);
  OK(gkrt_kernel_from_callback(rt, noop_cb, NULL, &cb));
  const uint64_t ws = 64;
  const float one = 1.0f;
  const size_t past8 = (size_t)PTRDIFF_MAX / 8 + 1; /* 8-byte elements: past PTRDIFF_MAX bytes */
  const size_t past1 = (size_t)PTRDIFF_MAX + 1;
  gkrt_tensor xx[2] = {x, x};
  uint32_t node = 0xabcd;
  gkrt_status st = GKRT_STATUS_OK;
  uint64_t count = 0;
  int expect_unsupported_too = 0;
  switch (which) {
    case 0: count = past8; st = gkrt_graph_add_kernel(g, cb, &x, past8, &y, 1, NULL, 0, NULL, &node); break;
    case 1: count = SIZE_MAX; st = gkrt_graph_add_kernel(g, cb, &x, SIZE_MAX, &y, 1, NULL, 0, NULL, &node); break;
    case 2: count = past8; st = gkrt_graph_add_kernel(g, cb, &x, 1, &y, past8, NULL, 0, NULL, &node); break;
    case 3: count = SIZE_MAX; st = gkrt_graph_add_kernel(g, cb, &x, 1, &y, SIZE_MAX, NULL, 0, NULL, &node); break;
    case 4: count = past8; st = gkrt_graph_add_kernel(g, cb, &x, 1, &y, 1, &ws, past8, NULL, &node); break;
    case 5: count = SIZE_MAX; st = gkrt_graph_add_kernel(g, cb, &x, 1, &y, 1, &ws, SIZE_MAX, NULL, &node); break;
    case 6: { /* built-in, wrong arity by a count near 2^64 */
      count = SIZE_MAX;
      st = gkrt_graph_add_kernel(g, add, xx, SIZE_MAX, &y, 1, NULL, 0, NULL, &node);
      break;
    }
    case 7: {
      gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &one, past1};
      count = past1;
      st = gkrt_graph_add_kernel(g, cb, &x, 1, &y, 1, NULL, 0, &l, &node);
      break;
    }
    case 8: {
      gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &one, SIZE_MAX};
      count = SIZE_MAX;
      st = gkrt_graph_add_kernel(g, cb, &x, 1, &y, 1, NULL, 0, &l, &node);
      break;
    }
    case 9: {
      gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &one, SIZE_MAX};
      count = SIZE_MAX;
      st = gkrt_graph_add_kernel(g, fill, NULL, 0, &y, 1, NULL, 0, &l, &node);
      break;
    }
    case 10: {
      gkrt_kernel *k = (gkrt_kernel *)(uintptr_t)0x5e47;
      const unsigned char image[4] = {0};
      count = SIZE_MAX;
      expect_unsupported_too = 1;
      st = gkrt_kernel_from_cubin(rt, image, SIZE_MAX, "f", &k);
      if (k != (gkrt_kernel *)(uintptr_t)0x5e47) {
        fprintf(stderr, "case %d: out written on failure\n", which);
        test_failures++;
      }
      break;
    }
    case 11: {
      gkrt_kernel *k = (gkrt_kernel *)(uintptr_t)0x5e47;
      const char *opt = "-O3";
      count = past8;
      expect_unsupported_too = 1;
      st = gkrt_kernel_from_source(rt, "extern \"C\" __global__ void f() {}", "f", &opt, past8, &k);
      if (k != (gkrt_kernel *)(uintptr_t)0x5e47) {
        fprintf(stderr, "case %d: out written on failure\n", which);
        test_failures++;
      }
      break;
    }
    default: return 2;
  }
  int ok = st == GKRT_STATUS_INVALID_ARGUMENT || (expect_unsupported_too && st == GKRT_STATUS_UNSUPPORTED);
  if (!ok) {
    fprintf(stderr, "case %d: -> %s (%s), expected GKRT_STATUS_INVALID_ARGUMENT naming %llu\n", which,
            gkrt_status_name(st), last_error(), (unsigned long long)count);
    test_failures++;
  } else if (st == GKRT_STATUS_INVALID_ARGUMENT) {
    MSG_HAS_U64(count);
  }
  CHECK_EQ_U64(node, 0xabcd);
  CHECK_EQ_U64(info_of(g).num_nodes, 0);
  /* The graph and runtime still work. */
  OK(gkrt_graph_add_kernel(g, fill, NULL, 0, &y, 1, NULL, 0, &(gkrt_launch){{1, 1, 1}, {1, 1, 1}, 0, &one, 4}, NULL));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_runtime_run(rt, g));
  float yv[4];
  OK(gkrt_graph_read_tensor(g, y, yv, sizeof yv));
  for (int i = 0; i < 4; i++) CHECK(yv[i] == 1.0f);
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(cb));
  OK(gkrt_kernel_release(fill));
  OK(gkrt_kernel_release(add));
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_failures ? 1 : 0;
}

enum { CASES = 12 };

int main(int argc, char **argv) {
  if (argc == 2) return run_case(atoi(argv[1])); /* one case, in this process (for a debugger) */
  int failed = 0;
  for (int c = 0; c < CASES; c++) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) _exit(run_case(c));
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      printf("case %d: passed\n", c);
    } else if (WIFEXITED(status)) {
      fprintf(stderr, "case %d: failed (exit %d); rerun alone with: %s %d\n", c, WEXITSTATUS(status), argv[0], c);
      failed++;
    } else {
      fprintf(stderr, "case %d: killed by signal %d; rerun alone with: %s %d\n", c,
              WIFSIGNALED(status) ? WTERMSIG(status) : -1, argv[0], c);
      failed++;
    }
  }
  if (failed) {
    fprintf(stderr, "api_limits_counts: %d of %d case(s) failed\n", failed, CASES);
    return 1;
  }
  return test_done("api_limits_counts");
}
