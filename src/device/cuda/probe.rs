//! Finding a usable CUDA driver (and NVRTC) without ever panicking.
//!
//! cudarc's `dynamic-loading` resolves every entry point lazily and *panics* when the library or
//! a symbol is missing. So before the first cudarc call we open the library ourselves with
//! `dlopen` — trying the same candidate names, in the same order, as cudarc will — and `dlsym`
//! every entry point this backend uses. After that check passes, no cudarc call here can panic.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
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
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
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
    "cuStreamIsCapturing",
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

fn dlopen(name: &str, flags: c_int) -> Result<*mut c_void, String> {
    let cname = CString::new(name).map_err(|_| format!("{name:?}: NUL in name"))?;
    // SAFETY: a valid NUL-terminated name.
    let h = unsafe { libc::dlopen(cname.as_ptr(), flags) };
    if h.is_null() {
        Err(last_dlerror())
    } else {
        Ok(h)
    }
}

/// The first of `candidates` (bare names, found through the loader's search path) that opens,
/// with its name; else the first error. RTLD_LAZY | RTLD_LOCAL is what libloading (cudarc) uses.
fn open_candidate(
    candidates: &[String],
    extra_flags: c_int,
) -> Result<(*mut c_void, String), String> {
    let mut first_error = None;
    for name in candidates {
        match dlopen(name, libc::RTLD_LAZY | libc::RTLD_LOCAL | extra_flags) {
            Ok(h) => return Ok((h, name.clone())),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or_default())
}

/// NVRTC ships with the toolkit, whose library folder is often not on the loader's path (only
/// LD_LIBRARY_PATH or an ld.so.conf entry puts it there). Look in the usual toolkit places and
/// load it by full path, with its `libnvrtc-builtins` beside it: a later `dlopen` of a bare
/// soname (cudarc's candidate `libnvrtc.so.13`, NVRTC's own `libnvrtc-builtins.so.13.0`) then
/// finds the copy already loaded.
fn preload_from_toolkit(candidates: &[String]) -> Option<(*mut c_void, String)> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    if let Ok(dir) = std::fs::read_dir("/usr/local") {
        let mut versions: Vec<PathBuf> = dir
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("cuda-"))
            .map(|e| e.path())
            .collect();
        versions.sort();
        roots.extend(versions.into_iter().rev()); // newest first
    }
    for root in &roots {
        for sub in [
            "lib64",
            "lib",
            "targets/x86_64-linux/lib",
            "targets/sbsa-linux/lib",
        ] {
            let dir = root.join(sub);
            for name in candidates {
                let path = dir.join(name);
                if !path.is_file() {
                    continue;
                }
                let Ok(h) = dlopen(&path.to_string_lossy(), libc::RTLD_LAZY | libc::RTLD_LOCAL)
                else {
                    continue;
                };
                // Will cudarc's bare-name dlopen now find this copy?
                if let Ok((h2, as_name)) = open_candidate(candidates, libc::RTLD_NOLOAD) {
                    preload_builtins(&dir);
                    return Some((h2, format!("{} (as {as_name})", path.display())));
                }
                // SAFETY: h came from dlopen above and is not used again.
                unsafe { libc::dlclose(h) };
            }
        }
    }
    None
}

/// Loads `dir/libnvrtc-builtins.so*` (which NVRTC opens by soname while compiling), if there.
fn preload_builtins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("libnvrtc-builtins.so")
        })
        .map(|e| e.path())
        .collect();
    names.sort();
    if let Some(path) = names.first() {
        if let Err(e) = dlopen(&path.to_string_lossy(), libc::RTLD_LAZY | libc::RTLD_LOCAL) {
            log::debug!("gkrt cuda: could not preload {}: {e}", path.display());
        }
    }
}

/// Opens `lib` the way cudarc will — its candidate names, in its order, so the library checked
/// here is the one cudarc uses — and checks `symbols` in it; returns the `dlopen` handle (as an
/// address). With `search_toolkit`, a library the loader cannot find is looked for in the CUDA
/// toolkit's folders. Handles are never closed: cudarc keeps the library loaded for the process
/// lifetime anyway.
fn check_library(
    lib: &str,
    what: &str,
    symbols: &[&str],
    search_toolkit: bool,
) -> Result<usize, String> {
    let mut candidates = cudarc::get_lib_name_candidates(lib);
    // Keep cudarc's order, drop its repeats.
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|c| seen.insert(c.clone()));
    let (handle, opened) = match open_candidate(&candidates, 0) {
        Ok(found) => found,
        Err(first_error) => match search_toolkit
            .then(|| preload_from_toolkit(&candidates))
            .flatten()
        {
            Some(found) => found,
            None => {
                return Err(format!(
                    "no {what} library could be loaded ({first_error}; also tried {}{})",
                    candidates
                        .iter()
                        .skip(1)
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .join(", "),
                    if search_toolkit {
                        ", and the CUDA toolkit folders"
                    } else {
                        ""
                    }
                ))
            }
        },
    };
    log::debug!("gkrt cuda: using {opened}");
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
        Ok(handle as usize)
    } else {
        Err(format!(
            "{opened} is too old for gkrt (CUDA 12.8+ driver needed): missing {}",
            missing.join(", ")
        ))
    }
}

/// The driver library's `dlopen` handle (as an address), once it and all its symbols were found
/// (cached: it cannot change in-process).
fn driver_handle() -> Result<usize, String> {
    static DRIVER: OnceLock<Result<usize, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| check_library("cuda", "CUDA driver", DRIVER_SYMBOLS, false))
        .clone()
}

/// The driver library and all its symbols are present.
pub(super) fn driver_library() -> Result<(), String> {
    driver_handle().map(|_| ())
}

/// The address of driver entry point `name`, which only newer drivers export (so it is not in
/// [`DRIVER_SYMBOLS`]), or `None`. A `dlsym` in the library cudarc uses: asking costs no driver
/// call, so an older driver's answer is not a failed CUDA call either.
pub(super) fn optional_driver_symbol(name: &CStr) -> Option<*mut c_void> {
    let handle = driver_handle().ok()? as *mut c_void;
    // SAFETY: a live dlopen handle (never closed); a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// NVRTC and all its symbols are present (cached).
pub(super) fn nvrtc_library() -> Result<(), String> {
    static NVRTC: OnceLock<Result<(), String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| check_library("nvrtc", "NVRTC", NVRTC_SYMBOLS, true).map(|_| ()))
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
