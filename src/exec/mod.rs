//! The executor: interprets a graph's step program (`plan::program`), step by step, on the
//! compute stream and the two copy streams. It analyses nothing: which tensors to allocate,
//! free, copy or rebuild, and in which order, was compiled at finalize.
//!
//! Memory comes from the pool on the compute stream. Because everything that touches a block
//! from the compute stream runs in order, a block freed there right after its reader was queued
//! can be handed to the next writer at once. Copies run on their own streams, ordered by events
//! (`copies.rs`). When an allocation fails anyway — the plan did not foresee it (fragmentation,
//! other graphs), or there is no plan because the graph should have fit — the fallback
//! (`alloc.rs`) takes back blocks pending on copy-outs, then evicts the resident tensor whose
//! next use is farthest away (Belady) and retries. A node that cannot fit even alone fails with
//! an out-of-memory error naming it and the sizes; nodes already queued never run again.
//!
//! Planned mode: intermediates and workspaces sit at fixed arena offsets (the program's `Alloc`
//! entries carry them) and make no pool call.

mod alloc;
mod collective;
mod copies;
mod eager;
mod launch;
mod poll;
mod profile;
mod store;
mod stream_order;

use crate::device::{DevPtr, Device, EventId, StreamId};
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorKind};
use crate::memory::pool::Pool;
use crate::memory::residency::{Residency, TensorMemory};
use crate::memory::{DeviceBacking, PinnedBacking};
use crate::plan::program::{Buf, PoolCall, Program, Step};
use crate::plan::swap_placements::Placements;
use crate::plan::swap_release::Releases;
use stream_order::{CopyStream, StreamOrder, Waiter};

pub use eager::{launch_eager, EagerKernel};
pub use profile::{Anchor, RunProfile};
pub use store::{StoreAccess, TensorStore};

/// The streams of a runtime and the event used to mark progress on the compute stream.
#[derive(Clone, Copy, Debug)]
pub struct Streams {
    pub compute: StreamId,
    pub copy_in: StreamId,
    pub copy_out: StreamId,
    /// Re-recorded on the compute stream whenever a copy stream must wait for work queued so far.
    pub marker: EventId,
    /// The communication stream: collectives run here, ordered by events (`collective.rs`).
    pub comm: StreamId,
}

/// Counters of one run.
#[derive(Default, Debug, Clone, Copy)]
pub struct RunCounters {
    pub nodes: u64,
    pub pool_allocs: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub tensors_out: u64,
    pub tensors_in: u64,
    /// Evictions made by the fallback (not planned).
    pub evictions: u64,
    /// Times the run left its program's order: a start off the plan's canonical state,
    /// evictions, a batch taken again on a clean slate, returns deferred for lack of room. A run
    /// without any made exactly its program's pool calls.
    pub fallbacks: u64,
    /// Tensors rebuilt by running their producer again (planned rematerialisation).
    pub recomputes: u64,
    /// Timing-event pairs used around compute-stream waits on copies (see `stall_pairs`).
    pub stall_pairs_used: usize,
    /// One past the last node whose kernel or collective was queued: the nodes before it ran
    /// (or were absorbed into a later collective's bucket). Traces read this many nodes' events.
    pub reached: u64,
    /// Allocations that took the range the pool's dry run placed them in (`Pool::take_at`),
    /// and those that had such a placement but found it taken (allocated as the pool chose).
    pub placed: u64,
    pub misplaced: u64,
    /// Copy-outs whose blocks the release schedule gave back while still pending.
    pub released: u64,
    /// Records and waits the run queued on the compute stream besides its kernels: marker
    /// records, waits for copies and collectives, the waits' timing events (`GKRT_EXEC_ELIDE`
    /// lowers it; profiling stamps and the pool's own markers are not counted).
    pub compute_syncs: u64,
    /// Returns started later than their program's step for lack of room (each deferral of a
    /// return counted: one may be deferred again at the next node).
    pub deferred_copy_ins: u64,
    /// Events the executor queried to give back blocks pending on copies (`poll.rs`).
    pub events_polled: u64,
    /// Waits the copy streams queued for other copies' events, and those left out as implied
    /// (`stream_order.rs`; the waits for the compute marker are not counted).
    pub copy_waits: u64,
    pub copy_waits_elided: u64,
    /// Compute-stream records and waits left out because the streams' order implied them
    /// (`stream_order.rs`): with them, `compute_syncs` is what the run queues with elision off.
    pub syncs_elided: u64,
}

pub struct Executor<'a> {
    device: &'a dyn Device,
    streams: Streams,
    pool: &'a mut Pool,
    pinned: &'a mut Pool,
    program: &'a Program,
    /// Planned mode: the arena's base address (its intermediates are never pool blocks).
    arena: Option<DevPtr>,
    mem: &'a mut [TensorMemory],
    /// Reusable (start, end) timing events recorded around each compute-stream wait on a copy.
    stall_pairs: &'a mut Vec<(EventId, EventId)>,
    profile: Option<&'a mut RunProfile>,
    /// The pool calls of the run, when the caller asked for them (tests compare them with the
    /// program's dry run).
    trace: Option<&'a mut Vec<PoolCall>>,
    pub counters: RunCounters,
    /// Returns that found no room yet, with the step that deferred them; retried at the next
    /// `RetryDeferred`.
    deferred: Vec<(u32, usize)>,
    /// Where the pool's dry run placed each allocation of this run (`alloc.rs`: `take_placed`).
    placements: Option<&'a Placements>,
    /// When copy-outs' blocks go back (`copies.rs`: `release_copies`); `None`: when taken.
    releases: Option<&'a Releases>,
    /// The step being performed (placements are found by it).
    step_at: usize,
    /// The events of the pending blocks the last placed allocation took.
    placed_events: Vec<EventId>,
    /// The blocks of the batch being taken.
    scratch_taken: Vec<DevPtr>,
    /// The workspaces of the node (or recompute) being queued.
    workspaces: Vec<DevPtr>,
    buffers: Vec<crate::device::Buffer>,
    /// Tensors of a recompute in progress: the fallback must not evict them.
    protected: Vec<u32>,
    /// The node whose steps are running (the node count at a run's start and end).
    node: usize,
    /// Per node: a collective node's event, recorded on the communication stream after it.
    collective_events: &'a [Option<EventId>],
    /// Per tensor: the event of a collective that may still read or write it (not yet waited
    /// for on the compute stream); freeing it then waits for that event.
    comm_busy: Vec<Option<EventId>>,
    /// The graph's first label (`TensorStore::set_label_base`; 0: none).
    labels: u32,
    /// Per fused group (`Program::fused`): its block while the run holds it.
    group_blocks: Vec<Option<DevPtr>>,
    /// Which syncs the streams' order already implies (`stream_order.rs`).
    order: StreamOrder,
    /// A timing pair's start is recorded and its end not yet: consecutive waits share it.
    wait_group_open: bool,
    /// When the executor was made: profiled runs record the host's time of each launch.
    began: std::time::Instant,
    /// Compute-stream syncs queued since the last timed launch (profiled runs record them).
    syncs_since_launch: u32,
    /// Scratch for sets of events waited for together.
    scratch_events: Vec<EventId>,
    /// The executor, not the pool, polls the copies' events, oldest first (`poll.rs`).
    poll_in_order: bool,
    /// Compute-stream waits on copies are timed (`ExecTarget::time_stalls`).
    time_stalls: bool,
}

/// What an executor works on: the runtime's device, streams and pools, one graph's program and
/// tensor memory.
pub struct ExecTarget<'a> {
    pub device: &'a dyn Device,
    pub streams: Streams,
    pub pool: &'a mut Pool,
    pub pinned: &'a mut Pool,
    pub program: &'a Program,
    /// The graph's tensor memory (and its arena, in planned mode).
    pub store: &'a mut TensorStore,
    pub stall_pairs: &'a mut Vec<(EventId, EventId)>,
    /// Per node: a collective node's event (empty when the graph has none).
    pub collective_events: &'a [Option<EventId>],
    /// Where the pool's dry run placed this run's allocations, for the run to take the same
    /// ranges (`swap_placements`); `None`: the pool chooses.
    pub placements: Option<&'a Placements>,
    /// Per step, the copy-outs whose blocks go back before it, their copies waited for
    /// (`swap_release`); `None`: blocks stay pending until taken.
    pub releases: Option<&'a Releases>,
    /// Leave out the syncs the streams' order implies (`stream_order.rs`, `GKRT_EXEC_ELIDE`).
    pub elide_syncs: bool,
    /// The executor polls the copies' events oldest first, the pool holding its events
    /// (`poll.rs`, `GKRT_EXEC_POLL_IN_ORDER`); the caller set `Pool::hold_events`.
    pub poll_in_order: bool,
    /// Every copy the graph's earlier runs queued has completed (they ended with the streams
    /// synchronised: a swapping graph's runs are synchronous), so no wait for one is needed.
    pub earlier_copies_done: bool,
    /// Time the compute stream's waits on copies with `stall_pairs` (`GKRT_EXEC_TIME_STALLS`;
    /// always with `elide_syncs` off).
    pub time_stalls: bool,
}

impl<'a> Executor<'a> {
    pub fn new(
        target: ExecTarget<'a>,
        mut profile: Option<&'a mut RunProfile>,
        trace: Option<&'a mut Vec<PoolCall>>,
    ) -> Self {
        let (arena, labels) = (target.store.arena(), target.store.label_base());
        let mem = target.store.mem_mut();
        if let Some(p) = profile.as_deref_mut() {
            p.reset();
            let resident = mem
                .iter()
                .enumerate()
                .filter(|(_, m)| m.on_device() && !m.is_bound());
            p.resident_at_start.extend(resident.map(|(t, _)| t as u32));
            let stats = target.pool.stats();
            p.pool_counts(0, stats.page_map_count, stats.device_wait_count, true);
        }
        Executor {
            device: target.device,
            streams: target.streams,
            pool: target.pool,
            pinned: target.pinned,
            program: target.program,
            arena,
            labels,
            mem,
            stall_pairs: target.stall_pairs,
            profile,
            trace,
            counters: RunCounters::default(),
            deferred: Vec::new(),
            placements: target.placements,
            releases: target.releases,
            step_at: 0,
            placed_events: Vec::new(),
            scratch_taken: Vec::new(),
            workspaces: Vec::new(),
            buffers: Vec::new(),
            protected: Vec::new(),
            node: 0,
            collective_events: target.collective_events,
            comm_busy: Vec::new(),
            group_blocks: vec![None; target.program.fused.len()],
            order: StreamOrder::new(target.elide_syncs, target.earlier_copies_done),
            wait_group_open: false,
            began: std::time::Instant::now(),
            syncs_since_launch: 0,
            scratch_events: Vec::new(),
            poll_in_order: target.poll_in_order,
            // Without elision every wait is timed, as before elision existed.
            time_stalls: target.time_stalls || !target.elide_syncs,
        }
    }

    /// Queues the whole program. On error every transient buffer is returned (after the streams
    /// have drained) and the error names the node at fault. The caller synchronises the streams
    /// afterwards; asynchronous failures surface there.
    pub fn run(&mut self, graph: &Graph) -> Result<()> {
        // A run that does not start from its plan's canonical state (a kept tensor's return
        // found no room at the end of the last run) cannot make the plan's pool calls.
        let off_start = self.program.keep.iter().any(|&t| {
            !matches!(
                self.mem[t as usize].state(),
                Residency::OnDevice | Residency::CopyingToDevice
            )
        });
        self.counters.fallbacks += off_start as u64;
        let result = self.run_steps(graph, 0..self.program.steps.len());
        if result.is_err() {
            self.release_after_failure(graph);
        }
        // The bytes the run ends with (after its last frees and sends home).
        self.sample_memory();
        result
    }

    /// Only the run's start: every persistent tensor the plan wants on the host goes there (for
    /// a plan just chosen). The caller synchronises the copy stream.
    pub fn enter_start_state(&mut self, graph: &Graph) -> Result<()> {
        let start = self.program.start_len(graph.nodes().len());
        self.run_steps(graph, 0..start)
    }

    fn run_steps(&mut self, graph: &Graph, range: std::ops::Range<usize>) -> Result<()> {
        let program = self.program;
        let nodes = graph.nodes();
        for i in range {
            let n = program.step_node[i] as usize;
            self.node = n;
            self.step_at = i;
            if let Err(e) = self
                .release_copies(i)
                .and_then(|()| self.step(graph, program.steps[i]))
            {
                return Err(match nodes.get(n) {
                    Some(node) => e.context(node.describe(n as u32)),
                    None => e,
                });
            }
        }
        self.close_waits()
    }

    fn step(&mut self, graph: &Graph, step: Step) -> Result<()> {
        match step {
            Step::SendHome(t) | Step::CopyOut(t) => {
                if self.mem[t as usize].state() == Residency::OnDevice {
                    self.swap_out(graph, t)?;
                }
            }
            Step::RetryDeferred => {
                let waiting = std::mem::take(&mut self.deferred);
                for (t, from) in waiting {
                    self.copy_in_ahead(graph, t, from)?;
                }
            }
            Step::CopyIn(t) => self.copy_in_ahead(graph, t, self.step_at)?,
            Step::Recompute {
                tensor,
                producer,
                first,
                count,
            } => self.recompute(graph, tensor, producer, first, count)?,
            Step::Ready(t) => self.ensure_resident(graph, t)?,
            Step::Settle(t) => {
                if self.mem[t as usize].state() == Residency::CopyingToDevice {
                    self.ensure_resident(graph, t)?;
                }
            }
            Step::Alloc { node, first, count } => {
                self.alloc_node_buffers(graph, node, first, count)?;
                for &t in &graph.nodes()[node as usize].outputs {
                    self.mem[t as usize].overwritten();
                }
            }
            Step::Launch(n) => {
                let node = &graph.nodes()[n as usize];
                if let Err(e) = self.launch(graph, n as usize, node, true) {
                    self.free_workspaces(n);
                    return Err(e);
                }
                if self.arena.is_some() {
                    self.workspaces.clear();
                }
                self.counters.nodes += 1;
                self.counters.reached = n as u64 + 1;
            }
            Step::FreeWorkspaces(n) => self.free_workspaces(n),
            Step::Free(t) => self.discard(t),
            Step::Drop(t) => {
                // (A tensor the fallback sent to the host stays there and is read back.)
                if self.mem[t as usize].state() == Residency::OnDevice {
                    self.discard(t);
                }
            }
            Step::Collective(n) => {
                self.queue_collective(graph, n)?;
                self.counters.nodes += 1;
                self.counters.reached = n as u64 + 1;
            }
            Step::AwaitCollective(n) => self.await_collective(graph, n)?,
            Step::FreeGroup(g) => self.free_group(g),
        }
        Ok(())
    }

    /// A return the plan starts ahead of its reader at step `from`: deferred when there is no
    /// room yet.
    fn copy_in_ahead(&mut self, graph: &Graph, t: u32, from: usize) -> Result<()> {
        if !self.prefetch(graph, t, from)? {
            self.counters.fallbacks += 1;
            self.counters.deferred_copy_ins += 1;
            self.deferred.push((t, from));
        }
        Ok(())
    }

    /// Rebuilds intermediate `x`, dropped by the plan, before the node that reads it: its
    /// producer (declared recomputable; its inputs unchanged since it ran, which the plan
    /// checked) is queued again with the same parameters. The fallback may evict around it, but
    /// not the tensors of this recompute.
    fn recompute(&mut self, graph: &Graph, x: u32, p: u32, first: u32, count: u32) -> Result<()> {
        if self.mem[x as usize].state() != Residency::Unallocated {
            return Ok(()); // the fallback sent it to the host before the drop: read back instead
        }
        let tensor = &graph.tensors()[x as usize];
        let producer = &graph.nodes()[p as usize];
        let context = |e: Error| {
            e.context(format!(
                "recomputing {} by running {} again",
                tensor.describe(x),
                producer.describe(p)
            ))
        };
        self.protected.clear();
        self.protected.extend(producer.inputs.iter().copied());
        self.protected.push(x);
        let result = (|| -> Result<()> {
            for &y in &producer.inputs {
                self.ensure_resident(graph, y)?;
            }
            self.workspaces.clear();
            self.workspaces.resize(producer.workspaces.len(), 0);
            // A clean slate may move the producer's inputs and the reading node's (returns
            // started for it); not `x`, which that node reads too: it has no contents yet.
            let reader = graph
                .nodes()
                .get(self.node)
                .map_or(&[][..], |r| &r.inputs[..]);
            let movable: Vec<u32> = producer
                .inputs
                .iter()
                .chain(reader)
                .copied()
                .filter(|&t| t != x)
                .collect();
            self.take_batch(graph, first, count, &movable)?;
            self.mem[x as usize].overwritten();
            let launched = self.launch(graph, p as usize, producer, false);
            self.free_workspaces(p);
            launched
        })();
        self.protected.clear();
        result.map_err(context)?;
        self.counters.recomputes += 1;
        Ok(())
    }

    /// Names the owner of the pool's next allocations: `buf` of `graph` (snapshots show it).
    fn own(&mut self, graph: &Graph, buf: Buf) {
        let label = match (self.labels, buf) {
            (0, _) => 0,
            (base, Buf::Tensor(t)) => base.wrapping_add(t),
            (base, Buf::Group(g)) => base.wrapping_add(self.program.fused[g as usize].members[0]),
            (base, Buf::Workspace { node, .. }) => base
                .wrapping_add(graph.tensors().len() as u32)
                .wrapping_add(node),
        };
        self.pool.set_owner(label);
    }

    /// True when tensor `t` lives in the planned arena, in memory the host bound or in a fused
    /// group's block, not in a pool block of its own: the fallback never moves it.
    fn fixed_place(&self, graph: &Graph, t: u32) -> bool {
        (self.arena.is_some() && graph.tensors()[t as usize].kind == TensorKind::Intermediate)
            || self.mem[t as usize].is_bound()
            || graph.fused_slot(t).is_some()
    }

    /// An intermediate after its last use (or dropped): its device block and host slot go back.
    fn discard(&mut self, t: u32) {
        let m = &mut self.mem[t as usize];
        let (copied_in, copied_out) = (m.event(true), m.event(false));
        let (device, host) = m.discard();
        if device.is_some() {
            self.note_residency(t, false);
        }
        // (Only intermediates are discarded: in planned mode they live in the arena; a fused
        // member's block is its group's, returned by `free_group`.)
        let member = crate::graph::fused::fused_slot(&self.program.fused, t).is_some();
        if let (Some(ptr), None, false) = (device, self.arena, member) {
            self.free_block(Buf::Tensor(t), ptr);
        }
        if let Some(slot) = host {
            // The slot is free once the last copies through it are done: an event recorded on
            // the copy-out stream after it has waited for the last copy-in covers both.
            let freed = (|| -> Result<()> {
                let backing = PinnedBacking(self.device);
                if copied_in.is_none() && copied_out.is_none() {
                    return Ok(self.pinned.free(&backing, slot)?);
                }
                if let Some(ci) = copied_in {
                    self.copy_waits(Waiter::CopyOut, ci, true)?;
                }
                let event = self.event_of(t, false)?;
                self.device.record_event(event, self.streams.copy_out)?;
                self.order.recorded(event, CopyStream::Out);
                Ok(self.pinned.free_after_event(&backing, slot, event)?)
            })();
            if let Err(e) = freed {
                log::error!("returning a host slot to the pinned pool: {e}");
            }
        }
    }

    /// Returns a block to the pool. The pointer came from this pool; failure would be a bug in
    /// the step program, and leaking is the safe outcome.
    fn free_block(&mut self, buf: Buf, ptr: DevPtr) {
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.push(PoolCall::Free { buf });
        }
        let busy = match buf {
            Buf::Tensor(t) => self.comm_busy.get(t as usize).copied().flatten(),
            Buf::Workspace { .. } => None,
            // Any member's event: the collective touches them all.
            Buf::Group(g) => self.program.fused[g as usize]
                .members
                .iter()
                .find_map(|&t| self.comm_busy.get(t as usize).copied().flatten()),
        };
        let freed = match busy {
            Some(event) => self
                .pool
                .free_after_event(&DeviceBacking(self.device), ptr, event),
            None => self.pool.free(&DeviceBacking(self.device), ptr),
        };
        if let Err(e) = freed {
            log::error!("returning a transient buffer to the pool: {e}");
        }
    }

    /// Returns node `n`'s pool workspaces, in index order.
    fn free_workspaces(&mut self, n: u32) {
        if self.arena.is_none() {
            let workspaces = std::mem::take(&mut self.workspaces);
            for (i, &ptr) in workspaces.iter().enumerate() {
                if ptr != 0 {
                    self.free_block(
                        Buf::Workspace {
                            node: n,
                            index: i as u32,
                        },
                        ptr,
                    );
                }
            }
            self.workspaces = workspaces;
        }
        self.workspaces.clear();
    }

    /// Fused group `g`'s block goes back (if the run holds it); its members were discarded.
    fn free_group(&mut self, g: u32) {
        if let Some(ptr) = self.group_blocks[g as usize].take() {
            self.free_block(Buf::Group(g), ptr);
        }
    }

    /// After a failed run: wait for every stream (copies may still use blocks), then return
    /// every intermediate's memory.
    fn release_after_failure(&mut self, graph: &Graph) {
        let drain = |device: &dyn Device, streams: Streams| {
            for s in [
                streams.compute,
                streams.copy_in,
                streams.copy_out,
                streams.comm,
            ] {
                // The run's own error is what the caller reports; a later one is logged.
                if let Err(e) = device.stream_synchronize(s) {
                    log::warn!("while cleaning up after a failed run: {e}");
                }
            }
        };
        drain(self.device, self.streams);
        for m in self.mem.iter_mut() {
            m.land();
        }
        // A swapping graph starts every run from the host: go back there now too (nothing is
        // lost — a tensor the failed run changed is copied out).
        if self.program.swapping {
            for (t, tensor) in graph.tensors().iter().enumerate() {
                if tensor.kind.persists() && self.mem[t].state() == Residency::OnDevice {
                    if let Err(e) = self.swap_out(graph, t as u32) {
                        log::warn!("while cleaning up after a failed run: {e}");
                    }
                }
            }
            drain(self.device, self.streams);
        }
        for (t, tensor) in graph.tensors().iter().enumerate() {
            self.mem[t].land();
            if tensor.kind == TensorKind::Intermediate {
                self.discard(t as u32);
            }
        }
        for g in 0..self.group_blocks.len() as u32 {
            self.free_group(g);
        }
        for event in self.pool.pending_events() {
            self.pool.assume_complete(event);
        }
    }
}
