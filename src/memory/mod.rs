//! Memory: the caching device pool and the adapter that feeds it segments from a device.

pub mod pool;

use crate::device::{DevPtr, Device, DeviceError, EventId};
use pool::PoolBacking;

/// The pool's view of a device: segments and event completion, nothing else.
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
}
