//! Asynchronous runs: the whole run queued, ordered after the host's stream and before what the
//! host queues there next, and waited for later.
//!
//! gkrt runs the graph on its own compute stream, as a synchronous run does, joined to the
//! host's stream by two events: the compute stream waits for what the host queued on its
//! stream so far (`fork`), and the host's stream waits for the run (`done`). So the pool's
//! stream order is unchanged: transient buffers go back to the pool on the compute stream,
//! behind the run's last reader, and are reused there in order (on another stream only after an
//! event, the pool's rule). Two asynchronous runs of one graph are ordered: both are on the
//! compute stream, in the order queued, whatever the host's streams.

use super::RuntimeGraph;
use crate::device::{DeviceError, EventId, StreamId};
use crate::runtime::{Error, Result, Runtime};
use std::ffi::c_void;
use std::sync::Arc;

/// The two events that join an asynchronous run to the host's stream (made at the first such
/// run, destroyed with the graph).
#[derive(Clone, Copy, Debug)]
pub(super) struct AsyncEvents {
    pub fork: EventId,
    pub done: EventId,
}

/// A failure raised on a stream, said as what it is (a host callback on the host backend).
fn stream_error(e: DeviceError) -> Error {
    match e {
        DeviceError::Async(m) => Error::CallbackFailed(m),
        other => Error::from(other),
    }
}

impl RuntimeGraph {
    /// Queues one run of the graph after the work queued so far on the native stream `stream`
    /// (NULL: gkrt's compute stream) and returns; work the host queues on `stream` afterwards
    /// runs after it. Failures while queueing are returned (the run is then drained and cleaned
    /// up as a synchronous run's); failures on the device, at `wait` or the next call that
    /// waits for the compute stream.
    pub fn run_async(&mut self, stream: *mut c_void) -> Result<()> {
        if !self.has_pops() {
            return self.run_async_once(stream);
        }
        let popped = self.begin_pops()?;
        match self.run_async_once(stream) {
            Ok(()) => self.finish_pops(popped),
            Err(e) => {
                self.cancel_pops(popped);
                Err(e)
            }
        }
    }

    fn run_async_once(&mut self, stream: *mut c_void) -> Result<()> {
        self.check_runnable()?;
        if self.swap.is_some() {
            return Err(Error::InvalidState(
                "this graph swaps (its working set exceeds the memory limit): its runs move \
                 tensors between device and host and must end on the host, so it runs only \
                 synchronously (gkrt_runtime_run)"
                    .into(),
            ));
        }
        if self.collective_events.iter().any(Option::is_some) {
            return Err(Error::InvalidState(
                "this graph has collective nodes: a rank that fails must abort its communicators \
                 before it waits for them, so the graph runs only synchronously (gkrt_runtime_run)"
                    .into(),
            ));
        }
        let rt = Arc::clone(&self.runtime);
        let mut guard = rt.lock_for_call()?;
        let st = &mut *guard;
        let host = host_stream(&rt, stream)?;
        let events = self.async_events(&rt)?;
        if host != rt.compute {
            rt.device.record_event(events.fork, host)?;
            rt.device.stream_wait_event(rt.compute, events.fork)?;
        }
        self.ever_run = true;
        let (queued, counters) = self.enqueue(&rt, st, false);
        if queued.is_err() {
            // Cleaned up as a synchronous run is: everything drained, the error returned.
            self.async_in_flight = false;
            return self.finish_run(&rt, st, queued, counters);
        }
        rt.device.record_event(events.done, rt.compute)?;
        if host != rt.compute {
            rt.device.stream_wait_event(host, events.done)?;
        }
        st.counters.add_run(&counters, 0);
        self.last_fallbacks = counters.fallbacks;
        // Queued: every address is fixed, so the next run of a planned graph may capture.
        self.successful_runs += 1;
        for (t, tensor) in self.graph.tensors().iter().enumerate() {
            if tensor.kind.persists() && self.store.get(t as u32).has_data() {
                self.has_contents[t] = true;
            }
        }
        self.async_in_flight = true;
        Ok(())
    }

    /// Waits until the graph's asynchronous runs have finished (and whatever gkrt queued before
    /// them on its compute stream); returns a failure the device raised in them. Nothing to
    /// wait for after a synchronous run; an error for a graph that never ran.
    pub fn wait(&mut self) -> Result<()> {
        if !self.ever_run {
            return Err(Error::InvalidState(
                "the graph was never run: there is nothing to wait for".into(),
            ));
        }
        if !self.async_in_flight {
            return Ok(());
        }
        let rt = Arc::clone(&self.runtime);
        let _st = rt.lock_for_call()?;
        self.async_in_flight = false;
        rt.device
            .stream_synchronize(rt.compute)
            .map_err(stream_error)
    }

    fn async_events(&mut self, rt: &Runtime) -> Result<AsyncEvents> {
        if let Some(events) = self.async_events {
            return Ok(events);
        }
        // Only ever waited for and synchronised on: untimed.
        let fork = rt.device.create_sync_event()?;
        let done = match rt.device.create_sync_event() {
            Ok(done) => done,
            Err(e) => {
                let _ = rt.device.destroy_event(fork);
                return Err(e.into());
            }
        };
        let events = AsyncEvents { fork, done };
        self.async_events = Some(events);
        Ok(events)
    }
}

/// The stream id of the host's native stream (NULL: the compute stream).
fn host_stream(rt: &Runtime, stream: *mut c_void) -> Result<StreamId> {
    if stream.is_null() {
        return Ok(rt.compute);
    }
    rt.device
        .import_stream(stream)
        .map_err(|e| Error::InvalidArgument(format!("stream {stream:p}: {e}")))
}
