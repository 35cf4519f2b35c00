/* The command line (options.h): every flag parsed and checked against its limits, with a
 * message naming what was wrong. */
#include "options.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(const char *why) {
  fprintf(stderr,
          "%s\nusage: gkrt_data_parallel --ranks N | --rank R --nranks N --id-file PATH  [--steps K] [--batch B]\n"
          "  [--in D] [--width H] [--out O] [--depth L] [--lr X] [--bucket-kib K] [--trace DIR --trace-steps T]\n"
          "  [--memory-limit MIB] [--reference 0|1]\n",
          why);
  return 2;
}

int parse(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->steps = 5;
  o->batch = 32;
  o->bucket_kib = 16;
  unsigned long in = 32, width = 64, out = 16, depth = 2;
  float lr = 0.2f;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) return usage("every flag takes a value");
    const char *f = argv[i], *v = argv[++i];
    char *end;
    if (!strcmp(f, "--lr")) {
      lr = strtof(v, &end);
      if (!*v || *end || !(lr > 0.0f) || lr > 100.0f) return usage("--lr must be a number in (0, 100]");
      continue;
    }
    unsigned long n = strtoul(v, &end, 10);
    int numeric = *v && !*end && *v != '-';
    if (!strcmp(f, "--id-file")) o->id_file = v;
    else if (!strcmp(f, "--trace")) o->trace_dir = v;
    else if (!numeric) return usage("flag values must be whole numbers");
    else if (!strcmp(f, "--ranks")) o->ranks = (uint32_t)n;
    else if (!strcmp(f, "--rank")) o->rank = (uint32_t)n, o->rank_given = 1;
    else if (!strcmp(f, "--nranks")) o->nranks = (uint32_t)n;
    else if (!strcmp(f, "--steps")) o->steps = (uint32_t)n;
    else if (!strcmp(f, "--trace-steps")) o->trace_steps = (uint32_t)n;
    else if (!strcmp(f, "--batch")) o->batch = n;
    else if (!strcmp(f, "--in")) in = n;
    else if (!strcmp(f, "--width")) width = n;
    else if (!strcmp(f, "--out")) out = n;
    else if (!strcmp(f, "--depth")) depth = n;
    else if (!strcmp(f, "--bucket-kib")) o->bucket_kib = n > (1ul << 22) ? UINT32_MAX : (uint32_t)n;
    else if (!strcmp(f, "--memory-limit")) o->memory_limit_mib = n;
    else if (!strcmp(f, "--reference")) {
      if (n > 1) return usage("--reference must be 0 or 1");
      o->skip_reference = n == 0;
    }
    else return usage("unknown flag");
  }
  uint32_t n = o->ranks ? o->ranks : o->nranks;
  if (o->ranks && (o->rank_given || o->nranks || o->id_file)) return usage("--ranks (threads) or --rank/--nranks/--id-file, not both");
  if (!o->ranks && (!o->nranks || !o->id_file || o->rank >= o->nranks))
    return usage("give --ranks N, or --rank R --nranks N --id-file PATH with R < N");
  if (n > DP_MAX_RANKS) return usage("at most 64 ranks");
  if (o->steps == 0 || o->steps + o->trace_steps > DP_MAX_STEPS) return usage("--steps must be 1.., steps + trace steps at most 1000");
  if (!o->trace_dir != !o->trace_steps) return usage("--trace DIR and --trace-steps T (T >= 1) go together");
  if (depth < 2 || depth > DP_MAX_DEPTH) return usage("--depth must be 2..16 (weight layers)");
  /* Matmul dimensions are 32-bit, and every tensor stays below 2^40 bytes. */
  if (!in || !width || !out || in > 65536 || width > 65536 || out > 65536) return usage("--in, --width and --out must be 1..65536");
  /* cuBLAS counts a layer's floats (the SGD step's axpy) in an int. */
  if (in * width > INT32_MAX || width * width > INT32_MAX || width * out > INT32_MAX)
    return usage("a layer (--in x --width, --width x --width, --width x --out) must have under 2^31 weights");
  if (o->batch == 0 || o->batch > (1ul << 20) || o->batch % n) return usage("--batch must be 1..2^20 and a multiple of the ranks");
  if (o->bucket_kib > (1u << 22)) return usage("--bucket-kib must be at most 4194304 (4 GiB)");
  if (o->memory_limit_mib > (1ul << 24)) return usage("--memory-limit is in MiB, at most 2^24");
  net_make(&o->nw, (uint32_t)depth, in, width, out, lr);
  return 0;
}
