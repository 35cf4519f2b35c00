//! The built-in kernels (`BuiltinOp`) as CUDA C, compiled once per device by NVRTC at first use.
//!
//! They must agree bit for bit with the host backend's plain `f32` arithmetic, so every add and
//! multiply is an explicitly rounded intrinsic (`__fadd_rn`, `__fmul_rn`): those are never
//! contracted into an FMA, whatever `--fmad` says (we also pass `--fmad=false`). Denormals are
//! kept (NVRTC's default `--ftz=false`). Matmul sums each output's products in `p = 0..k` order,
//! one rounding per add, exactly like `acc = acc + a * b` on the host. The one thing that cannot
//! match is a NaN's payload: the GPU returns the canonical NaN from arithmetic on NaN inputs.
//!
//! `Fill` and `Copy` need no kernel: they are `cuMemsetD32Async` (the value's bits) and
//! `cuMemcpyDtoDAsync`.

/// Threads per block of the element-wise kernels.
pub(super) const BLOCK: u32 = 256;
/// Matmul tile edge; blocks are `TILE × TILE` threads. Must equal `TILE` in [`SOURCE`].
pub(super) const TILE: u32 = 16;
/// The largest `gridDim.y` the driver accepts; the matmul kernel strides over row tiles beyond it.
pub(super) const MAX_GRID_Y: u32 = 65_535;

/// NVRTC options for [`SOURCE`] (the architecture is added by the compiler wrapper).
pub(super) const OPTIONS: &[&str] = &["--fmad=false"];

pub(super) const ADD: &str = "gkrt_add";
pub(super) const SCALE: &str = "gkrt_scale";
pub(super) const RELU: &str = "gkrt_relu";
pub(super) const RELU_GRAD: &str = "gkrt_relu_grad";
pub(super) const MATMUL: &str = "gkrt_matmul";

/// Kernel signatures (the launcher in `mod.rs` passes exactly these, in this order):
/// - `gkrt_add(float* out, const float* a, const float* b, u64 n)`
/// - `gkrt_scale(float* out, const float* x, float alpha, u64 n)`
/// - `gkrt_relu(float* out, const float* x, u64 n)`
/// - `gkrt_relu_grad(float* out, const float* grad, const float* x, u64 n)`
/// - `gkrt_matmul(float* out, const float* a, const float* b, unsigned m, unsigned n, unsigned k)`
///
/// No `__restrict__`: the layers above may run an element-wise op in place (out == input).
pub(super) const SOURCE: &str = r#"
typedef unsigned long long u64;

// Grid-stride loop with 64-bit indices: any n, any grid size.
#define GKRT_FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void gkrt_add(float* out, const float* a, const float* b, u64 n) {
    GKRT_FOR_EACH(i, n) { out[i] = __fadd_rn(a[i], b[i]); }
}

extern "C" __global__ void gkrt_scale(float* out, const float* x, float alpha, u64 n) {
    GKRT_FOR_EACH(i, n) { out[i] = __fmul_rn(alpha, x[i]); }
}

extern "C" __global__ void gkrt_relu(float* out, const float* x, u64 n) {
    GKRT_FOR_EACH(i, n) {
        const float v = x[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

extern "C" __global__ void gkrt_relu_grad(float* out, const float* grad, const float* x, u64 n) {
    GKRT_FOR_EACH(i, n) { out[i] = x[i] > 0.0f ? grad[i] : 0.0f; }
}

#define GKRT_TILE 16

// out[m x n] = a[m x k] . b[k x n], row-major. Block (TILE, TILE); grid.x covers the columns,
// grid.y strides over row tiles. Each thread owns one output and adds its k products in order.
extern "C" __global__ void gkrt_matmul(float* out, const float* a, const float* b,
                                       unsigned int m, unsigned int n, unsigned int k) {
    __shared__ float as[GKRT_TILE][GKRT_TILE];
    __shared__ float bs[GKRT_TILE][GKRT_TILE];
    const unsigned int tx = threadIdx.x;
    const unsigned int ty = threadIdx.y;
    const u64 col = (u64)blockIdx.x * GKRT_TILE + tx;
    const u64 tiles_m = ((u64)m + GKRT_TILE - 1) / GKRT_TILE;
    // Trip counts below depend only on blockIdx and m, n, k: uniform over the block, so the
    // __syncthreads() inside are reached by every thread.
    for (u64 tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
        const u64 row = tm * GKRT_TILE + ty;
        float acc = 0.0f;
        for (u64 p0 = 0; p0 < (u64)k; p0 += GKRT_TILE) {
            as[ty][tx] = (row < m && p0 + tx < k) ? a[row * k + p0 + tx] : 0.0f;
            bs[ty][tx] = (p0 + ty < k && col < n) ? b[(p0 + ty) * n + col] : 0.0f;
            __syncthreads();
            // Only the k real products, in order: the sum is literally the host's.
            const u64 rest = (u64)k - p0;
            const unsigned int len = rest < GKRT_TILE ? (unsigned int)rest : GKRT_TILE;
            for (unsigned int pp = 0; pp < len; ++pp) {
                acc = __fadd_rn(acc, __fmul_rn(as[ty][pp], bs[pp][tx]));
            }
            __syncthreads();
        }
        if (row < m && col < n) {
            out[row * n + col] = acc;
        }
    }
}
"#;
