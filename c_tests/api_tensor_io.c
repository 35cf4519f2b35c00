/*
 * api_tensor_io: gkrt_graph_write_tensor / gkrt_graph_read_tensor. Sizes that do not match
 * (the message names both sizes and the tensor), zero and huge sizes, reads before anything was
 * written or run, intermediates (never readable or writable), NULL data, NULL/unknown/foreign
 * ids, a run with an input never written (an error naming it), exact round trips of arbitrary
 * bytes, and that data is copied at the call (the caller's buffer is not used afterwards).
 */
#include "test_util.h"

enum { N = 250, BYTES = N * 4, RAW = 1001 };

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *add = builtin_kernel(rt, GKRT_BUILTIN_ADD), *scale = builtin_kernel(rt, GKRT_BUILTIN_SCALE);
  gkrt_kernel *copy = builtin_kernel(rt, GKRT_BUILTIN_COPY);
  gkrt_graph *g, *other;
  OK(gkrt_graph_create(rt, &g));
  OK(gkrt_graph_create(rt, &other));
  gkrt_tensor x = add_tensor(g, BYTES, GKRT_TENSOR_INPUT, "x_in");
  gkrt_tensor w = add_tensor(g, BYTES, GKRT_TENSOR_PARAMETER, "w_param");
  gkrt_tensor mid = add_tensor(g, BYTES, GKRT_TENSOR_INTERMEDIATE, "mid_t");
  gkrt_tensor y = add_tensor(g, BYTES, GKRT_TENSOR_OUTPUT, "y_out");
  gkrt_tensor raw = add_tensor(g, RAW, GKRT_TENSOR_INPUT, "raw_bytes");
  gkrt_tensor raw_out = add_tensor(g, RAW, GKRT_TENSOR_OUTPUT, "raw_out");
  gkrt_tensor foreign = add_tensor(other, BYTES, GKRT_TENSOR_INPUT, "foreign_in");
  gkrt_tensor xw[2] = {x, w};
  const float two = 2.0f;
  OK(add_node(g, add, xw, 2, mid, NULL, 0));
  OK(add_node(g, scale, &mid, 1, y, &two, sizeof two));
  OK(add_node(g, copy, &raw, 1, raw_out, NULL, 0));

  float xv[N], wv[N], yv[N], want[N], tmp[N + 8];
  unsigned char rawv[RAW], raw_back[RAW + 8];
  fill_floats(xv, N, 11);
  fill_floats(wv, N, 12);
  fill_bytes(rawv, RAW, 13);
  const uint64_t base_alloc = allocated_bytes(rt);

  /* --- Reads before anything was written or run: INVALID_STATE naming the tensor. --- */
  FAILS(gkrt_graph_read_tensor(g, x, tmp, BYTES), GKRT_STATUS_INVALID_STATE, "x_in");
  FAILS(gkrt_graph_read_tensor(g, w, tmp, BYTES), GKRT_STATUS_INVALID_STATE, "w_param");
  FAILS(gkrt_graph_read_tensor(g, y, tmp, BYTES), GKRT_STATUS_INVALID_STATE, "y_out");

  /* --- Sizes that do not match: the message names the tensor and both sizes. --- */
  const size_t bad_sizes[] = {BYTES - 1, BYTES + 4, 4, 0, (size_t)1 << 40, SIZE_MAX};
  for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
    FAILS(gkrt_graph_write_tensor(g, x, xv, bad_sizes[i]), GKRT_STATUS_INVALID_ARGUMENT, "x_in");
    MSG_HAS_U64(bad_sizes[i]);
    MSG_HAS_U64(BYTES);
  }
  /* None of them wrote anything or took memory. */
  FAILS(gkrt_graph_read_tensor(g, x, tmp, BYTES), GKRT_STATUS_INVALID_STATE, "x_in");
  CHECK_EQ_U64(allocated_bytes(rt), base_alloc);

  /* --- Intermediates can be neither written nor read. --- */
  FAILS(gkrt_graph_write_tensor(g, mid, xv, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "mid_t");
  FAILS(gkrt_graph_read_tensor(g, mid, tmp, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "mid_t");

  /* --- NULL data, NULL graph, wrong handles, unknown and foreign ids. --- */
  FAILS(gkrt_graph_write_tensor(g, x, NULL, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "data");
  FAILS(gkrt_graph_read_tensor(g, x, NULL, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "data");
  FAILS(gkrt_graph_write_tensor(g, x, NULL, 0), GKRT_STATUS_INVALID_ARGUMENT, "data");
  FAILS(gkrt_graph_write_tensor(NULL, x, xv, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_read_tensor(NULL, x, tmp, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "graph");
  FAILS(gkrt_graph_write_tensor((gkrt_graph *)rt, x, xv, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_graph_read_tensor((gkrt_graph *)add, x, tmp, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "kernel");
  const gkrt_tensor unknown[] = {0, x + 100, UINT64_MAX, foreign};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    FAILS(gkrt_graph_write_tensor(g, unknown[i], xv, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "tensor");
    MSG_HAS_U64(unknown[i]);
    FAILS(gkrt_graph_read_tensor(g, unknown[i], tmp, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "tensor");
    MSG_HAS_U64(unknown[i]);
  }
  FAILS(gkrt_graph_write_tensor(other, x, xv, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "tensor");
  MSG_HAS_U64(x);
  CHECK_EQ_U64(allocated_bytes(rt), base_alloc);

  /* --- Writing before finalize is allowed; round trip is exact; reads do not overrun. --- */
  OK(gkrt_graph_write_tensor(g, x, xv, BYTES));
  memset(tmp, 0x5A, sizeof tmp);
  OK(gkrt_graph_read_tensor(g, x, tmp, BYTES));
  CHECK(memcmp(tmp, xv, BYTES) == 0);
  for (size_t i = BYTES; i < sizeof tmp; i++) CHECK(((unsigned char *)tmp)[i] == 0x5A);
  /* A read of the wrong size names both sizes, and writes nothing into the buffer. */
  memset(tmp, 0x5A, sizeof tmp);
  FAILS(gkrt_graph_read_tensor(g, x, tmp, BYTES + 4), GKRT_STATUS_INVALID_ARGUMENT, "x_in");
  MSG_HAS_U64(BYTES + 4);
  MSG_HAS_U64(BYTES);
  FAILS(gkrt_graph_read_tensor(g, x, tmp, BYTES - 1), GKRT_STATUS_INVALID_ARGUMENT, "x_in");
  MSG_HAS_U64(BYTES - 1);
  FAILS(gkrt_graph_read_tensor(g, x, tmp, 0), GKRT_STATUS_INVALID_ARGUMENT, "x_in");
  FAILS(gkrt_graph_read_tensor(g, x, tmp, SIZE_MAX), GKRT_STATUS_INVALID_ARGUMENT, "x_in");
  MSG_HAS_U64(SIZE_MAX);
  for (size_t i = 0; i < sizeof tmp; i++) CHECK(((unsigned char *)tmp)[i] == 0x5A);
  OK(gkrt_graph_finalize(g));

  /* --- Running with inputs never written: an error naming the one missing. --- */
  gkrt_stats before = stats_of(rt);
  gkrt_status st = gkrt_runtime_run(rt, g);
  CHECK(st == GKRT_STATUS_INVALID_STATE || st == GKRT_STATUS_INVALID_ARGUMENT);
  MSG_HAS("w_param");
  CHECK_EQ_U64(allocated_bytes(rt), before.allocated_bytes);
  OK(gkrt_graph_write_tensor(g, w, wv, BYTES));
  st = gkrt_runtime_run(rt, g);
  CHECK(st == GKRT_STATUS_INVALID_STATE || st == GKRT_STATUS_INVALID_ARGUMENT);
  MSG_HAS("raw_bytes");
  CHECK_EQ_U64(allocated_bytes(rt), before.allocated_bytes + 1024); /* only w's memory was added */
  /* The outputs were not produced by those failed runs. */
  FAILS(gkrt_graph_read_tensor(g, y, tmp, BYTES), GKRT_STATUS_INVALID_STATE, "y_out");
  CHECK_RUNTIME_WORKS(rt);

  /* --- Arbitrary bytes (NaN patterns, odd length) round-trip through copy exactly. --- */
  OK(gkrt_graph_write_tensor(g, raw, rawv, RAW));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, yv, BYTES));
  for (int i = 0; i < N; i++) want[i] = two * (xv[i] + wv[i]);
  CHECK_BITS(yv, want, N);
  memset(raw_back, 0xC3, sizeof raw_back);
  OK(gkrt_graph_read_tensor(g, raw_out, raw_back, RAW));
  CHECK(memcmp(raw_back, rawv, RAW) == 0);
  CHECK(raw_back[RAW] == 0xC3);
  OK(gkrt_graph_read_tensor(g, raw, raw_back, RAW));
  CHECK(memcmp(raw_back, rawv, RAW) == 0);

  /* --- The data is copied at the call: changing the caller's buffer afterwards changes
   * nothing; a new write does. Parameters persist across runs. --- */
  float xv2[N];
  memcpy(xv2, xv, BYTES);
  OK(gkrt_graph_write_tensor(g, x, xv2, BYTES));
  for (int i = 0; i < N; i++) xv2[i] = 1000.0f;
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, yv, BYTES));
  CHECK_BITS(yv, want, N);
  fill_floats(xv, N, 21);
  OK(gkrt_graph_write_tensor(g, x, xv, BYTES));
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, yv, BYTES));
  for (int i = 0; i < N; i++) want[i] = two * (xv[i] + wv[i]);
  CHECK_BITS(yv, want, N);

  /* --- Outputs may be written by the host too; a run then overwrites them. --- */
  float mark[N];
  fill_floats(mark, N, 31);
  OK(gkrt_graph_write_tensor(g, y, mark, BYTES));
  OK(gkrt_graph_read_tensor(g, y, yv, BYTES));
  CHECK_BITS(yv, mark, N);
  OK(gkrt_runtime_run(rt, g));
  OK(gkrt_graph_read_tensor(g, y, yv, BYTES));
  CHECK_BITS(yv, want, N);
  /* Intermediates are still off limits after runs. */
  FAILS(gkrt_graph_read_tensor(g, mid, tmp, BYTES), GKRT_STATUS_INVALID_ARGUMENT, "mid_t");

  /* --- Persistent memory is exactly the persistent tensors (rounded to 256): x, w, y 1000 -> 1024
   * each, raw and raw_out 1001 -> 1024 each. --- */
  CHECK_EQ_U64(allocated_bytes(rt) - base_alloc, 5 * 1024);
  CHECK_EQ_U64(info_of(g).persistent_bytes, 5 * 1024);
  CHECK_RUNTIME_WORKS(rt);

  OK(gkrt_graph_release(g));
  OK(gkrt_graph_release(other));
  CHECK_EQ_U64(allocated_bytes(rt), base_alloc);
  OK(gkrt_kernel_release(add));
  OK(gkrt_kernel_release(scale));
  OK(gkrt_kernel_release(copy));
  OK(gkrt_runtime_release(rt));
  return test_done("api_tensor_io");
}
