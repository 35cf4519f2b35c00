//! Runs: one step through the executor, the capture and replay of planned graphs.

use super::{Replay, RuntimeGraph, TraceMark};
use crate::device::DeviceError;
use crate::exec::{ExecTarget, Executor, StoreAccess};
use crate::graph::Graph;
use crate::runtime::{Error, Result, Runtime};
use std::sync::Arc;

impl RuntimeGraph {
    /// Runs the graph once. On failure no node is re-run, every transient buffer is back in the
    /// pool, and the runtime and graph stay usable; the communicators of its collective nodes
    /// are aborted (the other ranks cannot complete this step without this one).
    pub fn run(&mut self) -> Result<()> {
        let result = self.run_popping();
        if let Err(e) = &result {
            self.abort_communicators(e);
        }
        result
    }

    /// A run with its queues' pops around it.
    fn run_popping(&mut self) -> Result<()> {
        if !self.has_pops() {
            return self.run_once();
        }
        // A run takes its queues' batches first; one that fails leaves them at the heads.
        let popped = self.begin_pops()?;
        match self.run_once() {
            Ok(()) => self.finish_pops(popped),
            Err(e) => {
                self.cancel_pops(popped);
                Err(e)
            }
        }
    }

    fn run_once(&mut self) -> Result<()> {
        self.check_runnable()?;
        let rt = Arc::clone(&self.runtime);
        let mut guard = rt.lock_for_call()?;
        let st = &mut *guard;
        // A run finishes whatever asynchronous run of this graph is in flight.
        self.async_in_flight = false;
        self.ever_run = true;
        if !self.digest_checked && self.graph.has_collectives() {
            self.check_collective_digest(&rt, st)?;
            self.digest_checked = true;
        }
        let (queued, counters) = self.enqueue(&rt, st, true);
        self.finish_run(&rt, st, queued, counters)
    }

    /// The checks made before anything runs: finalized, and every input or parameter a node
    /// reads written (or bound).
    pub(super) fn check_runnable(&self) -> Result<()> {
        if !self.graph.is_finalized() {
            return Err(Error::InvalidState(
                "the graph must be finalized before it runs".into(),
            ));
        }
        let lv = self.graph.liveness().expect("finalized");
        for (t, tensor) in self.graph.tensors().iter().enumerate() {
            let read_first = lv.first_use[t]
                .is_some_and(|n| self.graph.nodes()[n as usize].inputs.contains(&(t as u32)));
            if tensor.kind.host_written() && read_first && !self.has_contents[t] {
                return Err(Error::InvalidState(format!(
                    "{} is read by node {} but was never written",
                    tensor.describe(t as u32),
                    lv.first_use[t].unwrap()
                )));
            }
        }
        Ok(())
    }

    /// Queues one run (the state lock is held by the caller): the arena at the first planned
    /// run, then the captured replay, a capture, or the executor. Returns whether queueing
    /// succeeded and the run's counters; nothing is waited for. `sync`: `finish_run` follows
    /// (only such a run is traced).
    pub(super) fn enqueue(
        &mut self,
        rt: &Runtime,
        st: &mut crate::runtime::State,
        sync: bool,
    ) -> (Result<()>, crate::exec::RunCounters) {
        // Planned mode takes its arena from the pool once, at the first run, and keeps it.
        if let Some(layout) = &self.arena {
            let taken = self.store.take_arena(
                layout.size,
                self.graph.nodes().len() as u32,
                StoreAccess {
                    device: rt.device(),
                    stream: rt.compute,
                    pool: &mut st.pool,
                    pinned: &mut st.pinned,
                },
            );
            if let Err(e) = taken {
                return (Err(e), Default::default());
            }
        }
        let capture =
            self.replay == Replay::NotYet && self.successful_runs > 0 && begin_capture(rt);
        // While the runtime traces, runs are timed with events (not one being captured: its
        // events would become part of the replay).
        // An asynchronous run is not traced: nothing waits for its events.
        let traced = sync && st.trace.is_some() && !capture;
        self.trace_mark = st.trace.as_ref().filter(|_| sync).map(|t| TraceMark {
            began_us: t.now_us(),
            replayed: capture || matches!(self.replay, Replay::Captured(_)),
        });
        if self.replay == Replay::NotYet && self.successful_runs > 0 && !capture {
            self.replay = Replay::Off;
        }
        let mut counters;
        let mut queued = match self.replay {
            Replay::Captured(exec_graph) => {
                counters = crate::exec::RunCounters {
                    nodes: self.graph.nodes().len() as u64,
                    ..Default::default()
                };
                self.launch_replay(rt, exec_graph)
            }
            _ => {
                let r;
                (r, counters) = self.execute(rt, st, traced);
                r
            }
        };
        if capture {
            match (rt.device.end_capture(rt.compute), &queued) {
                (Ok(exec_graph), Ok(())) => {
                    self.replay = Replay::Captured(exec_graph);
                    if self.graph.has_collectives() {
                        log::info!("planned graph captured for replay with its collectives");
                    }
                    queued = self.launch_replay(rt, exec_graph);
                }
                (Ok(exec_graph), Err(e)) => {
                    let _ = rt.device.destroy_graph(exec_graph);
                    // A collective the communication library could not queue inside a capture
                    // would fail every later capture alike: later runs are not captured.
                    if self.graph.has_collectives() {
                        log::warn!("planned graph with collectives not captured for replay: {e}");
                        self.replay = Replay::Off;
                    }
                }
                (Err(e), _) => {
                    // The work was recorded, not run: run it the ordinary way.
                    log::warn!("planned graph not captured for replay: {e}");
                    self.replay = Replay::Off;
                    (queued, counters) = self.execute(rt, st, traced);
                }
            }
        }
        (queued, counters)
    }

    /// The end of a synchronous run (the state lock is held by the caller): waits for every
    /// stream, collects asynchronous failures and the run's counters, then the bookkeeping of a
    /// successful run (the swap plan's tuning after the first `tune::TUNING_RUNS`).
    pub(super) fn finish_run(
        &mut self,
        rt: &Arc<Runtime>,
        st: &mut crate::runtime::State,
        queued: Result<()>,
        counters: crate::exec::RunCounters,
    ) -> Result<()> {
        // Wait even after a queueing error: asynchronous failures must be collected now, and
        // copies must be done before their tensors are touched again.
        let mut finished = Ok(());
        for s in [rt.streams.compute, rt.streams.copy_in, rt.streams.copy_out] {
            let r = rt.device.stream_synchronize(s).map_err(|e| match e {
                DeviceError::Async(m) => Error::CallbackFailed(m),
                other => Error::from(other),
            });
            if finished.is_ok() {
                finished = r;
            }
        }
        // A rank that failed tells the others before it waits for its collectives, which may
        // be waiting for collectives of this rank that will never come.
        if let Some(e) = queued.as_ref().err().or(finished.as_ref().err()) {
            self.abort_communicators(e);
        }
        let comm = rt
            .device
            .stream_synchronize(rt.streams.comm)
            .map_err(|e| match e {
                DeviceError::Async(m) => Error::PeerFailed(m),
                other => Error::from(other),
            });
        if finished.is_ok() {
            finished = comm;
        }
        let mut wait_ms = 0.0f64;
        for &(start, end) in &st.stall_pairs[..counters.stall_pairs_used] {
            wait_ms += rt.device.event_elapsed_ms(start, end).unwrap_or(0.0) as f64;
        }
        st.counters.add_run(&counters, (wait_ms * 1e6) as u64);
        self.last_fallbacks = counters.fallbacks;
        // Every copy is done: in-flight states have landed.
        self.store.land_all();
        let outcome = queued.and(finished);
        if let (Some(trace), Some(mark)) = (st.trace.as_mut(), self.trace_mark.take()) {
            self.trace_run(
                trace,
                rt.device(),
                mark.began_us,
                &counters,
                mark.replayed,
                &outcome,
            );
        }
        outcome?;
        self.successful_runs += 1;
        if let (Some(path), true) = (crate::runtime::env::swap_timeline(), self.writes_timeline()) {
            if let Err(e) = self.write_timeline(rt.device(), path) {
                log::warn!("swap timeline not written to {path}: {e}");
            }
        }
        let tuning = self.swap.is_some() && !self.swap_candidates.is_empty() && !self.swap_chosen;
        // (The run that completes the tuning runs: the refit may start from an empty pool.)
        let emptied = tuning
            && self.swap_timings.len() + 1 >= super::tune::TUNING_RUNS
            && self.empty_for_tuning(rt, st);
        if tuning && self.tune_swap_plan(rt.device(), &st.pool) {
            self.swap_chosen = true;
            // Runs end in the plan's start state, a new plan's too (after emptying the pool,
            // its kept tensors back in the order its fit's dry run placed them). The run itself
            // succeeded: a failure here is only logged (the next run's start retries the move).
            let (r, _) = self.execute_with(
                rt,
                st,
                |exec, graph| {
                    exec.enter_start_state(graph)?;
                    if emptied {
                        exec.bring_kept(graph)?;
                    }
                    Ok(())
                },
                false,
            );
            let synced = rt.device.stream_synchronize(rt.streams.copy_out);
            if let Err(e) = r.and(synced.map_err(Error::from)) {
                log::warn!("moving tensors to the tuned swap plan's starting state: {e}");
            }
            self.store.land_all();
        }
        for (t, tensor) in self.graph.tensors().iter().enumerate() {
            if tensor.kind.persists() && self.store.get(t as u32).has_data() {
                self.has_contents[t] = true;
            }
        }
        Ok(())
    }
}

impl RuntimeGraph {
    /// Queues one run through the executor (the state lock is held by the caller), timed with
    /// events when `traced` or the swap plan wants timings.
    pub(super) fn execute(
        &mut self,
        rt: &Runtime,
        st: &mut crate::runtime::State,
        traced: bool,
    ) -> (Result<()>, crate::exec::RunCounters) {
        let profiled = traced
            || self.swap.is_some() && !self.swap_candidates.is_empty() && !self.swap_chosen
            || self.writes_timeline();
        self.profile.share_boundaries(traced);
        let backing = crate::memory::DeviceBacking(rt.device());
        self.refresh_placements(&mut st.pool, &backing, rt.compute);
        // A run with a release schedule meets the pool as its dry run did: the last run's copies
        // done (the host synchronised), and no block given back by polling until the schedule
        // or a take does.
        let releasing = self.releases.current.is_some();
        // Without one, a swapping run's executor polls the copies' events oldest first
        // (`exec/poll.rs`) and the pool holds them likewise.
        self.polling_in_order = !releasing && self.swap.is_some() && self.poll_in_order;
        let held = releasing || self.polling_in_order;
        if releasing {
            self.complete_last_copies(&mut st.pool, &backing);
        }
        if held {
            st.pool.poll_pending(&backing);
            st.pool.hold_events(true);
        }
        // Nor does it learn from markers which free pages the device has passed: its dry run
        // cannot know, and the pages it moves then differ from the dry run's.
        let markers_held = releasing && self.releases.hold_markers;
        st.pool.hold_markers(markers_held);
        let (r, counters) = self.execute_with(rt, st, |exec, graph| exec.run(graph), profiled);
        self.polling_in_order = false;
        if held {
            st.pool.hold_events(false);
        }
        st.pool.hold_markers(false);
        self.releases.last_released = counters.released;
        self.placements_after_run(&counters);
        (r, counters)
    }

    /// `what` through an executor over this graph's state (the state lock is held by the caller).
    pub(super) fn execute_with(
        &mut self,
        rt: &Runtime,
        st: &mut crate::runtime::State,
        what: impl FnOnce(&mut Executor<'_>, &Graph) -> Result<()>,
        profiled: bool,
    ) -> (Result<()>, crate::exec::RunCounters) {
        if let Some(calls) = &mut self.pool_calls {
            calls.clear();
        }
        let mut exec = Executor::new(
            ExecTarget {
                device: rt.device(),
                streams: rt.streams,
                pool: &mut st.pool,
                pinned: &mut st.pinned,
                program: &self.program,
                store: &mut self.store,
                stall_pairs: &mut st.stall_pairs,
                collective_events: &self.collective_events,
                placements: self.placements.current.as_ref(),
                releases: self.releases.current.as_ref(),
                elide_syncs: self.elide_syncs,
                poll_in_order: self.polling_in_order,
                // (Only a swapping graph's runs are all synchronous.)
                earlier_copies_done: self.swap.is_some(),
                time_stalls: self.time_stalls,
            },
            profiled.then_some(&mut self.profile),
            self.pool_calls.as_mut(),
        );
        let r = what(&mut exec, &self.graph);
        self.last_syncs = (exec.counters.compute_syncs, exec.counters.syncs_elided);
        self.last_polled = exec.counters.events_polled;
        self.last_copy_waits = (exec.counters.copy_waits, exec.counters.copy_waits_elided);
        self.last_deferred = (exec.counters.deferred_copy_ins, exec.counters.fallbacks);
        (r, exec.counters)
    }
}

impl RuntimeGraph {
    /// Launches the captured replay on the compute stream. With collectives: refused with
    /// `PeerFailed` once a communicator was aborted (the capture's calls name it), and each
    /// communicator watches the replay as one outstanding group (its timeout covers the whole
    /// replayed step; see `device/cuda/nccl.rs`).
    fn launch_replay(
        &mut self,
        rt: &Runtime,
        exec_graph: crate::device::GraphExecId,
    ) -> Result<()> {
        // (Only graphs with collectives have events for them: others skip the node scan.)
        let comms = if self.collective_events.is_empty() {
            Vec::new()
        } else {
            self.communicators()
        };
        if let Some(why) = comms.iter().find_map(|c| c.aborted()) {
            return Err(Error::PeerFailed(format!(
                "the replayed graph's communicator was aborted: {why}"
            )));
        }
        rt.device.launch_graph(exec_graph, rt.compute)?;
        self.replays += 1;
        for c in &comms {
            c.watch_replay(rt.device(), rt.compute)?;
        }
        Ok(())
    }
}

/// Starts capturing the compute stream; on failure logs why and returns false.
fn begin_capture(rt: &Runtime) -> bool {
    match rt.device.begin_capture(rt.compute) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("planned graph not captured for replay: {e}");
            false
        }
    }
}
