// Kernels with 0, 1 and several parameters of different sizes, for the parameter-layout tests
// (src/device/cuda/tests.rs). Compiled by NVRTC at test time on a GPU; the .cubin/.ptx beside
// this file are the same source compiled ahead (scripts/gen_cuda_param_fixtures.py), so the
// image parsers are tested without a GPU. Every kernel writes out[0] when out is non-null.
struct P12 { float a; float b; unsigned int n; };
struct P40 { double d[5]; };

extern "C" __global__ void gkrt_p0() {}

extern "C" __global__ void gkrt_p1(float* out) {
    if (out) out[0] = 1.0f;
}

// Sizes 1, 8, 2, 8, 12, 4, 40, 8.
extern "C" __global__ void gkrt_pmix(char c, float* out, short s, double d, P12 p, int i, P40 q,
                                     unsigned long long u) {
    if (out) out[0] = c + s + (float)d + p.a + p.b + p.n + i + (float)q.d[4] + (float)u;
}

// Parameters the body never reads still count. Sizes 8, 4, 8.
extern "C" __global__ void gkrt_punused(float* out, int unused_a, double unused_b) {
    if (out) out[0] = 2.0f;
}
