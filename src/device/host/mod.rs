//! The host backend: a faithful model of a GPU on the CPU.
//!
//! "Device memory" is host RAM handed out in segments; each stream is a worker thread that runs
//! its queue strictly in order; events are real completion flags that a stream can wait on. A
//! jitter option sleeps a random few microseconds before each queued item, so work on different
//! streams interleaves differently from run to run and a missing event wait shows up as a wrong
//! result in tests instead of hiding behind lucky timing.
//!
//! Asynchronous failures (a host callback returning an error) are sticky per stream until the
//! next `stream_synchronize`, which reports and clears them — the same contract CUDA gives the
//! layers above for kernel faults.

pub mod comm;
mod stream;

use super::registration::{Registrable, Registrations};
use super::*;
use crate::kernels::host as host_kernels;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use stream::{Event, Stream};

const SEGMENT_ALIGN: usize = 4096;

/// Options of the host model.
#[derive(Clone, Debug, Default)]
pub struct HostOptions {
    /// Upper bound of a random delay before each queued item, in microseconds (0 = off).
    pub jitter_us: u32,
    /// Seed of the jitter's random generator (each stream derives its own).
    pub seed: u64,
    /// What `total_memory` reports; segments beyond it fail with OutOfMemory.
    pub total_memory: u64,
}

pub struct HostDevice {
    options: HostOptions,
    streams: RwLock<Vec<Option<Arc<Stream>>>>,
    events: RwLock<Vec<Option<Arc<Event>>>>,
    segments: Mutex<BTreeMap<DevPtr, u64>>,
    segment_bytes: Mutex<u64>,
    epoch: Instant,
    /// The stream `import_stream(NULL)` stands for, created on first use.
    default_stream: Mutex<Option<StreamId>>,
    /// Segments registered with this device's communicators (the model of `ncclCommRegister`).
    registrations: Registrations,
}

impl HostDevice {
    pub fn new(options: HostOptions) -> HostDevice {
        let mut options = options;
        if options.total_memory == 0 {
            options.total_memory = 64 << 30;
        }
        HostDevice {
            options,
            streams: RwLock::new(Vec::new()),
            events: RwLock::new(Vec::new()),
            segments: Mutex::new(BTreeMap::new()),
            segment_bytes: Mutex::new(0),
            registrations: Registrations::default(),
            epoch: Instant::now(),
            default_stream: Mutex::new(None),
        }
    }

    fn stream(&self, id: StreamId) -> DeviceResult<Arc<Stream>> {
        self.streams
            .read()
            .unwrap()
            .get(id.0 as usize)
            .and_then(|s| s.clone())
            .ok_or_else(|| DeviceError::Invalid(format!("unknown stream {}", id.0)))
    }

    fn event(&self, id: EventId) -> DeviceResult<Arc<Event>> {
        self.events
            .read()
            .unwrap()
            .get(id.0 as usize)
            .and_then(|e| e.clone())
            .ok_or_else(|| DeviceError::Invalid(format!("unknown event {}", id.0)))
    }

    /// Checks that [ptr, ptr+bytes) lies inside one live segment, so a bad pointer from the
    /// layers above is an error here instead of a wild write into the process.
    fn check_range(&self, ptr: DevPtr, bytes: u64) -> DeviceResult<()> {
        let segments = self.segments.lock().unwrap();
        let inside = segments
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, &len)| {
                ptr.checked_add(bytes).is_some_and(|end| end <= base + len)
            });
        if inside {
            Ok(())
        } else {
            Err(DeviceError::Invalid(format!(
                "device range 0x{ptr:x}+{bytes} is not inside an allocated segment"
            )))
        }
    }

    /// Queues a copy; every copy on the host backend is a `memmove` run in stream order. The
    /// device side of it was range-checked by the caller, and the host side is the caller's
    /// contract (valid until the stream passes the copy).
    fn enqueue_copy(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let (dst, src) = (SendPtr(dst), SendPtr(src as *mut u8));
        self.enqueue(
            stream,
            Box::new(move || {
                let (dst, src) = (dst, src);
                // SAFETY: see above.
                unsafe { std::ptr::copy(src.0, dst.0, bytes as usize) };
                Ok(())
            }),
        )
    }

    fn enqueue(&self, stream: StreamId, job: stream::Job) -> DeviceResult<()> {
        self.stream(stream)?.push(job);
        Ok(())
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        // Stop workers first: they may still touch segment memory.
        for s in self.streams.write().unwrap().drain(..).flatten() {
            s.shutdown();
        }
        for (ptr, bytes) in std::mem::take(&mut *self.segments.lock().unwrap()) {
            // SAFETY: allocated in alloc_segment with this layout; workers are stopped.
            unsafe {
                dealloc(
                    ptr as *mut u8,
                    Layout::from_size_align_unchecked(bytes as usize, SEGMENT_ALIGN),
                )
            };
        }
    }
}

/// A raw pointer that crosses into a worker thread. The stream contract (the caller keeps the
/// memory valid until the stream passes the work) is what makes sending it sound.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: see the type's comment; the pointee is plain bytes.
unsafe impl Send for SendPtr {}

impl Device for HostDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Host
    }

    fn name(&self) -> String {
        "host".to_string()
    }

    fn total_memory(&self) -> u64 {
        self.options.total_memory
    }

    fn alloc_segment(&self, bytes: u64) -> DeviceResult<DevPtr> {
        let oom = |m: &str| DeviceError::OutOfMemory {
            requested: bytes,
            message: m.to_string(),
        };
        if bytes == 0 {
            return Err(DeviceError::Invalid("segment of 0 bytes".into()));
        }
        {
            let mut used = self.segment_bytes.lock().unwrap();
            if used.saturating_add(bytes) > self.options.total_memory {
                return Err(oom("host backend's total_memory reached"));
            }
            *used += bytes;
        }
        let layout = Layout::from_size_align(bytes as usize, SEGMENT_ALIGN)
            .map_err(|_| oom("size too large"))?;
        // SAFETY: layout has non-zero size. Zeroed so that a read of never-written memory is
        // deterministic (a real GPU gives garbage; tests poison explicitly where it matters).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            *self.segment_bytes.lock().unwrap() -= bytes;
            return Err(oom("host allocation failed"));
        }
        self.segments.lock().unwrap().insert(ptr as DevPtr, bytes);
        self.registrations.added(ptr as DevPtr, bytes);
        Ok(ptr as DevPtr)
    }

    fn free_segment(&self, ptr: DevPtr, bytes: u64) -> DeviceResult<()> {
        // Like cuMemFree, freeing waits for queued work: a block freed stream-ordered may still
        // be read by work in flight when the pool hands its whole segment back.
        let streams: Vec<Arc<Stream>> = self
            .streams
            .read()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect();
        for s in streams {
            s.wait_idle();
        }
        // Deregistered while still allocated, and only when the free is valid.
        let known = self.segments.lock().unwrap().get(&ptr).copied();
        if known == Some(bytes) {
            self.registrations.removing(ptr);
        }
        let len = self.segments.lock().unwrap().remove(&ptr);
        match len {
            Some(len) if len == bytes => {
                *self.segment_bytes.lock().unwrap() -= len;
                // SAFETY: allocated with this layout in alloc_segment.
                unsafe {
                    dealloc(
                        ptr as *mut u8,
                        Layout::from_size_align_unchecked(len as usize, SEGMENT_ALIGN),
                    )
                };
                Ok(())
            }
            Some(len) => {
                self.segments.lock().unwrap().insert(ptr, len);
                Err(DeviceError::Invalid(format!(
                    "free_segment 0x{ptr:x}: size {bytes} but segment has {len}"
                )))
            }
            None => Err(DeviceError::Invalid(format!(
                "free_segment 0x{ptr:x}: not a segment"
            ))),
        }
    }

    fn alloc_pinned(&self, bytes: u64) -> DeviceResult<*mut u8> {
        let layout =
            Layout::from_size_align(bytes.max(1) as usize, SEGMENT_ALIGN).map_err(|_| {
                DeviceError::OutOfMemory {
                    requested: bytes,
                    message: "size too large".into(),
                }
            })?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: "host allocation failed".into(),
            });
        }
        Ok(ptr)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: u64) -> DeviceResult<()> {
        // SAFETY: allocated by alloc_pinned with this layout.
        unsafe {
            dealloc(
                ptr,
                Layout::from_size_align_unchecked(bytes.max(1) as usize, SEGMENT_ALIGN),
            )
        };
        Ok(())
    }

    fn create_stream(&self) -> DeviceResult<StreamId> {
        let mut streams = self.streams.write().unwrap();
        let id = streams.len() as u32;
        let seed = self.options.seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(id as u64 + 1));
        streams.push(Some(Stream::spawn(id, self.options.jitter_us, seed)));
        Ok(StreamId(id))
    }

    fn destroy_stream(&self, stream: StreamId) -> DeviceResult<()> {
        let s = self
            .streams
            .write()
            .unwrap()
            .get_mut(stream.0 as usize)
            .and_then(|s| s.take())
            .ok_or_else(|| DeviceError::Invalid(format!("unknown stream {}", stream.0)))?;
        s.shutdown();
        Ok(())
    }

    fn native_stream(&self, stream: StreamId) -> DeviceResult<*mut c_void> {
        let s = self.stream(stream)?;
        Ok(Arc::as_ptr(&s) as *mut c_void)
    }

    fn import_stream(&self, native: *mut c_void) -> DeviceResult<StreamId> {
        if native.is_null() {
            let mut default = self.default_stream.lock().unwrap();
            return match *default {
                Some(id) => Ok(id),
                None => {
                    let id = self.create_stream()?;
                    *default = Some(id);
                    Ok(id)
                }
            };
        }
        let streams = self.streams.read().unwrap();
        streams
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| Arc::as_ptr(s) as *mut c_void == native))
            .map(|i| StreamId(i as u32))
            .ok_or_else(|| {
                DeviceError::Invalid(format!(
                    "stream handle {native:p} is not a stream of the host backend (pass NULL for its default stream)"
                ))
            })
    }

    fn stream_synchronize(&self, stream: StreamId) -> DeviceResult<()> {
        self.stream(stream)?.synchronize()
    }

    fn create_event(&self) -> DeviceResult<EventId> {
        let mut events = self.events.write().unwrap();
        let id = events.len() as u32;
        events.push(Some(Arc::new(Event::new(self.epoch))));
        Ok(EventId(id))
    }

    fn destroy_event(&self, event: EventId) -> DeviceResult<()> {
        self.events
            .write()
            .unwrap()
            .get_mut(event.0 as usize)
            .and_then(|e| e.take())
            .map(|_| ())
            .ok_or_else(|| DeviceError::Invalid(format!("unknown event {}", event.0)))
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> DeviceResult<()> {
        let ev = self.event(event)?;
        let generation = ev.begin_record();
        self.enqueue(
            stream,
            Box::new(move || {
                ev.complete(generation);
                Ok(())
            }),
        )
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        let ev = self.event(event)?;
        let generation = ev.recorded_generation();
        self.enqueue(
            stream,
            Box::new(move || {
                ev.wait(generation);
                Ok(())
            }),
        )
    }

    fn event_query(&self, event: EventId) -> DeviceResult<bool> {
        let ev = self.event(event)?;
        Ok(ev.is_complete(ev.recorded_generation()))
    }

    fn event_synchronize(&self, event: EventId) -> DeviceResult<()> {
        let ev = self.event(event)?;
        ev.wait(ev.recorded_generation());
        Ok(())
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> DeviceResult<f32> {
        let (a, b) = (
            self.event(start)?.completed_at(),
            self.event(end)?.completed_at(),
        );
        match (a, b) {
            (Some(a), Some(b)) => Ok((b.as_secs_f64() - a.as_secs_f64()) as f32 * 1000.0),
            _ => Err(DeviceError::Invalid(
                "event_elapsed_ms on an event that has not completed".into(),
            )),
        }
    }

    unsafe fn copy_h2d_async(
        &self,
        dst: DevPtr,
        src: *const u8,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()> {
        self.check_range(dst, bytes)?;
        self.enqueue_copy(dst as *mut u8, src, bytes, stream)
    }

    unsafe fn copy_d2h_async(
        &self,
        dst: *mut u8,
        src: DevPtr,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()> {
        self.check_range(src, bytes)?;
        self.enqueue_copy(dst, src as *const u8, bytes, stream)
    }

    fn copy_d2d_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: u64,
        stream: StreamId,
    ) -> DeviceResult<()> {
        self.check_range(dst, bytes)?;
        self.check_range(src, bytes)?;
        self.enqueue_copy(dst as *mut u8, src as *const u8, bytes, stream)
    }

    fn load_function(&self, source: ModuleSource<'_>, function: &str) -> DeviceResult<FunctionId> {
        let what = match source {
            ModuleSource::Ptx(_) => "PTX",
            ModuleSource::Cubin(_) => "cubin",
            ModuleSource::CudaSource { .. } => "CUDA source",
        };
        Err(DeviceError::Unsupported(format!(
            "the host backend cannot run {what} kernels (function '{function}'); use built-ins or host callbacks, or the CUDA backend"
        )))
    }

    fn launch(
        &self,
        function: FunctionId,
        _: &LaunchDims,
        _: &[Buffer],
        _: &[u8],
        _: StreamId,
    ) -> DeviceResult<()> {
        Err(DeviceError::Invalid(format!(
            "unknown function {}",
            function.0
        )))
    }

    fn launch_builtin(
        &self,
        op: BuiltinOp,
        inputs: &[Buffer],
        outputs: &[Buffer],
        stream: StreamId,
    ) -> DeviceResult<()> {
        for b in inputs.iter().chain(outputs) {
            self.check_range(b.ptr, b.bytes)?;
        }
        let inputs: Vec<Buffer> = inputs.to_vec();
        let outputs: Vec<Buffer> = outputs.to_vec();
        self.enqueue(
            stream,
            Box::new(move || {
                // SAFETY: ranges are inside live segments, and stream order keeps them allocated
                // until this runs (the pool reuses a block only after its stream passes it).
                unsafe { host_kernels::run(op, &inputs, &outputs) };
                Ok(())
            }),
        )
    }

    fn enqueue_host_work(&self, stream: StreamId, work: HostWork) -> DeviceResult<()> {
        let token = SendPtr(self.native_stream(stream)? as *mut u8);
        self.enqueue(
            stream,
            Box::new(move || {
                let token = token;
                work(token.0 as *mut c_void)
            }),
        )
    }

    fn comm_unique_id(&self) -> DeviceResult<super::comm::UniqueId> {
        Ok(comm::unique_id())
    }

    fn comm_init_rank(
        &self,
        id: &super::comm::UniqueId,
        rank: u32,
        nranks: u32,
        options: super::comm::CommOptions,
    ) -> DeviceResult<Arc<dyn super::comm::Communicator>> {
        let joined = comm::join(id, rank, nranks, options)?;
        let registrable: Arc<dyn Registrable> = joined.clone();
        self.registrations.attach(&registrable);
        Ok(joined)
    }
}

#[cfg(test)]
#[path = "registration_tests.rs"]
mod registration_tests;
