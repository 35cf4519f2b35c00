/*
 * gkrt_runtime_trace_begin / gkrt_runtime_trace_end: bad input gets a status and a message and
 * leaves the runtime usable; a trace of two runs of a two-node graph names both nodes twice on the
 * compute track and samples the memory counters. (python/tests/test_trace.py parses the JSON.)
 * Runs on the host backend and, with GKRT_DEVICE=cuda, on a GPU.
 */
#include "test_util.h"

#include <unistd.h>

/* The file's bytes, NUL-terminated; NULL when it cannot be read. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = 0;
  fclose(f);
  return buf;
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

int main(void) {
  gkrt_runtime *rt = test_runtime(64ull << 20);
  char path[] = "/tmp/gkrt_api_trace_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);

  FAILS(gkrt_runtime_trace_begin(NULL), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  FAILS(gkrt_runtime_trace_end(rt, path), GKRT_STATUS_INVALID_STATE, "no trace");
  OK(gkrt_runtime_trace_begin(rt));
  FAILS(gkrt_runtime_trace_end(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "path");
  FAILS(gkrt_runtime_trace_end(rt, "/nonexistent-gkrt-dir/t.json"), GKRT_STATUS_INVALID_ARGUMENT,
        "/nonexistent-gkrt-dir/t.json");
  /* That trace was dropped: ending again finds none. */
  FAILS(gkrt_runtime_trace_end(rt, path), GKRT_STATUS_INVALID_STATE, "no trace");

  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x, h, y;
  OK(gkrt_graph_add_tensor(g, 4096, GKRT_TENSOR_INPUT, "x", &x));
  OK(gkrt_graph_add_tensor(g, 4096, GKRT_TENSOR_INTERMEDIATE, "h", &h));
  OK(gkrt_graph_add_tensor(g, 4096, GKRT_TENSOR_OUTPUT, "y", &y));
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU), *copy = builtin_kernel(rt, GKRT_BUILTIN_COPY);
  uint32_t n0, n1;
  OK(gkrt_graph_add_kernel(g, relu, &x, 1, &h, 1, NULL, 0, NULL, &n0));
  OK(gkrt_graph_add_kernel(g, copy, &h, 1, &y, 1, NULL, 0, NULL, &n1));
  OK(gkrt_graph_set_node_name(g, n0, "first_relu"));
  OK(gkrt_graph_set_node_name(g, n1, "then_copy"));
  OK(gkrt_graph_finalize(g));
  float data[1024] = {0};
  OK(gkrt_graph_write_tensor(g, x, data, sizeof data));

  OK(gkrt_runtime_run(rt, g)); /* not traced */
  OK(gkrt_runtime_trace_begin(rt));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_runtime_trace_end(rt, path));
  OK(gkrt_runtime_run(rt, g)); /* not traced either */
  char *json = slurp(path);
  CHECK(json != NULL);
  if (json) {
    CHECK(strncmp(json, "{\"displayTimeUnit\"", 18) == 0);
    CHECK_EQ_U64((uint64_t)count(json, "\"name\":\"node 0 'first_relu'"), 2);
    CHECK_EQ_U64((uint64_t)count(json, "\"name\":\"node 1 'then_copy'"), 2);
    /* Counters are sampled where they change (before a node, at a run's end): at least once a
     * run, at most three times a run. */
    int samples = count(json, "\"name\":\"allocated bytes\"");
    CHECK(samples >= 2 && samples <= 6);
    CHECK_EQ_U64((uint64_t)count(json, "\"name\":\"gkrt_run\""), 2);
    CHECK(count(json, "\"runs\":2") == 1);
    free(json);
  }
  OK(gkrt_kernel_release(relu));
  OK(gkrt_kernel_release(copy));
  OK(gkrt_graph_release(g));
  unlink(path);
  OK(gkrt_runtime_release(rt));
  return test_done("api_trace");
}
