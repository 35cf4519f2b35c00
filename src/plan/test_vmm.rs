//! A device with virtual memory for the plan's pool tests (`gpt2_shape_tests.rs`,
//! `swap_placements_tests.rs`, `swap_release_tests.rs`): every reservation granted at 2 MiB
//! pages from 1 TiB up, maps free, and events complete only when a test says so, so the pool's
//! dry runs simulate the virtual range as on the H200.

use crate::device::{DeviceError, EventId, VirtualMemory};
use crate::memory::pool::PoolBacking;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;

pub const PAGE: u64 = 2 << 20;

/// A device with virtual memory that grants everything, whose events complete when told.
#[derive(Default)]
pub struct Device {
    next: Cell<u64>,
    done: RefCell<HashSet<EventId>>,
}

impl PoolBacking for Device {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        let at = self.next.get().max(1 << 40);
        self.next.set(at + bytes.div_ceil(PAGE) * PAGE + PAGE);
        Ok(at)
    }
    fn free_segment(&self, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn event_complete(&self, e: EventId) -> bool {
        self.done.borrow().contains(&e)
    }
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }
}

impl VirtualMemory for Device {
    fn granularity(&self) -> u64 {
        PAGE
    }
    fn reserve(&self, bytes: u64) -> Result<u64, DeviceError> {
        self.alloc_segment(bytes)
    }
    fn unreserve(&self, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn map(&self, _: u64, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn unmap(&self, _: u64, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn trim(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

impl Device {
    /// Marks `events` complete.
    pub fn complete(&self, events: impl IntoIterator<Item = EventId>) {
        self.done.borrow_mut().extend(events);
    }
}
