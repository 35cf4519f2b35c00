/* include/gkrt.h compiles alone as strict C99 (-std=c99 -pedantic -Werror, see CMakeLists.txt),
 * and its version macros agree with the library it is linked to. */
#include <gkrt.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  char expected[64];
  snprintf(expected, sizeof expected, "%d.%d.%d", GKRT_VERSION_MAJOR, GKRT_VERSION_MINOR, GKRT_VERSION_PATCH);
  if (strcmp(expected, gkrt_version()) != 0) {
    fprintf(stderr, "header says %s, library says %s\n", expected, gkrt_version());
    return 1;
  }
  printf("api_header_c99: all checks passed\n");
  return 0;
}
