//! The executor: interprets a finalized graph's step program.
//!
//! Per node, in order: start the returns the swap plan scheduled here; rebuild the tensors the
//! plan recomputes here (their producer's inputs made resident, the producer queued again);
//! make the node's inputs resident (the compute stream waits on a copy-in event, never the
//! host); give its new outputs and workspaces memory; queue the kernel; return its workspaces
//! and the intermediates whose last use it was; start the swap-outs the plan scheduled after
//! it and drop the tensors it will recompute. Nothing here analyses
//! the graph: alloc/free lists, next uses and the swap plan were computed at finalize.
//!
//! Memory comes from the pool on the compute stream. Because everything that touches a block
//! from the compute stream runs in order, a block freed there right after its reader was queued
//! can be handed to the next writer at once. Copies run on their own streams, ordered by events:
//! a copy-out waits for a marker recorded on the compute stream after the tensor's last use, and
//! its block is freed pending the copy's event; a copy-in waits for a marker (the block's
//! previous users) and for the tensor's own copy-out, and the first reader waits for it.
//!
//! When an allocation fails — the plan did not foresee it (fragmentation, other graphs), or there
//! is no plan because the graph should have fit — the executor first takes back blocks pending on
//! copy-outs (making the compute stream wait for them), then evicts the resident tensor whose
//! next use is farthest away (Belady) and retries. A node that cannot fit even alone fails with
//! an out-of-memory error naming it and the sizes; nodes already queued never run again.
//!
//! Planned mode: transient buffers sit at fixed arena offsets and make no pool call.

mod copies;

use crate::device::{Buffer, DevPtr, Device, EventId, StreamId};
use crate::graph::liveness::NEVER;
use crate::graph::{Graph, Node, TensorKind};
use crate::kernels::{CallbackArgs, CallbackBuffer, HostCallback, Kernel};
use crate::memory::pool::{Pool, PoolError};
use crate::memory::residency::{Residency, TensorMemory};
use crate::memory::DeviceBacking;
use crate::plan::swap::SwapPlan;
use crate::runtime::error::{Error, Result};
use std::ffi::c_void;

/// Fixed places of every transient buffer (planned mode): `tensor_offsets[t]` for
/// intermediates, `workspace_offsets[node][i]` for workspaces, both relative to `base`.
pub struct FixedLayout<'a> {
    pub base: DevPtr,
    pub tensor_offsets: &'a [u64],
    pub workspace_offsets: &'a [Vec<u64>],
}

/// The streams of a runtime and the event used to mark progress on the compute stream.
#[derive(Clone, Copy, Debug)]
pub struct Streams {
    pub compute: StreamId,
    pub copy_in: StreamId,
    pub copy_out: StreamId,
    /// Re-recorded on the compute stream whenever a copy stream must wait for work queued so far.
    pub marker: EventId,
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
    /// Tensors rebuilt by running their producer again (planned rematerialisation).
    pub recomputes: u64,
    /// Timing-event pairs used around compute-stream waits on copies (see `stall_pairs`).
    pub stall_pairs_used: usize,
}

/// Timing events of one profiled run (the first run of a swapping graph): a pair around each
/// node's kernel on the compute stream and around each swap copy on its stream. Events are
/// created on first use and reused by later profiled runs.
#[derive(Default, Debug)]
pub struct RunProfile {
    pub nodes: Vec<(EventId, EventId)>,
    /// (start, end, bytes, host to device)
    pub copies: Vec<(EventId, EventId, u64, bool)>,
    spare_copy_events: Vec<(EventId, EventId)>,
}

impl RunProfile {
    /// Every event it holds, for destruction.
    pub fn events(&self) -> impl Iterator<Item = EventId> + '_ {
        self.nodes
            .iter()
            .copied()
            .chain(self.copies.iter().map(|&(a, b, _, _)| (a, b)))
            .chain(self.spare_copy_events.iter().copied())
            .flat_map(|(a, b)| [a, b])
    }

    fn reset(&mut self) {
        let used = self.copies.drain(..).map(|(a, b, _, _)| (a, b));
        self.spare_copy_events.extend(used);
    }

    fn node_pair(&mut self, device: &dyn Device, n: usize) -> Result<(EventId, EventId)> {
        while self.nodes.len() <= n {
            self.nodes
                .push((device.create_event()?, device.create_event()?));
        }
        Ok(self.nodes[n])
    }

    fn copy_pair(&mut self, device: &dyn Device) -> Result<(EventId, EventId)> {
        match self.spare_copy_events.pop() {
            Some(pair) => Ok(pair),
            None => Ok((device.create_event()?, device.create_event()?)),
        }
    }
}

pub struct Executor<'a> {
    device: &'a dyn Device,
    streams: Streams,
    pool: &'a mut Pool,
    pinned: &'a mut Pool,
    layout: Option<FixedLayout<'a>>,
    mem: &'a mut [TensorMemory],
    plan: Option<&'a SwapPlan>,
    /// Reusable (start, end) timing events recorded around each compute-stream wait on a copy.
    stall_pairs: &'a mut Vec<(EventId, EventId)>,
    profile: Option<&'a mut RunProfile>,
    pub counters: RunCounters,
    /// Planned returns that found no room yet; retried before each node.
    deferred: Vec<u32>,
    scratch_batch: Vec<(u64, u32, usize)>,
    scratch_taken: Vec<DevPtr>,
    workspaces: Vec<DevPtr>,
    buffers: Vec<Buffer>,
    /// Tensors of a recompute in progress: the fallback must not evict them.
    protected: Vec<u32>,
}

impl<'a> Executor<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: &'a dyn Device,
        streams: Streams,
        pool: &'a mut Pool,
        pinned: &'a mut Pool,
        layout: Option<FixedLayout<'a>>,
        mem: &'a mut [TensorMemory],
        plan: Option<&'a SwapPlan>,
        stall_pairs: &'a mut Vec<(EventId, EventId)>,
        mut profile: Option<&'a mut RunProfile>,
    ) -> Self {
        if let Some(p) = profile.as_deref_mut() {
            p.reset();
        }
        Executor {
            device,
            streams,
            pool,
            pinned,
            layout,
            mem,
            plan,
            stall_pairs,
            profile,
            counters: RunCounters::default(),
            deferred: Vec::new(),
            scratch_batch: Vec::new(),
            scratch_taken: Vec::new(),
            workspaces: Vec::new(),
            buffers: Vec::new(),
            protected: Vec::new(),
        }
    }

    /// Queues every node of `graph` (finalized). With a swap plan, the run ends with every
    /// persistent tensor on its way back to the host. On error every transient buffer is
    /// returned (after the streams have drained) and the error names the node at fault. The
    /// caller synchronises the streams afterwards; asynchronous failures surface there.
    pub fn run(&mut self, graph: &Graph) -> Result<()> {
        let mut result = self.enter_start_state(graph);
        if result.is_ok() {
            result = (0..graph.nodes().len()).try_for_each(|n| self.run_node(graph, n));
        }
        if let (Ok(()), Some(plan)) = (&result, self.plan) {
            // The returns for the next run, then everything else persistent goes to the host.
            let last = graph.nodes().len();
            let waiting: Vec<u32> = self
                .deferred
                .drain(..)
                .chain(plan.prefetch_before[last].iter().copied())
                .collect();
            for t in waiting {
                if let Err(e) = self.prefetch(graph, last, t) {
                    result = Err(e);
                    break;
                }
            }
            if result.is_ok() {
                result = self.return_persistent_to_host(graph, false);
            }
        }
        if result.is_err() {
            self.release_after_failure(graph);
        }
        result
    }

    fn run_node(&mut self, graph: &Graph, n: usize) -> Result<()> {
        let lv = graph.liveness().expect("executor runs finalized graphs");
        let node = &graph.nodes()[n];
        let at = |e: Error| e.context(format!("node {n} ({})", node.kernel.describe()));

        if let Some(plan) = self.plan {
            // Returns that found no room earlier go first (they are needed sooner).
            let mut waiting = std::mem::take(&mut self.deferred);
            waiting.extend_from_slice(&plan.prefetch_before[n]);
            for t in waiting {
                if !self.prefetch(graph, n, t).map_err(at)? {
                    self.deferred.push(t);
                }
            }
            for &x in &plan.recompute_before[n] {
                self.recompute(graph, n, x).map_err(at)?;
            }
        }
        for &t in &node.inputs {
            self.ensure_resident(graph, n, t).map_err(at)?;
        }
        for &t in &node.outputs {
            if self.mem[t as usize].state == Residency::CopyingToDevice {
                self.ensure_resident(graph, n, t).map_err(at)?;
            }
        }
        self.alloc_node_buffers(graph, n).map_err(at)?;
        for &t in &node.outputs {
            // The node overwrites it: any host copy is stale from now on.
            self.mem[t as usize].host_valid = false;
        }

        let launched = self.launch(graph, n, node, true).map_err(at);
        self.give_workspaces();
        launched?;
        self.counters.nodes += 1;

        for &t in &lv.frees[n] {
            self.discard(t);
        }
        if let Some(plan) = self.plan {
            for &t in &plan.swap_out_after[n] {
                if self.mem[t as usize].state == Residency::OnDevice {
                    self.swap_out(graph, t).map_err(at)?;
                }
            }
            for &t in &plan.drop_after[n] {
                // (A tensor the fallback sent to the host stays there and is read back.)
                if self.mem[t as usize].state == Residency::OnDevice {
                    self.discard(t);
                }
            }
        }
        Ok(())
    }

    /// Rebuilds intermediate `x`, dropped by the plan, before node `n` reads it: its producer
    /// (declared recomputable; its inputs unchanged since it ran, which the plan checked) is
    /// queued again with the same parameters. The fallback may evict around it, but not the
    /// tensors of this recompute.
    fn recompute(&mut self, graph: &Graph, n: usize, x: u32) -> Result<()> {
        if self.mem[x as usize].state != Residency::Unallocated {
            return Ok(()); // the fallback sent it to the host before the drop: read back instead
        }
        let tensor = &graph.tensors()[x as usize];
        let p = tensor.producer.expect("a planned recompute has a producer") as usize;
        let producer = &graph.nodes()[p];
        let context = |e: Error| {
            e.context(format!(
                "recomputing {} by running node {p} ({}) again",
                tensor.describe(x),
                producer.kernel.describe()
            ))
        };
        self.protected.clear();
        self.protected.extend(producer.inputs.iter().copied());
        self.protected.push(x);
        let result = (|| -> Result<()> {
            for &y in &producer.inputs {
                self.ensure_resident(graph, n, y)?;
            }
            // Its block and the producer's workspaces, as a node's own (largest first, one
            // more try on a clean slate when they do not fit).
            self.workspaces.clear();
            self.workspaces.resize(producer.workspaces.len(), 0);
            let mut batch = std::mem::take(&mut self.scratch_batch);
            let mut taken = std::mem::take(&mut self.scratch_taken);
            batch.clear();
            batch.push((tensor.size, x, 0));
            batch.extend(
                producer
                    .workspaces
                    .iter()
                    .enumerate()
                    .map(|(i, &w)| (w, u32::MAX, i)),
            );
            batch.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
            // A clean slate may move the producer's inputs and node n's (returns started for it).
            // (Not `x`, which node n reads too: it has no contents yet.)
            let movable: Vec<u32> = producer
                .inputs
                .iter()
                .chain(&graph.nodes()[n].inputs)
                .copied()
                .filter(|&t| t != x)
                .collect();
            let allocated = self.take_batch(graph, n, &batch, &mut taken, &movable);
            self.scratch_batch = batch;
            self.scratch_taken = taken;
            allocated?;
            self.mem[x as usize].host_valid = false;
            let launched = self.launch(graph, p, producer, false);
            self.give_workspaces();
            launched
        })();
        self.protected.clear();
        result.map_err(context)?;
        self.counters.recomputes += 1;
        Ok(())
    }

    /// Queues node `n`'s kernel on the compute stream (timed when the run is profiled and
    /// `timed`: a recompute is not the node's own measurement).
    fn launch(&mut self, graph: &Graph, n: usize, node: &Node, timed: bool) -> Result<()> {
        let tensors = graph.tensors();
        self.buffers.clear();
        for &t in node.inputs.iter().chain(&node.outputs) {
            let ptr = self.mem[t as usize].device.ok_or_else(|| {
                Error::Internal(format!(
                    "{} is not on the device when its node runs",
                    tensors[t as usize].describe(t)
                ))
            })?;
            self.buffers.push(Buffer {
                ptr,
                bytes: tensors[t as usize].size,
            });
        }
        for (&ptr, &bytes) in self.workspaces.iter().zip(&node.workspaces) {
            self.buffers.push(Buffer { ptr, bytes });
        }
        let n_in = node.inputs.len();
        let n_out = node.outputs.len();
        let stream = self.streams.compute;
        let timing = match self.profile.as_deref_mut() {
            Some(p) if timed => Some(p.node_pair(self.device, n)?),
            _ => None,
        };
        if let Some((start, _)) = timing {
            self.device.record_event(start, stream)?;
        }
        match &node.kernel {
            Kernel::Builtin(_) => {
                let op = node.builtin.expect("validated at add_kernel");
                self.device.launch_builtin(
                    op,
                    &self.buffers[..n_in],
                    &self.buffers[n_in..n_in + n_out],
                    stream,
                )?;
            }
            Kernel::Device { function, .. } => {
                self.device
                    .launch(*function, &node.dims, &self.buffers, &node.params, stream)?;
            }
            Kernel::Callback(cb) => {
                let work = callback_work(*cb, n as u32, &self.buffers, n_in, n_out, &node.params);
                self.device
                    .enqueue_host_work(stream, work)
                    .map_err(|e| Error::CallbackFailed(e.to_string()))?;
            }
        }
        if let Some((_, end)) = timing {
            self.device.record_event(end, stream)?;
        }
        Ok(())
    }

    /// Memory for node `n`'s new outputs and its workspaces, largest first (so small blocks do
    /// not split the space a large one needs). If that fails with nothing left to evict, the
    /// node's own blocks are returned, cached segments released, and the batch tried once more
    /// on a clean slate before the node is declared too large.
    fn alloc_node_buffers(&mut self, graph: &Graph, n: usize) -> Result<()> {
        let node = &graph.nodes()[n];
        let tensors = graph.tensors();
        self.workspaces.clear();
        self.workspaces.resize(node.workspaces.len(), 0);
        // (bytes, output tensor or u32::MAX, workspace index); scratch vectors are reused so the
        // per-node path allocates nothing on the host.
        let mut batch = std::mem::take(&mut self.scratch_batch);
        let mut taken = std::mem::take(&mut self.scratch_taken);
        batch.clear();
        for &t in &node.outputs {
            let m = &mut self.mem[t as usize];
            if m.on_device() {
                continue;
            }
            match (&self.layout, tensors[t as usize].kind) {
                (Some(layout), TensorKind::Intermediate) => {
                    m.device = Some(layout.base + layout.tensor_offsets[t as usize]);
                    m.state = Residency::OnDevice;
                }
                _ => batch.push((tensors[t as usize].size, t, 0)),
            }
        }
        for (i, &w) in node.workspaces.iter().enumerate() {
            match &self.layout {
                Some(layout) => self.workspaces[i] = layout.base + layout.workspace_offsets[n][i],
                None => batch.push((w, u32::MAX, i)),
            }
        }
        batch.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
        let mut result = self.take_batch(graph, n, &batch, &mut taken, &node.inputs);
        if matches!(result, Err(Error::OutOfMemory(_))) {
            // An output the node overwrites but does not read, still on the device from an
            // earlier run, may sit where the rest needs room: send it out (its contents kept
            // on the host should the node fail after all) and take it fresh with the rest.
            let stale: Vec<u32> = node
                .outputs
                .iter()
                .copied()
                .filter(|t| {
                    !node.inputs.contains(t)
                        && self.mem[*t as usize].state == Residency::OnDevice
                        && (self.layout.is_none() || tensors[*t as usize].kind.persists())
                })
                .collect();
            if !stale.is_empty() {
                for &t in &stale {
                    if let Err(e) = self.swap_out(graph, t) {
                        result = Err(e);
                    }
                }
                if result
                    .as_ref()
                    .is_err_and(|e| matches!(e, Error::OutOfMemory(_)))
                {
                    batch.extend(stale.iter().map(|&t| (tensors[t as usize].size, t, 0)));
                    batch.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
                    self.workspaces.resize(node.workspaces.len(), 0); // cleared by the failure
                    result = self.take_batch(graph, n, &batch, &mut taken, &node.inputs);
                }
            }
        }
        self.scratch_batch = batch;
        self.scratch_taken = taken;
        result
    }

    /// Takes the blocks of `batch` (bytes, output tensor or `u32::MAX`, workspace index) for
    /// work queued before node `n` that reads `inputs`; see `alloc_node_buffers`.
    fn take_batch(
        &mut self,
        graph: &Graph,
        n: usize,
        batch: &[(u64, u32, usize)],
        taken: &mut Vec<DevPtr>,
        inputs: &[u32],
    ) -> Result<()> {
        let tensors = graph.tensors();
        let mut last_error = None;
        for attempt in 0..2 {
            taken.clear();
            let mut failed = None;
            for &(bytes, t, i) in batch {
                match self.alloc(graph, n, bytes) {
                    Ok(ptr) => taken.push(ptr),
                    Err(e) => {
                        let what = if t == u32::MAX {
                            format!("workspace {i} of {bytes} bytes")
                        } else {
                            format!("its output {}", tensors[t as usize].describe(t))
                        };
                        failed = Some(e.context(format!("allocating {what}")));
                        break;
                    }
                }
            }
            match failed {
                None => {
                    for (&(_, t, i), &ptr) in batch.iter().zip(taken.iter()) {
                        if t == u32::MAX {
                            self.workspaces[i] = ptr;
                        } else {
                            let m = &mut self.mem[t as usize];
                            m.device = Some(ptr);
                            m.state = Residency::OnDevice;
                        }
                    }
                    return Ok(());
                }
                Some(e) => {
                    for &ptr in taken.iter() {
                        self.give(ptr);
                    }
                    let out_of_memory = matches!(e, Error::OutOfMemory(_));
                    last_error = Some(e);
                    if !out_of_memory || attempt == 1 {
                        break;
                    }
                    self.repack_inputs(graph, n, inputs)?;
                }
            }
        }
        self.workspaces.clear();
        Err(last_error.expect("a failed attempt left its error"))
    }

    /// Last resort before declaring node `n` too large: the resident `inputs` of what is being
    /// queued may sit in segments whose free space is too fragmented for the rest. Send them
    /// out, take back every block pending on a copy, release every free segment, and bring the
    /// inputs back largest first.
    fn repack_inputs(&mut self, graph: &Graph, n: usize, inputs: &[u32]) -> Result<()> {
        let mut inputs: Vec<u32> = inputs.to_vec();
        inputs.sort_unstable();
        inputs.dedup();
        let in_pool = |t: u32| self.layout.is_none() || graph.tensors()[t as usize].kind.persists();
        let movable: Vec<u32> = inputs.into_iter().filter(|&t| in_pool(t)).collect();
        for &t in &movable {
            if self.mem[t as usize].state == Residency::OnDevice {
                self.swap_out(graph, t)?;
            }
        }
        self.take_back_all_pending()?;
        self.pool.release_cached(&DeviceBacking(self.device))?;
        let mut by_size = movable;
        by_size.sort_unstable_by_key(|&t| std::cmp::Reverse(graph.tensors()[t as usize].size));
        for t in by_size {
            self.ensure_resident(graph, n, t)?;
        }
        Ok(())
    }

    /// Device memory (for the compute stream) from the pool; on failure takes one block pending
    /// on a copy-out (the compute stream waits for that copy alone), else all of them, then
    /// evicts the resident tensor used farthest in the future, and retries.
    fn alloc(&mut self, graph: &Graph, n: usize, bytes: u64) -> Result<DevPtr> {
        loop {
            self.counters.pool_allocs += 1;
            match self
                .pool
                .alloc(&DeviceBacking(self.device), bytes, self.streams.compute)
            {
                Ok(ptr) => return Ok(ptr),
                Err(PoolError::OutOfMemory { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if let Some((ptr, event)) = self.pool.take_pending(bytes, self.streams.compute) {
                self.compute_waits(event)?;
                return Ok(ptr);
            }
            if self.take_back_all_pending()? {
                continue;
            }
            match self.pick_victim(graph, n) {
                Some(victim) => {
                    self.counters.evictions += 1;
                    if self.mem[victim as usize].state == Residency::CopyingToDevice {
                        let event = self.mem[victim as usize]
                            .copy_in
                            .expect("a tensor copying in has an event");
                        self.compute_waits(event)?;
                        self.mem[victim as usize].state = Residency::OnDevice;
                    }
                    self.swap_out(graph, victim)?;
                }
                None => {
                    let need: u64 = crate::plan::swap::node_tensors(&graph.nodes()[n])
                        .iter()
                        .map(|&t| graph.tensors()[t as usize].size)
                        .sum::<u64>()
                        + graph.nodes()[n].workspaces.iter().sum::<u64>();
                    let s = self.pool.stats();
                    return Err(Error::OutOfMemory(format!(
                        "out of device memory: {bytes} bytes requested; the node's inputs, outputs and workspaces \
                         total {need} bytes, the memory limit is {} bytes, {} bytes are allocated and {} reserved, \
                         and nothing is left to evict",
                        self.pool.memory_limit(),
                        s.allocated_bytes,
                        s.reserved_bytes
                    )));
                }
            }
        }
    }

    /// The resident tensor (pool memory, not used by node `n`, not in flight) whose next use is
    /// farthest away. A scan over the tensors: this is the fallback path, taken only when the
    /// plan did not foresee an allocation failure.
    fn pick_victim(&self, graph: &Graph, n: usize) -> Option<u32> {
        let lv = graph.liveness().expect("finalized");
        let node = &graph.nodes()[n];
        let mut best: Option<(u32, u32)> = None;
        for (t, m) in self.mem.iter().enumerate() {
            let t32 = t as u32;
            let in_arena = self.layout.is_some() && !graph.tensors()[t].kind.persists();
            // A tensor still copying in may go too: it is cheap to drop (its host copy is
            // current) once the compute stream has waited for the copy.
            let movable = matches!(m.state, Residency::OnDevice | Residency::CopyingToDevice);
            if !movable
                || in_arena
                || node.inputs.contains(&t32)
                || node.outputs.contains(&t32)
                || self.protected.contains(&t32)
            {
                continue;
            }
            let next = lv.next_use_after(t32, n as u32);
            if best.is_none_or(|(b, _)| next > b) {
                best = Some((next, t32));
            }
            if next == NEVER {
                break;
            }
        }
        best.map(|(_, t)| t)
    }

    /// A swap plan starts from its `keep` on the device, less `leave_at_start`, and every other
    /// persistent tensor on the host: one left on the device otherwise (the plan was just
    /// changed) is sent home (a copy only when the host copy is stale). The caller
    /// synchronises the copy stream.
    pub fn enter_start_state(&mut self, graph: &Graph) -> Result<()> {
        let Some(plan) = self.plan else {
            return Ok(());
        };
        let not_kept = (0..graph.tensors().len() as u32).filter(|&t| {
            graph.tensors()[t as usize].kind.persists() && plan.keep.binary_search(&t).is_err()
        });
        for t in not_kept.chain(plan.leave_at_start.iter().copied()) {
            if self.mem[t as usize].state == Residency::OnDevice {
                self.swap_out(graph, t)?;
            }
        }
        Ok(())
    }

    /// After a run with a swap plan: persistent tensors other than the plan's `keep` (all of
    /// them after a failure: a clean slate that gives the memory back) go back to the host (a
    /// copy only when the host copy is stale), so every run starts from the same state.
    fn return_persistent_to_host(&mut self, graph: &Graph, including_kept: bool) -> Result<()> {
        let keep: &[u32] = match self.plan {
            Some(p) if !including_kept => &p.keep,
            _ => &[],
        };
        for (t, tensor) in graph.tensors().iter().enumerate() {
            if tensor.kind.persists()
                && self.mem[t].state == Residency::OnDevice
                && keep.binary_search(&(t as u32)).is_err()
            {
                self.swap_out(graph, t as u32)?;
            }
        }
        Ok(())
    }

    /// An intermediate after its last use: its device block and host slot go back.
    fn discard(&mut self, t: u32) {
        let m = &mut self.mem[t as usize];
        let device = m.device.take();
        let host = m.host.take();
        let (copied_in, copied_out) = (m.copy_in, m.copy_out);
        m.state = Residency::Unallocated;
        m.host_valid = false;
        if let (Some(ptr), None) = (device, &self.layout) {
            self.give(ptr);
        }
        if let Some(slot) = host {
            // The slot is free once the last copies through it are done: an event recorded on
            // the copy-out stream after it has waited for the last copy-in covers both.
            let freed = (|| -> Result<()> {
                let backing = crate::memory::PinnedBacking(self.device);
                if copied_in.is_none() && copied_out.is_none() {
                    return Ok(self.pinned.free(&backing, slot)?);
                }
                if let Some(ci) = copied_in {
                    self.device.stream_wait_event(self.streams.copy_out, ci)?;
                }
                let event = self.event_of(t, false)?;
                self.device.record_event(event, self.streams.copy_out)?;
                Ok(self.pinned.free_after_event(
                    &crate::memory::PinnedBacking(self.device),
                    slot,
                    event,
                )?)
            })();
            if let Err(e) = freed {
                log::error!("returning a host slot to the pinned pool: {e}");
            }
        }
    }

    fn give(&mut self, ptr: DevPtr) {
        // The pointer came from this pool; failure would be a bug in the step program, and
        // leaking is the safe outcome.
        if let Err(e) = self.pool.free(&DeviceBacking(self.device), ptr) {
            log::error!("returning a transient buffer to the pool: {e}");
        }
    }

    fn give_workspaces(&mut self) {
        if self.layout.is_none() {
            let workspaces = std::mem::take(&mut self.workspaces);
            for &ptr in &workspaces {
                self.give(ptr);
            }
            self.workspaces = workspaces;
        }
        self.workspaces.clear();
    }

    /// After a failed run: wait for every stream (copies may still use blocks), then return
    /// every intermediate's memory.
    fn release_after_failure(&mut self, graph: &Graph) {
        let drain = |device: &dyn Device, streams: Streams| {
            for s in [streams.compute, streams.copy_in, streams.copy_out] {
                // The run's own error is what the caller reports; a later one is logged.
                if let Err(e) = device.stream_synchronize(s) {
                    log::warn!("while cleaning up after a failed run: {e}");
                }
            }
        };
        drain(self.device, self.streams);
        for m in self.mem.iter_mut() {
            if m.state == Residency::CopyingToDevice {
                m.state = Residency::OnDevice;
            }
        }
        // A swapping graph starts every run from the host: go back there now too (nothing is
        // lost — a tensor the failed run changed is copied out).
        if self.plan.is_some() {
            if let Err(e) = self.return_persistent_to_host(graph, true) {
                log::warn!("while cleaning up after a failed run: {e}");
            }
            drain(self.device, self.streams);
        }
        for (t, tensor) in graph.tensors().iter().enumerate() {
            let m = &mut self.mem[t];
            match m.state {
                Residency::CopyingToDevice => m.state = Residency::OnDevice,
                Residency::CopyingToHost => m.state = Residency::OnHost,
                _ => {}
            }
            if tensor.kind == TensorKind::Intermediate {
                self.discard(t as u32);
            }
        }
        for event in self.pool.pending_events() {
            self.pool.assume_complete(event);
        }
    }
}

/// Packages a host-callback node as device host-work: the buffers are copied into the closure
/// so it owns everything it touches when the host backend runs it later on the stream worker.
fn callback_work(
    cb: HostCallback,
    node: u32,
    buffers: &[Buffer],
    n_in: usize,
    n_out: usize,
    params: &[u8],
) -> crate::device::HostWork {
    let bufs: Vec<CallbackBuffer> = buffers
        .iter()
        .map(|b| CallbackBuffer {
            ptr: b.ptr as *mut c_void,
            size: b.bytes as usize,
        })
        .collect();
    let params = params.to_vec();
    let bufs = SendBuffers(bufs);
    Box::new(move |stream| {
        let bufs = bufs;
        let b = &bufs.0;
        let args = CallbackArgs {
            inputs: b.as_ptr(),
            num_inputs: n_in,
            outputs: b[n_in..].as_ptr(),
            num_outputs: n_out,
            workspaces: b[n_in + n_out..].as_ptr(),
            num_workspaces: b.len() - n_in - n_out,
            params: if params.is_empty() {
                std::ptr::null()
            } else {
                params.as_ptr() as *const c_void
            },
            params_size: params.len(),
            stream,
            node,
        };
        // SAFETY: the function pointer and user data were given by the host for this purpose;
        // `args` and everything it points to live until the call returns.
        let status = unsafe { crate::kernels::call_callback(cb, &args) };
        if status == 0 {
            Ok(())
        } else {
            Err(format!(
                "node {node} (host callback) reported failure {status}"
            ))
        }
    })
}

struct SendBuffers(Vec<CallbackBuffer>);
// SAFETY: the pointers are device addresses the callback is entitled to use on its stream.
unsafe impl Send for SendBuffers {}
