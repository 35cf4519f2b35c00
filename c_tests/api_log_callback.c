/*
 * api_log_callback: gkrt_set_log_callback sends every message the library writes to the host's
 * callback instead of stderr (level, target, message), and NULL sends them to stderr again.
 * stderr goes to a temporary file, which must hold no gkrt line while the callback is set.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "test_util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int count, by_level[6], bad;
static char last_info[512];

static void on_log(uint32_t level, const char *target, const char *message, void *user) {
  pthread_mutex_lock(&mu);
  count++;
  if (level < 1 || level > 5 || user != (void *)&mu || strncmp(target, "gkrt", 4) != 0 || message[0] == 0)
    bad++;
  else
    by_level[level]++;
  if (level == 3) snprintf(last_info, sizeof last_info, "%s", message);
  pthread_mutex_unlock(&mu);
}

/* A graph whose one node needs more than the limit: finalize warns about it. */
static void finalize_a_node_too_large(gkrt_runtime *rt) {
  gkrt_kernel *relu = builtin_kernel(rt, GKRT_BUILTIN_RELU);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));
  gkrt_tensor x = add_tensor(g, 1 << 20, GKRT_TENSOR_INPUT, "x");
  gkrt_tensor y = add_tensor(g, 1 << 20, GKRT_TENSOR_OUTPUT, "y");
  OK(add_node(g, relu, &x, 1, y, NULL, 0));
  OK(gkrt_graph_finalize(g));
  OK(gkrt_graph_release(g));
  OK(gkrt_kernel_release(relu));
}

static long gkrt_lines(FILE *f) {
  fflush(stderr);
  rewind(f);
  char line[1024];
  long n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, "[gkrt") != NULL;
  return n;
}

int main(void) {
  FILE *err = tmpfile();
  CHECK(err != NULL);
  int saved = dup(2);
  dup2(fileno(err), 2);

  OK(gkrt_set_log_callback(on_log, &mu));
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_HOST, GKRT_MEMORY_DYNAMIC, 1 << 20, 0, 3); /* info: "gkrt runtime on ..." */
  finalize_a_node_too_large(rt);                 /* a warning */
  pthread_mutex_lock(&mu);
  int infos = by_level[3], warnings = by_level[2], bad_calls = bad;
  pthread_mutex_unlock(&mu);
  CHECK(infos >= 1);
  CHECK(strstr(last_info, "gkrt runtime on") != NULL || infos > 1);
  CHECK(warnings >= 1);
  CHECK_EQ_U64(bad_calls, 0);
  CHECK_EQ_U64(gkrt_lines(err), 0); /* nothing on stderr while the callback is set */

  /* Back to stderr: the same messages land there, and the callback hears nothing more. */
  OK(gkrt_set_log_callback(NULL, NULL));
  pthread_mutex_lock(&mu);
  int before = count;
  pthread_mutex_unlock(&mu);
  gkrt_runtime *rt2 = runtime_with(GKRT_DEVICE_HOST, GKRT_MEMORY_DYNAMIC, 1 << 20, 0, 3);
  finalize_a_node_too_large(rt2);
  CHECK(gkrt_lines(err) >= 2);
  pthread_mutex_lock(&mu);
  CHECK_EQ_U64(count, before);
  pthread_mutex_unlock(&mu);

  OK(gkrt_runtime_release(rt));
  OK(gkrt_runtime_release(rt2));
  dup2(saved, 2);
  close(saved);
  fclose(err);
  return test_done("api_log_callback");
}
