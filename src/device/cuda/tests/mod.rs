//! Tests of the CUDA backend, one submodule per part of it; this file holds the helpers they
//! share (the device, buffers, uploads and downloads, bit-exact comparison, test values).
//!
//! `without_gpu` and parts of `param_layouts` and `nccl` run anywhere (no GPU, no driver):
//! probing must fail cleanly, never panic; parameter counts are read right from NVRTC-compiled
//! images.
//! The `gpu_*` tests need a CUDA GPU: `cargo test --lib device::cuda -- --ignored`.
//! `gpu_neg_*` tests provoke driver errors on purpose (a bad image, a missing kernel, an
//! impossible allocation): every other test makes no CUDA call that fails, so a run under
//! compute-sanitizer can skip them by name (`--skip gpu_neg_ --skip gpu_alone_`) and expect
//! zero errors.
//! `gpu_alone_kernel_fault_surfaces_at_sync` (in `fault`) poisons the (process-wide) primary
//! context, so it only does something when run alone: `GKRT_CUDA_POISON_TEST=1 cargo test --lib
//! device::cuda::tests::fault::gpu_alone_kernel_fault_surfaces_at_sync -- --ignored --exact`.

use super::launch::{check_signature, cu_launch, kernel_args};
use super::modules::{driver_param_count, param_sizes_of};
use super::*;
use crate::device::{Buffer, BuiltinOp, DeviceError, LaunchDims, ModuleSource};

mod aliases;
mod builtin_kernels;
mod fault;
mod memory;
mod nccl;
mod overhead;
mod param_layouts;
mod streams;
mod user_kernels;
mod without_gpu;

fn gpu() -> CudaDevice {
    CudaDevice::open(0).expect("these tests need CUDA device 0")
}

fn buf(ptr: DevPtr, elems: usize) -> Buffer {
    Buffer {
        ptr,
        bytes: (elems * 4) as u64,
    }
}

fn alloc_f32(d: &CudaDevice, elems: usize) -> DevPtr {
    d.alloc_segment((elems.max(1) * 4) as u64).unwrap()
}

fn upload(d: &CudaDevice, s: StreamId, data: &[f32]) -> DevPtr {
    let p = alloc_f32(d, data.len());
    unsafe { d.copy_h2d_async(p, data.as_ptr() as *const u8, (data.len() * 4) as u64, s) }.unwrap();
    d.stream_synchronize(s).unwrap();
    p
}

fn download(d: &CudaDevice, s: StreamId, p: DevPtr, elems: usize) -> Vec<f32> {
    let mut v = vec![0f32; elems];
    unsafe { d.copy_d2h_async(v.as_mut_ptr() as *mut u8, p, (elems * 4) as u64, s) }.unwrap();
    d.stream_synchronize(s).unwrap();
    v
}

/// Bit-exact comparison; two NaNs count as equal (the GPU returns the canonical NaN from
/// arithmetic on NaN inputs, the CPU propagates the payload).
fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// Deterministic test values over many binades (so rounding and summation order matter), with
/// zeros of both signs, denormals and the smallest normal sprinkled in.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match i % 97 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::from_bits(1 + (x as u32 & 0xFFFF)),
                3 => -f32::MIN_POSITIVE,
                _ => {
                    let mantissa = (x >> 40) as f32 / (1u64 << 24) as f32 + 0.5; // [0.5, 1.5)
                    let exp = ((x >> 8) % 41) as i32 - 20;
                    let sign = if x & 1 == 0 { 1.0 } else { -1.0 };
                    sign * mantissa * 2f32.powi(exp)
                }
            }
        })
        .collect()
}

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: reading the bytes of a plain #[repr(C)] value with no padding-sensitive use.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}
