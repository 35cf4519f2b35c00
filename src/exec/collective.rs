//! Collective nodes in a run: queued on the communication stream after the compute work queued
//! so far (an event recorded on the compute stream, waited on by the communication stream), with
//! the node's own event recorded after it. The compute stream waits for that event only where
//! the program says (`Step::AwaitCollective`: before the first node that touches the
//! collective's tensors), so compute in between overlaps the collective; a tensor freed before
//! then goes back to the pool pending on the event (`Executor::free_block`).

use super::Executor;
use crate::error::{Error, Result};
use crate::graph::Graph;

impl Executor<'_> {
    pub(super) fn queue_collective(&mut self, graph: &Graph, n: u32) -> Result<()> {
        let node = &graph.nodes()[n as usize];
        let comm = node.comm.as_ref().ok_or_else(|| {
            Error::Internal(format!(
                "node {n} is queued as a collective but has no communicator"
            ))
        })?;
        let event = self
            .collective_events
            .get(n as usize)
            .copied()
            .flatten()
            .ok_or_else(|| Error::Internal(format!("collective node {n} has no event")))?;
        let ptr = |t: u32| -> Result<u64> {
            self.mem[t as usize].device().ok_or_else(|| {
                Error::Internal(format!(
                    "{} is not on the device when its collective runs",
                    graph.tensors()[t as usize].describe(t)
                ))
            })
        };
        let mut call = graph.collective_call(n);
        if let Some(&t) = node.inputs.first() {
            call.send = ptr(t)?;
        }
        if let Some(&t) = node.outputs.first() {
            call.recv = ptr(t)?;
        }
        let (compute, comm_stream) = (self.streams.compute, self.streams.comm);
        self.device.record_event(self.streams.marker, compute)?;
        self.order.marker_recorded();
        self.synced_compute();
        self.device
            .stream_wait_event(comm_stream, self.streams.marker)?;
        // A profiled run times the call on the communication stream (the trace's
        // communication track).
        let timing = match self.profile.as_deref_mut() {
            Some(p) => Some(p.collective_pair(self.device, n as usize)?),
            None => None,
        };
        if let Some((start, _)) = timing {
            self.device.record_event(start, comm_stream)?;
        }
        comm.0.enqueue(self.device, &[call], comm_stream)?;
        if let Some((_, end)) = timing {
            self.device.record_event(end, comm_stream)?;
        }
        self.device.record_event(event, comm_stream)?;
        if self.comm_busy.len() < self.mem.len() {
            self.comm_busy.resize(self.mem.len(), None);
        }
        for &t in node.inputs.iter().chain(&node.outputs) {
            self.comm_busy[t as usize] = Some(event);
        }
        Ok(())
    }

    pub(super) fn await_collective(&mut self, graph: &Graph, n: u32) -> Result<()> {
        let Some(event) = self.collective_events.get(n as usize).copied().flatten() else {
            return Err(Error::Internal(format!("collective node {n} has no event")));
        };
        self.device.stream_wait_event(self.streams.compute, event)?;
        self.order.compute_queued();
        self.synced_compute();
        if let Some(p) = self.profile.as_deref_mut() {
            p.compute_queued();
        }
        let node = &graph.nodes()[n as usize];
        for &t in node.inputs.iter().chain(&node.outputs) {
            if self.comm_busy.get(t as usize) == Some(&Some(event)) {
                self.comm_busy[t as usize] = None;
            }
        }
        Ok(())
    }
}
