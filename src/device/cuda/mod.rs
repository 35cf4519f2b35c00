//! The CUDA backend: [`CudaDevice`] implements [`Device`] for one GPU through the CUDA driver API.
//!
//! **What it owns.** One reference to the device's *primary* context (the context the CUDA
//! runtime API uses too, so a host callback that calls cudart or a library such as cuBLAS works
//! on our memory and streams), and every driver object it creates: non-blocking streams, events
//! (timing enabled), loaded modules (PTX, cubin/fatbin, NVRTC-compiled source, the built-in
//! kernels of `builtins.rs`) and instantiated graphs. Device segments and pinned host blocks are
//! handed out raw; the pool above owns them. Drop waits for the context's queued work, destroys
//! graphs, events, streams and modules, then releases the primary context.
//!
//! **Threading.** Every method takes `&self` and may be called from any thread: each call first
//! makes our context current on the calling thread (`cuCtxGetCurrent`, and `cuCtxSetCurrent`
//! only when it differs). Streams, events and graphs live in tables indexed by the small integer
//! ids of `device/` — `RwLock<Vec<Option<Arc<handle>>>>` — so the hot path (launch, record,
//! wait, copy) takes a shared lock just long enough to clone an `Arc`, and calls the driver with
//! no lock held. The `Arc` keeps a handle alive while a call on another thread still uses it, so
//! a concurrent destroy can never hand the driver a dangling handle; the driver object goes with
//! the last `Arc`. Slots are never reused, so a stale id is an `Invalid` error, not a different
//! object. Functions are only unloaded at Drop, so their table holds plain handles.
//!
//! **Which cudarc layer.** The raw `cudarc::driver::sys` (and `cudarc::nvrtc::sys`) bindings,
//! with raw `CUdeviceptr`s. cudarc's safe layer (`CudaContext`, `CudaStream`, `CudaSlice`) owns
//! allocations and records its own events around every slice use: that duplicates, and fights,
//! the runtime's own pool and event ordering. Calling `sys` directly keeps the raw `CUresult` of
//! every call, which [`check`] turns into `DeviceError::Driver { call, name, message }` with the
//! driver's own error name (`cuGetErrorName`) and text (`cuGetErrorString`).
//!
//! cudarc's dynamic loading panics when libcuda or one of its symbols is missing, so nothing here
//! calls into cudarc before [`probe`] has `dlopen`-ed the library and found every symbol we use.

mod builtins;
mod nvrtc;
mod probe;
#[cfg(test)]
mod tests;

pub use probe::probe;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::sys::{self, CUresult};

use super::{
    Buffer, BuiltinOp, DevPtr, Device, DeviceError, DeviceKind, DeviceResult, EventId, FunctionId,
    GraphExecId, HostWork, LaunchDims, ModuleSource, StreamId,
};

/// The alignment `Device::alloc_segment` promises.
const SEGMENT_ALIGN: u64 = 512;
/// Buffers a launch passes without a heap allocation.
const INLINE_BUFFERS: usize = 16;

// ---------------------------------------------------------------------------------------------
// Errors

/// The driver's name for `r` (`CUDA_ERROR_ILLEGAL_ADDRESS`), or its debug form if it has none.
pub(super) fn error_name(r: CUresult) -> String {
    let mut p: *const c_char = ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string (or fails).
    if unsafe { sys::cuGetErrorName(r, &mut p) } == CUresult::CUDA_SUCCESS && !p.is_null() {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("{r:?}")
    }
}

/// The driver's description of `r`.
pub(super) fn error_string(r: CUresult) -> String {
    let mut p: *const c_char = ptr::null();
    // SAFETY: as for error_name.
    if unsafe { sys::cuGetErrorString(r, &mut p) } == CUresult::CUDA_SUCCESS && !p.is_null() {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        "unknown CUDA error".to_owned()
    }
}

#[cold]
fn driver_error(call: &'static str, r: CUresult) -> DeviceError {
    DeviceError::Driver {
        call,
        name: error_name(r),
        message: error_string(r),
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the `Driver` error naming `call`.
#[inline]
fn check(call: &'static str, r: CUresult) -> DeviceResult<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_error(call, r))
    }
}

#[cold]
fn invalid(message: String) -> DeviceError {
    DeviceError::Invalid(message)
}

fn to_usize(bytes: u64) -> DeviceResult<usize> {
    usize::try_from(bytes).map_err(|_| invalid(format!("{bytes} bytes do not fit in usize")))
}

// Lock helpers: our critical sections never panic, so poisoning carries no meaning here.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Driver handles
//
// SAFETY of every `unsafe impl Send/Sync` below: each type wraps one opaque driver handle that we
// never dereference. The driver API is thread-safe and a handle may be used from any thread on
// which its context is current; every method makes our context current before using one, and
// the tables/`Arc`s guarantee a handle is destroyed only once, after its last use.

struct Ctx(sys::CUcontext);
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

/// Generates a handle type whose Drop destroys it (errors are logged: Drop cannot return them)
/// and whose `destroy` does the same but reports the error.
macro_rules! owned_handle {
    ($name:ident, $raw:ty, $call:literal, $destroy:path) => {
        struct $name($raw);
        unsafe impl Send for $name {}
        unsafe impl Sync for $name {}
        impl $name {
            #[allow(dead_code)] // not every handle type is destroyed explicitly
            fn destroy(self) -> DeviceResult<()> {
                let raw = self.0;
                std::mem::forget(self);
                // SAFETY: the handle is live and owned by `self`, which no longer exists.
                check($call, unsafe { $destroy(raw) })
            }
        }
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: as in `destroy`; this is the handle's only destruction.
                let r = unsafe { $destroy(self.0) };
                if r != CUresult::CUDA_SUCCESS {
                    log::warn!("gkrt cuda: {} failed in drop: {}", $call, error_name(r));
                }
            }
        }
    };
}

owned_handle!(
    Stream,
    sys::CUstream,
    "cuStreamDestroy_v2",
    sys::cuStreamDestroy_v2
);
owned_handle!(
    Event,
    sys::CUevent,
    "cuEventDestroy_v2",
    sys::cuEventDestroy_v2
);
owned_handle!(
    GraphExec,
    sys::CUgraphExec,
    "cuGraphExecDestroy",
    sys::cuGraphExecDestroy
);
owned_handle!(Module, sys::CUmodule, "cuModuleUnload", sys::cuModuleUnload);

#[derive(Clone, Copy)]
struct Func(sys::CUfunction);
unsafe impl Send for Func {}
unsafe impl Sync for Func {}

/// A loaded kernel and what the driver says about its parameters.
struct FuncEntry {
    func: Func,
    name: Box<str>,
    /// Byte size of each parameter (`cuFuncGetParamInfo`), used to reject a launch whose
    /// buffers/params do not match the kernel's signature before the driver reads past them.
    /// `None` when the driver could not tell.
    param_sizes: Option<Box<[usize]>>,
}

/// Id-indexed table of shared handles. Slots are never reused (see the module comment).
struct Table<T> {
    slots: RwLock<Vec<Option<Arc<T>>>>,
    what: &'static str,
}

impl<T> Table<T> {
    fn new(what: &'static str) -> Self {
        Table {
            slots: RwLock::new(Vec::new()),
            what,
        }
    }

    fn insert(&self, value: T) -> DeviceResult<u32> {
        let mut slots = write(&self.slots);
        let id = u32::try_from(slots.len())
            .map_err(|_| invalid(format!("too many {}s created", self.what)))?;
        slots.push(Some(Arc::new(value)));
        Ok(id)
    }

    #[inline]
    fn get(&self, id: u32) -> DeviceResult<Arc<T>> {
        match read(&self.slots).get(id as usize) {
            Some(Some(v)) => Ok(Arc::clone(v)),
            _ => Err(self.unknown(id)),
        }
    }

    fn remove(&self, id: u32) -> DeviceResult<Arc<T>> {
        let taken = write(&self.slots)
            .get_mut(id as usize)
            .and_then(Option::take);
        taken.ok_or_else(|| self.unknown(id))
    }

    /// Empties the table; the handles are destroyed (outside the lock) as the `Arc`s drop.
    fn clear(&self) {
        let all = std::mem::take(&mut *write(&self.slots));
        drop(all);
    }

    #[cold]
    fn unknown(&self, id: u32) -> DeviceError {
        invalid(format!("unknown or destroyed {} id {id}", self.what))
    }
}

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
struct Modules {
    /// Index into `loaded` of each module already built.
    by_key: HashMap<ModuleKey, usize>,
    /// Every module loaded, unloaded at Drop.
    loaded: Vec<Module>,
    /// (module index, function name) → id, so loading a function twice returns the same id.
    functions: HashMap<(usize, String), FunctionId>,
}

/// The built-in kernels, loaded once per device.
struct Builtins {
    add: Func,
    scale: Func,
    relu: Func,
    relu_grad: Func,
    matmul: Func,
}

/// Pointers to a kernel's arguments, for `cuLaunchKernel`'s `kernelParams`. The driver only
/// reads through them (and copies the values before returning).
macro_rules! kernel_args {
    ($($arg:ident),* $(,)?) => {
        [$(ptr::addr_of!($arg) as *mut c_void),*]
    };
}

/// `cuLaunchKernel` on raw arguments.
///
/// # Safety
/// `f` must be a live function of our context, `stream` a live stream of it, and `args` must
/// match the kernel's parameters in number and size.
unsafe fn cu_launch(
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
    let r = sys::cuLaunchKernel(
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
    );
    check("cuLaunchKernel", r)
}

/// Rejects a launch whose arguments do not match the kernel's parameters: the driver would read
/// `param_sizes[i]` bytes behind each argument pointer, past the end of a too-short blob.
fn check_signature(
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

/// The size of each parameter of `f`, or `None` if the driver cannot say.
fn param_sizes(f: Func) -> Option<Box<[usize]>> {
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: f is a live, loaded function; out-pointers are valid.
        let r = unsafe { sys::cuFuncGetParamInfo(f.0, sizes.len(), &mut offset, &mut size) };
        match r {
            CUresult::CUDA_SUCCESS => sizes.push(size),
            // One past the last parameter.
            CUresult::CUDA_ERROR_INVALID_VALUE => break,
            _ => return None,
        }
        if sizes.len() > 4096 {
            return None;
        }
    }
    // An empty answer cannot be told apart from "not supported": do not validate then.
    (!sizes.is_empty()).then(|| sizes.into_boxed_slice())
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

// ---------------------------------------------------------------------------------------------
// The device

/// One CUDA GPU behind the [`Device`] trait. See the module comment.
pub struct CudaDevice {
    ordinal: u32,
    dev: sys::CUdevice,
    ctx: Ctx,
    name: String,
    total_memory: u64,
    /// Compute capability (major, minor).
    cc: (i32, i32),
    /// Grid cap of the element-wise built-ins: 4 blocks per SM.
    max_blocks: u32,
    streams: Table<Stream>,
    events: Table<Event>,
    graphs: Table<GraphExec>,
    functions: RwLock<Vec<FuncEntry>>,
    modules: Mutex<Modules>,
    builtins: OnceLock<Builtins>,
    /// Serialises the first compilation of the built-ins.
    builtins_init: Mutex<()>,
    /// Segments whose driver address was not `SEGMENT_ALIGN`-aligned: aligned → raw address.
    realigned: Mutex<HashMap<DevPtr, DevPtr>>,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("compute_capability", &self.cc)
            .field("total_memory", &self.total_memory)
            .finish_non_exhaustive()
    }
}

struct DeviceInfo {
    name: String,
    total_memory: u64,
    cc: (i32, i32),
    sm_count: i32,
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> DeviceResult<i32> {
    let mut v: c_int = 0;
    // SAFETY: dev came from cuDeviceGet; valid out-pointer.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

impl CudaDevice {
    /// Opens GPU `ordinal`: retains its primary context and reads its properties.
    /// `DeviceError::NoDevice` (with [`probe`]'s reason) when there is no usable driver or device.
    pub fn open(ordinal: u32) -> DeviceResult<CudaDevice> {
        probe(ordinal).map_err(DeviceError::NoDevice)?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: cuInit succeeded in probe; valid out-pointers.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal as c_int)
        })?;
        let mut ctx: sys::CUcontext = ptr::null_mut();
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let info = match Self::query(dev, ctx) {
            Ok(info) => info,
            Err(e) => {
                // SAFETY: balances the retain above.
                unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
                return Err(e);
            }
        };
        let max_blocks = u32::try_from(info.sm_count.max(1))
            .unwrap_or(1)
            .saturating_mul(4);
        Ok(CudaDevice {
            ordinal,
            dev,
            ctx: Ctx(ctx),
            name: info.name,
            total_memory: info.total_memory,
            cc: info.cc,
            max_blocks,
            streams: Table::new("stream"),
            events: Table::new("event"),
            graphs: Table::new("graph"),
            functions: RwLock::new(Vec::new()),
            modules: Mutex::new(Modules::default()),
            builtins: OnceLock::new(),
            builtins_init: Mutex::new(()),
            realigned: Mutex::new(HashMap::new()),
        })
    }

    fn query(dev: sys::CUdevice, ctx: sys::CUcontext) -> DeviceResult<DeviceInfo> {
        // SAFETY: ctx is the retained primary context of dev; buffers and out-pointers are valid.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
        let mut buf = [0 as c_char; 256];
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev)
        })?;
        buf[buf.len() - 1] = 0;
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut total: usize = 0;
        check("cuDeviceTotalMem_v2", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total, dev)
        })?;
        use sys::CUdevice_attribute as A;
        let major = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sm_count = attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(DeviceInfo {
            name,
            total_memory: total as u64,
            cc: (major, minor),
            sm_count,
        })
    }

    /// The CUDA device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Compute capability (major, minor), e.g. (9, 0) on an H200.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Makes our context current on the calling thread (a no-op when it already is).
    ///
    /// This leaves it current afterwards: it is the primary context, the one the CUDA runtime
    /// would use on this thread anyway.
    #[inline]
    fn bind(&self) -> DeviceResult<()> {
        let mut current: sys::CUcontext = ptr::null_mut();
        // SAFETY: valid out-pointer; self.ctx is retained until Drop.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current != self.ctx.0 {
            check("cuCtxSetCurrent", unsafe {
                sys::cuCtxSetCurrent(self.ctx.0)
            })?;
        }
        Ok(())
    }

    fn mem_alloc(&self, size: usize, requested: u64) -> DeviceResult<DevPtr> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; context is current.
        match unsafe { sys::cuMemAlloc_v2(&mut p, size) } {
            CUresult::CUDA_SUCCESS => Ok(p),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory {
                requested,
                message: format!(
                    "cuMemAlloc_v2: {}",
                    error_string(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
                ),
            }),
            r => Err(driver_error("cuMemAlloc_v2", r)),
        }
    }

    fn func(&self, id: FunctionId) -> DeviceResult<Func> {
        read(&self.functions)
            .get(id.0 as usize)
            .map(|e| e.func)
            .ok_or_else(|| invalid(format!("unknown function id {}", id.0)))
    }

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

    fn load_module(&self, source: &ModuleSource<'_>) -> DeviceResult<Module> {
        match source {
            ModuleSource::Ptx(text) => {
                let c = CString::new(*text)
                    .map_err(|_| DeviceError::Compile("PTX text contains a NUL byte".into()))?;
                self.load_image(c.as_ptr() as *const c_void)
            }
            ModuleSource::Cubin(image) => {
                if image.is_empty() {
                    return Err(DeviceError::Compile("empty cubin image".into()));
                }
                // The driver sizes an ELF or fatbin from its header; anything else it reads as
                // NUL-terminated text, so give it a terminated copy rather than let it overrun.
                const ELF: &[u8] = b"\x7fELF";
                const FATBIN: &[u8] = &0xBA55_ED50u32.to_le_bytes();
                if image.starts_with(ELF) || image.starts_with(FATBIN) {
                    self.load_image(image.as_ptr() as *const c_void)
                } else {
                    let mut text = image.to_vec();
                    text.push(0);
                    self.load_image(text.as_ptr() as *const c_void)
                }
            }
            ModuleSource::CudaSource { source, options } => {
                match nvrtc::compile(source, options, self.cc).map_err(DeviceError::Compile)? {
                    nvrtc::Image::Cubin(bin) => self.load_image(bin.as_ptr() as *const c_void),
                    nvrtc::Image::Ptx(ptx) => self.load_image(ptx.as_ptr() as *const c_void),
                }
            }
        }
    }

    /// The built-in kernels, compiled with NVRTC on first use (once per device).
    fn builtins(&self) -> DeviceResult<&Builtins> {
        if let Some(b) = self.builtins.get() {
            return Ok(b);
        }
        let _init = lock(&self.builtins_init);
        if let Some(b) = self.builtins.get() {
            return Ok(b);
        }
        let options: Vec<String> = builtins::OPTIONS.iter().map(|s| (*s).to_owned()).collect();
        let load = |name: &str| -> DeviceResult<Func> {
            let source = ModuleSource::CudaSource {
                source: builtins::SOURCE,
                options: &options,
            };
            let id = self.load_function(source, name)?;
            self.func(id)
        };
        let b = Builtins {
            add: load(builtins::ADD)?,
            scale: load(builtins::SCALE)?,
            relu: load(builtins::RELU)?,
            relu_grad: load(builtins::RELU_GRAD)?,
            matmul: load(builtins::MATMUL)?,
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
        let blocks = n
            .div_ceil(u64::from(builtins::BLOCK))
            .min(u64::from(self.max_blocks)) as u32;
        // SAFETY: f is a built-in whose signature the caller's args match; stream is live.
        unsafe { cu_launch(f, [blocks, 1, 1], [builtins::BLOCK, 1, 1], 0, stream, args) }
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

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Err(e) = self.bind() {
            log::warn!("gkrt cuda: cannot make the context current in drop: {e}");
        }
        // Queued work may still use our streams, events and modules: let it finish first.
        // SAFETY: plain driver call on the current context.
        let r = unsafe { sys::cuCtxSynchronize() };
        if r != CUresult::CUDA_SUCCESS {
            log::warn!(
                "gkrt cuda: cuCtxSynchronize failed in drop: {}",
                error_name(r)
            );
        }
        self.graphs.clear();
        self.events.clear();
        self.streams.clear();
        write(&self.functions).clear();
        let modules = std::mem::take(&mut *lock(&self.modules));
        drop(modules); // unloads every module
                       // SAFETY: balances the retain in `open`; nothing of ours uses the context any more.
        let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
        if r != CUresult::CUDA_SUCCESS {
            log::warn!(
                "gkrt cuda: cuDevicePrimaryCtxRelease_v2 failed: {}",
                error_name(r)
            );
        }
    }
}

impl Device for CudaDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn total_memory(&self) -> u64 {
        self.total_memory
    }

    // --- memory ---

    fn alloc_segment(&self, bytes: u64) -> DeviceResult<DevPtr> {
        if bytes == 0 {
            return Err(invalid("alloc_segment of 0 bytes".into()));
        }
        let size = to_usize(bytes)?;
        self.bind()?;
        let p = self.mem_alloc(size, bytes)?;
        if p % SEGMENT_ALIGN == 0 {
            return Ok(p);
        }
        // cuMemAlloc only documents 256-byte alignment (in practice it gives more). Rare path:
        // over-allocate and remember the raw address for free_segment.
        // SAFETY: p was just allocated and is unused.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(p) })?;
        let padded = size
            .checked_add(SEGMENT_ALIGN as usize - 1)
            .ok_or_else(|| invalid(format!("alloc_segment of {bytes} bytes overflows")))?;
        let raw = self.mem_alloc(padded, bytes)?;
        let aligned = raw.next_multiple_of(SEGMENT_ALIGN);
        lock(&self.realigned).insert(aligned, raw);
        Ok(aligned)
    }

    fn free_segment(&self, ptr: DevPtr, _bytes: u64) -> DeviceResult<()> {
        if ptr == 0 {
            return Err(invalid("free_segment of a null pointer".into()));
        }
        self.bind()?;
        let raw = lock(&self.realigned).remove(&ptr).unwrap_or(ptr);
        // SAFETY: the driver validates that raw is an allocation base of this context.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(raw) })
    }

    fn alloc_pinned(&self, bytes: u64) -> DeviceResult<*mut u8> {
        if bytes == 0 {
            return Err(invalid("alloc_pinned of 0 bytes".into()));
        }
        let size = to_usize(bytes)?;
        self.bind()?;
        let mut p: *mut c_void = ptr::null_mut();
        // PORTABLE: pinned for every context, not only ours (host programs may use others).
        // SAFETY: valid out-pointer.
        match unsafe { sys::cuMemHostAlloc(&mut p, size, sys::CU_MEMHOSTALLOC_PORTABLE) } {
            CUresult::CUDA_SUCCESS => Ok(p as *mut u8),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: format!(
                    "cuMemHostAlloc: {}",
                    error_string(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
                ),
            }),
            r => Err(driver_error("cuMemHostAlloc", r)),
        }
    }

    fn free_pinned(&self, ptr: *mut u8, _bytes: u64) -> DeviceResult<()> {
        if ptr.is_null() {
            return Err(invalid("free_pinned of a null pointer".into()));
        }
        self.bind()?;
        // SAFETY: the driver validates that ptr came from cuMemHostAlloc.
        check("cuMemFreeHost", unsafe {
            sys::cuMemFreeHost(ptr as *mut c_void)
        })
    }

    // --- streams and events ---

    fn create_stream(&self) -> DeviceResult<StreamId> {
        self.bind()?;
        let mut s: sys::CUstream = ptr::null_mut();
        // Non-blocking: no implicit ordering with the legacy default stream, which other code in
        // the process may use.
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        // SAFETY: valid out-pointer.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, flags)
        })?;
        self.streams.insert(Stream(s)).map(StreamId)
    }

    fn destroy_stream(&self, stream: StreamId) -> DeviceResult<()> {
        self.bind()?;
        let s = self.streams.remove(stream.0)?;
        // If another thread is still using it, its last Arc destroys it.
        match Arc::try_unwrap(s) {
            Ok(s) => s.destroy(),
            Err(_) => Ok(()),
        }
    }

    fn native_stream(&self, stream: StreamId) -> DeviceResult<*mut c_void> {
        Ok(self.streams.get(stream.0)?.0 as *mut c_void)
    }

    fn stream_synchronize(&self, stream: StreamId) -> DeviceResult<()> {
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        // Kernel faults raised since the last sync come back here (e.g. CUDA_ERROR_ILLEGAL_ADDRESS).
        // SAFETY: live stream (the Arc holds it).
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s.0)
        })
    }

    fn create_event(&self) -> DeviceResult<EventId> {
        self.bind()?;
        let mut e: sys::CUevent = ptr::null_mut();
        // Default flags: timing enabled (event_elapsed_ms needs it).
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT as c_uint;
        // SAFETY: valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, flags)
        })?;
        self.events.insert(Event(e)).map(EventId)
    }

    fn destroy_event(&self, event: EventId) -> DeviceResult<()> {
        self.bind()?;
        let e = self.events.remove(event.0)?;
        match Arc::try_unwrap(e) {
            Ok(e) => e.destroy(),
            Err(_) => Ok(()),
        }
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> DeviceResult<()> {
        let e = self.events.get(event.0)?;
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        // SAFETY: live event and stream of our context.
        check("cuEventRecord", unsafe { sys::cuEventRecord(e.0, s.0) })
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        let s = self.streams.get(stream.0)?;
        let e = self.events.get(event.0)?;
        self.bind()?;
        // SAFETY: live stream and event; flags 0 (CU_EVENT_WAIT_DEFAULT).
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(s.0, e.0, 0)
        })
    }

    fn event_query(&self, event: EventId) -> DeviceResult<bool> {
        let e = self.events.get(event.0)?;
        self.bind()?;
        // SAFETY: live event. A never-recorded event reports CUDA_SUCCESS.
        match unsafe { sys::cuEventQuery(e.0) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver_error("cuEventQuery", r)),
        }
    }

    fn event_synchronize(&self, event: EventId) -> DeviceResult<()> {
        let e = self.events.get(event.0)?;
        self.bind()?;
        // SAFETY: live event.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(e.0)
        })
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> DeviceResult<f32> {
        let a = self.events.get(start.0)?;
        let b = self.events.get(end.0)?;
        self.bind()?;
        let mut ms = 0f32;
        // SAFETY: live events; valid out-pointer.
        check("cuEventElapsedTime_v2", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, a.0, b.0)
        })?;
        Ok(ms)
    }

    // --- copies ---

    fn copy_h2d_async(
        &self,
        dst: DevPtr,
        src: *const u8,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let s = self.streams.get(stream.0)?;
        if bytes == 0 {
            return Ok(());
        }
        if dst == 0 || src.is_null() {
            return Err(invalid("copy_h2d_async with a null pointer".into()));
        }
        let n = to_usize(bytes)?;
        self.bind()?;
        // SAFETY: the caller keeps src valid until the stream passes the copy (trait contract);
        // the driver validates dst.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, n, s.0)
        })
    }

    fn copy_d2h_async(
        &self,
        dst: *mut u8,
        src: DevPtr,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let s = self.streams.get(stream.0)?;
        if bytes == 0 {
            return Ok(());
        }
        if dst.is_null() || src == 0 {
            return Err(invalid("copy_d2h_async with a null pointer".into()));
        }
        let n = to_usize(bytes)?;
        self.bind()?;
        // SAFETY: as for copy_h2d_async.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, n, s.0)
        })
    }

    fn copy_d2d_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let s = self.streams.get(stream.0)?;
        if bytes == 0 {
            return Ok(());
        }
        if dst == 0 || src == 0 {
            return Err(invalid("copy_d2d_async with a null pointer".into()));
        }
        let n = to_usize(bytes)?;
        self.bind()?;
        // SAFETY: the driver validates both device ranges.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, n, s.0)
        })
    }

    // --- kernels ---

    fn load_function(&self, source: ModuleSource<'_>, function: &str) -> DeviceResult<FunctionId> {
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
        match unsafe { sys::cuModuleGetFunction(&mut f, modules.loaded[index].0, cname.as_ptr()) } {
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
            param_sizes: param_sizes(func),
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

    fn launch(
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

    fn launch_builtin(
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
                let tile = builtins::TILE;
                let grid = [
                    n.div_ceil(tile),
                    m.div_ceil(tile).min(builtins::MAX_GRID_Y),
                    1,
                ];
                let mut args = kernel_args!(o, a, b, m, n, k);
                // SAFETY: args match gkrt_matmul's signature; live stream.
                unsafe { cu_launch(f, grid, [tile, tile, 1], 0, stream, &mut args) }
            }
        }
    }

    fn enqueue_host_work(&self, stream: StreamId, work: HostWork) -> DeviceResult<()> {
        // The Arc keeps the stream alive while the work runs, even if another thread destroys it.
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        let native = s.0 as *mut c_void;
        // A panic must not unwind through the runtime's C boundary from inside a callback.
        match catch_unwind(AssertUnwindSafe(move || work(native))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(DeviceError::Async(message)),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".to_owned());
                Err(DeviceError::Async(format!("host work panicked: {what}")))
            }
        }
    }

    // --- capture ---

    fn supports_capture(&self) -> bool {
        true
    }

    /// Begins capturing `stream` in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: while this thread
    /// captures, a capture-unsafe call *on this thread* (cuMemAlloc, a synchronisation, ...) fails
    /// with an error instead of silently running outside the graph — a planned step must make
    /// no pool calls, so that would be a bug worth seeing — while other threads (other runtimes
    /// in the process) are not restricted, as they would be in GLOBAL mode. RELAXED would let
    /// such a call slip by. Consequence: `end_capture` must be called on the same thread.
    fn begin_capture(&self, stream: StreamId) -> DeviceResult<()> {
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        // Compile/load the built-ins now: module loading has no place inside a capture. Not
        // fatal here (e.g. no NVRTC): a built-in launch in the capture will report it.
        if let Err(e) = self.builtins() {
            log::debug!("gkrt cuda: built-ins unavailable before capture: {e}");
        }
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: live stream.
        check("cuStreamBeginCapture_v2", unsafe {
            sys::cuStreamBeginCapture_v2(s.0, mode)
        })
    }

    fn end_capture(&self, stream: StreamId) -> DeviceResult<GraphExecId> {
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: live stream; valid out-pointer.
        let r = unsafe { sys::cuStreamEndCapture(s.0, &mut graph) };
        if r != CUresult::CUDA_SUCCESS {
            if !graph.is_null() {
                // SAFETY: a graph returned to us, destroyed once.
                unsafe { sys::cuGraphDestroy(graph) };
            }
            return Err(driver_error("cuStreamEndCapture", r));
        }
        if graph.is_null() {
            return Err(invalid("stream capture produced no graph".into()));
        }
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        // SAFETY: graph is live; flags 0. The exec does not need the graph afterwards.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        let rd = unsafe { sys::cuGraphDestroy(graph) };
        check("cuGraphInstantiateWithFlags", r)?;
        let exec = GraphExec(exec);
        if rd != CUresult::CUDA_SUCCESS {
            log::warn!("gkrt cuda: cuGraphDestroy failed: {}", error_name(rd));
        }
        self.graphs.insert(exec).map(GraphExecId)
    }

    fn launch_graph(&self, graph: GraphExecId, stream: StreamId) -> DeviceResult<()> {
        let g = self.graphs.get(graph.0)?;
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        // SAFETY: live graph exec and stream.
        check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(g.0, s.0) })
    }

    fn destroy_graph(&self, graph: GraphExecId) -> DeviceResult<()> {
        self.bind()?;
        let g = self.graphs.remove(graph.0)?;
        match Arc::try_unwrap(g) {
            Ok(g) => g.destroy(),
            Err(_) => Ok(()),
        }
    }
}
