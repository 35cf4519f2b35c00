//! A graph's queue pops: input tensors that each run takes from a device data queue
//! (`runtime/queue.rs`). At the start of every run the graph takes the queue's next batch and
//! binds those tensors to the slot's buffers (so nodes read the batch in place: no copy); the
//! compute stream waits for the slot's copy on the device, never the host. Once the run is
//! queued the slot goes back to the queue's producers, whose next copy into it waits for the run
//! on the device. A run that fails before it is queued leaves the batch at the queue's head.
//!
//! The pop is the first step of a run rather than a node among the others: its outputs must be
//! in place before any node reads them, and binding (not the step program) is what puts a tensor
//! at an address it does not own. A planned graph replayed as a CUDA graph keeps one capture
//! per set of bound addresses (`binding.rs`), so with a queue: one per slot.

use super::RuntimeGraph;
use crate::runtime::queue::PoppedSlot;
use crate::runtime::{DeviceQueue, Error, Result};
use std::sync::Arc;

/// One queue a graph pops from, and the tensors its batch's buffers become.
pub(super) struct QueuePop {
    queue: Arc<DeviceQueue>,
    tensors: Vec<u32>,
}

/// The slots a run took, to be finished or put back.
pub(super) type Popped = Vec<(Arc<DeviceQueue>, PoppedSlot)>;

impl RuntimeGraph {
    /// Makes each run pop one batch of `queue` into the input tensors `ids` (one per buffer of
    /// the batch, sizes equal). The graph must be finalized and not swap, like any binding.
    pub fn add_queue_pop(&mut self, queue: Arc<DeviceQueue>, ids: &[u64]) -> Result<()> {
        if queue.runtime().serial() != self.runtime.serial() {
            return Err(Error::InvalidArgument(format!(
                "queue '{}' belongs to another runtime than the graph",
                queue.name()
            )));
        }
        if ids.len() != queue.sizes().len() {
            return Err(Error::InvalidArgument(format!(
                "queue '{}' has {} buffers per batch; {} tensors were given",
                queue.name(),
                queue.sizes().len(),
                ids.len()
            )));
        }
        let mut tensors = Vec::with_capacity(ids.len());
        for (i, (&id, &size)) in ids.iter().zip(queue.sizes()).enumerate() {
            let t = self.binding_index(id, "pop a queue's batch into")?;
            let tensor = &self.graph.tensors()[t as usize];
            if !tensor.kind.host_written() || tensor.kind.persists() && tensor.producer.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "cannot pop queue '{}' into {}: only inputs and parameters no node writes can be",
                    queue.name(),
                    tensor.describe(t)
                )));
            }
            if tensor.size != size {
                return Err(Error::InvalidArgument(format!(
                    "queue '{}' buffer {i} has {size} bytes; {} differs",
                    queue.name(),
                    tensor.describe(t)
                )));
            }
            let taken = self.pops.iter().any(|p| p.tensors.contains(&t)) || tensors.contains(&t);
            if taken {
                return Err(Error::InvalidArgument(format!(
                    "{} is already popped into",
                    tensor.describe(t)
                )));
            }
            tensors.push(t);
        }
        self.pops.push(QueuePop { queue, tensors });
        Ok(())
    }

    /// Takes every queue's next batch (waiting up to its pop timeout) and binds the tensors to
    /// it. On failure the batches taken so far go back.
    pub(super) fn begin_pops(&mut self) -> Result<Popped> {
        let mut popped: Popped = Vec::with_capacity(self.pops.len());
        for i in 0..self.pops.len() {
            let queue = Arc::clone(&self.pops[i].queue);
            let slot = match queue.begin_pop() {
                Ok(s) => s,
                Err(e) => {
                    self.cancel_pops(popped);
                    return Err(e);
                }
            };
            let buffers = queue.buffers(&slot).to_vec();
            popped.push((queue, slot));
            let tensors = self.pops[i].tensors.clone();
            for (t, ptr) in tensors.into_iter().zip(buffers) {
                if let Err(e) = self.bind_index(t, ptr) {
                    self.cancel_pops(popped);
                    return Err(e);
                }
            }
        }
        Ok(popped)
    }

    /// The run is queued: the slots go back to their producers.
    pub(super) fn finish_pops(&mut self, popped: Popped) -> Result<()> {
        let mut first = Ok(());
        for (queue, slot) in popped {
            let r = queue.finish_pop(slot);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// The run failed before it was queued: the batches stay at their queues' heads.
    pub(super) fn cancel_pops(&mut self, popped: Popped) {
        for (queue, _) in popped {
            queue.cancel_pop();
        }
    }

    /// Whether the graph pops from any queue.
    pub(super) fn has_pops(&self) -> bool {
        !self.pops.is_empty()
    }
}
