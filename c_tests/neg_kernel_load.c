/*
 * neg_kernel_load: device code that cannot load gives COMPILE_ERROR with the reason, never a
 * crash, and leaves the runtime working: CUDA source that does not compile (with NVRTC's log),
 * an unknown NVRTC option, a function the module does not have (CUDA source and PTX), text that
 * is not PTX, and an image that is not a cubin. On the host backend, which runs no device code,
 * each is UNSUPPORTED.
 *
 * neg_*: these tests make CUDA calls fail on purpose (cuModuleLoadDataEx, cuModuleGetFunction),
 * which compute-sanitizer reports as errors; `scripts/gpu/run.sh sanitize` runs them but does
 * not require zero errors of them. Every other test must make no failing CUDA call.
 */
#include "test_util.h"

static const char *SRC =
    "struct Params { float add; unsigned int n; };\n"
    "extern \"C\" __global__ void add_one(float* in, float* out, Params p) {\n"
    "  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < p.n) out[i] = in[i] + p.add;\n"
    "}\n";

static const char *PTX =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry ptx_noop(.param .u64 p)\n"
    "{\n"
    "  ret;\n"
    "}\n";

int main(void) {
  gkrt_runtime *rt = test_runtime(0);
  gkrt_kernel *k = (gkrt_kernel *)(uintptr_t)0x5e47, *const sentinel = (gkrt_kernel *)(uintptr_t)0x5e47;
  const uint8_t image[16] = {1, 2, 3, 4};
  if (test_on_host(rt)) {
    FAILS(gkrt_kernel_from_source(rt, SRC, "no_such_kernel", NULL, 0, &k), GKRT_STATUS_UNSUPPORTED, "no_such_kernel");
    FAILS(gkrt_kernel_from_ptx(rt, "this is not PTX at all", "f", &k), GKRT_STATUS_UNSUPPORTED, "f");
    FAILS(gkrt_kernel_from_cubin(rt, image, sizeof image, "g", &k), GKRT_STATUS_UNSUPPORTED, "g");
  } else {
    const char *bad_src = "extern \"C\" __global__ void broken(float* o) { o[0] = undefined_thing_xyz; }\n";
    FAILS(gkrt_kernel_from_source(rt, bad_src, "broken", NULL, 0, &k), GKRT_STATUS_COMPILE_ERROR,
          "undefined_thing_xyz");
    const char *bad_opt[1] = {"--no-such-nvrtc-option"};
    gkrt_status so = gkrt_kernel_from_source(rt, SRC, "add_one", bad_opt, 1, &k);
    CHECK(so == GKRT_STATUS_COMPILE_ERROR || so == GKRT_STATUS_INVALID_ARGUMENT);
    MSG_HAS("--no-such-nvrtc-option");
    /* cuModuleGetFunction: CUDA_ERROR_NOT_FOUND. */
    FAILS(gkrt_kernel_from_source(rt, SRC, "no_such_kernel", NULL, 0, &k), GKRT_STATUS_COMPILE_ERROR,
          "no_such_kernel");
    FAILS(gkrt_kernel_from_ptx(rt, PTX, "no_such_ptx_fn", &k), GKRT_STATUS_COMPILE_ERROR, "no_such_ptx_fn");
    /* cuModuleLoadDataEx: CUDA_ERROR_INVALID_PTX / CUDA_ERROR_INVALID_IMAGE. */
    FAILS(gkrt_kernel_from_ptx(rt, "this is not PTX at all", "f", &k), GKRT_STATUS_COMPILE_ERROR, "");
    CHECK(gkrt_last_error_message(NULL, 0) > 0);
    FAILS(gkrt_kernel_from_cubin(rt, image, sizeof image, "f", &k), GKRT_STATUS_COMPILE_ERROR, "");
    /* The same module's good function still loads after a missing one was asked for. */
    gkrt_kernel *good = NULL;
    OK(gkrt_kernel_from_ptx(rt, PTX, "ptx_noop", &good));
    OK(gkrt_kernel_release(good));
  }
  CHECK(k == sentinel);
  CHECK_RUNTIME_WORKS(rt);
  OK(gkrt_runtime_release(rt));
  return test_done("neg_kernel_load");
}
