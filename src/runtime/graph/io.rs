//! Tensor I/O from the host: writes and reads of persistent tensors, checked by one function.

use super::RuntimeGraph;
use crate::memory::residency::Residency;
use crate::memory::{DeviceBacking, PinnedBacking};
use crate::runtime::{Error, Result};
use std::sync::Arc;

impl RuntimeGraph {
    /// The index of persistent tensor `id` for a host copy of `size` bytes (`verb`: "write" or
    /// "read"): the one check of a tensor write or read, made before any host memory is touched.
    fn io_index(&self, id: u64, size: u64, verb: &str) -> Result<u32> {
        let t = self.graph.tensor_index(id)?;
        let tensor = &self.graph.tensors()[t as usize];
        if !tensor.kind.persists() {
            return Err(Error::InvalidArgument(format!(
                "cannot {verb} {}: intermediates live only inside a run; make it an output to read it",
                tensor.describe(t)
            )));
        }
        if size != tensor.size {
            return Err(Error::InvalidArgument(format!(
                "{verb} of {size} bytes does not match {}",
                tensor.describe(t)
            )));
        }
        Ok(t)
    }

    /// Checks a host copy of `size` bytes against a persistent tensor (`io_index`); the C API
    /// calls this before it makes a slice of the caller's buffer.
    pub fn check_io(&self, id: u64, size: u64, verb: &str) -> Result<()> {
        self.io_index(id, size, verb).map(|_| ())
    }

    /// Waits (on the host) until no copy of `t` is in flight, so its host slot and device
    /// block can be touched directly.
    fn settle(&mut self, t: u32) -> Result<()> {
        let rt = &self.runtime;
        let m = &mut self.mem[t as usize];
        for event in [m.event(false), m.event(true)].into_iter().flatten() {
            rt.device.event_synchronize(event)?;
        }
        m.land();
        Ok(())
    }

    /// Copies `data` into a persistent tensor. A tensor on the device is written there; one on
    /// the host (or, in a swapping graph, one never written) is written into its pinned slot.
    pub fn write(&mut self, id: u64, data: &[u8]) -> Result<()> {
        let t = self.io_index(id, data.len() as u64, "write")?;
        self.settle(t)?;
        let rt = Arc::clone(&self.runtime);
        let mut st = rt.lock_for_call()?;
        let bytes = data.len() as u64;
        let to_host = match self.mem[t as usize].state() {
            Residency::OnHost => true,
            Residency::Unallocated => self.swap.is_some(),
            _ => false,
        };
        let m = &mut self.mem[t as usize];
        if to_host {
            let slot = match m.host() {
                Some(slot) => slot,
                None => {
                    let slot = st.pinned.alloc(
                        &PinnedBacking(rt.device()),
                        bytes,
                        crate::device::StreamId(0),
                    )?;
                    m.give_host_slot(slot);
                    slot
                }
            };
            // SAFETY: the slot holds `bytes` bytes and no copy uses it (settled above).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), slot as *mut u8, data.len()) };
            m.written_on_host();
        } else {
            let ptr = match m.device() {
                Some(p) => p,
                None => st
                    .pool
                    .alloc(&DeviceBacking(rt.device()), bytes, rt.compute)?,
            };
            m.placed(ptr);
            m.overwritten();
            // SAFETY: `data` outlives the copy: the stream is synchronised before we return.
            unsafe {
                rt.device
                    .copy_h2d_async(ptr, data.as_ptr(), bytes, rt.compute)?
            };
            rt.device.stream_synchronize(rt.compute)?;
        }
        self.has_contents[t as usize] = true;
        Ok(())
    }

    /// Copies a persistent tensor's contents into `out`, from wherever they are.
    pub fn read(&mut self, id: u64, out: &mut [u8]) -> Result<()> {
        let t = self.io_index(id, out.len() as u64, "read")?;
        if !self.has_contents[t as usize] {
            return Err(Error::InvalidState(format!(
                "{} has no contents yet: write it or run the graph first",
                self.graph.tensors()[t as usize].describe(t)
            )));
        }
        self.settle(t)?;
        let rt = &self.runtime;
        let _st = rt.lock_for_call()?;
        let m = &self.mem[t as usize];
        match (m.state(), m.device(), m.host()) {
            (Residency::OnDevice, Some(ptr), _) => {
                // SAFETY: `out` outlives the copy: the stream is synchronised before we return.
                unsafe {
                    rt.device
                        .copy_d2h_async(out.as_mut_ptr(), ptr, out.len() as u64, rt.compute)?
                };
                rt.device.stream_synchronize(rt.compute)?;
            }
            (Residency::OnHost, _, Some(slot)) if m.host_valid() => {
                // SAFETY: the slot holds the tensor's bytes and no copy uses it (settled above).
                unsafe {
                    std::ptr::copy_nonoverlapping(slot as *const u8, out.as_mut_ptr(), out.len())
                };
            }
            (state, _, _) => {
                return Err(Error::Internal(format!(
                    "{} is marked as holding contents but is {state:?}",
                    self.graph.tensors()[t as usize].describe(t)
                )))
            }
        }
        Ok(())
    }
}
