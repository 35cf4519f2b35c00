/*
 * "A program built against the current header runs against a library built with one extra
 * config field", and the reverse. This program is built against include/gkrt.h; it also declares
 * the next version of gkrt_config itself (the header's struct and one u64 appended, as the
 * library built with the cargo feature abi-test-extra-field has it: src/capi/config_layout.rs,
 * where the field is a memory limit in MiB that replaces memory_limit when non-zero).
 *
 *   abi_extra_field [v1]    against the library whose gkrt_config is the header's
 *   abi_extra_field extra   against the variant with the extra field
 *
 * The argument says which library the caller put on the loader's path; the program checks that
 * the library is that one (gkrt_config_init_sized reports how many bytes it knows), so running
 * it against the wrong library fails. In CTest it runs as "v1"; scripts/abi_extra_field_test.sh
 * (run by .ci/run) builds the variant and runs it as "extra".
 *
 * Checked both ways: config values set by the program reach the runtime (gkrt_stats.memory_limit),
 * the library never writes past the program's struct, graphs run; a program with the larger
 * struct works on the older library while the new field is zero and gets
 * GKRT_STATUS_UNSUPPORTED naming its offset when it is set.
 */
#include "test_util.h"

/* The next version of gkrt_config, as a program built against that header would declare it. */
typedef struct {
  gkrt_config v1;
  uint64_t memory_limit_mib;
} config_next;

enum { CANARY = 0xAB };

/* A runtime from `cfg` (the program's struct, whatever its size), its memory limit checked. */
static void create_and_run(const gkrt_config *cfg, uint64_t want_limit) {
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(cfg, &rt));
  if (!rt) return;
  CHECK_EQ_U64(stats_of(rt).memory_limit, want_limit);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
}

int main(int argc, char **argv) {
  int extra = argc > 1 && strcmp(argv[1], "extra") == 0;
  if (argc > 1 && !extra && strcmp(argv[1], "v1") != 0) {
    fprintf(stderr, "usage: abi_extra_field v1|extra\n");
    return 2;
  }
  const uint64_t v1_bytes = sizeof(gkrt_config), next_bytes = sizeof(config_next);
  CHECK_EQ_U64(next_bytes, v1_bytes + 8); /* the appended field, no padding */
  const uint64_t lib_bytes = extra ? next_bytes : v1_bytes;

  /* --- a program built against the current header --- */
  struct {
    gkrt_config c;
    unsigned char after[32];
  } old;
  memset(&old, CANARY, sizeof old);
  OK(gkrt_config_init_sized(&old.c, sizeof old.c));
  CHECK_EQ_U64(old.c.struct_size, v1_bytes);
  for (size_t i = 0; i < sizeof old.after; i++) CHECK(old.after[i] == CANARY); /* nothing written past */
  gkrt_config plain;
  OK(gkrt_config_init(&plain));
  CHECK(memcmp(&plain, &old.c, sizeof plain) == 0); /* the same defaults either way */
  CHECK_EQ_U64(plain.memory_limit, 0);
  CHECK_EQ_U64(plain.device, GKRT_DEVICE_AUTO);
  old.c.device = GKRT_DEVICE_HOST;
  old.c.memory_limit = 48ull << 20;
  old.c.log_level = 1;
  old.c.seed = 7;
  /* The values set reach the runtime; the field this program lacks keeps its default. */
  create_and_run(&old.c, 48ull << 20);

  /* --- a program built against the next header --- */
  config_next next;
  memset(&next, CANARY, sizeof next);
  OK(gkrt_config_init_sized(&next.v1, sizeof next));
  /* The library says how many bytes it knows: this tells the two libraries apart. */
  CHECK_EQ_U64(next.v1.struct_size, lib_bytes);
  CHECK_EQ_U64(next.memory_limit_mib, 0); /* its default, or zeroed by the older library */
  next.v1.device = GKRT_DEVICE_HOST;
  next.v1.memory_limit = 40ull << 20;
  next.v1.log_level = 1;
  /* The new field at its default: either library runs it, whatever struct_size says. */
  create_and_run(&next.v1, 40ull << 20);
  next.v1.struct_size = next_bytes;
  create_and_run(&next.v1, 40ull << 20);
  /* The new field set: the variant honours it; the older library refuses it by offset. */
  next.memory_limit_mib = 32;
  if (extra) {
    create_and_run(&next.v1, 32ull << 20);
  } else {
    gkrt_runtime *rt = NULL;
    FAILS(gkrt_runtime_create(&next.v1, &rt), GKRT_STATUS_UNSUPPORTED, "offset");
    MSG_HAS_U64(v1_bytes);
    CHECK(rt == NULL);
    if (rt) OK(gkrt_runtime_release(rt));
  }
  return test_done(extra ? "abi_extra_field (library with the extra field)" : "abi_extra_field (header's library)");
}
