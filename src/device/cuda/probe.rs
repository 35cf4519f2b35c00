//! Finding a usable CUDA driver (and NVRTC) without ever panicking.
//!
//! cudarc's `dynamic-loading` resolves every entry point lazily and *panics* when the library or
//! a symbol is missing. So before the first cudarc call we open the library ourselves with
//! `dlopen` — trying the same candidate names, in the same order, as cudarc will — and `dlsym`
//! every entry point this backend uses. After that check passes, no cudarc call here can panic.

use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult};

use super::{error_name, error_string};

/// Every driver entry point `cuda/` calls (exact exported names: cudarc loads them by these).
/// Keep in sync with the `sys::cu*` calls in this directory.
pub(super) const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD32Async",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncLoad",
    "cuFuncGetParamInfo",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphLaunch",
];

/// Every NVRTC entry point `cuda/nvrtc.rs` calls.
pub(super) const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcGetErrorString",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
];

/// The text of the last `dlerror()`, or a placeholder.
fn last_dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string valid until the next
    // dl* call on this thread; we copy it at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".to_owned()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Opens the first of `lib`'s candidate names that loads — the names cudarc tries, in its order,
/// so the library checked here is the library cudarc will use — and checks `symbols` in it.
/// The handle is never closed: cudarc keeps the same library loaded for the process lifetime.
fn check_library(lib: &str, what: &str, symbols: &[&str]) -> Result<(), String> {
    let mut candidates = cudarc::get_lib_name_candidates(lib);
    // Keep cudarc's order, drop its repeats.
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|c| seen.insert(c.clone()));
    let mut first_error = None;
    let mut handle: *mut c_void = ptr::null_mut();
    let mut opened = String::new();
    for name in &candidates {
        let Ok(cname) = CString::new(name.as_str()) else {
            continue;
        };
        // SAFETY: a valid NUL-terminated name; RTLD_LAZY | RTLD_LOCAL is what libloading uses.
        let h = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if h.is_null() {
            let err = last_dlerror();
            first_error.get_or_insert(err);
        } else {
            handle = h;
            opened = name.clone();
            break;
        }
    }
    if handle.is_null() {
        return Err(format!(
            "no {what} library could be loaded ({}; also tried {})",
            first_error.unwrap_or_default(),
            candidates
                .iter()
                .skip(1)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let missing: Vec<&str> = symbols
        .iter()
        .copied()
        .filter(|s| {
            let cs = CString::new(*s).expect("symbol names have no NUL");
            // SAFETY: handle is a live dlopen handle; the name is NUL-terminated.
            unsafe { libc::dlsym(handle, cs.as_ptr()) }.is_null()
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{opened} is too old for gkrt (CUDA 12.8+ driver needed): missing {}",
            missing.join(", ")
        ))
    }
}

/// The driver library and all its symbols are present (cached: it cannot change in-process).
pub(super) fn driver_library() -> Result<(), String> {
    static DRIVER: OnceLock<Result<(), String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| check_library("cuda", "CUDA driver", DRIVER_SYMBOLS))
        .clone()
}

/// NVRTC and all its symbols are present (cached).
pub(super) fn nvrtc_library() -> Result<(), String> {
    static NVRTC: OnceLock<Result<(), String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| check_library("nvrtc", "NVRTC", NVRTC_SYMBOLS))
        .clone()
}

fn driver_call_text(call: &str, r: CUresult) -> String {
    format!("{call} failed: {} ({})", error_name(r), error_string(r))
}

/// Is a CUDA driver loadable and device `ordinal` present? Never panics.
///
/// `Err` says exactly why: no driver library (or one missing entry points), the `cuInit` error
/// name (`CUDA_ERROR_NO_DEVICE`, `CUDA_ERROR_STUB_LIBRARY`, ...), zero devices, or the ordinal
/// out of range.
pub fn probe(ordinal: u32) -> Result<(), String> {
    driver_library()?;
    // Belt and braces: the symbol check above makes a cudarc panic impossible, but a panic
    // must never cross this function (it is reached from the C ABI).
    std::panic::catch_unwind(|| -> Result<(), String> {
        // SAFETY: plain driver calls with valid out-pointers; the library is loaded.
        let r = unsafe { sys::cuInit(0) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(driver_call_text("cuInit", r));
        }
        let mut count: std::ffi::c_int = 0;
        let r = unsafe { sys::cuDeviceGetCount(&mut count) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(driver_call_text("cuDeviceGetCount", r));
        }
        if count <= 0 {
            return Err("the CUDA driver reports 0 devices".to_owned());
        }
        if i64::from(ordinal) >= i64::from(count) {
            return Err(format!(
                "CUDA device ordinal {ordinal} out of range ({count} device{} present)",
                if count == 1 { "" } else { "s" }
            ));
        }
        Ok(())
    })
    .unwrap_or_else(|_| Err("the CUDA driver binding panicked while probing".to_owned()))
}
