//! Launching kernels: `cuLaunchKernel` with one `CUdeviceptr` argument per buffer and then the
//! params blob as one by-value struct, without a heap allocation for up to 16 buffers, after
//! checking the arguments against the parameter sizes the driver reported at load time.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::handles::{check, invalid, read, Func, FuncEntry};
use super::CudaDevice;
use crate::device::{Buffer, DevPtr, DeviceResult, FunctionId, LaunchDims, StreamId};

/// Buffers a launch passes without a heap allocation.
const INLINE_BUFFERS: usize = 16;

/// Pointers to a kernel's arguments, for `cuLaunchKernel`'s `kernelParams`. The driver only
/// reads through them (and copies the values before returning).
macro_rules! kernel_args {
    ($($arg:ident),* $(,)?) => {
        [$(ptr::addr_of!($arg) as *mut c_void),*]
    };
}
pub(super) use kernel_args;

/// `cuLaunchKernel` on raw arguments.
///
/// # Safety
/// `f` must be a live function of our context, `stream` a live stream of it, and `args` must
/// match the kernel's parameters in number and size.
pub(super) unsafe fn cu_launch(
    f: Func,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: sys::CUstream,
    args: &mut [*mut c_void],
) -> DeviceResult<()> {
    let params = if args.is_empty() {
        ptr::null_mut()
    } else {
        args.as_mut_ptr()
    };
    // SAFETY: forwarded to the caller; `params` is NULL or `args.len()` valid pointers.
    let r = unsafe {
        sys::cuLaunchKernel(
            f.0,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared_mem,
            stream,
            params,
            ptr::null_mut(),
        )
    };
    check("cuLaunchKernel", r)
}

/// Rejects a launch whose arguments do not match the kernel's parameters: the driver would read
/// `param_sizes[i]` bytes behind each argument pointer, past the end of a too-short blob.
pub(super) fn check_signature(
    entry: &FuncEntry,
    sizes: &[usize],
    buffers: &[Buffer],
    params: &[u8],
) -> DeviceResult<()> {
    let passed = buffers.len() + usize::from(!params.is_empty());
    if sizes.len() != passed {
        return Err(invalid(format!(
            "kernel `{}` takes {} parameters; the launch passes {} buffer(s){}",
            entry.name,
            sizes.len(),
            buffers.len(),
            if params.is_empty() {
                ""
            } else {
                " and a params blob"
            }
        )));
    }
    if let Some(i) = sizes[..buffers.len()].iter().position(|&s| s != 8) {
        return Err(invalid(format!(
            "parameter {i} of kernel `{}` is {} bytes, not a device pointer",
            entry.name, sizes[i]
        )));
    }
    if !params.is_empty() && params.len() < sizes[buffers.len()] {
        return Err(invalid(format!(
            "kernel `{}` takes a {}-byte params struct; the blob has {} bytes",
            entry.name,
            sizes[buffers.len()],
            params.len()
        )));
    }
    Ok(())
}

impl CudaDevice {
    pub(super) fn launch_impl(
        &self,
        function: FunctionId,
        dims: &LaunchDims,
        buffers: &[Buffer],
        params: &[u8],
        stream: StreamId,
    ) -> DeviceResult<()> {
        let func = {
            let functions = read(&self.functions);
            let entry = functions
                .get(function.0 as usize)
                .ok_or_else(|| invalid(format!("unknown function id {}", function.0)))?;
            if let Some(sizes) = &entry.param_sizes {
                check_signature(entry, sizes, buffers, params)?;
            }
            entry.func
        };
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        let blob = params.as_ptr() as *mut c_void;
        if buffers.len() <= INLINE_BUFFERS {
            // No heap allocation: pointer values and argument pointers in stack arrays.
            let mut ptrs = [0 as DevPtr; INLINE_BUFFERS];
            let mut args = [ptr::null_mut::<c_void>(); INLINE_BUFFERS + 1];
            for (p, b) in ptrs.iter_mut().zip(buffers) {
                *p = b.ptr;
            }
            for (a, p) in args.iter_mut().zip(&ptrs[..buffers.len()]) {
                *a = p as *const DevPtr as *mut c_void;
            }
            let mut n = buffers.len();
            if !params.is_empty() {
                args[n] = blob;
                n += 1;
            }
            // SAFETY: args point at live locals/params for the call; signature checked above
            // when the driver could describe it.
            unsafe {
                cu_launch(
                    func,
                    dims.grid,
                    dims.block,
                    dims.shared_mem_bytes,
                    s.0,
                    &mut args[..n],
                )
            }
        } else {
            let ptrs: Vec<DevPtr> = buffers.iter().map(|b| b.ptr).collect();
            let mut args: Vec<*mut c_void> = ptrs
                .iter()
                .map(|p| p as *const DevPtr as *mut c_void)
                .collect();
            if !params.is_empty() {
                args.push(blob);
            }
            // SAFETY: as above.
            unsafe {
                cu_launch(
                    func,
                    dims.grid,
                    dims.block,
                    dims.shared_mem_bytes,
                    s.0,
                    &mut args,
                )
            }
        }
    }
}
