/* What the data-parallel example checks and reports (checks.c): every rank's weights identical
 * bit for bit, close to the single runtime's, and each rank's figures and fingerprint. */
#ifndef GKRT_DP_CHECKS_H
#define GKRT_DP_CHECKS_H

#include <gkrt.h>
#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "rank.h"

/* Check 2's tolerance, relative to the largest weight (main.c's top comment says why 1e-5). */
#define DP_TOL 1e-5

int ranks_identical(gkrt_runtime *rt, gkrt_comm *comm, const float *w, size_t floats, size_t limit_mib, uint32_t rank);
int report(const options *o, const rank_job *jobs, uint32_t local, uint32_t n, const float *ref_w);

#endif
