/* The data-parallel example's error handling: a gkrt call's status, with the library's message on
 * stderr when it failed, and TRY, which returns 1 from the calling function on a failure. */
#ifndef GKRT_DP_STATUS_H
#define GKRT_DP_STATUS_H

#include <gkrt.h>
#include <stdio.h>

static inline int check(gkrt_status st, const char *what) {
  if (st == GKRT_STATUS_OK) return 0;
  char msg[512];
  gkrt_last_error_message(msg, sizeof msg);
  fprintf(stderr, "%s failed: %s: %s\n", what, gkrt_status_name(st), msg);
  return 1;
}
#define TRY(call)                       \
  do {                                  \
    if (check((call), #call)) return 1; \
  } while (0)

#endif
