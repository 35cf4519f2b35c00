//! Raw pool use: buffers a host program keeps in the runtime's pool (`gkrt_malloc` /
//! `gkrt_free`, and the PyTorch allocator entry points), stream-ordered like `cuMemAllocAsync` /
//! `cuMemFreeAsync`.
//!
//! A block belongs to the stream it was allocated on. Freed on that stream, it is reusable at
//! once by later allocations there (the stream runs in order). Freed on another stream, the
//! owning stream is made to wait (on the device, not the host) for the work the freeing stream
//! has queued so far, and then the block is reused as above: later work on the owning stream
//! cannot overtake the last use of the buffer.
//!
//! A block used on other streams too is named with them first (`raw_record_stream`, as
//! PyTorch's `Tensor.record_stream`, which never reaches a pluggable allocator): its free then
//! makes the owning stream wait for the work each of them has queued by then, as a free on that
//! stream would. Such a block carries a tag of its own, so the free's fast path (one lookup,
//! tag compared) passes it to the slow path and never looks for named streams itself.
//!
//! Raw blocks carry their own tag in the pool, so a graph's tensor can never be freed through
//! `gkrt_free`, nor a raw buffer by a graph.

use std::ffi::c_void;

use super::{Error, Result, Runtime, State};
use crate::device::{DevPtr, StreamId};
use crate::memory::DeviceBacking;

/// Pool tag of raw blocks (a graph's blocks have tag 0).
const RAW_TAG: u8 = 1;
/// Pool tag of raw blocks named in use on other streams (`State::stream_uses`).
const RAW_USED_TAG: u8 = 2;

// The errors of the raw calls are built out of line, so that the hot path stays small.

#[cold]
#[inline(never)]
fn zero_size() -> Error {
    Error::InvalidArgument("gkrt_malloc of 0 bytes (a size must be at least 1)".into())
}

#[cold]
#[inline(never)]
fn alloc_failed(e: crate::memory::pool::PoolError, bytes: u64) -> Error {
    Error::from(e).context(format_args!("gkrt_malloc of {bytes} bytes"))
}

impl Runtime {
    /// Returns every free block the pool caches to the device (`gkrt_runtime_release_cached`):
    /// plain segments that are wholly free and free pages of virtual ranges, waiting for the
    /// device to be idle first. The bytes given back.
    pub fn release_cached(&self) -> Result<u64> {
        let mut st = self.lock_for_call()?;
        Ok(st.pool.release_cached(&DeviceBacking(self.device()))?)
    }

    /// The id of the native stream `stream` (NULL: the device's default stream), remembered
    /// in the state (under its lock; a thread-local would cost more than the pool on the GPU
    /// machine, see `lock_for_call`).
    #[inline(always)]
    pub(super) fn raw_stream(&self, st: &mut State, stream: *mut c_void) -> Result<StreamId> {
        match st.last_raw_stream {
            Some((native, id)) if native == stream as usize => Ok(id),
            _ => self.raw_stream_first(st, stream),
        }
    }

    /// `raw_stream` for a stream other than the last one (out of line: the hot path stays
    /// small).
    #[cold]
    #[inline(never)]
    fn raw_stream_first(&self, st: &mut State, stream: *mut c_void) -> Result<StreamId> {
        let key = stream as usize;
        let id = self
            .device
            .import_stream(stream)
            .map_err(|e| Error::InvalidArgument(format!("stream {stream:p}: {e}")))?;
        // A stream first met here is the caller's own (the runtime's streams keep their rule).
        let own = [self.compute, self.streams.copy_in, self.streams.copy_out];
        if !own.contains(&id) {
            let raw_virtual = st.raw_virtual;
            st.pool.set_new_stream_growth(id, raw_virtual);
        }
        st.last_raw_stream = Some((key, id));
        Ok(id)
    }

    /// Allocates `bytes` from the runtime's pool for use on the native stream `stream` (NULL:
    /// the device's default stream). Counts against the memory limit like any tensor.
    pub fn raw_alloc(&self, bytes: u64, stream: *mut c_void) -> Result<DevPtr> {
        let mut st = self.lock_for_call()?;
        self.raw_alloc_in(&mut st, bytes, stream)
    }

    /// `raw_alloc` with the state lock already held (`try_lock_for_call`).
    #[inline]
    pub fn raw_alloc_in(&self, st: &mut State, bytes: u64, stream: *mut c_void) -> Result<DevPtr> {
        if bytes == 0 {
            return Err(zero_size());
        }
        let s = self.raw_stream(st, stream)?;
        st.pool.set_owner(crate::runtime::snapshot::LABEL_RAW);
        match st
            .pool
            .alloc_tagged(&DeviceBacking(&*self.device), bytes, s, RAW_TAG)
        {
            Ok(p) => Ok(p),
            Err(e) => Err(alloc_failed(e, bytes)),
        }
    }

    /// Returns a block from `raw_alloc` to the pool, ordered on the native stream `stream`.
    /// With `expected_size`, a block whose requested size differs is logged (and still freed:
    /// the address identifies it).
    pub fn raw_free(
        &self,
        ptr: DevPtr,
        stream: *mut c_void,
        expected_size: Option<u64>,
    ) -> Result<()> {
        let mut st = self.lock_for_call()?;
        self.raw_free_in(&mut st, ptr, stream, expected_size)
    }

    /// `raw_free` with the state lock already held (`try_lock_for_call`).
    #[inline]
    pub fn raw_free_in(
        &self,
        st: &mut State,
        ptr: DevPtr,
        stream: *mut c_void,
        expected_size: Option<u64>,
    ) -> Result<()> {
        let s = self.raw_stream(st, stream)?;
        let backing = DeviceBacking(&*self.device);
        // The common case in one lookup: a raw block freed on its own stream, sizes agreeing.
        if st
            .pool
            .free_if_owned(&backing, ptr, RAW_TAG, s, expected_size)
        {
            return Ok(());
        }
        self.raw_free_other(st, ptr, s, expected_size)
    }

    /// Names `stream` (native; NULL: the device's default stream) as a user of the raw block at
    /// `ptr` besides its own stream: when the block is freed, its own stream first waits for
    /// the work queued on `stream` by then. Its own stream is no use to name (a no-op).
    pub fn raw_record_stream(&self, ptr: DevPtr, stream: *mut c_void) -> Result<()> {
        let mut st = self.lock_for_call()?;
        let s = self.raw_stream(&mut st, stream)?;
        let owner = match st.pool.block_info(ptr) {
            Some(b) if b.tag == RAW_TAG || b.tag == RAW_USED_TAG => b.stream,
            Some(_) => {
                return Err(Error::InvalidArgument(format!(
                    "record_stream of {ptr:#x}: the block holds a tensor of a graph, not memory \
                     from gkrt_malloc"
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "record_stream of {ptr:#x}: not a live block of this runtime's pool (never \
                     returned by gkrt_malloc, already freed, or not the start of the block)"
                )))
            }
        };
        if s != owner {
            let uses = st.stream_uses.entry(ptr).or_default();
            if !uses.contains(&s) {
                uses.push(s);
            }
            st.pool.retag(ptr, RAW_USED_TAG);
        }
        Ok(())
    }

    /// Before the raw block at `ptr`, named in use on other streams, is freed: its own stream
    /// `owner` waits for those streams (`raw_record_stream`), and the block is a plain raw one
    /// again. A device error (a named stream destroyed since, say) leaves the block live and
    /// forgets the names, so that the error is reported once and a second free frees the block.
    fn order_after_uses(&self, st: &mut State, ptr: DevPtr, owner: StreamId) -> Result<()> {
        st.pool.retag(ptr, RAW_TAG);
        for u in st.stream_uses.remove(&ptr).unwrap_or_default() {
            self.order_after(u, owner).map_err(|e| {
                e.context(format_args!(
                    "free of {ptr:#x}: ordering it after a stream named by record_stream (the \
                     block stays live; free it again)"
                ))
            })?;
        }
        Ok(())
    }

    /// The rest of `raw_free_in`: a free on another stream, a size that differs, a block named
    /// in use on other streams, or an error.
    #[cold]
    #[inline(never)]
    fn raw_free_other(
        &self,
        st: &mut State,
        ptr: DevPtr,
        s: StreamId,
        expected_size: Option<u64>,
    ) -> Result<()> {
        let backing = DeviceBacking(&*self.device);
        match st.pool.block_info(ptr) {
            None => Err(Error::InvalidArgument(format!(
                "gkrt_free of {ptr:#x}: not a live block of this runtime's pool (never returned by \
                 gkrt_malloc, already freed, or not the start of the block)"
            ))),
            Some(b) if b.tag != RAW_TAG && b.tag != RAW_USED_TAG => Err(Error::InvalidArgument(format!(
                "gkrt_free of {ptr:#x}: the block holds a tensor of a graph, not memory from gkrt_malloc"
            ))),
            Some(b) => {
                if let Some(n) = expected_size.filter(|&n| n != b.requested) {
                    log::warn!(
                        "free of {ptr:#x} with size {n}, but {} bytes were allocated there",
                        b.requested
                    );
                }
                if b.tag == RAW_USED_TAG {
                    self.order_after_uses(st, ptr, b.stream)?;
                }
                if b.stream != s {
                    self.order_after(s, b.stream)?;
                }
                Ok(st.pool.free(&backing, ptr)?)
            }
        }
    }

    /// Makes later work on `owner` wait for the work queued on `freeing` so far. One event,
    /// recorded, waited on (the wait captures that record), and destroyed at once: the device
    /// keeps it alive until the wait is resolved.
    fn order_after(&self, freeing: StreamId, owner: StreamId) -> Result<()> {
        let d = &*self.device;
        let event = d.create_sync_event()?;
        let ordered = d
            .record_event(event, freeing)
            .and_then(|()| d.stream_wait_event(owner, event));
        let destroyed = d.destroy_event(event);
        ordered?;
        Ok(destroyed?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Config, DeviceChoice};

    fn host() -> std::sync::Arc<Runtime> {
        Runtime::new(Config {
            device: DeviceChoice::Host,
            memory_limit: 64 << 20,
            ..Config::default()
        })
        .unwrap()
    }

    #[test]
    fn raw_blocks_round_trip_and_bad_frees_are_named() {
        let rt = host();
        let null = std::ptr::null_mut();
        let a = rt.raw_alloc(1000, null).unwrap();
        let b = rt.raw_alloc(3000, null).unwrap();
        assert_ne!(a, b);
        assert_eq!(rt.stats().unwrap().pool.allocated_bytes, 1024 + 3072);
        rt.raw_free(a, null, None).unwrap();
        let e = rt.raw_free(a, null, None).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("already freed")),
            "{e:?}"
        );
        let e = rt.raw_free(b + 256, null, None).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
        let e = rt.raw_alloc(0, null).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("0 bytes")));
        let e = rt.raw_alloc(65 << 20, null).unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory(m) if m.contains("gkrt_malloc of 68157440 bytes")),
            "{e:?}"
        );
        let e = rt.raw_alloc(8, 0x1234 as *mut c_void).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("0x1234")),
            "{e:?}"
        );
        rt.raw_free(b, null, Some(3000)).unwrap();
        assert_eq!(rt.stats().unwrap().pool.allocated_bytes, 0);
    }

    #[test]
    fn a_graph_tensor_cannot_be_freed_raw() {
        let rt = host();
        let tensor = {
            let mut st = rt.lock();
            st.pool
                .alloc(&DeviceBacking(rt.device()), 512, rt.compute)
                .unwrap()
        };
        let e = rt.raw_free(tensor, std::ptr::null_mut(), None).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("tensor of a graph")),
            "{e:?}"
        );
        assert_eq!(rt.lock().pool.block_size(tensor), Some(512));
    }

    #[test]
    fn a_block_named_in_use_on_another_stream_is_freed_after_that_streams_work() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let rt = host();
        let null = std::ptr::null_mut();
        let compute = rt.compute;
        let native = rt.device.native_stream(compute).unwrap();
        // An unknown block is named in the error; the runtime goes on.
        let e = rt.raw_record_stream(0x1000, native).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("not a live block")));
        let a = rt.raw_alloc(4096, null).unwrap();
        // The compute stream still uses the block when the default stream frees it.
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        rt.device
            .enqueue_host_work(
                compute,
                Box::new(move |_| {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    d.store(true, Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
        rt.raw_record_stream(a, native).unwrap();
        rt.raw_record_stream(a, native).unwrap();
        rt.raw_record_stream(a, null).unwrap(); // its own stream: nothing to wait for
        assert_eq!(rt.lock().stream_uses.get(&a).map(Vec::len), Some(1));
        rt.raw_free(a, null, None).unwrap();
        assert!(rt.lock().stream_uses.is_empty());
        // Work the default stream queues after the free runs after the compute stream's.
        let seen = Arc::new(AtomicBool::new(false));
        let (d, s) = (done.clone(), seen.clone());
        let default = rt.device.import_stream(null).unwrap();
        rt.device
            .enqueue_host_work(
                default,
                Box::new(move |_| {
                    s.store(d.load(Ordering::SeqCst), Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
        rt.device.stream_synchronize(default).unwrap();
        assert!(
            seen.load(Ordering::SeqCst),
            "the default stream overtook the compute stream"
        );
        assert_eq!(rt.raw_alloc(4096, null).unwrap(), a);
    }

    #[test]
    fn free_on_another_stream_orders_the_owner_after_it() {
        let rt = host();
        let own = rt.device.native_stream(rt.compute).unwrap();
        let a = rt.raw_alloc(4096, std::ptr::null_mut()).unwrap();
        // Freed on the compute stream: the default stream waits for it, then reuses the block.
        rt.raw_free(a, own, None).unwrap();
        assert_eq!(rt.raw_alloc(4096, std::ptr::null_mut()).unwrap(), a);
    }
}
