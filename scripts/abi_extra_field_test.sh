#!/usr/bin/env bash
# The compatibility test of gkrt_config's size field (issue 18: "a program built against the
# current header runs against a library built with one extra config field"), with real binaries:
#  1. builds the library variant whose gkrt_config has one field appended (cargo feature
#     abi-test-extra-field, src/capi/config_layout.rs) as a debug cdylib in its own target
#     directory (target/abi-variant: the normal build's artefacts are untouched);
#  2. compiles c_tests/abi_extra_field.c once, against include/gkrt.h and the normal library
#     (target/release, built before this runs: README's test command);
#  3. runs that one binary against the normal library ("v1") and against the variant ("extra"),
#     chosen with LD_LIBRARY_PATH (the binary has no rpath).
# Run by .ci/run's main job. Usage: scripts/abi_extra_field_test.sh [work dir, default /tmp/gkrt-abi]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/gkrt-abi}
mkdir -p "$work"
[ -f target/release/libgkrt.so ] || cargo build --release --lib
cp include/gkrt.h "$work/gkrt.h.before"
cargo build --lib --features abi-test-extra-field --target-dir target/abi-variant
variant=target/abi-variant/debug
[ -e "$variant/libgkrt.so.0" ] || ln -sf libgkrt.so "$variant/libgkrt.so.0"
cc -std=c11 -Wall -Wextra -Werror -Iinclude -Ic_tests c_tests/abi_extra_field.c -Ltarget/release -lgkrt -lm \
  -o "$work/abi_extra_field"
LD_LIBRARY_PATH="$PWD/target/release" "$work/abi_extra_field" v1
LD_LIBRARY_PATH="$PWD/$variant" "$work/abi_extra_field" extra
# The binary really loaded the variant: its gkrt_config_init_sized reported 8 bytes more (checked
# inside); and the variant's build left the committed header as it was (the field is not in it).
cmp -s include/gkrt.h "$work/gkrt.h.before" || { echo "building the variant changed include/gkrt.h" >&2; exit 1; }
echo "abi_extra_field: passed against both libraries"
