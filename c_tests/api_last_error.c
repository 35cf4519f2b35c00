/*
 * api_last_error: gkrt_last_error_message — the length-only query, truncation to the buffer,
 * NUL termination, and that the text stays until the next failing call (successful calls do
 * not clear or change it).
 */
#include "test_util.h"

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_graph *g;
  OK(gkrt_graph_create(rt, &g));

  /* A failure whose message names a size we choose. */
  gkrt_tensor t = 12345;
  FAILS(gkrt_graph_add_tensor(g, 0, GKRT_TENSOR_INPUT, "zero_sized_tensor", &t), GKRT_STATUS_INVALID_ARGUMENT,
        "zero_sized_tensor");
  CHECK_EQ_U64(t, 12345); /* out-parameters are written only on success */

  /* Length only: NULL buffer, or a zero length (the buffer is then not touched). */
  size_t len = gkrt_last_error_message(NULL, 0);
  CHECK(len > strlen("zero_sized_tensor"));
  CHECK_EQ_U64(gkrt_last_error_message(NULL, 100), len);
  char untouched[4] = {'a', 'b', 'c', 'd'};
  CHECK_EQ_U64(gkrt_last_error_message(untouched, 0), len);
  CHECK(memcmp(untouched, "abcd", 4) == 0);

  /* The full message. */
  char *full = malloc(len + 1 + 16);
  memset(full, 'X', len + 1 + 16);
  CHECK_EQ_U64(gkrt_last_error_message(full, len + 1 + 16), len);
  CHECK_EQ_U64(strlen(full), len);
  CHECK(strstr(full, "zero_sized_tensor") != NULL);
  CHECK(full[len + 1] == 'X'); /* nothing written past the NUL */

  /* Truncated: len - 1 bytes and a NUL, returns the full length, writes nothing beyond. */
  char small[8];
  memset(small, 'Y', sizeof small);
  CHECK_EQ_U64(gkrt_last_error_message(small, 5), len);
  CHECK(memcmp(small, full, 4) == 0);
  CHECK(small[4] == '\0');
  CHECK(small[5] == 'Y');
  char one[2] = {'Z', 'Z'};
  CHECK_EQ_U64(gkrt_last_error_message(one, 1), len);
  CHECK(one[0] == '\0' && one[1] == 'Z');
  /* Exactly fitting. */
  char *exact = malloc(len + 1);
  CHECK_EQ_U64(gkrt_last_error_message(exact, len + 1), len);
  CHECK(strcmp(exact, full) == 0);
  free(exact);

  /* Successful calls leave the last error as it was. */
  gkrt_tensor x = add_tensor(g, 64, GKRT_TENSOR_INPUT, "x");
  gkrt_stats s;
  OK(gkrt_runtime_stats(rt, &s));
  float data[16] = {0};
  OK(gkrt_graph_write_tensor(g, x, data, sizeof data));
  CHECK_RUNTIME_WORKS(rt);
  CHECK_EQ_STR(last_error(), full);

  /* The next failure replaces it. */
  FAILS(gkrt_graph_add_tensor(g, 77, 9999, "bad_kind_tensor", &t), GKRT_STATUS_INVALID_ARGUMENT, "kind");
  MSG_HAS_U64(9999);
  CHECK(strstr(last_error(), "zero_sized_tensor") == NULL);
  free(full);

  OK(gkrt_graph_release(g));
  OK(gkrt_runtime_release(rt));
  return test_done("api_last_error");
}
