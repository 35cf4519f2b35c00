//! Loading kernels: PTX, cubin/fatbin images and CUDA source (through NVRTC) become modules,
//! cached by their full code so the same source is compiled once per device; functions are
//! looked up by name, loaded eagerly, and their parameter sizes recorded for launch checks.
//!
//! **Parameter layout without a failing call.** `cuFuncGetParamInfo(f, i)` gives parameter `i`'s
//! size, but the driver API before CUDA 13.2 has no parameter count; asking for one index past
//! the last to find it fails with `CUDA_ERROR_INVALID_VALUE` — an error compute-sanitizer reports
//! in every program that loads a kernel. So the count comes first, from the driver where it has
//! `cuFuncGetParamCount` (13.2+, looked up with `dlsym`: cudarc binds it only for 13.2), else from
//! the image we loaded the module from (`params.rs`: the PTX `.entry` declaration, the cubin's
//! `EIATTR_KPARAM_INFO` records), and only indices below it are asked for. Where neither can
//! tell (a compressed fatbin), the kernel's launches are not checked against its signature.

use std::collections::HashMap;
use std::ffi::{c_uint, c_void, CString};
use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult};

use super::handles::{
    check, driver_error, error_name, error_string, invalid, lock, write, Func, FuncEntry, Module,
};
use super::params::KernelImage;
use super::{nvrtc, probe, CudaDevice};
use crate::device::{DeviceError, DeviceResult, FunctionId, ModuleSource};

/// Cache key of a loaded module: the full code (and NVRTC options), so a hash collision can
/// never hand back the wrong module.
#[derive(PartialEq, Eq, Hash)]
enum ModuleKey {
    Ptx(String),
    Image(Vec<u8>),
    Source {
        source: String,
        options: Vec<String>,
    },
}

impl ModuleKey {
    fn of(source: &ModuleSource<'_>) -> Self {
        match source {
            ModuleSource::Ptx(p) => ModuleKey::Ptx((*p).to_owned()),
            ModuleSource::Cubin(b) => ModuleKey::Image(b.to_vec()),
            ModuleSource::CudaSource { source, options } => ModuleKey::Source {
                source: (*source).to_owned(),
                options: options.to_vec(),
            },
        }
    }
}

#[derive(Default)]
pub(super) struct Modules {
    /// Index into `loaded` of each module already built.
    by_key: HashMap<ModuleKey, usize>,
    /// Every module loaded, unloaded at Drop, with the image it came from (for parameter counts).
    loaded: Vec<(Module, KernelImage)>,
    /// (module index, function name) → id, so loading a function twice returns the same id.
    functions: HashMap<(usize, String), FunctionId>,
}

/// `cuFuncGetParamCount(CUfunction, size_t*)`, where the driver has it (CUDA 13.2+).
type ParamCountFn = unsafe extern "C" fn(sys::CUfunction, *mut usize) -> CUresult;

fn driver_param_count_fn() -> Option<ParamCountFn> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let addr = (*F.get_or_init(|| {
        probe::optional_driver_symbol(c"cuFuncGetParamCount").map(|p| p as usize)
    }))?;
    // SAFETY: the driver's export of that name has this signature (cuda.h, CUDA 13.2+).
    Some(unsafe { std::mem::transmute::<usize, ParamCountFn>(addr) })
}

/// The number of parameters of `f` as the driver tells it, or `None` where the driver has no
/// such query (before CUDA 13.2).
pub(super) fn driver_param_count(f: Func) -> Option<usize> {
    let query = driver_param_count_fn()?;
    let mut n = 0usize;
    // SAFETY: f is a live, loaded function; valid out-pointer.
    match unsafe { query(f.0, &mut n) } {
        CUresult::CUDA_SUCCESS => Some(n),
        r => {
            log::warn!("gkrt cuda: cuFuncGetParamCount failed: {}", error_name(r));
            None
        }
    }
}

/// The size of each of the `count` parameters of `f` (`cuFuncGetParamInfo` for indices below
/// `count` only), or `None` if the driver disagrees with that count.
pub(super) fn param_sizes_of(f: Func, count: usize, name: &str) -> Option<Box<[usize]>> {
    let mut sizes = Vec::with_capacity(count);
    for i in 0..count {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: f is a live, loaded function; out-pointers are valid.
        let r = unsafe { sys::cuFuncGetParamInfo(f.0, i, &mut offset, &mut size) };
        if r != CUresult::CUDA_SUCCESS {
            // Only a wrong count gets here: the image said more parameters than the driver has.
            log::warn!(
                "gkrt cuda: kernel `{name}`: cuFuncGetParamInfo({i}) of {count} failed ({}); its \
                 launches will not be checked against its parameters",
                error_name(r)
            );
            return None;
        }
        sizes.push(size);
    }
    Some(sizes.into_boxed_slice())
}

/// The size of each parameter of `f` (kernel `name` of a module loaded from `image`), or `None`
/// when neither the driver nor the image tells the count. See the module comment.
fn param_sizes(f: Func, image: &KernelImage, name: &str) -> Option<Box<[usize]>> {
    let count = driver_param_count(f).or_else(|| image.param_count(name));
    match count {
        Some(n) => param_sizes_of(f, n, name),
        None => {
            log::debug!(
                "gkrt cuda: kernel `{name}`: parameter count unknown (image not understood); its \
                 launches will not be checked against its parameters"
            );
            None
        }
    }
}

/// Driver errors of `cuModuleLoadDataEx` that mean "this code is bad", not "the device is".
fn is_image_error(r: CUresult) -> bool {
    matches!(
        r,
        CUresult::CUDA_ERROR_INVALID_IMAGE
            | CUresult::CUDA_ERROR_INVALID_PTX
            | CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            | CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU
            | CUresult::CUDA_ERROR_JIT_COMPILER_NOT_FOUND
            | CUresult::CUDA_ERROR_JIT_COMPILATION_DISABLED
            | CUresult::CUDA_ERROR_INVALID_SOURCE
            | CUresult::CUDA_ERROR_INVALID_VALUE
            | CUresult::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND
            | CUresult::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED
    )
}

impl CudaDevice {
    /// Loads `image` (a cubin/fatbin, or NUL-terminated PTX) as a module; JIT errors come back
    /// as `Compile` with the JIT log.
    fn load_image(&self, image: *const c_void) -> DeviceResult<Module> {
        const LOG_BYTES: usize = 16 * 1024;
        let mut log = vec![0u8; LOG_BYTES];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // The size option is passed by value, cast to a pointer (the driver's convention).
        let mut values = [log.as_mut_ptr() as *mut c_void, LOG_BYTES as *mut c_void];
        let mut module: sys::CUmodule = ptr::null_mut();
        // SAFETY: image is a valid image per the caller; options/values arrays of length 2 and a
        // log buffer of LOG_BYTES that outlives the call.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                image,
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if r == CUresult::CUDA_SUCCESS {
            return Ok(Module(module));
        }
        if !is_image_error(r) {
            return Err(driver_error("cuModuleLoadDataEx", r));
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let log = String::from_utf8_lossy(&log[..end]);
        let log = log.trim_end();
        Err(DeviceError::Compile(format!(
            "cuModuleLoadDataEx failed: {} ({}){}{}",
            error_name(r),
            error_string(r),
            if log.is_empty() { "" } else { "\n" },
            log
        )))
    }

    /// Loads `source` as a module; returns it with the image it was loaded from.
    fn load_module(&self, source: &ModuleSource<'_>) -> DeviceResult<(Module, KernelImage)> {
        match source {
            ModuleSource::Ptx(text) => {
                let c = CString::new(*text)
                    .map_err(|_| DeviceError::Compile("PTX text contains a NUL byte".into()))?;
                let module = self.load_image(c.as_ptr() as *const c_void)?;
                Ok((module, KernelImage::Ptx(c.into_bytes().into_boxed_slice())))
            }
            ModuleSource::Cubin(image) => {
                if image.is_empty() {
                    return Err(DeviceError::Compile("empty cubin image".into()));
                }
                // The driver sizes an ELF or fatbin from its header; anything else it reads as
                // NUL-terminated text, so give it a terminated copy rather than let it overrun.
                const ELF: &[u8] = b"\x7fELF";
                const FATBIN: &[u8] = &0xBA55_ED50u32.to_le_bytes();
                let module = if image.starts_with(ELF) || image.starts_with(FATBIN) {
                    self.load_image(image.as_ptr() as *const c_void)?
                } else {
                    let mut text = image.to_vec();
                    text.push(0);
                    self.load_image(text.as_ptr() as *const c_void)?
                };
                Ok((
                    module,
                    KernelImage::Binary(image.to_vec().into_boxed_slice()),
                ))
            }
            ModuleSource::CudaSource { source, options } => {
                match nvrtc::compile(source, options, self.cc).map_err(DeviceError::Compile)? {
                    nvrtc::Image::Cubin(bin) => {
                        let module = self.load_image(bin.as_ptr() as *const c_void)?;
                        Ok((module, KernelImage::Binary(bin.into_boxed_slice())))
                    }
                    nvrtc::Image::Ptx(ptx) => {
                        let module = self.load_image(ptx.as_ptr() as *const c_void)?;
                        Ok((module, KernelImage::Ptx(ptx.into_boxed_slice())))
                    }
                }
            }
        }
    }

    pub(super) fn load_function_impl(
        &self,
        source: ModuleSource<'_>,
        function: &str,
    ) -> DeviceResult<FunctionId> {
        let cname = CString::new(function)
            .map_err(|_| invalid(format!("function name {function:?} contains NUL")))?;
        self.bind()?;
        let mut modules = lock(&self.modules);
        let key = ModuleKey::of(&source);
        let index = match modules.by_key.get(&key) {
            Some(&i) => i,
            None => {
                let module = self.load_module(&source)?;
                modules.loaded.push(module);
                let i = modules.loaded.len() - 1;
                modules.by_key.insert(key, i);
                i
            }
        };
        if let Some(&id) = modules.functions.get(&(index, function.to_owned())) {
            return Ok(id);
        }
        let mut f: sys::CUfunction = ptr::null_mut();
        // SAFETY: live module; NUL-terminated name; valid out-pointer.
        match unsafe {
            sys::cuModuleGetFunction(&mut f, modules.loaded[index].0 .0, cname.as_ptr())
        } {
            CUresult::CUDA_SUCCESS => {}
            CUresult::CUDA_ERROR_NOT_FOUND => {
                let hint = match source {
                    ModuleSource::CudaSource { .. } => {
                        " (declare it extern \"C\" so its name is not mangled)"
                    }
                    _ => "",
                };
                return Err(DeviceError::Compile(format!(
                    "no kernel named `{function}` in the module{hint}"
                )));
            }
            r => return Err(driver_error("cuModuleGetFunction", r)),
        }
        let func = Func(f);
        // Load it now (lazy loading would otherwise do it at the first launch, which may be
        // inside a stream capture or a timed region).
        // SAFETY: f is a live function.
        check("cuFuncLoad", unsafe { sys::cuFuncLoad(f) })?;
        let entry = FuncEntry {
            func,
            name: function.into(),
            param_sizes: param_sizes(func, &modules.loaded[index].1, function),
        };
        let id = {
            let mut functions = write(&self.functions);
            let id = u32::try_from(functions.len())
                .map_err(|_| invalid("too many functions loaded".into()))?;
            functions.push(entry);
            FunctionId(id)
        };
        modules.functions.insert((index, function.to_owned()), id);
        Ok(id)
    }
}
