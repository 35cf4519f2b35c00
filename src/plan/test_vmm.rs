//! A device with virtual memory for the plan's pool tests (`gpt2_shape_tests.rs`,
//! `swap_placements_tests.rs`, `swap_release_tests.rs`): every reservation granted at 2 MiB
//! pages from 1 TiB up, maps free, and events complete only when a test says so, so the pool's
//! dry runs simulate the virtual range as on the H200. `Device::with_markers` also records the
//! pool's marker events and passes each at once: a device that keeps up with the host, which
//! the pool's dry run cannot know (`pool_fidelity_tests.rs`).

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
    /// Markers recorded so far, when the device records them (`with_markers`).
    markers: Option<Cell<u32>>,
    /// A clock that each reading advances by this many ns (`with_slow_clock`), else the host's.
    clock: Option<(Cell<u64>, u64)>,
}

/// Marker events are numbered from here, above any copy event a test makes.
const FIRST_MARKER: u32 = 1 << 30;

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
        (self.markers.is_some() && e.0 >= FIRST_MARKER) || self.done.borrow().contains(&e)
    }
    fn record_marker(&self, _: crate::device::StreamId, reuse: Option<EventId>) -> Option<EventId> {
        let n = self.markers.as_ref()?;
        n.set(n.get() + 1);
        Some(reuse.unwrap_or(EventId(FIRST_MARKER + n.get())))
    }
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }
    fn now_ns(&self) -> u64 {
        match &self.clock {
            Some((now, step)) => {
                now.set(now.get() + step);
                now.get()
            }
            None => crate::plan::test_vmm::host_now(),
        }
    }
}

/// The host's monotonic clock in ns (the backing's default).
fn host_now() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
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
    /// A device that records the pool's marker events and has passed each as soon as it is
    /// recorded (one that keeps up with the host): the pool then knows every free block idle.
    pub fn with_markers() -> Device {
        Device {
            markers: Some(Cell::new(0)),
            ..Device::default()
        }
    }

    /// `self` with a clock that each reading advances by `step_ns`: the pool's page moves
    /// then cost that much each, far more than the host's clock times them in a dry run.
    pub fn with_slow_clock(self, step_ns: u64) -> Device {
        Device {
            clock: Some((Cell::new(0), step_ns)),
            ..self
        }
    }

    /// Marks `events` complete.
    pub fn complete(&self, events: impl IntoIterator<Item = EventId>) {
        self.done.borrow_mut().extend(events);
    }
}
