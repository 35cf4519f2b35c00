//! Device memory for a node's batch of new buffers, and the fallback when the pool has no room:
//! blocks pending on copy-outs taken back, the farthest-used tensor evicted (Belady), and as a
//! last resort the node's own inputs repacked on a clean slate.

use super::Executor;
use crate::device::DevPtr;
use crate::error::{Error, Result};
use crate::graph::liveness::NEVER;
use crate::graph::Graph;
use crate::memory::pool::{Lane, PoolError};
use crate::memory::residency::Residency;
use crate::memory::DeviceBacking;
use crate::plan::program::{Buf, PoolCall};

impl Executor<'_> {
    /// Memory for node `n`'s batch (`Alloc` step): arena entries are placed, pool entries taken
    /// largest first. If that fails with nothing left to evict, the node's own blocks are
    /// returned, cached segments released, and the batch tried once more on a clean slate
    /// before the node is declared too large.
    pub(super) fn alloc_node_buffers(
        &mut self,
        graph: &Graph,
        n: u32,
        first: u32,
        count: u32,
    ) -> Result<()> {
        let node = &graph.nodes()[n as usize];
        self.workspaces.clear();
        self.workspaces.resize(node.workspaces.len(), 0);
        let mut result = self.take_batch(graph, first, count, &node.inputs);
        if matches!(result, Err(Error::OutOfMemory(_))) {
            // An output the node overwrites but does not read, still on the device from an
            // earlier run, may sit where the rest needs room: send it out (its contents kept
            // on the host should the node fail after all) and take it fresh with the rest.
            let stale: Vec<u32> = node
                .outputs
                .iter()
                .copied()
                .filter(|&t| {
                    !node.inputs.contains(&t)
                        && self.mem[t as usize].state() == Residency::OnDevice
                        && !self.fixed_place(graph, t)
                })
                .collect();
            if !stale.is_empty() {
                self.counters.fallbacks += 1;
                for &t in &stale {
                    self.counters.evictions += 1;
                    self.note_eviction(t);
                    if let Err(e) = self.swap_out(graph, t) {
                        result = Err(e);
                    }
                }
                if result
                    .as_ref()
                    .is_err_and(|e| matches!(e, Error::OutOfMemory(_)))
                {
                    self.workspaces.resize(node.workspaces.len(), 0); // cleared by the failure
                    result = self.take_batch(graph, first, count, &node.inputs);
                }
            }
        }
        result
    }

    /// Takes the program's batch `first..first + count` for the node being queued, which reads
    /// `inputs`: arena entries at their offsets, outputs already on the device skipped, the
    /// rest from the pool in the batch's order. See `alloc_node_buffers`.
    pub(super) fn take_batch(
        &mut self,
        graph: &Graph,
        first: u32,
        count: u32,
        inputs: &[u32],
    ) -> Result<()> {
        let program = self.program;
        let batch = program.batch(first, count);
        let tensors = graph.tensors();
        let mut taken = std::mem::take(&mut self.scratch_taken);
        let mut last_error = None;
        for attempt in 0..2 {
            taken.clear();
            let mut failed = None;
            for e in batch {
                let skip = match e.buf {
                    Buf::Tensor(t) => e.arena.is_some() || self.mem[t as usize].on_device(),
                    Buf::Workspace { .. } => e.arena.is_some(),
                    Buf::Group(g) => self.group_blocks[g as usize].is_some(),
                };
                if skip {
                    taken.push(0);
                    continue;
                }
                if let Some(trace) = self.trace.as_deref_mut() {
                    trace.push(PoolCall::Alloc {
                        buf: e.buf,
                        bytes: e.bytes,
                    });
                }
                self.own(graph, e.buf);
                match self.alloc_at(graph, e.buf, e.bytes, self.step_at) {
                    Ok(ptr) => taken.push(ptr),
                    Err(err) => {
                        let what = match e.buf {
                            Buf::Workspace { index, .. } => {
                                format!("workspace {index} of {} bytes", e.bytes)
                            }
                            Buf::Tensor(t) => {
                                format!("its output {}", tensors[t as usize].describe(t))
                            }
                            Buf::Group(g) => format!(
                                "the fused block of {} bytes for node {}'s tensors",
                                e.bytes, program.fused[g as usize].node
                            ),
                        };
                        failed = Some(err.context(format!("allocating {what}")));
                        break;
                    }
                }
            }
            match failed {
                None => {
                    let base = self.arena.unwrap_or(0);
                    for (e, &ptr) in batch.iter().zip(taken.iter()) {
                        let ptr = match e.arena {
                            Some(offset) => base + offset,
                            None if ptr == 0 => continue, // already on the device
                            None => ptr,
                        };
                        match e.buf {
                            Buf::Workspace { index, .. } => self.workspaces[index as usize] = ptr,
                            Buf::Tensor(t) => {
                                self.mem[t as usize].placed(ptr);
                                self.note_residency(t, true);
                            }
                            Buf::Group(g) => {
                                // Every member has its slot from now on; its producer writes
                                // straight into it.
                                let group = &program.fused[g as usize];
                                for (&m, &offset) in group.members.iter().zip(&group.offsets) {
                                    self.mem[m as usize].placed(ptr + offset);
                                    self.note_residency(m, true);
                                }
                                self.group_blocks[g as usize] = Some(ptr);
                            }
                        }
                    }
                    self.scratch_taken = taken;
                    return Ok(());
                }
                Some(err) => {
                    for (e, &ptr) in batch.iter().zip(taken.iter()) {
                        if ptr != 0 && e.arena.is_none() {
                            self.free_block(e.buf, ptr);
                        }
                    }
                    let out_of_memory = matches!(err, Error::OutOfMemory(_));
                    last_error = Some(err);
                    if !out_of_memory || attempt == 1 {
                        break;
                    }
                    self.counters.fallbacks += 1;
                    if let Err(e) = self.repack_inputs(graph, inputs) {
                        self.scratch_taken = taken;
                        return Err(e);
                    }
                }
            }
        }
        self.scratch_taken = taken;
        self.workspaces.clear();
        Err(last_error.expect("a failed attempt left its error"))
    }

    /// Last resort before declaring the node too large: the resident `inputs` of what is being
    /// queued may sit in segments whose free space is too fragmented for the rest. Send them
    /// out, take back every block pending on a copy, release every free segment, and bring the
    /// inputs back largest first.
    fn repack_inputs(&mut self, graph: &Graph, inputs: &[u32]) -> Result<()> {
        let mut inputs: Vec<u32> = inputs.to_vec();
        inputs.sort_unstable();
        inputs.dedup();
        let movable: Vec<u32> = inputs
            .into_iter()
            .filter(|&t| !self.fixed_place(graph, t))
            .collect();
        for &t in &movable {
            if self.mem[t as usize].state() == Residency::OnDevice {
                self.counters.evictions += 1;
                self.note_eviction(t);
                self.swap_out(graph, t)?;
            }
        }
        self.take_back_all_pending()?;
        self.pool.release_cached(&DeviceBacking(self.device))?;
        let mut by_size = movable;
        by_size.sort_unstable_by_key(|&t| std::cmp::Reverse(graph.tensors()[t as usize].size));
        for t in by_size {
            self.ensure_resident(graph, t)?;
        }
        Ok(())
    }

    /// The pool lane of `buf`'s block. A persistent tensor of a graph that does not swap stays on
    /// the device from one run to the next: it goes in the compute stream's lasting lane, so the
    /// working lane's range empties at each run's end and the next run follows the epoch plan of
    /// the last (`memory::pool` `epochs.rs`). A swapping graph's persistent tensors come and go
    /// as its plan says, in the one lane its dry runs model.
    pub(super) fn lane_of(&self, graph: &Graph, buf: Buf) -> Lane {
        match buf {
            Buf::Tensor(t)
                if !self.program.swapping && graph.tensors()[t as usize].kind.persists() =>
            {
                Lane::Lasting
            }
            _ => Lane::Working,
        }
    }

    /// A block for the compute stream from the pool, in `lane`: `Pool::alloc_in` when it may
    /// wait for the device to move pages, else `Pool::alloc_no_wait_in`.
    pub(super) fn pool_alloc(
        &mut self,
        bytes: u64,
        may_wait: bool,
        lane: Lane,
    ) -> std::result::Result<DevPtr, PoolError> {
        let (backing, stream) = (DeviceBacking(self.device), self.streams.compute);
        if may_wait {
            self.pool.alloc_in(&backing, bytes, stream, lane)
        } else {
            self.pool.alloc_no_wait_in(&backing, bytes, stream, lane)
        }
    }

    /// The range the pool's dry run placed `buf`'s allocation of step `step` in, when the run
    /// follows placements and the range is free or pending on copies (`Pool::take_at`): the
    /// caller makes the stream that will use the block wait for `placed_events`. `None`: no
    /// placement, or it is taken (counted in `misplaced`); allocate as the pool chooses.
    pub(super) fn take_placed(&mut self, buf: Buf, bytes: u64, step: usize) -> Option<DevPtr> {
        let at = self.placements?.get(step, buf)?;
        self.poll_copies();
        self.placed_events.clear();
        let backing = DeviceBacking(self.device);
        let stream = self.streams.compute;
        match self
            .pool
            .take_at(&backing, at, bytes, stream, &mut self.placed_events)
        {
            Some(ptr) => {
                self.counters.placed += 1;
                self.counters.pool_allocs += 1;
                Some(ptr)
            }
            None => {
                self.counters.misplaced += 1;
                None
            }
        }
    }

    /// Device memory for `buf` (for the compute stream) at step `step`: its dry-run placement
    /// (`take_placed`; the compute stream waits for the copies it takes the range of), else
    /// `alloc`.
    pub(super) fn alloc_at(
        &mut self,
        graph: &Graph,
        buf: Buf,
        bytes: u64,
        step: usize,
    ) -> Result<DevPtr> {
        let Some(ptr) = self.take_placed(buf, bytes, step) else {
            let lane = self.lane_of(graph, buf);
            return self.alloc(graph, bytes, lane);
        };
        for i in 0..self.placed_events.len() {
            if let Err(e) = self.compute_waits(self.placed_events[i]) {
                if let Err(back) = self.pool.free(&DeviceBacking(self.device), ptr) {
                    log::error!("returning a transient buffer to the pool: {back}");
                }
                return Err(e);
            }
        }
        Ok(ptr)
    }

    /// Device memory (for the compute stream, in `lane`): first, in the working lane and where
    /// the pool's config allows, a block pending on a copy-out that fits more closely than any
    /// free one (`Pool::take_pending_if_closer`: the placement of the pool's dry run, which the
    /// swap plan was fitted with and which frees such blocks at once; the compute stream waits
    /// for that copy); else from the pool, without the pool waiting for the
    /// device (`Pool::alloc_no_wait_in`); on failure takes one block pending on a copy-out, else
    /// all of them; only then lets the pool wait for the device to move pages, then evicts the
    /// resident tensor used farthest in the future, and retries.
    pub(super) fn alloc(&mut self, graph: &Graph, bytes: u64, lane: Lane) -> Result<DevPtr> {
        self.poll_copies();
        let backing = DeviceBacking(self.device);
        let closer = match lane {
            Lane::Working => {
                self.pool
                    .take_pending_if_closer(&backing, bytes, self.streams.compute)
            }
            Lane::Lasting => None,
        };
        if let Some((ptr, event)) = closer {
            self.counters.pool_allocs += 1;
            self.compute_waits(event)?;
            return Ok(ptr);
        }
        let mut may_wait = false;
        loop {
            self.counters.pool_allocs += 1;
            match self.pool_alloc(bytes, may_wait, lane) {
                Ok(ptr) => return Ok(ptr),
                Err(PoolError::OutOfMemory { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if let Some((ptr, event)) = self.pool.take_pending_in(bytes, self.streams.compute, lane)
            {
                self.compute_waits(event)?;
                return Ok(ptr);
            }
            if self.take_back_all_pending()? {
                continue;
            }
            if !std::mem::replace(&mut may_wait, true) {
                continue;
            }
            match self.pick_victim(graph) {
                Some(victim) => {
                    self.counters.evictions += 1;
                    self.note_eviction(victim);
                    self.counters.fallbacks += 1;
                    if self.mem[victim as usize].state() == Residency::CopyingToDevice {
                        let event = self.mem[victim as usize]
                            .event(true)
                            .expect("a tensor copying in has an event");
                        self.compute_waits(event)?;
                        self.mem[victim as usize].copied_in();
                    }
                    self.swap_out(graph, victim)?;
                }
                None => {
                    let need = graph
                        .nodes()
                        .get(self.node)
                        .map(|node| {
                            crate::plan::swap::node_tensors(node)
                                .iter()
                                .map(|&t| graph.tensors()[t as usize].size)
                                .sum::<u64>()
                                + node.workspaces.iter().sum::<u64>()
                        })
                        .unwrap_or(bytes);
                    let s = self.pool.stats();
                    return Err(Error::OutOfMemory(format!(
                        "out of device memory: {bytes} bytes requested; the node's inputs, outputs and workspaces \
                         total {need} bytes, the memory limit is {} bytes, {} bytes are allocated and {} reserved, \
                         the largest free block is {} bytes, and nothing is left to evict; the largest \
                         tensors on the device: {}",
                        self.pool.memory_limit(),
                        s.allocated_bytes,
                        s.reserved_bytes,
                        self.pool.largest_free_block(),
                        self.largest_resident(graph, 5)
                    )));
                }
            }
        }
    }

    /// The `n` largest tensors with device memory, named, for an out-of-memory message.
    fn largest_resident(&self, graph: &Graph, n: usize) -> String {
        let tensors = graph.tensors();
        let mut on_device: Vec<u32> = (0..self.mem.len() as u32)
            .filter(|&t| self.mem[t as usize].device().is_some())
            .collect();
        on_device.sort_unstable_by_key(|&t| std::cmp::Reverse(tensors[t as usize].size));
        if on_device.is_empty() {
            return "none".into();
        }
        on_device
            .iter()
            .take(n)
            .map(|&t| tensors[t as usize].describe(t))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The resident tensor (pool memory, not used by the node being queued, not in flight)
    /// whose next use is farthest away. A scan over the tensors: this is the fallback path,
    /// taken only when the plan did not foresee an allocation failure.
    fn pick_victim(&self, graph: &Graph) -> Option<u32> {
        let lv = graph.liveness().expect("finalized");
        let n = self.node;
        let node = graph.nodes().get(n);
        let mut best: Option<(u32, u32)> = None;
        for (t, m) in self.mem.iter().enumerate() {
            let t32 = t as u32;
            // A tensor still copying in may go too: it is cheap to drop (its host copy is
            // current) once the compute stream has waited for the copy.
            let movable = matches!(m.state(), Residency::OnDevice | Residency::CopyingToDevice);
            let own =
                node.is_some_and(|node| node.inputs.contains(&t32) || node.outputs.contains(&t32));
            if !movable || self.fixed_place(graph, t32) || own || self.protected.contains(&t32) {
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
}
