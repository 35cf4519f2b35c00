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
//! every call, which `check` turns into `DeviceError::Driver { call, name, message }` with the
//! driver's own error name (`cuGetErrorName`) and text (`cuGetErrorString`).
//!
//! cudarc's dynamic loading panics when libcuda or one of its symbols is missing, so nothing here
//! calls into cudarc before [`probe`] has `dlopen`-ed the library and found every symbol we use.
//!
//! **Files.** `probe.rs` finds the driver (and NVRTC) without panicking; `handles.rs` holds the
//! error mapping, handle wrappers and id tables; `modules.rs` loads PTX/cubin/source into cached
//! modules; `params.rs` reads a kernel's parameter count from the image it was loaded from (so
//! its layout is asked of the driver without a failing call); `nvrtc.rs` compiles CUDA C++;
//! `launch.rs` launches; `builtins.rs` is the built-in kernels' CUDA source and their launcher;
//! `vmm.rs` the virtual-memory ranges and pages the pool grows by; `tests/` the tests, a file per
//! part (GPU ones are `#[ignore]`d).

mod builtins;
mod handles;
mod launch;
mod modules;
mod nccl;
mod nccl_calls;
mod nvrtc;
mod params;
mod probe;
mod vmm;

pub use probe::probe;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use cudarc::driver::sys::{self, CUresult};

use builtins::Builtins;
use handles::{
    check, driver_error, error_name, error_string, invalid, lock, read, to_usize, write, Ctx,
    Event, Func, FuncEntry, GraphExec, Owned, Stream, Table,
};
use modules::Modules;

use super::{
    Buffer, BuiltinOp, DevPtr, Device, DeviceError, DeviceKind, DeviceResult, EventId, FunctionId,
    GraphExecId, HostWork, LaunchDims, ModuleSource, StreamId, VirtualMemory,
};

/// The alignment `Device::alloc_segment` promises.
const SEGMENT_ALIGN: u64 = 512;

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
    /// Streams of the host program wrapped by `import_stream`: native handle → id.
    imported: Mutex<HashMap<usize, u32>>,
    /// Virtual-memory granularity, probed on first use; `None`: unsupported or turned off.
    vmm_page: OnceLock<Option<u64>>,
    /// Physical allocations of virtual memory: mapped ones by address, and spares.
    vmm_handles: Mutex<vmm::Handles>,
    /// Streams an aborted NCCL communicator left work on (`nccl.rs`): reported by
    /// `stream_synchronize` as `PeerFailed`.
    comm_failures: Arc<nccl::StreamFailures>,
    /// Segments and mapped pages, registered with every NCCL communicator of the device.
    registrations: super::registration::Registrations,
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
            imported: Mutex::new(HashMap::new()),
            vmm_page: OnceLock::new(),
            vmm_handles: Mutex::new(vmm::Handles::default()),
            comm_failures: Arc::new(nccl::StreamFailures::default()),
            registrations: Default::default(),
        })
    }

    /// Turns virtual-memory growth off for this device (the pool then uses plain `cuMemAlloc`
    /// segments); the runtime calls it right after `open` for `GKRT_VMM=0`.
    pub fn disable_virtual_memory(&self) {
        let _ = self.vmm_page.set(None);
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
    #[allow(dead_code)] // unused since device/ is crate-private: the owner may remove it
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Compute capability (major, minor), e.g. (9, 0) on an H200.
    #[cfg_attr(not(test), allow(dead_code))] // used by device/cuda/tests/ only
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
        self.release_vmm_handles();
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
            self.registrations.added(p, bytes);
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
        self.registrations.added(aligned, bytes);
        Ok(aligned)
    }

    fn free_segment(&self, ptr: DevPtr, _bytes: u64) -> DeviceResult<()> {
        if ptr == 0 {
            return Err(invalid("free_segment of a null pointer".into()));
        }
        self.bind()?;
        // Communicators let go of it first (a no-op for an address that is no segment).
        self.registrations.removing(ptr);
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

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: u64) -> DeviceResult<()> {
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
        self.streams.insert(Stream(s, Owned::Yes)).map(StreamId)
    }

    fn destroy_stream(&self, stream: StreamId) -> DeviceResult<()> {
        self.bind()?;
        let s = self.streams.remove(stream.0)?;
        lock(&self.imported).retain(|_, id| *id != stream.0);
        // If another thread is still using it, its last Arc destroys it.
        match Arc::try_unwrap(s) {
            Ok(s) => s.destroy(),
            Err(_) => Ok(()),
        }
    }

    fn native_stream(&self, stream: StreamId) -> DeviceResult<*mut c_void> {
        Ok(self.streams.get(stream.0)?.0 as *mut c_void)
    }

    fn import_stream(&self, native: *mut c_void) -> DeviceResult<StreamId> {
        let key = native as usize;
        if let Some(id) = self
            .streams
            .find(|s| s.0 as usize == key && s.1 == Owned::Yes)
        {
            return Ok(StreamId(id));
        }
        let mut imported = lock(&self.imported);
        if let Some(&id) = imported.get(&key) {
            return Ok(StreamId(id));
        }
        let id = self
            .streams
            .insert(Stream(native as sys::CUstream, Owned::Borrowed))?;
        imported.insert(key, id);
        Ok(StreamId(id))
    }

    fn stream_synchronize(&self, stream: StreamId) -> DeviceResult<()> {
        let s = self.streams.get(stream.0)?;
        self.bind()?;
        // Kernel faults raised since the last sync come back here (e.g. CUDA_ERROR_ILLEGAL_ADDRESS).
        // SAFETY: live stream (the Arc holds it).
        let synced = check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s.0)
        });
        // A communicator aborted while this stream held its collectives: the work "completed"
        // without its data.
        match self.comm_failures.take(s.0 as usize) {
            Some(why) => Err(DeviceError::PeerFailed(why)),
            None => synced,
        }
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

    fn create_sync_event(&self) -> DeviceResult<EventId> {
        self.bind()?;
        let mut e: sys::CUevent = ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
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

    unsafe fn copy_h2d_async(
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

    unsafe fn copy_d2h_async(
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
        self.load_function_impl(source, function)
    }

    fn launch(
        &self,
        function: FunctionId,
        dims: &LaunchDims,
        buffers: &[Buffer],
        params: &[u8],
        stream: StreamId,
    ) -> DeviceResult<()> {
        self.launch_impl(function, dims, buffers, params, stream)
    }

    fn launch_builtin(
        &self,
        op: BuiltinOp,
        inputs: &[Buffer],
        outputs: &[Buffer],
        stream: StreamId,
    ) -> DeviceResult<()> {
        self.launch_builtin_impl(op, inputs, outputs, stream)
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

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.vmm_page().map(|_| self as &dyn VirtualMemory)
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

    // --- communicators: NCCL (nccl.rs) ---
    fn comm_unique_id(&self) -> DeviceResult<super::comm::UniqueId> {
        nccl::unique_id()
    }

    fn comm_init_rank(
        &self,
        id: &super::comm::UniqueId,
        rank: u32,
        nranks: u32,
        options: super::comm::CommOptions,
    ) -> DeviceResult<Arc<dyn super::comm::Communicator>> {
        // NCCL takes the device from the current context.
        self.bind()?;
        nccl::init_rank(
            &self.ctx,
            &self.comm_failures,
            &self.registrations,
            id,
            rank,
            nranks,
            options,
        )
    }

    fn comm_wrap(
        &self,
        native: *mut c_void,
        rank: u32,
        nranks: u32,
        options: super::comm::CommOptions,
    ) -> DeviceResult<Arc<dyn super::comm::Communicator>> {
        self.bind()?;
        nccl::wrap(
            self.ordinal,
            &self.ctx,
            &self.comm_failures,
            &self.registrations,
            native,
            rank,
            nranks,
            options,
        )
    }
}

// Last, so the tests see the macros above.
#[cfg(test)]
mod tests;
