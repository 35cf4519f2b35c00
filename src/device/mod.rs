//! The device layer: the one trait every backend implements, and the types that cross it.
//!
//! It imports only `kernels` (the descriptions of what a launch runs — `BuiltinOp`,
//! `LaunchDims`, `FunctionId`, `Buffer`, and the built-ins' CPU arithmetic the host backend
//! runs) and `error`. Everything above this module is generic over `dyn Device`, made by `open`
//! (the one function that picks a backend); only `cuda/` names cudarc and only `host/` knows
//! that "device memory" is host RAM. Streams, events and functions are small
//! integer handles into tables the backend owns, so the layers above can copy them freely and a
//! backend can validate them (a stale handle is an error, not undefined behaviour).

pub mod comm;
pub mod cuda;
pub mod host;
pub mod registration;

use crate::error::Error;
/// The kernel descriptions the device implements live one layer down, in `kernels`; they are
/// re-exported here because every backend method names them.
pub use crate::kernels::{Buffer, BuiltinOp, FunctionId, LaunchDims};
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

/// A device address. On the host backend it is a host address inside a segment; on CUDA a
/// `CUdeviceptr`.
pub type DevPtr = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphExecId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Host,
    Cuda,
}

/// Errors of the device layer. `capi/` maps them to statuses.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceError {
    /// The device (or the backend's own limit) could not provide `requested` bytes.
    OutOfMemory { requested: u64, message: String },
    /// No usable device: no driver, no GPU, or the ordinal does not exist.
    NoDevice(String),
    /// A driver call failed; `name` is the driver's error name (e.g. `CUDA_ERROR_INVALID_VALUE`).
    Driver {
        call: &'static str,
        name: String,
        message: String,
    },
    /// PTX / cubin / CUDA source could not be compiled or loaded.
    Compile(String),
    /// Work already queued failed (a kernel fault, a host callback that reported failure);
    /// surfaced at the next synchronisation.
    Async(String),
    /// The backend cannot do this (e.g. PTX on the host backend).
    Unsupported(String),
    /// A bad handle or argument reached the device layer.
    Invalid(String),
    /// Another rank of a communicator failed, left, timed out or disagreed about a collective;
    /// the communicator is aborted.
    PeerFailed(String),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory { requested, message } => {
                write!(
                    f,
                    "device out of memory allocating {requested} bytes: {message}"
                )
            }
            DeviceError::NoDevice(m) => write!(f, "no device: {m}"),
            DeviceError::Driver {
                call,
                name,
                message,
            } => write!(f, "{call} failed: {name} ({message})"),
            DeviceError::Compile(m) => write!(f, "kernel compilation failed: {m}"),
            DeviceError::Async(m) => write!(f, "asynchronous error: {m}"),
            DeviceError::Unsupported(m) => write!(f, "unsupported: {m}"),
            DeviceError::Invalid(m) => write!(f, "invalid: {m}"),
            DeviceError::PeerFailed(m) => write!(f, "peer failed: {m}"),
        }
    }
}

impl std::error::Error for DeviceError {}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Error {
        let text = e.to_string();
        match e {
            DeviceError::OutOfMemory { .. } => Error::OutOfMemory(text),
            DeviceError::NoDevice(_) => Error::NoDevice(text),
            DeviceError::Driver { .. } | DeviceError::Async(_) => Error::Device(text),
            DeviceError::Compile(_) => Error::Compile(text),
            DeviceError::Unsupported(_) => Error::Unsupported(text),
            // The device refuses what it was handed (e.g. a parameter blob the kernel's
            // signature does not take): the caller's input, as far as the device can tell.
            DeviceError::Invalid(_) => Error::InvalidArgument(text),
            DeviceError::PeerFailed(_) => Error::PeerFailed(text),
        }
    }
}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// Which backend `open` gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The GPU when a driver and device `ordinal` are present, else the host backend.
    Auto,
    Host,
    Cuda,
}

/// Opens a device: the one place a backend is chosen (a new backend adds its arm here).
/// `ordinal` picks the GPU; `host_options` configure the host backend when it is the one
/// opened. A CUDA device asked for but not usable is `NoDevice`; `Auto` falls back to the host.
pub fn open(
    backend: Backend,
    ordinal: u32,
    host_options: host::HostOptions,
    cuda_virtual_memory: bool,
) -> DeviceResult<Arc<dyn Device>> {
    let host = move || -> Arc<dyn Device> { Arc::new(host::HostDevice::new(host_options)) };
    let cuda = || -> DeviceResult<Arc<dyn Device>> {
        let device = cuda::CudaDevice::open(ordinal)?;
        if !cuda_virtual_memory {
            log::info!("gkrt cuda: virtual memory turned off (GKRT_VMM=0)");
            device.disable_virtual_memory();
        }
        Ok(Arc::new(device))
    };
    match backend {
        Backend::Host => Ok(host()),
        Backend::Cuda => {
            cuda::probe(ordinal)
                .map_err(|why| DeviceError::NoDevice(format!("CUDA device requested: {why}")))?;
            cuda()
        }
        Backend::Auto => match cuda::probe(ordinal) {
            Ok(()) => {
                log::info!("device auto: CUDA driver and device {ordinal} found");
                cuda()
            }
            Err(why) => {
                log::info!("device auto: using the host backend ({why})");
                Ok(host())
            }
        },
    }
}

/// Kernel code handed to `Device::load_function`.
pub enum ModuleSource<'a> {
    /// PTX text (NUL-free).
    Ptx(&'a str),
    /// A cubin (or fatbin) image.
    Cubin(&'a [u8]),
    /// CUDA C++ source, compiled by NVRTC with these extra options.
    CudaSource {
        source: &'a str,
        options: &'a [String],
    },
}

/// Work a host callback node runs. It receives the backend's native stream handle
/// (`CUstream` on CUDA, an opaque token on the host backend).
pub type HostWork = Box<dyn FnOnce(*mut c_void) -> Result<(), String> + Send>;

/// Virtual memory: address ranges reserved with nothing behind them, and physical memory mapped
/// into them on demand (CUDA: `cuMemAddressReserve`, `cuMemCreate` + `cuMemMap` +
/// `cuMemSetAccess`, `cuMemUnmap`). The pool grows one such range per stream, so its free memory
/// never splits at segment seams and free pages can be handed back or moved where needed.
pub trait VirtualMemory {
    /// Mapping granularity in bytes (a power of two; 2 MiB on current NVIDIA GPUs).
    fn granularity(&self) -> u64;
    /// Reserves `bytes` (a multiple of the granularity) of address space, granularity-aligned.
    fn reserve(&self, bytes: u64) -> DeviceResult<DevPtr>;
    /// Releases a reservation; nothing in it may be mapped any more.
    fn unreserve(&self, base: DevPtr, bytes: u64) -> DeviceResult<()>;
    /// Backs `count` consecutive pages of `page` bytes from `addr` (granularity-aligned, inside a
    /// reservation, unmapped) with one physical allocation each, readable and writable by the
    /// device; all or nothing (`OutOfMemory` when the device has no memory left).
    fn map(&self, addr: DevPtr, page: u64, count: u64) -> DeviceResult<()>;
    /// Unmaps `count` consecutive pages of `page` bytes from `addr`, each mapped by `map` (or
    /// `map_alias`) with the same page size. The caller has made sure that no queued work still
    /// uses them (with `quiesce`, or an event recorded after their last use that has
    /// completed). Memory no longer mapped at any address is kept as spares that a later `map`
    /// of that page size reuses without a new allocation, until `trim`; memory still mapped at
    /// another address (`map_alias`) stays there.
    fn unmap(&self, addr: DevPtr, page: u64, count: u64) -> DeviceResult<()>;
    /// Whether `map_alias` works on this device.
    fn supports_aliases(&self) -> bool {
        false
    }
    /// Maps the physical allocation of `page` bytes mapped at `from` at `addr` as well
    /// (granularity-aligned, inside a reservation, unmapped), readable and writable by the
    /// device: one allocation at two addresses, the same bytes through either (CUDA maps one
    /// `cuMemCreate` handle at several addresses). Its memory is counted once, and becomes a
    /// spare only when its last address is unmapped.
    fn map_alias(&self, addr: DevPtr, from: DevPtr, page: u64) -> DeviceResult<()> {
        let _ = (addr, from, page);
        Err(DeviceError::Unsupported(
            "this device cannot map memory at a second address".into(),
        ))
    }
    /// Waits until the device has finished all work queued so far.
    fn quiesce(&self) -> DeviceResult<()>;
    /// Releases the memory of every spare left by `unmap`.
    fn trim(&self) -> DeviceResult<()>;
}

/// The device abstraction. All methods take `&self`: backends lock internally, and a runtime
/// shares its device through an `Arc`.
///
/// Ordering contract (identical on every backend): work enqueued on one stream runs in order;
/// work on different streams is unordered unless an event orders it; `*_async` copies read or
/// write host memory at the time they execute on the stream, so the host memory must stay valid
/// until the stream passes them (use `stream_synchronize` or an event).
pub trait Device: Send + Sync {
    fn kind(&self) -> DeviceKind;
    /// Human-readable name ("host", "NVIDIA H200").
    fn name(&self) -> String;
    /// Total memory the device has (the budget is enforced above, by the pool).
    fn total_memory(&self) -> u64;

    // --- memory ---
    /// A fresh segment of device memory; address aligned to at least 512 bytes.
    fn alloc_segment(&self, bytes: u64) -> DeviceResult<DevPtr>;
    fn free_segment(&self, ptr: DevPtr, bytes: u64) -> DeviceResult<()>;
    /// Page-locked host memory usable by async copies.
    fn alloc_pinned(&self, bytes: u64) -> DeviceResult<*mut u8>;
    /// # Safety
    /// `ptr` came from `alloc_pinned(bytes)` of this device and no queued copy still uses it.
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: u64) -> DeviceResult<()>;

    // --- streams and events ---
    fn create_stream(&self) -> DeviceResult<StreamId>;
    fn destroy_stream(&self, stream: StreamId) -> DeviceResult<()>;
    /// The native handle handed to host callbacks (`CUstream`).
    fn native_stream(&self, stream: StreamId) -> DeviceResult<*mut c_void>;
    /// The id of a stream created outside gkrt, from its native handle (`CUstream` on CUDA;
    /// NULL is the legacy default stream there, and a stream of the backend's own on the host
    /// backend). The stream is wrapped, not owned: gkrt never destroys it, and the caller keeps
    /// it alive while gkrt may use it. The same handle always gives the same id; a handle of one
    /// of the device's own streams gives that stream's id.
    fn import_stream(&self, native: *mut c_void) -> DeviceResult<StreamId>;
    /// Blocks until everything queued on `stream` has run; returns the first asynchronous error
    /// raised there since the last synchronisation (and clears it).
    fn stream_synchronize(&self, stream: StreamId) -> DeviceResult<()>;
    fn create_event(&self) -> DeviceResult<EventId>;
    /// An event only ever waited for, queried or synchronised on, never timed
    /// (`event_elapsed_ms` may fail on it): CUDA creates it without timing
    /// (`CU_EVENT_DISABLE_TIMING`, the flag NVIDIA recommends for events used with
    /// `cuStreamWaitEvent` and `cuEventQuery`). Other backends: a plain event.
    fn create_sync_event(&self) -> DeviceResult<EventId> {
        self.create_event()
    }
    fn destroy_event(&self, event: EventId) -> DeviceResult<()>;
    /// Captures the work queued on `stream` so far; the event completes when it has run.
    fn record_event(&self, event: EventId, stream: StreamId) -> DeviceResult<()>;
    /// Work queued on `stream` after this call waits for the event's last record.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()>;
    /// True when the event's last record has completed (or it was never recorded).
    fn event_query(&self, event: EventId) -> DeviceResult<bool>;
    fn event_synchronize(&self, event: EventId) -> DeviceResult<()>;
    /// Milliseconds between two completed records.
    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> DeviceResult<f32>;

    // --- copies ---
    /// # Safety
    /// `src` is valid for `bytes` reads until the stream has passed this copy.
    unsafe fn copy_h2d_async(
        &self,
        dst: DevPtr,
        src: *const u8,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()>;
    /// # Safety
    /// `dst` is valid for `bytes` writes until the stream has passed this copy.
    unsafe fn copy_d2h_async(
        &self,
        dst: *mut u8,
        src: DevPtr,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()>;
    fn copy_d2d_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()>;

    // --- kernels ---
    /// Loads (compiling if needed) `function` from `source`.
    fn load_function(&self, source: ModuleSource<'_>, function: &str) -> DeviceResult<FunctionId>;
    /// Launches a loaded function. Kernel parameters, in order: one pointer per buffer in
    /// `buffers` (inputs, outputs, workspaces), then — when `params` is non-empty — `params` as
    /// one by-value parameter (a C struct the kernel declares).
    fn launch(
        &self,
        function: FunctionId,
        dims: &LaunchDims,
        buffers: &[Buffer],
        params: &[u8],
        stream: StreamId,
    ) -> DeviceResult<()>;
    /// Launches a built-in kernel. `inputs` and `outputs` are already validated.
    fn launch_builtin(
        &self,
        op: BuiltinOp,
        inputs: &[Buffer],
        outputs: &[Buffer],
        stream: StreamId,
    ) -> DeviceResult<()>;
    /// Runs host work in stream order. Host backend: on the stream's worker, after the work
    /// queued before it. CUDA: immediately on the calling thread, which is expected to enqueue
    /// device work on the given `CUstream`; an `Err` is returned at once.
    fn enqueue_host_work(&self, stream: StreamId, work: HostWork) -> DeviceResult<()>;

    /// Virtual-memory support, when the backend has it; the pool uses plain segments without.
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        None
    }

    // --- whole-step capture (CUDA graphs); the host backend replays nothing and says so ---
    fn supports_capture(&self) -> bool {
        false
    }
    fn begin_capture(&self, _stream: StreamId) -> DeviceResult<()> {
        Err(DeviceError::Unsupported("stream capture".into()))
    }
    fn end_capture(&self, _stream: StreamId) -> DeviceResult<GraphExecId> {
        Err(DeviceError::Unsupported("stream capture".into()))
    }
    fn launch_graph(&self, _graph: GraphExecId, _stream: StreamId) -> DeviceResult<()> {
        Err(DeviceError::Unsupported("graph launch".into()))
    }
    fn destroy_graph(&self, _graph: GraphExecId) -> DeviceResult<()> {
        Ok(())
    }

    // --- communicators (comm.rs); a backend without them says so ---
    /// A fresh unique id for `comm_init_rank` (`ncclGetUniqueId`).
    fn comm_unique_id(&self) -> DeviceResult<comm::UniqueId> {
        Err(DeviceError::Unsupported(format!(
            "communicators on the {} backend",
            self.name()
        )))
    }
    /// Joins the communicator of `id` as `rank` of `nranks`, waiting for every rank to join
    /// (`ncclCommInitRank`).
    fn comm_init_rank(
        &self,
        _id: &comm::UniqueId,
        _rank: u32,
        _nranks: u32,
        _options: comm::CommOptions,
    ) -> DeviceResult<Arc<dyn comm::Communicator>> {
        Err(DeviceError::Unsupported(format!(
            "communicators on the {} backend",
            self.name()
        )))
    }
    /// Wraps a communicator the host program made (`ncclComm_t` on CUDA) as `rank` of `nranks`;
    /// it stays the caller's: releasing the wrapper never destroys it.
    fn comm_wrap(
        &self,
        _native: *mut c_void,
        _rank: u32,
        _nranks: u32,
        _options: comm::CommOptions,
    ) -> DeviceResult<Arc<dyn comm::Communicator>> {
        Err(DeviceError::Unsupported(format!(
            "wrapping a native (NCCL) communicator on the {} backend",
            self.name()
        )))
    }
}
