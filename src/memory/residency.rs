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

#[derive(Clone, Debug)]
pub struct TensorMemory {
    pub state: Residency,
    /// The device block (OnDevice, CopyingToDevice).
    pub device: Option<DevPtr>,
    /// The pinned host slot, once the tensor has needed one; kept while the tensor lives.
    pub host: Option<u64>,
    /// The host slot holds the current contents (once `copy_out` has completed).
    pub host_valid: bool,
    /// Recorded on the copy-out stream after the tensor's last device→host copy.
    pub copy_out: Option<EventId>,
    /// Recorded on the copy-in stream after the tensor's last host→device copy.
    pub copy_in: Option<EventId>,
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
        }
    }
}

impl TensorMemory {
    pub fn on_device(&self) -> bool {
        matches!(self.state, Residency::OnDevice | Residency::CopyingToDevice)
    }

    /// Contents exist somewhere (device or host).
    pub fn has_data(&self) -> bool {
        self.on_device()
            || (self.host_valid
                && matches!(self.state, Residency::OnHost | Residency::CopyingToHost))
    }
}
