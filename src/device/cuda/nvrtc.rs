//! CUDA C++ → loadable image through NVRTC (cudarc's raw `nvrtc::sys` layer).
//!
//! We ask NVRTC for a cubin for the device's exact `sm_XY`: it needs no driver JIT and does not
//! depend on the driver accepting the PTX ISA version of a newer NVRTC. Only when NVRTC does not
//! know the device's architecture (a GPU newer than the toolkit) do we fall back to PTX for the
//! newest virtual architecture it knows, which the driver JIT-compiles.

use std::ffi::{c_char, c_int, CStr, CString};
use std::ptr;
use std::sync::OnceLock;

use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};

use super::probe;

/// What NVRTC produced.
pub(super) enum Image {
    /// An ELF cubin for the device.
    Cubin(Vec<u8>),
    /// NUL-terminated PTX text.
    Ptx(Vec<u8>),
}

fn nvrtc_error_name(r: nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string (or NULL).
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Destroys the program on every exit path.
struct Program(nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 came from nvrtcCreateProgram and is destroyed once, here.
        let r = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
        if r != nvrtcResult::NVRTC_SUCCESS {
            log::warn!("nvrtcDestroyProgram failed: {}", nvrtc_error_name(r));
        }
    }
}

/// The SM versions (e.g. 90 for sm_90) this NVRTC can generate code for; empty if unknown.
fn supported_archs() -> &'static [c_int] {
    static ARCHS: OnceLock<Vec<c_int>> = OnceLock::new();
    ARCHS.get_or_init(|| {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointers sized by the count NVRTC reports.
        unsafe {
            if sys::nvrtcGetNumSupportedArchs(&mut n) != nvrtcResult::NVRTC_SUCCESS || n <= 0 {
                return Vec::new();
            }
            let mut v = vec![0 as c_int; n as usize];
            if sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) != nvrtcResult::NVRTC_SUCCESS {
                return Vec::new();
            }
            v
        }
    })
}

/// `--gpu-architecture=...` for a device of compute capability `cc` (major, minor).
fn arch_option(cc: (i32, i32)) -> String {
    let sm = cc.0 * 10 + cc.1;
    let archs = supported_archs();
    if archs.is_empty() || archs.contains(&sm) {
        return format!("--gpu-architecture=sm_{sm}");
    }
    match archs.iter().copied().filter(|&a| a < sm).max() {
        // Newer GPU than this NVRTC knows: PTX for the newest virtual arch, JIT-ed by the driver.
        Some(a) => format!("--gpu-architecture=compute_{a}"),
        None => format!("--gpu-architecture=sm_{sm}"),
    }
}

fn has_arch_option(options: &[String]) -> bool {
    options.iter().any(|o| {
        o.starts_with("--gpu-architecture") || o.starts_with("-arch") || o.starts_with("--gpu-name")
    })
}

fn program_log(prog: nvrtcProgram) -> String {
    let mut size: usize = 0;
    // SAFETY: prog is a live program; the buffer has the size NVRTC reported.
    unsafe {
        if sys::nvrtcGetProgramLogSize(prog, &mut size) != nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char)
            != nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_owned()
    }
}

/// Compiles `source` with `options` (plus `--gpu-architecture` for `cc` unless the options name
/// one). `Err` carries the NVRTC error name and the compile log.
pub(super) fn compile(source: &str, options: &[String], cc: (i32, i32)) -> Result<Image, String> {
    probe::nvrtc_library().map_err(|e| format!("NVRTC is not available: {e}"))?;
    let src = CString::new(source).map_err(|_| "CUDA source contains a NUL byte".to_owned())?;
    let mut opts: Vec<CString> = Vec::with_capacity(options.len() + 1);
    for o in options {
        opts.push(
            CString::new(o.as_str())
                .map_err(|_| format!("NVRTC option {o:?} contains a NUL byte"))?,
        );
    }
    if !has_arch_option(options) {
        opts.push(CString::new(arch_option(cc)).expect("no NUL"));
    }
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

    let mut raw: nvrtcProgram = ptr::null_mut();
    // SAFETY: src and the name are NUL-terminated and outlive the program; no headers.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            c"gkrt.cu".as_ptr(),
            0,
            ptr::null(),
            ptr::null(),
        )
    };
    if r != nvrtcResult::NVRTC_SUCCESS {
        return Err(format!(
            "nvrtcCreateProgram failed: {}",
            nvrtc_error_name(r)
        ));
    }
    let prog = Program(raw);

    // SAFETY: opt_ptrs point into `opts`, alive for the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    if r != nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(prog.0);
        return Err(format!(
            "nvrtcCompileProgram failed: {}\n{log}",
            nvrtc_error_name(r)
        ));
    }

    // A cubin exists when compiling for a real sm_XY; for a virtual compute_XY only PTX does.
    let mut size: usize = 0;
    // SAFETY: live program; buffers sized by the sizes NVRTC reports.
    unsafe {
        if sys::nvrtcGetCUBINSize(prog.0, &mut size) == nvrtcResult::NVRTC_SUCCESS && size > 0 {
            let mut cubin = vec![0u8; size];
            let r = sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut c_char);
            if r != nvrtcResult::NVRTC_SUCCESS {
                return Err(format!("nvrtcGetCUBIN failed: {}", nvrtc_error_name(r)));
            }
            return Ok(Image::Cubin(cubin));
        }
        let r = sys::nvrtcGetPTXSize(prog.0, &mut size);
        if r != nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return Err(format!("nvrtcGetPTXSize failed: {}", nvrtc_error_name(r)));
        }
        let mut ptx = vec![0u8; size];
        let r = sys::nvrtcGetPTX(prog.0, ptx.as_mut_ptr() as *mut c_char);
        if r != nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcGetPTX failed: {}", nvrtc_error_name(r)));
        }
        // The size includes the terminating NUL; make sure of it.
        if ptx.last() != Some(&0) {
            ptx.push(0);
        }
        Ok(Image::Ptx(ptx))
    }
}
