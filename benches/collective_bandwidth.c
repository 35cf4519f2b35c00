/*
 * Collective bandwidth on 1..8 GPUs (issue 16): all-reduce, all-gather and reduce-scatter as gkrt
 * collective nodes against plain NCCL calls on the same sizes, in the same process, through the
 * same communicator. One process is one rank on device = rank.
 *
 * The program makes one NCCL communicator (ncclCommInitRank; rank 0 writes the unique id to
 * --id-file, the others poll for it) and hands it to gkrt with gkrt_comm_wrap_nccl, so the two
 * columns differ only by gkrt's own cost and by where the buffers live: gkrt's in the runtime's
 * pool (registered with the communicator by gkrt, ncclCommRegister), the plain calls' in
 * cuMemAlloc buffers of this program (registered too with --plain-register 1, the default, so
 * both sides register alike). NCCL_LOCAL_REGISTER=0 in the environment makes NCCL ignore every
 * registration: run.sh runs the bench with and without it (registered against unregistered).
 *
 * Sizes S (nccl-tests' convention: the larger buffer): 1 MiB, 4 MiB, ... up to --max-mib
 * (default 1024). all-reduce S -> S, all-gather S/n -> S, reduce-scatter S -> S/n, f32 sum, out
 * of place. "ar_fused" is an all-reduce over a fused block: four intermediates of S/4 made by
 * FILL nodes, one all-reduce node over the four (one collective call on their contiguous block),
 * COPY nodes to outputs; its gkrt_us is that graph's median less the same graph without the
 * all-reduce (measured beside it: the fills and copies), so it is the collective's share only.
 *
 * Each result is checked once before timing (every rank's input is rank+1: sums are n(n+1)/2,
 * all-gather's slot r is r+1); then median microseconds over --reps calls, each a
 * gkrt_runtime_run (collective graphs run synchronously) or an NCCL call and
 * cuStreamSynchronize. Printed per size: time, algbw = S/time, busbw (all-reduce algbw*2(n-1)/n,
 * the others algbw*(n-1)/n; "-" on one rank, where nothing crosses a link), and ratio = plain
 * time / gkrt time (gkrt's bandwidth as a share of plain NCCL's; the goal is >= 0.97 at 64 MiB
 * and above with n >= 2).
 *
 * Fault mode (--hold SECONDS): every rank runs a 64 MiB all-reduce graph over and over for up to
 * SECONDS with the communicator's timeout --timeout-ms; the caller kills one rank meanwhile. A
 * surviving rank prints "FAULT rank R: run N failed after T ms (M runs succeeded before): STATUS:
 * message", checks that its runtime still runs a graph without collectives, prints "runtime still
 * usable" and exits 3. A rank that ran the whole time without a failure exits 0 (nobody was killed).
 *
 * Build (on the GPU machine, see scripts/gpu/run.sh mgpu):
 *   cc -O2 benches/collective_bandwidth.c -Iinclude -I$CUDA/include -Llib -lgkrt -lcuda -ldl
 * Run: collective_bandwidth --rank R --nranks N --id-file PATH [--max-mib M] [--reps K]
 *        [--plain-register 0|1] [--timeout-ms T] [--hold SECONDS]
 * NCCL_NVLS_ENABLE=0 is set before the first NCCL call when unset.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "bench_util.h"

#include "nccl_dl.h"

typedef struct options {
  int rank, nranks, reps, plain_register, hold_s;
  unsigned timeout_ms;
  size_t max_bytes;
  const char *id_file;
} options;

static int usage(const char *why) {
  fprintf(stderr,
          "%s\nusage: collective_bandwidth --rank R --nranks N --id-file PATH [--max-mib M] [--reps K] "
          "[--plain-register 0|1] [--timeout-ms T] [--hold SECONDS]\n",
          why);
  return 2;
}

static int parse(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->nranks = 0;
  o->reps = 20;
  o->plain_register = 1;
  o->max_bytes = (size_t)1 << 30;
  int have_rank = 0;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) return usage("every flag takes a value");
    const char *f = argv[i], *v = argv[++i];
    char *end;
    long n = strtol(v, &end, 10);
    if (!strcmp(f, "--id-file")) {
      o->id_file = v;
      continue;
    }
    if (!*v || *end || n < 0) return usage("flag values must be whole numbers >= 0");
    if (!strcmp(f, "--rank")) o->rank = (int)n, have_rank = 1;
    else if (!strcmp(f, "--nranks")) o->nranks = (int)n;
    else if (!strcmp(f, "--reps")) o->reps = (int)n;
    else if (!strcmp(f, "--max-mib")) o->max_bytes = (size_t)n << 20;
    else if (!strcmp(f, "--plain-register")) o->plain_register = n != 0;
    else if (!strcmp(f, "--timeout-ms")) o->timeout_ms = (unsigned)n;
    else if (!strcmp(f, "--hold")) o->hold_s = (int)n;
    else return usage("unknown flag");
  }
  if (!have_rank || o->nranks < 1 || o->nranks > 64 || o->rank >= o->nranks || !o->id_file)
    return usage("give --rank R --nranks N --id-file PATH with 0 <= R < N <= 64");
  if (o->reps < 3 || o->reps > 100000) return usage("--reps must be 3..100000");
  if (o->max_bytes < ((size_t)1 << 20) || o->max_bytes > ((size_t)16 << 30)) return usage("--max-mib must be 1..16384");
  return 0;
}

/* Rank 0 writes the id through a temporary file renamed into place (a reader never sees half of
 * it); the others poll for it for up to two minutes. */
static void share_id(const options *o, nccl_id *id) {
  if (o->rank == 0) {
    NC(nccl_get_unique_id(id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->id_file);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, o->id_file) != 0) {
      fprintf(stderr, "cannot write the id to %s: %s\n", o->id_file, strerror(errno));
      exit(1);
    }
    return;
  }
  for (int tries = 0; tries < 1200; tries++) {
    FILE *f = fopen(o->id_file, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  fprintf(stderr, "rank %d: no id in %s after two minutes\n", o->rank, o->id_file);
  exit(1);
}

enum { AR, AG, RS, NCOLL };
static const char *coll_names[NCOLL] = {"all_reduce", "all_gather", "reduce_scatter"};
static const gkrt_collective coll_kinds[NCOLL] = {GKRT_COLLECTIVE_ALL_REDUCE, GKRT_COLLECTIVE_ALL_GATHER,
                                                  GKRT_COLLECTIVE_REDUCE_SCATTER};

static size_t in_bytes(int c, size_t s, int n) { return c == AG ? s / n : s; }
static size_t out_bytes(int c, size_t s, int n) { return c == RS ? s / n : s; }

/* The value at float index `i` of collective `c`'s output when rank r's input is r+1 everywhere. */
static float expected(int c, size_t i, size_t out_floats, int n) {
  if (c == AG) return (float)(i / (out_floats / n) + 1);
  return (float)n * (n + 1) / 2;
}

static int bad_results;

/* Checks the first and last float of every rank's slot (one slot unless all-gather). */
static void check_floats(const char *what, size_t bytes, int c, int n, const float *first, const float *last,
                         int slot) {
  size_t floats = bytes / 4, per = c == AG ? floats / n : floats;
  float want_first = expected(c, (size_t)slot * per, floats, n), want_last = expected(c, (size_t)slot * per + per - 1, floats, n);
  if (*first != want_first || *last != want_last) {
    fprintf(stderr, "%s %s %zu bytes slot %d: got %g .. %g, want %g .. %g\n", what, coll_names[c], bytes, slot, *first,
            *last, want_first, want_last);
    bad_results = 1;
  }
}

static void check_device(const char *what, int c, int n, CUdeviceptr buf, size_t bytes) {
  size_t per = c == AG ? bytes / n : bytes;
  for (int slot = 0; slot < (c == AG ? n : 1); slot++) {
    float first, last;
    CU(cuMemcpyDtoH(&first, buf + slot * per, 4));
    CU(cuMemcpyDtoH(&last, buf + slot * per + per - 4, 4));
    check_floats(what, bytes, c, n, &first, &last, slot);
  }
}

static void fill_host(float *h, size_t bytes, float v) {
  for (size_t i = 0; i < bytes / 4; i++) h[i] = v;
}

/* Median microseconds of `reps` gkrt_runtime_run calls of `g` after a few warm-ups. */
static double time_graph(gkrt_runtime *rt, gkrt_graph *g, int reps, double *t) {
  for (int i = 0; i < 3; i++) GK(gkrt_runtime_run(rt, g));
  for (int i = 0; i < reps; i++) {
    double t0 = now_ms();
    GK(gkrt_runtime_run(rt, g));
    t[i] = (now_ms() - t0) * 1e3;
  }
  return median(t, reps);
}

/* gkrt: one collective node from an input to an output tensor of the pool. */
static double gkrt_single(gkrt_runtime *rt, gkrt_comm *comm, int c, size_t s, const options *o, float *host,
                              double *t) {
  size_t ib = in_bytes(c, s, o->nranks), ob = out_bytes(c, s, o->nranks);
  gkrt_graph *g;
  GK(gkrt_graph_create(rt, &g));
  gkrt_tensor x, y;
  GK(gkrt_graph_add_tensor(g, ib, GKRT_TENSOR_INPUT, "x", &x));
  GK(gkrt_graph_add_tensor(g, ob, GKRT_TENSOR_OUTPUT, "y", &y));
  GK(gkrt_graph_add_collective(g, comm, coll_kinds[c], GKRT_REDUCE_SUM, 0, GKRT_DTYPE_F32, &x, 1, &y, 1, NULL));
  GK(gkrt_graph_finalize(g));
  fill_host(host, ib, (float)(o->rank + 1));
  GK(gkrt_graph_write_tensor(g, x, host, ib));
  GK(gkrt_runtime_run(rt, g));
  GK(gkrt_graph_read_tensor(g, y, host, ob));
  size_t per = c == AG ? ob / o->nranks / 4 : ob / 4;
  for (int slot = 0; slot < (c == AG ? o->nranks : 1); slot++)
    check_floats("gkrt", ob, c, o->nranks, &host[slot * per], &host[slot * per + per - 1], slot);
  double us = time_graph(rt, g, o->reps, t);
  GK(gkrt_graph_release(g));
  return us;
}

/* gkrt: an all-reduce over a fused block of four FILL-made intermediates, COPY'd to outputs;
 * with_collective 0 builds the same graph without it. */
static gkrt_graph *fused_graph(gkrt_runtime *rt, gkrt_comm *comm, size_t s, float value, int with_collective,
                               gkrt_tensor *outs) {
  gkrt_kernel *fill, *copy;
  GK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_FILL, &fill));
  GK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_COPY, &copy));
  gkrt_graph *g;
  GK(gkrt_graph_create(rt, &g));
  gkrt_tensor parts[4];
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, &value, sizeof value};
  gkrt_launch plain = {{1, 1, 1}, {1, 1, 1}, 0, NULL, 0};
  for (int k = 0; k < 4; k++) {
    GK(gkrt_graph_add_tensor(g, s / 4, GKRT_TENSOR_INTERMEDIATE, "part", &parts[k]));
    GK(gkrt_graph_add_tensor(g, s / 4, GKRT_TENSOR_OUTPUT, "out", &outs[k]));
    GK(gkrt_graph_add_kernel(g, fill, NULL, 0, &parts[k], 1, NULL, 0, &launch, NULL));
  }
  if (with_collective)
    GK(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_SUM, 0, GKRT_DTYPE_F32, parts, 4,
                                 parts, 4, NULL));
  for (int k = 0; k < 4; k++) GK(gkrt_graph_add_kernel(g, copy, &parts[k], 1, &outs[k], 1, NULL, 0, &plain, NULL));
  GK(gkrt_graph_finalize(g));
  GK(gkrt_kernel_release(fill));
  GK(gkrt_kernel_release(copy));
  return g;
}

/* The fused all-reduce's share of its graph's time: median(with) - median(without). */
static double gkrt_fused(gkrt_runtime *rt, gkrt_comm *comm, size_t s, const options *o, float *host, double *t,
                         double *compute_us) {
  gkrt_tensor outs[4];
  gkrt_graph *bare = fused_graph(rt, comm, s, (float)(o->rank + 1), 0, outs);
  *compute_us = time_graph(rt, bare, o->reps, t);
  GK(gkrt_graph_release(bare));
  gkrt_graph *g = fused_graph(rt, comm, s, (float)(o->rank + 1), 1, outs);
  GK(gkrt_runtime_run(rt, g));
  for (int k = 0; k < 4; k++) {
    GK(gkrt_graph_read_tensor(g, outs[k], host, s / 4));
    check_floats("gkrt fused", s / 4, AR, o->nranks, &host[0], &host[s / 16 - 1], 0);
  }
  double us = time_graph(rt, g, o->reps, t);
  GK(gkrt_graph_release(g));
  return us - *compute_us;
}

static int nccl_call(int c, CUdeviceptr in, CUdeviceptr out, size_t s, int n, nccl_comm comm, CUstream st) {
  switch (c) {
    case AR: return nccl_all_reduce((void *)in, (void *)out, s / 4, NCCL_FLOAT32, NCCL_SUM, comm, st);
    case AG: return nccl_all_gather((void *)in, (void *)out, s / n / 4, NCCL_FLOAT32, comm, st);
    default: return nccl_reduce_scatter((void *)in, (void *)out, s / n / 4, NCCL_FLOAT32, NCCL_SUM, comm, st);
  }
}

/* Plain NCCL on cuMemAlloc buffers (registered with --plain-register 1). */
static double plain_collective(nccl_comm raw, CUstream st, int c, size_t s, const options *o, double *t) {
  size_t ib = in_bytes(c, s, o->nranks), ob = out_bytes(c, s, o->nranks);
  CUdeviceptr in, out;
  CU(cuMemAlloc(&in, ib));
  CU(cuMemAlloc(&out, ob));
  float v = (float)(o->rank + 1);
  unsigned bits;
  memcpy(&bits, &v, 4);
  CU(cuMemsetD32(in, bits, ib / 4));
  CU(cuCtxSynchronize());
  void *h_in = NULL, *h_out = NULL;
  if (o->plain_register) {
    /* Registration only makes the calls faster: a failure is reported and the call runs unregistered. */
    int r1 = nccl_comm_register(raw, (void *)in, ib, &h_in), r2 = nccl_comm_register(raw, (void *)out, ob, &h_out);
    if (r1 || r2)
      fprintf(stderr, "plain %s %zu bytes: ncclCommRegister failed (%s): unregistered\n", coll_names[c], s,
              nccl_error_string(r1 ? r1 : r2));
    if (r1) h_in = NULL;
    if (r2) h_out = NULL;
  }
  NC(nccl_call(c, in, out, s, o->nranks, raw, st));
  CU(cuStreamSynchronize(st));
  check_device("plain", c, o->nranks, out, ob);
  for (int i = 0; i < 3; i++) NC(nccl_call(c, in, out, s, o->nranks, raw, st));
  CU(cuStreamSynchronize(st));
  for (int i = 0; i < o->reps; i++) {
    double t0 = now_ms();
    NC(nccl_call(c, in, out, s, o->nranks, raw, st));
    CU(cuStreamSynchronize(st));
    t[i] = (now_ms() - t0) * 1e3;
  }
  if (h_in) NC(nccl_comm_deregister(raw, h_in));
  if (h_out) NC(nccl_comm_deregister(raw, h_out));
  CU(cuMemFree(in));
  CU(cuMemFree(out));
  return median(t, o->reps);
}

/* nccl-tests' bus-bandwidth factor; 0 on one rank (printed as "-"). */
static double bus_factor(int c, int n) {
  if (n == 1) return 0;
  return c == AR ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

static void print_row(const char *name, size_t s, int c, int n, double gk_us, double pl_us) {
  double gk_alg = s / gk_us / 1e3, pl_alg = s / pl_us / 1e3; /* GB/s */
  double f = bus_factor(c, n);
  char gb[32] = "-", pb[32] = "-";
  if (f > 0) {
    snprintf(gb, sizeof gb, "%.1f", gk_alg * f);
    snprintf(pb, sizeof pb, "%.1f", pl_alg * f);
  }
  printf("%-15s %11zu %11.1f %11.1f %10.1f %10.1f %10s %10s %7.3f\n", name, s, gk_us, pl_us, gk_alg, pl_alg, gb, pb,
         pl_us / gk_us);
  fflush(stdout);
}

/* Fault mode: all-reduce graph runs until one fails or `hold_s` seconds pass. */
static int hold(gkrt_runtime *rt, gkrt_comm *comm, const options *o) {
  const size_t s = (size_t)64 << 20;
  gkrt_graph *g;
  GK(gkrt_graph_create(rt, &g));
  gkrt_tensor x, y;
  GK(gkrt_graph_add_tensor(g, s, GKRT_TENSOR_INPUT, "x", &x));
  GK(gkrt_graph_add_tensor(g, s, GKRT_TENSOR_OUTPUT, "y", &y));
  GK(gkrt_graph_add_collective(g, comm, GKRT_COLLECTIVE_ALL_REDUCE, GKRT_REDUCE_SUM, 0, GKRT_DTYPE_F32, &x, 1, &y, 1,
                               NULL));
  GK(gkrt_graph_finalize(g));
  float *zeros = calloc(1, s);
  if (!zeros) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }
  GK(gkrt_graph_write_tensor(g, x, zeros, s));
  free(zeros);
  printf("rank %d: holding: 64 MiB all-reduce runs for up to %d s, communicator timeout %u ms\n", o->rank, o->hold_s,
         o->timeout_ms);
  fflush(stdout);
  double start = now_ms();
  long runs = 0;
  gkrt_status st = GKRT_STATUS_OK;
  double t0 = start;
  while (now_ms() - start < o->hold_s * 1e3) {
    t0 = now_ms();
    st = gkrt_runtime_run(rt, g);
    if (st != GKRT_STATUS_OK) break;
    runs++;
  }
  GK(gkrt_graph_release(g));
  if (st == GKRT_STATUS_OK) {
    printf("rank %d: %ld runs in %d s, no failure\n", o->rank, runs, o->hold_s);
    return 0;
  }
  char msg[1024];
  gkrt_last_error_message(msg, sizeof msg);
  printf("FAULT rank %d: run %ld failed after %.0f ms (%ld runs succeeded before): %s: %s\n", o->rank, runs + 1,
         now_ms() - t0, runs, gkrt_status_name(st), msg);
  /* The runtime must stay usable: a graph without collectives runs and computes. */
  gkrt_kernel *fill;
  GK(gkrt_kernel_builtin(rt, GKRT_BUILTIN_FILL, &fill));
  GK(gkrt_graph_create(rt, &g));
  gkrt_tensor z;
  float v = 2.5f, got[256];
  gkrt_launch launch = {{1, 1, 1}, {1, 1, 1}, 0, &v, sizeof v};
  GK(gkrt_graph_add_tensor(g, sizeof got, GKRT_TENSOR_OUTPUT, "z", &z));
  GK(gkrt_graph_add_kernel(g, fill, NULL, 0, &z, 1, NULL, 0, &launch, NULL));
  GK(gkrt_graph_finalize(g));
  GK(gkrt_runtime_run(rt, g));
  GK(gkrt_graph_read_tensor(g, z, got, sizeof got));
  GK(gkrt_graph_release(g));
  GK(gkrt_kernel_release(fill));
  if (got[0] != 2.5f || got[255] != 2.5f) {
    printf("rank %d: runtime NOT usable after the fault (fill gave %g)\n", o->rank, got[0]);
    return 1;
  }
  printf("rank %d: runtime still usable after the fault\n", o->rank);
  return 3;
}

int main(int argc, char **argv) {
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc;
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  load_nccl();

  gkrt_config cfg;
  GK(gkrt_config_init(&cfg));
  cfg.device = GKRT_DEVICE_CUDA;
  cfg.device_ordinal = (uint32_t)o.rank;
  cfg.log_level = 1;
  gkrt_runtime *rt;
  GK(gkrt_runtime_create(&cfg, &rt));
  /* gkrt made device R's primary context current on this thread; NCCL and our calls use it. */
  CU(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CU(cuDeviceGet(&dev, o.rank));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CUstream stream;
  CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  nccl_id id;
  share_id(&o, &id);
  nccl_comm raw;
  NC(nccl_comm_init_rank(&raw, o.nranks, id, o.rank));
  gkrt_comm *comm;
  GK(gkrt_comm_wrap_nccl(rt, raw, (uint32_t)o.rank, (uint32_t)o.nranks, o.timeout_ms, &comm));

  if (o.hold_s > 0) {
    rc = hold(rt, comm, &o);
    GK(gkrt_comm_release(comm));
    /* After a fault gkrt aborted the communicator (ncclCommAbort freed it): not ours to destroy. */
    if (rc == 0) NC(nccl_comm_destroy(raw));
    CU(cuStreamDestroy(stream));
    GK(gkrt_runtime_release(rt));
    CU(cuDevicePrimaryCtxRelease(dev));
    return rc;
  }

  const char *reg_env = getenv("NCCL_LOCAL_REGISTER");
  printf("collective_bandwidth: rank %d of %d on device %d, %d reps, median per call; gkrt's pool registered by gkrt, "
         "plain buffers %s; NCCL_LOCAL_REGISTER=%s%s\n",
         o.rank, o.nranks, o.rank, o.reps, o.plain_register ? "registered (ncclCommRegister)" : "not registered",
         reg_env ? reg_env : "(unset: 1)", reg_env && !strcmp(reg_env, "0") ? " (registration ignored by NCCL)" : "");
  printf("%-15s %11s %11s %11s %10s %10s %10s %10s %7s\n", "collective", "bytes", "gkrt_us", "plain_us", "gkrt_alg",
         "plain_alg", "gkrt_bus", "plain_bus", "ratio");
  double *t = malloc(sizeof(double) * o.reps);
  float *host = malloc(o.max_bytes);
  if (!t || !host) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }
  for (size_t s = (size_t)1 << 20; s <= o.max_bytes; s *= 4) {
    for (int c = 0; c < NCOLL; c++) {
      double gk = gkrt_single(rt, comm, c, s, &o, host, t);
      double pl = plain_collective(raw, stream, c, s, &o, t);
      print_row(coll_names[c], s, c, o.nranks, gk, pl);
    }
    double compute_us;
    double gk = gkrt_fused(rt, comm, s, &o, host, t, &compute_us);
    double pl = plain_collective(raw, stream, AR, s, &o, t);
    print_row("ar_fused", s, AR, o.nranks, gk, pl);
  }
  printf("(GB/s = 1e9 bytes/s; ratio = plain_us / gkrt_us; ar_fused's gkrt_us = its graph less the same graph "
         "without the all-reduce)\n");
  free(t);
  free(host);
  GK(gkrt_comm_release(comm));
  NC(nccl_comm_destroy(raw)); /* ours: gkrt_comm_release left it alone */
  CU(cuStreamDestroy(stream));
  GK(gkrt_runtime_release(rt));
  CU(cuDevicePrimaryCtxRelease(dev));
  if (bad_results) {
    printf("collective_bandwidth: FAILED: a result was wrong (see above)\n");
    return 1;
  }
  printf("collective_bandwidth: every result checked: OK\n");
  return 0;
}
