//! Binding: persistent tensors read and written in place in device memory the host owns.
//!
//! A bound tensor is never swapped, moved or freed by gkrt and holds no pool memory, so it is
//! outside the memory limit. Binding needs a finalized graph (the arena and the swap decision
//! are made first, counting every persistent tensor: conservative) and a graph that does not
//! swap (its plan moves persistent tensors between device and host). A planned graph replayed
//! as a captured CUDA graph is captured again at the next run when a bound address changes.

use super::{Replay, RuntimeGraph};
use crate::exec::StoreAccess;
use crate::runtime::{Error, Result};
use std::sync::Arc;

impl RuntimeGraph {
    /// The index of tensor `id` for a bind or unbind (`verb`), after the checks every such call
    /// shares.
    fn binding_index(&self, id: u64, verb: &str) -> Result<u32> {
        let t = self.graph.tensor_index(id)?;
        let tensor = &self.graph.tensors()[t as usize];
        if !tensor.kind.persists() {
            return Err(Error::InvalidArgument(format!(
                "cannot {verb} {}: only inputs, parameters and outputs can be bound; \
                 intermediates live inside a run",
                tensor.describe(t)
            )));
        }
        if !self.graph.is_finalized() {
            return Err(Error::InvalidState(format!(
                "cannot {verb} {}: finalize the graph first",
                tensor.describe(t)
            )));
        }
        if self.swap.is_some() {
            return Err(Error::InvalidState(format!(
                "cannot {verb} {}: the graph swaps (its working set exceeds the memory limit), \
                 and its swap plan moves persistent tensors; bound tensors need a graph that fits",
                tensor.describe(t)
            )));
        }
        Ok(t)
    }

    /// Binds persistent tensor `id` to `bytes` bytes of device memory at `ptr` (at least the
    /// tensor's size). Its contents are the memory's from now on: an input counts as written.
    pub fn bind(&mut self, id: u64, ptr: u64, bytes: u64) -> Result<()> {
        let t = self.binding_index(id, "bind")?;
        let tensor = &self.graph.tensors()[t as usize];
        if ptr == 0 {
            return Err(Error::InvalidArgument(format!(
                "cannot bind {} to a NULL pointer",
                tensor.describe(t)
            )));
        }
        if bytes < tensor.size {
            return Err(Error::InvalidArgument(format!(
                "cannot bind {} to {bytes} bytes: it needs {} bytes",
                tensor.describe(t),
                tensor.size
            )));
        }
        let old = self
            .store
            .get(t)
            .is_bound()
            .then(|| self.store.get(t).device());
        let rt = Arc::clone(&self.runtime);
        {
            let mut st = rt.lock_for_call()?;
            let st = &mut *st;
            self.store.bind(
                t,
                ptr,
                StoreAccess {
                    device: rt.device(),
                    stream: rt.compute,
                    pool: &mut st.pool,
                    pinned: &mut st.pinned,
                },
            )?;
        }
        self.has_contents[t as usize] = true;
        if old != Some(Some(ptr)) {
            self.addresses_changed();
        }
        Ok(())
    }

    /// Unbinds persistent tensor `id` (a no-op for one not bound): gkrt forgets the host's
    /// memory, and the tensor has no contents until written or produced again.
    pub fn unbind(&mut self, id: u64) -> Result<()> {
        let t = self.binding_index(id, "unbind")?;
        if !self.store.get(t).is_bound() {
            return Ok(());
        }
        // The host may reuse the memory once this returns: nothing gkrt queued may still use it.
        {
            let _st = self.runtime.lock_for_call()?;
            self.runtime.drain()?;
        }
        self.store.unbind(t);
        self.has_contents[t as usize] = false;
        self.addresses_changed();
        Ok(())
    }

    /// A tensor's address changed: a captured replay has the old one baked in, so it is
    /// dropped and captured again at the next run (a capture costs one ordinary run).
    fn addresses_changed(&mut self) {
        if let Replay::Captured(exec_graph) = self.replay {
            log::info!(
                "a bound address changed: the planned graph is captured again at its next run"
            );
            if let Err(e) = self.runtime.device.destroy_graph(exec_graph) {
                log::warn!("destroying the replaced capture: {e}");
            }
            self.replay = Replay::NotYet;
            self.captures_dropped += 1;
        }
    }

    /// Whether persistent tensor `t` is bound to the host's memory.
    pub fn is_bound(&self, t: u32) -> bool {
        self.store.get(t).is_bound()
    }

    /// How many captured replays were dropped because a bound address changed.
    pub fn captures_dropped(&self) -> u64 {
        self.captures_dropped
    }
}
