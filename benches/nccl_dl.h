/*
 * NCCL loaded at run time for the collective benches (collective_overhead.c,
 * collective_bandwidth.c): the few declarations they use, so the build needs no NCCL headers,
 * and load_nccl(), which finds libnccl.so.2 (or libnccl.so) on the loader's path and exits with a
 * message naming what is missing.
 */
#ifndef GKRT_BENCH_NCCL_DL_H
#define GKRT_BENCH_NCCL_DL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>

typedef struct {
  char internal[128];
} nccl_id;
typedef void *nccl_comm;
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 };
static int (*nccl_get_unique_id)(nccl_id *);
static int (*nccl_comm_init_rank)(nccl_comm *, int, nccl_id, int);
static int (*nccl_all_reduce)(const void *, void *, size_t, int, int, nccl_comm, CUstream);
static int (*nccl_all_gather)(const void *, void *, size_t, int, nccl_comm, CUstream);
static int (*nccl_reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm, CUstream);
static int (*nccl_comm_register)(nccl_comm, void *, size_t, void **);
static int (*nccl_comm_deregister)(nccl_comm, void *);
static int (*nccl_comm_destroy)(nccl_comm);
static const char *(*nccl_error_string)(int);

#define NC(call)                                                                              \
  do {                                                                                        \
    int r_ = (call);                                                                          \
    if (r_ != 0) {                                                                            \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, nccl_error_string(r_)); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "libnccl lacks %s\n", name);
    exit(1);
  }
  return p;
}

static void load_nccl(void) {
  void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "no libnccl.so.2 / libnccl.so on the loader's path: %s\n", dlerror());
    exit(1);
  }
  *(void **)&nccl_get_unique_id = sym(lib, "ncclGetUniqueId");
  *(void **)&nccl_comm_init_rank = sym(lib, "ncclCommInitRank");
  *(void **)&nccl_all_reduce = sym(lib, "ncclAllReduce");
  *(void **)&nccl_all_gather = sym(lib, "ncclAllGather");
  *(void **)&nccl_reduce_scatter = sym(lib, "ncclReduceScatter");
  *(void **)&nccl_comm_register = sym(lib, "ncclCommRegister");
  *(void **)&nccl_comm_deregister = sym(lib, "ncclCommDeregister");
  *(void **)&nccl_comm_destroy = sym(lib, "ncclCommDestroy");
  *(void **)&nccl_error_string = sym(lib, "ncclGetErrorString");
}

#endif
