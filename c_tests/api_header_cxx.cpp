// include/gkrt.h compiles alone as C++ (with -Werror) and links: extern "C" is right.
#include <gkrt.h>

#include <cstdio>
#include <cstring>

int main() {
  gkrt_config cfg;
  if (gkrt_config_init(&cfg) != GKRT_STATUS_OK || cfg.memory_mode != GKRT_MEMORY_DYNAMIC) {
    std::fprintf(stderr, "gkrt_config_init from C++ failed\n");
    return 1;
  }
  if (std::strcmp(gkrt_status_name(GKRT_STATUS_OUT_OF_MEMORY), "GKRT_STATUS_OUT_OF_MEMORY") != 0) {
    std::fprintf(stderr, "status names differ from the enum\n");
    return 1;
  }
  std::printf("api_header_cxx: all checks passed\n");
  return 0;
}
