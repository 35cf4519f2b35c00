//! The built-in kernels on the CPU, which the host backend (`device::host`) runs.
//!
//! The arithmetic is the contract the CUDA versions match bit for bit: element-wise ops are
//! single IEEE operations; the matrix product accumulates each output over k in order with a
//! separate multiply and add (no fused multiply-add), starting from 0.0.
//!
//! Inputs and outputs may alias (in-place nodes), so everything goes through raw pointers and
//! reads each element before writing the same index.

use super::{Buffer, BuiltinOp};

fn f32s(b: &Buffer) -> (*mut f32, usize) {
    (b.ptr as *mut f32, (b.bytes / 4) as usize)
}

/// Runs one built-in.
///
/// # Safety
/// Every buffer must be valid for its size and f32-aligned; matmul's output must not alias
/// its inputs (the graph layer rejects that).
pub unsafe fn run(op: BuiltinOp, inputs: &[Buffer], outputs: &[Buffer]) {
    let (out, n) = f32s(&outputs[0]);
    let unary = |f: &dyn Fn(f32) -> f32| {
        let (x, _) = f32s(&inputs[0]);
        for i in 0..n {
            // SAFETY: `x` and `out` hold `n` f32s each (the caller's contract).
            unsafe { out.add(i).write(f(x.add(i).read())) };
        }
    };
    let binary = |f: &dyn Fn(f32, f32) -> f32| {
        let ((a, _), (b, _)) = (f32s(&inputs[0]), f32s(&inputs[1]));
        for i in 0..n {
            // SAFETY: `a`, `b` and `out` hold `n` f32s each (the caller's contract).
            unsafe { out.add(i).write(f(a.add(i).read(), b.add(i).read())) };
        }
    };
    match op {
        BuiltinOp::Fill { value } => {
            for i in 0..n {
                // SAFETY: `out` holds `n` f32s (the caller's contract).
                unsafe { out.add(i).write(value) };
            }
        }
        // SAFETY: both buffers are valid for the output's size (the caller's contract).
        BuiltinOp::Copy => unsafe {
            std::ptr::copy(
                inputs[0].ptr as *const u8,
                outputs[0].ptr as *mut u8,
                outputs[0].bytes as usize,
            )
        },
        BuiltinOp::Add => binary(&|a, b| a + b),
        BuiltinOp::Scale { alpha } => unary(&|x| alpha * x),
        BuiltinOp::Relu => unary(&|x| if x > 0.0 { x } else { 0.0 }),
        BuiltinOp::ReluGrad => binary(&|g, x| if x > 0.0 { g } else { 0.0 }),
        BuiltinOp::Matmul { m, n, k } => {
            let (m, n, k) = (m as usize, n as usize, k as usize);
            // SAFETY: the buffers hold m*k, k*n and m*n f32s and the output aliases neither
            // input (the caller's contract).
            let (a, b, c) = unsafe {
                (
                    std::slice::from_raw_parts(inputs[0].ptr as *const f32, m * k),
                    std::slice::from_raw_parts(inputs[1].ptr as *const f32, k * n),
                    std::slice::from_raw_parts_mut(outputs[0].ptr as *mut f32, m * n),
                )
            };
            // i-p-j order keeps b's rows streaming through the cache; each c[i][j] still sums
            // its k products in order 0..k, which is what makes it match the GPU bit for bit.
            for i in 0..m {
                let row = &mut c[i * n..(i + 1) * n];
                row.fill(0.0);
                for p in 0..k {
                    let aip = a[i * k + p];
                    let brow = &b[p * n..(p + 1) * n];
                    for (cj, &bj) in row.iter_mut().zip(brow) {
                        *cj += aip * bj;
                    }
                }
            }
        }
    }
}
