//! Collective nodes of a graph bound to its runtime: adding them (the communicator must be of
//! the same runtime), the per-node events their runs record, and what a failed run does to
//! their communicators (aborts them, so that the other ranks fail instead of waiting).

use super::RuntimeGraph;
use crate::device::comm::CollectiveKind;
use crate::kernels::collective::DType;
use crate::runtime::{Comm, Error, Result};
use std::sync::Arc;

impl RuntimeGraph {
    /// Adds a collective node over `comm` (a communicator of this graph's runtime); returns the
    /// node's index.
    pub fn add_collective(
        &mut self,
        comm: &Comm,
        kind: CollectiveKind,
        dtype: DType,
        inputs: &[u64],
        outputs: &[u64],
    ) -> Result<u32> {
        if !Arc::ptr_eq(comm.runtime(), &self.runtime) {
            return Err(Error::InvalidArgument(
                "the communicator belongs to another runtime than the graph".into(),
            ));
        }
        Ok(self.graph.add_collective(
            Arc::clone(comm.communicator()),
            kind,
            dtype,
            inputs,
            outputs,
        )?)
    }

    /// One event per collective node, made at finalize.
    pub(super) fn make_collective_events(&mut self) -> Result<()> {
        let device = self.runtime.device();
        for (n, node) in self.graph.nodes().iter().enumerate() {
            if node.comm.is_some() {
                if self.collective_events.len() <= n {
                    self.collective_events.resize(n + 1, None);
                }
                if self.collective_events[n].is_none() {
                    self.collective_events[n] = Some(device.create_event()?);
                }
            }
        }
        Ok(())
    }

    /// After a failed run: every communicator of the graph is aborted, so that ranks waiting
    /// for this one's collectives fail with `PeerFailed` instead of waiting for their timeout.
    pub(super) fn abort_communicators(&self, why: &Error) {
        for node in self.graph.nodes() {
            if let Some(comm) = &node.comm {
                if comm.0.aborted().is_none() {
                    comm.0.abort(&format!("its run failed: {why}"));
                }
            }
        }
    }
}
