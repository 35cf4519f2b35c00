//! Tensor I/O from the host: writes and reads of persistent tensors, checked by one function.

use super::RuntimeGraph;
use crate::exec::StoreAccess;
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

    /// Copies `data` into a persistent tensor. A tensor on the device is written there; one on
    /// the host (or, in a swapping graph, one never written) is written into its pinned slot.
    pub fn write(&mut self, id: u64, data: &[u8]) -> Result<()> {
        let t = self.io_index(id, data.len() as u64, "write")?;
        let rt = Arc::clone(&self.runtime);
        let mut st = rt.lock_for_call()?;
        let st = &mut *st;
        self.store.write(
            t,
            data,
            self.swap.is_some(),
            StoreAccess {
                device: rt.device(),
                stream: rt.compute,
                pool: &mut st.pool,
                pinned: &mut st.pinned,
            },
        )?;
        self.has_contents[t as usize] = true;
        Ok(())
    }

    /// Copies a persistent tensor's contents into `out`, from wherever they are.
    pub fn read(&mut self, id: u64, out: &mut [u8]) -> Result<()> {
        let t = self.io_index(id, out.len() as u64, "read")?;
        let tensor = &self.graph.tensors()[t as usize];
        if !self.has_contents[t as usize] {
            return Err(Error::InvalidState(format!(
                "{} has no contents yet: write it or run the graph first",
                tensor.describe(t)
            )));
        }
        let rt = &self.runtime;
        let _st = rt.lock_for_call()?;
        self.store
            .read(t, out, rt.device(), rt.compute, || tensor.describe(t))
    }
}
