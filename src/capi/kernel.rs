//! C API: kernel objects.

use super::boundary::{c_slice, c_str, guard};
use super::handles::{self, KernelObject, Object};
use super::types::*;
use crate::runtime::{
    BuiltinKind, Error, HostCallback, Kernel, ModuleSource, Runtime, UserDataOwner,
};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// Registers a handle for `kernel` and writes it to `*out`.
///
/// # Safety
/// `out` is valid for a write (checked non-NULL by `check_out`).
unsafe fn publish(
    rt: Arc<Runtime>,
    kernel: Kernel,
    out: *mut *mut gkrt_kernel,
) -> Result<(), Error> {
    let handle = handles::register(Object::Kernel(Arc::new(KernelObject {
        runtime: rt,
        kernel,
    })))? as *mut gkrt_kernel;
    // SAFETY: forwarded to the caller.
    unsafe { *out = handle };
    Ok(())
}

fn check_out(out: *mut *mut gkrt_kernel) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::InvalidArgument(
            "out (gkrt_kernel **) is NULL".into(),
        ));
    }
    Ok(())
}

/// A built-in kernel (GKRT_BUILTIN_*). `*out` is released with `gkrt_kernel_release`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_kernel_builtin(
    runtime: *mut gkrt_runtime,
    builtin: gkrt_builtin,
    out: *mut *mut gkrt_kernel,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        check_out(out)?;
        let kind = BuiltinKind::from_raw(builtin).ok_or_else(|| {
            Error::InvalidArgument(format!("built-in {builtin} is not a gkrt_builtin"))
        })?;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { publish(rt, Kernel::Builtin(kind), out) }
    })
}

/// A host callback kernel: `fn(args, user_data)` is called for every node that uses it (see
/// `gkrt_callback_fn` for where and when). `user_data` is passed through untouched; the host
/// keeps it alive (see `gkrt_kernel_from_callback_with_free` for gkrt to free it).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_kernel_from_callback(
    runtime: *mut gkrt_runtime,
    callback: gkrt_callback_fn,
    user_data: *mut c_void,
    out: *mut *mut gkrt_kernel,
) -> gkrt_status {
    // SAFETY: the caller's contract, passed on.
    unsafe { gkrt_kernel_from_callback_with_free(runtime, callback, user_data, None, out) }
}

/// A function that frees a callback's user data.
#[allow(non_camel_case_types)]
pub type gkrt_free_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// `gkrt_kernel_from_callback`, and gkrt owns `user_data`: `free_user_data(user_data)` is called
/// once, when the kernel's handle and every graph whose nodes use the kernel have been released
/// (on whatever thread releases the last of them). NULL `free_user_data` is the same as
/// `gkrt_kernel_from_callback`. When the call fails, nothing is freed: the data is still the
/// caller's.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_kernel_from_callback_with_free(
    runtime: *mut gkrt_runtime,
    callback: gkrt_callback_fn,
    user_data: *mut c_void,
    free_user_data: gkrt_free_fn,
    out: *mut *mut gkrt_kernel,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        check_out(out)?;
        let func = callback.ok_or_else(|| Error::InvalidArgument("callback is NULL".into()))?;
        let owner =
            free_user_data.map(|free| Arc::new(UserDataOwner::new(free, user_data as usize)));
        let kernel = Kernel::Callback(HostCallback {
            func,
            user_data: user_data as usize,
            owner: owner.clone(),
        });
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { publish(rt, kernel, out) }?;
        // Only a kernel that exists frees the data: a failed call leaves it to the caller.
        if let Some(owner) = owner {
            owner.arm();
        }
        Ok(())
    })
}

/// A kernel from PTX text (NUL-terminated), function `name`. CUDA backend only: the host
/// backend answers GKRT_STATUS_UNSUPPORTED. Load errors give GKRT_STATUS_COMPILE_ERROR with
/// the driver's log.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_kernel_from_ptx(
    runtime: *mut gkrt_runtime,
    ptx: *const c_char,
    name: *const c_char,
    out: *mut *mut gkrt_kernel,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        check_out(out)?;
        // SAFETY: the C contract: `ptx` and `name` are NULL or NUL-terminated strings.
        let (ptx, name) = unsafe { (c_str(ptx, "ptx")?, c_str(name, "name")?) };
        let k = rt.load_kernel(ModuleSource::Ptx(ptx), name)?;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { publish(rt, k, out) }
    })
}

/// A kernel from a cubin or fatbin image of `size` bytes, function `name`. CUDA backend only.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_kernel_from_cubin(
    runtime: *mut gkrt_runtime,
    image: *const c_void,
    size: usize,
    name: *const c_char,
    out: *mut *mut gkrt_kernel,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        check_out(out)?;
        if image.is_null() || size == 0 {
            return Err(Error::InvalidArgument(
                "cubin image is NULL or empty".into(),
            ));
        }
        // SAFETY: the C contract: `image` holds `size` bytes, `name` is NULL or a
        // NUL-terminated string.
        let (image, name) = unsafe {
            (
                c_slice(image as *const u8, size, "the cubin image")?,
                c_str(name, "name")?,
            )
        };
        let k = rt.load_kernel(ModuleSource::Cubin(image), name)?;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { publish(rt, k, out) }
    })
}

/// A kernel from CUDA C++ source compiled by NVRTC (once per runtime and source; cached),
/// function `name` (declare it `extern "C" __global__`). `options` is an array of
/// `num_options` NUL-terminated NVRTC options (may be NULL when 0); the target architecture
/// is added for the device. CUDA backend only.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_kernel_from_source(
    runtime: *mut gkrt_runtime,
    source: *const c_char,
    name: *const c_char,
    options: *const *const c_char,
    num_options: usize,
    out: *mut *mut gkrt_kernel,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        check_out(out)?;
        // SAFETY: the C contract: `source`, `name` and each of the `num_options` options are
        // NULL or NUL-terminated strings; `options` is NULL (when 0) or holds `num_options`.
        let (source, name, opts) = unsafe {
            (
                c_str(source, "source")?,
                c_str(name, "name")?,
                c_slice(options, num_options, "options")?
                    .iter()
                    .map(|&o| c_str(o, "an option").map(str::to_string))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        };
        let k = rt.load_kernel(
            ModuleSource::CudaSource {
                source,
                options: &opts,
            },
            name,
        )?;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { publish(rt, k, out) }
    })
}

/// Releases the caller's kernel handle; graphs that use the kernel keep what they need.
/// NULL is a no-op; releasing twice gives GKRT_STATUS_INVALID_ARGUMENT.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_kernel_release(kernel: *mut gkrt_kernel) -> gkrt_status {
    if kernel.is_null() {
        return gkrt_status::GKRT_STATUS_OK;
    }
    guard(|| handles::release(kernel as usize, "kernel"))
}
