/*
 * api_comm: communicators on the host backend. Four runtimes in four threads join one unique id
 * and each sees its rank; every argument error (NULL pointers, a rank out of range, an id not
 * made by gkrt, a second join of one rank, a different number of ranks) is refused with a
 * message; a rank alone times out with GKRT_STATUS_PEER_FAILED instead of hanging; abort,
 * release (NULL, twice, a handle of another kind) and release order (the communicator keeps its
 * runtime alive). Wrapping an NCCL communicator is refused on the host backend. On CUDA the
 * communicator is NCCL's: one rank joins, sees its rank, argument errors are refused, and it is
 * released; without libnccl the status is UNSUPPORTED naming the library names searched.
 */
#include "test_util.h"

#include <pthread.h>

#define RANKS 4

struct rank_arg {
  gkrt_unique_id id;
  uint32_t rank;
  gkrt_status status;
  uint32_t seen_rank, seen_nranks;
};

static void *join(void *p) {
  struct rank_arg *a = p;
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_HOST, GKRT_MEMORY_DYNAMIC, 0, 0, 1);
  gkrt_comm *c = NULL;
  a->status = gkrt_comm_init_rank(rt, &a->id, a->rank, RANKS, 10000, &c);
  if (a->status == GKRT_STATUS_OK) {
    OK(gkrt_comm_rank(c, &a->seen_rank, &a->seen_nranks));
    OK(gkrt_comm_release(c));
  }
  OK(gkrt_runtime_release(rt));
  return NULL;
}

int main(void) {
  gkrt_runtime *rt = runtime_with(GKRT_DEVICE_HOST, GKRT_MEMORY_DYNAMIC, 0, 0, 1);
  if (!test_on_host(rt)) {
    gkrt_unique_id id;
    gkrt_comm *c = NULL;
    gkrt_status st = gkrt_comm_get_unique_id(rt, &id);
    if (st == GKRT_STATUS_UNSUPPORTED) {
      MSG_HAS("libnccl.so");
      printf("api_comm: NCCL missing (%s)\n", last_error());
    } else {
      OK(st);
      FAILS(gkrt_comm_init_rank(rt, &id, 1, 1, 5000, &c), GKRT_STATUS_INVALID_ARGUMENT, "rank 1 of 1");
      FAILS(gkrt_comm_init_rank(rt, &id, 0, 0, 5000, &c), GKRT_STATUS_INVALID_ARGUMENT, "at least 1");
      FAILS(gkrt_comm_wrap_nccl(rt, NULL, 0, 1, 0, &c), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
      OK(gkrt_comm_init_rank(rt, &id, 0, 1, 20000, &c));
      uint32_t rank = 9, nranks = 9;
      OK(gkrt_comm_rank(c, &rank, &nranks));
      CHECK_EQ_U64(rank, 0);
      CHECK_EQ_U64(nranks, 1);
      OK(gkrt_comm_release(c));
      printf("api_comm: NCCL communicator of one rank made and released\n");
    }
    OK(gkrt_runtime_release(rt));
    return test_done("api_comm");
  }

  /* Wrapping a native communicator: the host backend has no NCCL. */
  {
    gkrt_comm *w = NULL;
    int fake_nccl_comm = 0;
    FAILS(gkrt_comm_wrap_nccl(rt, &fake_nccl_comm, 0, 1, 0, &w), GKRT_STATUS_UNSUPPORTED, "wrapping");
    FAILS(gkrt_comm_wrap_nccl(rt, NULL, 0, 1, 0, &w), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
    FAILS(gkrt_comm_wrap_nccl(rt, &fake_nccl_comm, 0, 1, 0, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
    CHECK(w == NULL);
  }

  /* Four ranks, one id. */
  struct rank_arg args[RANKS];
  pthread_t threads[RANKS];
  gkrt_unique_id id;
  OK(gkrt_comm_get_unique_id(rt, &id));
  for (uint32_t r = 0; r < RANKS; r++) {
    args[r].id = id;
    args[r].rank = r;
    args[r].seen_rank = args[r].seen_nranks = 999;
    CHECK(pthread_create(&threads[r], NULL, join, &args[r]) == 0);
  }
  for (uint32_t r = 0; r < RANKS; r++) {
    CHECK(pthread_join(threads[r], NULL) == 0);
    CHECK_EQ_U64(args[r].status, GKRT_STATUS_OK);
    CHECK_EQ_U64(args[r].seen_rank, r);
    CHECK_EQ_U64(args[r].seen_nranks, RANKS);
  }
  /* Two ids are never equal. */
  gkrt_unique_id id2;
  OK(gkrt_comm_get_unique_id(rt, &id2));
  CHECK(memcmp(&id, &id2, sizeof id) != 0);

  /* Bad arguments. */
  gkrt_comm *sentinel = (gkrt_comm *)(uintptr_t)0x5e47, *c = sentinel;
  FAILS(gkrt_comm_get_unique_id(rt, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_comm_get_unique_id(NULL, &id2), GKRT_STATUS_INVALID_ARGUMENT, "runtime");
  FAILS(gkrt_comm_init_rank(rt, NULL, 0, 1, 50, &c), GKRT_STATUS_INVALID_ARGUMENT, "id");
  FAILS(gkrt_comm_init_rank(rt, &id2, 0, 1, 50, NULL), GKRT_STATUS_INVALID_ARGUMENT, "out");
  FAILS(gkrt_comm_init_rank(rt, &id2, 4, 4, 50, &c), GKRT_STATUS_INVALID_ARGUMENT, "rank 4 of 4");
  FAILS(gkrt_comm_init_rank(rt, &id2, 0, 0, 50, &c), GKRT_STATUS_INVALID_ARGUMENT, "at least 1");
  gkrt_unique_id zeros;
  memset(&zeros, 0, sizeof zeros);
  FAILS(gkrt_comm_init_rank(rt, &zeros, 0, 1, 50, &c), GKRT_STATUS_INVALID_ARGUMENT,
        "not made by gkrt_comm_get_unique_id");
  CHECK(c == sentinel);

  /* A rank alone: the others never come, and the wait ends. */
  FAILS(gkrt_comm_init_rank(rt, &id2, 0, 2, 100, &c), GKRT_STATUS_PEER_FAILED, "rank(s) 1 to join");
  MSG_HAS("timed out after 100 ms");
  CHECK(c == sentinel);

  /* One rank of one: abort, then rank still answers; release; twice is an error. */
  gkrt_unique_id id3;
  OK(gkrt_comm_get_unique_id(rt, &id3));
  OK(gkrt_comm_init_rank(rt, &id3, 0, 1, 0, &c));
  /* Used up once every rank joined. */
  gkrt_comm *c2 = NULL;
  FAILS(gkrt_comm_init_rank(rt, &id3, 0, 2, 50, &c2), GKRT_STATUS_PEER_FAILED, "to join");
  OK(gkrt_comm_abort(c));
  uint32_t rank = 9, nranks = 9;
  OK(gkrt_comm_rank(c, &rank, NULL));
  OK(gkrt_comm_rank(c, NULL, &nranks));
  CHECK_EQ_U64(rank, 0);
  CHECK_EQ_U64(nranks, 1);
  FAILS(gkrt_comm_rank((gkrt_comm *)rt, &rank, NULL), GKRT_STATUS_INVALID_ARGUMENT, "not a communicator");
  FAILS(gkrt_graph_release((gkrt_graph *)c), GKRT_STATUS_INVALID_ARGUMENT, "communicator, not a graph");
  OK(gkrt_comm_release(c));
  FAILS(gkrt_comm_release(c), GKRT_STATUS_INVALID_ARGUMENT, "not live");
  FAILS(gkrt_comm_abort(c), GKRT_STATUS_INVALID_ARGUMENT, "not live");
  OK(gkrt_comm_release(NULL));

  /* A communicator keeps its runtime alive: release the runtime first. */
  gkrt_unique_id id4;
  OK(gkrt_comm_get_unique_id(rt, &id4));
  OK(gkrt_comm_init_rank(rt, &id4, 0, 1, 0, &c));
  OK(gkrt_runtime_release(rt));
  OK(gkrt_comm_rank(c, &rank, &nranks));
  OK(gkrt_comm_release(c));
  return test_done("api_comm");
}
