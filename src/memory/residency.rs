//! Residency: where each tensor's bytes are. One entry per tensor of a graph, keyed by the
//! tensor's index — never by a device address, which two tensors may hold one after the other.

use crate::device::{DevPtr, EventId};

/// The swap state machine. A tensor is in exactly one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// No memory anywhere (an intermediate outside its live range, an output not yet produced).
    Unallocated,
    OnDevice,
    /// Being copied to its host slot; its device block is freed pending the copy's event.
    CopyingToHost,
    OnHost,
    /// Being copied back; the compute stream waits for `copy_in` before the first reader.
    CopyingToDevice,
}

/// Where one tensor's bytes are. Its fields change only through the transitions below, each
/// named for what happened to the tensor, so the state machine lives in one place.
#[derive(Clone, Debug)]
pub struct TensorMemory {
    state: Residency,
    /// The device block (OnDevice, CopyingToDevice).
    device: Option<DevPtr>,
    /// The pinned host slot, once the tensor has needed one; kept while the tensor lives.
    host: Option<u64>,
    /// The host slot holds the current contents (once `copy_out` has completed).
    host_valid: bool,
    /// Recorded on the copy-out stream after the tensor's last device→host copy.
    copy_out: Option<EventId>,
    /// Recorded on the copy-in stream after the tensor's last host→device copy.
    copy_in: Option<EventId>,
    /// `device` is memory the host bound (`bind`): never moved, swapped or freed by gkrt.
    bound: bool,
}

impl Default for TensorMemory {
    fn default() -> Self {
        TensorMemory {
            state: Residency::Unallocated,
            device: None,
            host: None,
            host_valid: false,
            copy_out: None,
            copy_in: None,
            bound: false,
        }
    }
}

impl TensorMemory {
    pub fn state(&self) -> Residency {
        self.state
    }

    pub fn device(&self) -> Option<DevPtr> {
        self.device
    }

    pub fn host(&self) -> Option<u64> {
        self.host
    }

    pub fn host_valid(&self) -> bool {
        self.host_valid
    }

    /// The copy-in (`incoming`) or copy-out event, if one was ever made.
    pub fn event(&self, incoming: bool) -> Option<EventId> {
        if incoming {
            self.copy_in
        } else {
            self.copy_out
        }
    }

    /// Records the event made for the tensor's copies in (`incoming`) or out.
    pub fn set_event(&mut self, incoming: bool, event: EventId) {
        if incoming {
            self.copy_in = Some(event);
        } else {
            self.copy_out = Some(event);
        }
    }

    /// The events made for the tensor, taken for destruction.
    pub fn take_events(&mut self) -> impl Iterator<Item = EventId> {
        [self.copy_in.take(), self.copy_out.take()]
            .into_iter()
            .flatten()
    }

    pub fn on_device(&self) -> bool {
        matches!(self.state, Residency::OnDevice | Residency::CopyingToDevice)
    }

    /// Contents exist somewhere (device or host).
    pub fn has_data(&self) -> bool {
        self.on_device()
            || (self.host_valid
                && matches!(self.state, Residency::OnHost | Residency::CopyingToHost))
    }

    /// Got device memory (a new output's block, an arena offset, a write's block).
    pub fn placed(&mut self, ptr: DevPtr) {
        self.device = Some(ptr);
        self.state = Residency::OnDevice;
    }

    /// A node is about to overwrite it, or the host wrote its device copy: any host copy is
    /// stale from now on.
    pub fn overwritten(&mut self) {
        self.host_valid = false;
    }

    /// A copy from its host slot into `ptr` is queued.
    pub fn copying_in(&mut self, ptr: DevPtr) {
        self.device = Some(ptr);
        self.state = Residency::CopyingToDevice;
    }

    /// The compute stream waits for its copy-in (or a failed run drained it): on the device.
    pub fn copied_in(&mut self) {
        debug_assert!(self.on_device());
        self.state = Residency::OnDevice;
    }

    /// Leaves the device; returns its block. `copied`: a copy to the host slot is queued (the
    /// block is freed pending it); otherwise the host copy was current already.
    pub fn leave_device(&mut self, copied: bool) -> DevPtr {
        let ptr = self
            .device
            .take()
            .expect("a tensor on the device has a block");
        self.host_valid = true;
        self.state = if copied {
            Residency::CopyingToHost
        } else {
            Residency::OnHost
        };
        ptr
    }

    /// The tensor's host slot, now that it has one.
    pub fn set_host_slot(&mut self, slot: u64) {
        self.host = Some(slot);
    }

    /// The host wrote it into its host slot.
    pub fn written_on_host(&mut self) {
        self.host_valid = true;
        self.state = Residency::OnHost;
    }

    /// Every queued copy has finished: in-flight states have landed.
    pub fn land(&mut self) {
        self.state = match self.state {
            Residency::CopyingToHost => Residency::OnHost,
            Residency::CopyingToDevice => Residency::OnDevice,
            s => s,
        };
    }

    /// No memory any more (an intermediate after its last use, a dropped tensor, a released
    /// graph): returns its device block and host slot for the caller to return to their pools
    /// (never memory the host bound: that is the host's).
    pub fn discard(&mut self) -> (Option<DevPtr>, Option<u64>) {
        self.state = Residency::Unallocated;
        self.host_valid = false;
        let device = self.device.take().filter(|_| !self.bound);
        self.bound = false;
        (device, self.host.take())
    }

    /// Lives in memory the host bound.
    pub fn is_bound(&self) -> bool {
        self.bound
    }

    /// The host bound it to `ptr`: its contents are there from now on, in place. (The caller
    /// returned any block of its own first.)
    pub fn bind(&mut self, ptr: DevPtr) {
        debug_assert!(self.device.is_none() || self.bound);
        self.device = Some(ptr);
        self.state = Residency::OnDevice;
        self.host_valid = false;
        self.bound = true;
    }

    /// The host took its memory back: no contents anywhere until written or produced again.
    pub fn unbind(&mut self) {
        debug_assert!(self.bound);
        self.device = None;
        self.state = Residency::Unallocated;
        self.host_valid = false;
        self.bound = false;
    }
}
