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

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::handles::{check, invalid, lock, to_usize, Func};
use super::launch::{cu_launch, kernel_args};
use super::CudaDevice;
use crate::device::{Buffer, BuiltinOp, DeviceResult, ModuleSource, StreamId};

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

/// The built-in kernels, loaded once per device.
pub(super) struct Builtins {
    pub(super) add: Func,
    pub(super) scale: Func,
    pub(super) relu: Func,
    pub(super) relu_grad: Func,
    pub(super) matmul: Func,
}

impl CudaDevice {
    /// The built-in kernels, compiled with NVRTC on first use (once per device).
    pub(super) fn builtins(&self) -> DeviceResult<&Builtins> {
        if let Some(b) = self.builtins.get() {
            return Ok(b);
        }
        let _init = lock(&self.builtins_init);
        if let Some(b) = self.builtins.get() {
            return Ok(b);
        }
        let options: Vec<String> = OPTIONS.iter().map(|s| (*s).to_owned()).collect();
        let load = |name: &str| -> DeviceResult<Func> {
            let source = ModuleSource::CudaSource {
                source: SOURCE,
                options: &options,
            };
            let id = self.load_function_impl(source, name)?;
            self.func(id)
        };
        let b = Builtins {
            add: load(ADD)?,
            scale: load(SCALE)?,
            relu: load(RELU)?,
            relu_grad: load(RELU_GRAD)?,
            matmul: load(MATMUL)?,
        };
        Ok(self.builtins.get_or_init(|| b))
    }

    /// Launches an element-wise built-in over `n` elements: 256 threads per block, grid capped at
    /// 4 blocks per SM (the kernels stride over the rest).
    fn launch_elementwise(
        &self,
        f: Func,
        n: u64,
        stream: sys::CUstream,
        args: &mut [*mut c_void],
    ) -> DeviceResult<()> {
        if n == 0 {
            return Ok(());
        }
        let blocks = n.div_ceil(u64::from(BLOCK)).min(u64::from(self.max_blocks)) as u32;
        // SAFETY: f is a built-in whose signature the caller's args match; stream is live.
        unsafe { cu_launch(f, [blocks, 1, 1], [BLOCK, 1, 1], 0, stream, args) }
    }
}

/// Checks that `buf` holds at least `elems` f32 values.
fn need_elems(buf: &Buffer, elems: u64, what: &str) -> DeviceResult<()> {
    match elems.checked_mul(4) {
        Some(bytes) if buf.bytes >= bytes => Ok(()),
        _ => Err(invalid(format!(
            "built-in {what}: a buffer of {} bytes is too small for {elems} f32",
            buf.bytes
        ))),
    }
}

impl CudaDevice {
    pub(super) fn launch_builtin_impl(
        &self,
        op: BuiltinOp,
        inputs: &[Buffer],
        outputs: &[Buffer],
        stream: StreamId,
    ) -> DeviceResult<()> {
        let [out] = outputs else {
            return Err(invalid(format!(
                "built-in {op:?} takes 1 output, got {}",
                outputs.len()
            )));
        };
        let arity = match op {
            BuiltinOp::Fill { .. } => 0,
            BuiltinOp::Add | BuiltinOp::ReluGrad | BuiltinOp::Matmul { .. } => 2,
            BuiltinOp::Copy | BuiltinOp::Scale { .. } | BuiltinOp::Relu => 1,
        };
        if inputs.len() != arity {
            return Err(invalid(format!(
                "built-in {op:?} takes {arity} input(s), got {}",
                inputs.len()
            )));
        }
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        let stream = s.0;
        let n = out.bytes / 4;
        let o = out.ptr;
        match op {
            BuiltinOp::Fill { value } => {
                if n == 0 {
                    return Ok(());
                }
                // A 32-bit memset of the value's bits: exactly out[i] = value.
                // SAFETY: the driver validates the range; live stream.
                check("cuMemsetD32Async", unsafe {
                    sys::cuMemsetD32Async(o, value.to_bits(), to_usize(n)?, stream)
                })
            }
            BuiltinOp::Copy => {
                let src = &inputs[0];
                if src.bytes < out.bytes {
                    return Err(invalid(format!(
                        "built-in Copy: input {} bytes < output {} bytes",
                        src.bytes, out.bytes
                    )));
                }
                if out.bytes == 0 {
                    return Ok(());
                }
                // SAFETY: the driver validates both ranges; live stream.
                check("cuMemcpyDtoDAsync_v2", unsafe {
                    sys::cuMemcpyDtoDAsync_v2(o, src.ptr, to_usize(out.bytes)?, stream)
                })
            }
            BuiltinOp::Add => {
                need_elems(&inputs[0], n, "Add")?;
                need_elems(&inputs[1], n, "Add")?;
                let (a, b) = (inputs[0].ptr, inputs[1].ptr);
                let f = self.builtins()?.add;
                self.launch_elementwise(f, n, stream, &mut kernel_args!(o, a, b, n))
            }
            BuiltinOp::Scale { alpha } => {
                need_elems(&inputs[0], n, "Scale")?;
                let x = inputs[0].ptr;
                let f = self.builtins()?.scale;
                self.launch_elementwise(f, n, stream, &mut kernel_args!(o, x, alpha, n))
            }
            BuiltinOp::Relu => {
                need_elems(&inputs[0], n, "Relu")?;
                let x = inputs[0].ptr;
                let f = self.builtins()?.relu;
                self.launch_elementwise(f, n, stream, &mut kernel_args!(o, x, n))
            }
            BuiltinOp::ReluGrad => {
                need_elems(&inputs[0], n, "ReluGrad")?;
                need_elems(&inputs[1], n, "ReluGrad")?;
                let (grad, x) = (inputs[0].ptr, inputs[1].ptr);
                let f = self.builtins()?.relu_grad;
                self.launch_elementwise(f, n, stream, &mut kernel_args!(o, grad, x, n))
            }
            BuiltinOp::Matmul { m, n, k } => {
                let (m64, n64, k64) = (u64::from(m), u64::from(n), u64::from(k));
                need_elems(out, m64 * n64, "Matmul (out)")?;
                need_elems(&inputs[0], m64 * k64, "Matmul (a)")?;
                need_elems(&inputs[1], k64 * n64, "Matmul (b)")?;
                if m == 0 || n == 0 {
                    return Ok(());
                }
                let (a, b) = (inputs[0].ptr, inputs[1].ptr);
                let f = self.builtins()?.matmul;
                let tile = TILE;
                let grid = [n.div_ceil(tile), m.div_ceil(tile).min(MAX_GRID_Y), 1];
                let mut args = kernel_args!(o, a, b, m, n, k);
                // SAFETY: args match gkrt_matmul's signature; live stream.
                unsafe { cu_launch(f, grid, [tile, tile, 1], 0, stream, &mut args) }
            }
        }
    }
}
