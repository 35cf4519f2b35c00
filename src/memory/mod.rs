//! Memory: the caching device pool, the pinned host pool (the same allocator over pinned
//! segments), residency of tensors, and the adapters that feed the pools from a device.

pub mod history;
pub mod pool;
pub mod residency;

use crate::device::{DevPtr, Device, DeviceError, EventId, StreamId, VirtualMemory};
use pool::PoolBacking;

/// The pool's view of a device: segments, virtual memory and event completion, nothing else.
pub struct DeviceBacking<'a>(pub &'a dyn Device);

impl PoolBacking for DeviceBacking<'_> {
    fn alloc_segment(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        self.0.alloc_segment(bytes)
    }

    fn free_segment(&self, addr: DevPtr, bytes: u64) -> Result<(), DeviceError> {
        self.0.free_segment(addr, bytes)
    }

    fn event_complete(&self, event: EventId) -> bool {
        // An event the device no longer knows cannot guard anything: treat as complete.
        self.0.event_query(event).unwrap_or(true)
    }

    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        self.0.virtual_memory()
    }

    fn record_marker(&self, stream: StreamId, reuse: Option<EventId>) -> Option<EventId> {
        let event = match reuse {
            Some(e) => e,
            // Only ever queried or waited for: untimed, which the device records more cheaply.
            None => self.0.create_sync_event().ok()?,
        };
        match self.0.record_event(event, stream) {
            Ok(()) => Some(event),
            Err(_) => {
                let _ = self.0.destroy_event(event);
                None
            }
        }
    }

    fn release_marker(&self, event: EventId) {
        let _ = self.0.destroy_event(event);
    }
}

/// The pinned host pool's view of a device: page-locked segments, pinned once and reused (pinning
/// costs about half a second per GiB), so swapping never pins per copy.
pub struct PinnedBacking<'a>(pub &'a dyn Device);

impl PoolBacking for PinnedBacking<'_> {
    fn alloc_segment(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        self.0.alloc_pinned(bytes).map(|p| p as u64)
    }

    fn free_segment(&self, addr: DevPtr, bytes: u64) -> Result<(), DeviceError> {
        // SAFETY: the pool frees a segment only when no block in it is live or pending on an
        // event, i.e. no queued copy uses it.
        unsafe { self.0.free_pinned(addr as *mut u8, bytes) }
    }

    fn event_complete(&self, event: EventId) -> bool {
        self.0.event_query(event).unwrap_or(true)
    }
}
