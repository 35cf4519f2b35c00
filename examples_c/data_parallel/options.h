/* The data-parallel example's command line (options.c): the flags, their defaults and limits. */
#ifndef GKRT_DP_OPTIONS_H
#define GKRT_DP_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "net.h"

enum { DP_MAX_RANKS = 64, DP_MAX_STEPS = 1000 };

typedef struct options {
  uint32_t ranks, rank, nranks, steps, trace_steps, bucket_kib;
  int rank_given, skip_reference;
  size_t batch, memory_limit_mib;
  const char *id_file, *trace_dir;
  net nw;
} options;

/* Fills `o` from the flags; non-zero (2) after printing the usage on a bad command line. */
int parse(int argc, char **argv, options *o);

#endif
