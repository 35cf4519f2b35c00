/*
 * gkrt_config and gkrt_stats carry their size (struct_size), so a program built against one
 * header runs against a library with more or fewer fields. Here the program plays both sides:
 * - a newer program (its gkrt_config has one more field than this library's): init fills this
 *   library's fields and zeroes the new one; a runtime is made while the new field is zero, and
 *   refused with GKRT_STATUS_UNSUPPORTED naming its offset once it is set;
 * - a newer program reading stats: the library fills its own fields, zeroes the rest and says
 *   how many bytes it filled;
 * - sizes below the first version, NULLs, garbage struct_size: argument errors;
 * - the first version's entry points write exactly the first version: gkrt_config_init
 *   sizeof(gkrt_config) (no field added since), gkrt_runtime_stats 224 bytes (the fields after
 *   tensors_recomputed came later), no byte past them.
 * (The other direction, an older program on a newer library, needs a library with a field this
 * header lacks: src/capi/sized.rs tests it with two versions of a struct.)
 */
#include "test_util.h"

#include <stddef.h>

typedef struct {
  gkrt_config base;
  uint64_t added_later; /* a field a newer header would have */
} newer_config;

typedef struct {
  gkrt_stats base;
  uint64_t added_later[3];
} newer_stats;

int main(void) {
  /* The first version's init writes sizeof(gkrt_config) bytes, no more. */
  newer_config n;
  memset(&n, 0xAB, sizeof n);
  OK(gkrt_config_init(&n.base));
  CHECK_EQ_U64(n.base.struct_size, sizeof(gkrt_config));
  CHECK_EQ_U64(n.added_later, 0xABABABABABABABABull);

  /* A newer program: its new field comes back zero, struct_size is what the library filled. */
  memset(&n, 0xAB, sizeof n);
  OK(gkrt_config_init_sized(&n.base, sizeof n));
  CHECK_EQ_U64(n.added_later, 0);
  CHECK_EQ_U64(n.base.struct_size, sizeof(gkrt_config));
  CHECK_EQ_U64(n.base.memory_limit, 0);
  CHECK_EQ_U64(n.base.log_level, 2);
  /* It passes its own size to gkrt_runtime_create through struct_size. */
  n.base.struct_size = sizeof n;
  n.base.device = GKRT_DEVICE_HOST;
  n.base.memory_limit = 64ull << 20;
  n.base.log_level = 1;
  gkrt_runtime *rt = NULL;
  OK(gkrt_runtime_create(&n.base, &rt));
  CHECK(rt != NULL);
  /* Its new field set: this library cannot honour it, and says which. */
  n.added_later = 1;
  gkrt_runtime *rt2 = NULL;
  FAILS(gkrt_runtime_create(&n.base, &rt2), GKRT_STATUS_UNSUPPORTED, "offset");
  char offset[32];
  snprintf(offset, sizeof offset, "offset %u", (unsigned)sizeof(gkrt_config));
  MSG_HAS(offset);
  CHECK(rt2 == NULL);

  /* Sizes that cannot be a gkrt_config. */
  gkrt_config c;
  FAILS(gkrt_config_init_sized(&c, 8), GKRT_STATUS_INVALID_ARGUMENT, "at least 56");
  FAILS(gkrt_config_init_sized(NULL, sizeof c), GKRT_STATUS_INVALID_ARGUMENT, "NULL");
  OK(gkrt_config_init(&c));
  c.struct_size = 0; /* filled by hand, without the init function */
  FAILS(gkrt_runtime_create(&c, &rt2), GKRT_STATUS_INVALID_ARGUMENT, "struct_size");
  c.struct_size = 1ull << 40;
  FAILS(gkrt_runtime_create(&c, &rt2), GKRT_STATUS_INVALID_ARGUMENT, "gkrt_config size");
  CHECK(rt2 == NULL);

  /* Stats: the first version's call fills the first version (224 bytes, up to
   * tensors_recomputed) and nothing after it; a newer program's struct gets this library's
   * fields, zeros after them, and struct_size saying where they end. */
  void *p = NULL;
  OK(gkrt_malloc(rt, 1000, NULL, &p));
  newer_stats s;
  memset(&s, 0xCD, sizeof s);
  OK(gkrt_runtime_stats(rt, &s.base));
  CHECK_EQ_U64(s.base.struct_size, 224);
  CHECK_EQ_U64(offsetof(gkrt_stats, tensors_recomputed) + 8, 224);
  CHECK_EQ_U64(s.base.allocated_bytes, 1024);
  CHECK_EQ_U64(s.base.pool_epochs_followed, 0xCDCDCDCDCDCDCDCDull);
  CHECK_EQ_U64(s.added_later[0], 0xCDCDCDCDCDCDCDCDull);
  memset(&s, 0xCD, sizeof s);
  OK(gkrt_runtime_stats_sized(rt, &s.base, sizeof s));
  CHECK_EQ_U64(s.base.struct_size, sizeof(gkrt_stats));
  CHECK_EQ_U64(s.base.allocated_bytes, 1024);
  CHECK_EQ_U64(s.base.memory_limit, 64ull << 20);
  CHECK_EQ_U64(s.added_later[0] | s.added_later[1] | s.added_later[2], 0);
  FAILS(gkrt_runtime_stats_sized(rt, &s.base, 16), GKRT_STATUS_INVALID_ARGUMENT, "at least 224");
  FAILS(gkrt_runtime_stats_sized(rt, NULL, sizeof s), GKRT_STATUS_INVALID_ARGUMENT, "NULL");

  /* The runtime made from the newer program's config works. */
  OK(gkrt_free(rt, p, NULL));
  OK(gkrt_runtime_release(rt));
  return test_done("api_struct_size");
}
