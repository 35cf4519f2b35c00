/* Must NOT compile with -Werror=unused-result (test api_header_must_use): a status ignored. */
#include <gkrt.h>

void ignore(gkrt_runtime *rt) { gkrt_runtime_release(rt); }
