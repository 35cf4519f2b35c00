/*
 * api_version: the version macros agree with gkrt_version(), and gkrt_status_name names every
 * status (and answers "GKRT_STATUS_UNKNOWN" for anything else).
 */
#include "test_util.h"

int main(void) {
  /* gkrt_version: "MAJOR.MINOR.PATCH" from the header's macros, a static string. */
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", GKRT_VERSION_MAJOR, GKRT_VERSION_MINOR, GKRT_VERSION_PATCH);
  const char *v = gkrt_version();
  CHECK(v != NULL);
  CHECK_EQ_STR(v, want);
  CHECK(gkrt_version() == v); /* static: the same string every call */

  /* gkrt_status_name: every status value by name, and their numbering is fixed. */
  static const struct {
    gkrt_status status;
    int value;
    const char *name;
  } names[] = {
      {GKRT_STATUS_OK, 0, "GKRT_STATUS_OK"},
      {GKRT_STATUS_INVALID_ARGUMENT, 1, "GKRT_STATUS_INVALID_ARGUMENT"},
      {GKRT_STATUS_INVALID_STATE, 2, "GKRT_STATUS_INVALID_STATE"},
      {GKRT_STATUS_OUT_OF_MEMORY, 3, "GKRT_STATUS_OUT_OF_MEMORY"},
      {GKRT_STATUS_NO_DEVICE, 4, "GKRT_STATUS_NO_DEVICE"},
      {GKRT_STATUS_DEVICE_ERROR, 5, "GKRT_STATUS_DEVICE_ERROR"},
      {GKRT_STATUS_COMPILE_ERROR, 6, "GKRT_STATUS_COMPILE_ERROR"},
      {GKRT_STATUS_CALLBACK_FAILED, 7, "GKRT_STATUS_CALLBACK_FAILED"},
      {GKRT_STATUS_UNSUPPORTED, 8, "GKRT_STATUS_UNSUPPORTED"},
      {GKRT_STATUS_INTERNAL, 9, "GKRT_STATUS_INTERNAL"},
      {GKRT_STATUS_PEER_FAILED, 10, "GKRT_STATUS_PEER_FAILED"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    CHECK_EQ_U64((int)names[i].status, names[i].value);
    CHECK_EQ_STR(gkrt_status_name((int32_t)names[i].status), names[i].name);
    CHECK_EQ_STR(gkrt_status_name(names[i].value), names[i].name);
  }
  const int32_t unknown[] = {-1, 11, 12, 100, 255, 0x7fffffff, (int32_t)0x80000000};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
    CHECK_EQ_STR(gkrt_status_name(unknown[i]), "GKRT_STATUS_UNKNOWN");

  /* Both work with no runtime at all, and a runtime reports the same version afterwards. */
  gkrt_runtime *rt = test_runtime(0);
  CHECK_EQ_STR(gkrt_version(), want);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_done("api_version");
}
