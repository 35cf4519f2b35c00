//! Swap copies: moving a tensor between its device block and its pinned host slot, ordered by
//! events only (no host waits, no whole-device synchronisation).

use super::stream_order::{CopyStream, Waiter};
use super::{Anchor, Executor};
use crate::device::{EventId, StreamId};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::memory::history::Action;
use crate::memory::pool::Lane;
use crate::memory::residency::Residency;
use crate::memory::{DeviceBacking, PinnedBacking};
use crate::plan::program::{Buf, PoolCall};

impl Executor<'_> {
    /// Makes tensor `t` readable on the compute stream by the node being queued.
    pub(super) fn ensure_resident(&mut self, graph: &Graph, t: u32) -> Result<()> {
        match self.mem[t as usize].state() {
            Residency::OnDevice => return Ok(()),
            Residency::CopyingToDevice => {}
            Residency::OnHost | Residency::CopyingToHost => {
                self.swap_in(graph, t, true, self.step_at).map(|_| ())?
            }
            Residency::Unallocated => {
                return Err(Error::InvalidState(format!(
                    "{} has no contents when node {} reads it",
                    graph.tensors()[t as usize].describe(t),
                    self.node
                )))
            }
        }
        let event = self.mem[t as usize]
            .event(true)
            .expect("a tensor copying in has an event");
        self.compute_waits(event)?;
        self.mem[t as usize].copied_in();
        Ok(())
    }

    /// Sends every persistent tensor on the device home (copied when the device's copy is
    /// newer), so that the graph holds no block of the pool: a swapping graph's tuning then fits
    /// its candidates to an empty pool. The caller synchronises the copy-out stream.
    pub fn send_all_home(&mut self, graph: &Graph) -> Result<()> {
        for t in 0..self.mem.len() as u32 {
            let m = &self.mem[t as usize];
            let persists = graph.tensors()[t as usize].kind.persists();
            if persists && m.state() == Residency::OnDevice && !m.is_bound() {
                self.swap_out(graph, t)?;
            }
        }
        self.close_waits()
    }

    /// Brings the plan's kept tensors that are on the host to the device in the plan's order,
    /// the order in which the pool's dry run allocates its canonical start (`PoolWalk`): after
    /// `send_all_home`, the runs then start from the blocks the fit's dry run started from.
    pub fn bring_kept(&mut self, graph: &Graph) -> Result<()> {
        for &t in &self.program.keep {
            if matches!(
                self.mem[t as usize].state(),
                Residency::OnHost | Residency::CopyingToHost
            ) {
                self.ensure_resident(graph, t)?;
            }
        }
        self.close_waits()
    }

    /// Starts bringing `t` back as the plan says at step `from`, if memory allows without
    /// evicting anything. Returns false when it does not (yet): the caller tries again before
    /// the next node, and the read at the node that needs it brings it in at the latest.
    pub(super) fn prefetch(&mut self, graph: &Graph, t: u32, from: usize) -> Result<bool> {
        if matches!(
            self.mem[t as usize].state(),
            Residency::OnHost | Residency::CopyingToHost
        ) {
            return self.swap_in(graph, t, false, from);
        }
        Ok(true)
    }

    /// A block in `lane` without evicting, for a copy in: the free pool (without the pool
    /// waiting for the device), else one block whose copy-out is queued (returned with the
    /// copy's event, which the copy-in stream then waits for: compute does not stall), else all
    /// such blocks (the compute stream waits for them: the memory the plan counted on is exactly
    /// theirs, and the link is the bottleneck whenever they are not done yet), else the pool
    /// moving pages however it must (`Executor::alloc`'s order).
    fn alloc_without_evicting(
        &mut self,
        bytes: u64,
        lane: Lane,
    ) -> Result<Option<(u64, Option<EventId>)>> {
        use crate::memory::pool::PoolError::OutOfMemory;
        self.poll_copies();
        self.counters.pool_allocs += 1;
        match self.pool_alloc(bytes, false, lane) {
            Ok(ptr) => return Ok(Some((ptr, None))),
            Err(OutOfMemory { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some((ptr, event)) = self.pool.take_pending_in(bytes, self.streams.compute, lane) {
            return Ok(Some((ptr, Some(event))));
        }
        // With the pending blocks back, without waiting for the device; then however it must.
        let tries: &[bool] = if self.take_back_all_pending()? {
            &[false, true]
        } else {
            &[true]
        };
        for &may_wait in tries {
            self.counters.pool_allocs += 1;
            match self.pool_alloc(bytes, may_wait, lane) {
                Ok(ptr) => return Ok(Some((ptr, None))),
                Err(OutOfMemory { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// Queues the host→device copy of `t` for step `step`; returns false when `may_evict` is off
    /// and no memory is free.
    fn swap_in(&mut self, graph: &Graph, t: u32, may_evict: bool, step: usize) -> Result<bool> {
        let tensor = &graph.tensors()[t as usize];
        if !self.mem[t as usize].host_valid() {
            return Err(Error::Internal(format!(
                "{} is on the host without a valid copy",
                tensor.describe(t)
            )));
        }
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.push(PoolCall::Alloc {
                buf: Buf::Tensor(t),
                bytes: tensor.size,
            });
        }
        self.own(graph, Buf::Tensor(t));
        let copy_in = self.streams.copy_in;
        let (ptr, block_copy) = if may_evict {
            let ptr = self
                .alloc_at(graph, Buf::Tensor(t), tensor.size, step)
                .map_err(|e| e.context(format!("bringing back {}", tensor.describe(t))))?;
            (ptr, None)
        } else if let Some(ptr) = self.take_placed(Buf::Tensor(t), tensor.size, step) {
            // The copy waits for the copies out of the range it takes, not compute.
            for i in 0..self.placed_events.len() {
                self.copy_waits(Waiter::CopyIn, self.placed_events[i], false)?;
            }
            (ptr, None)
        } else {
            let lane = self.lane_of(graph, Buf::Tensor(t));
            match self.alloc_without_evicting(tensor.size, lane)? {
                Some(found) => found,
                None => {
                    if let Some(trace) = self.trace.as_deref_mut() {
                        trace.pop(); // deferred: the call is made again later
                    }
                    return Ok(false);
                }
            }
        };
        self.pool.note_live(Action::SwapIn, ptr);
        // The block's previous users are on the compute stream, or the copy-out still reading
        // it; the source is written by the tensor's own copy-out, if one is still in flight.
        self.copy_stream_waits_compute(copy_in, CopyStream::In)?;
        if let Some(event) = block_copy {
            self.copy_waits(Waiter::CopyIn, event, false)?;
        }
        if let Some(out) = self.mem[t as usize].event(false) {
            self.copy_waits(Waiter::CopyIn, out, true)?;
        }
        let host = self.mem[t as usize]
            .host()
            .expect("a valid host copy has a slot");
        let timing = self.copy_timing_start(copy_in)?;
        // SAFETY: the slot belongs to this tensor until it is discarded, which waits for this
        // copy's event.
        unsafe {
            self.device
                .copy_h2d_async(ptr, host as *const u8, tensor.size, copy_in)?
        };
        self.copy_timing_end(timing, copy_in, (tensor.size, t), true)?;
        let event = self.event_of(t, true)?;
        self.device.record_event(event, copy_in)?;
        self.order.recorded(event, CopyStream::In);
        self.mem[t as usize].copying_in(ptr);
        self.note_copy_residency(t, true);
        self.counters.bytes_in += tensor.size;
        self.counters.tensors_in += 1;
        Ok(true)
    }

    /// Sends `t` (on the device) to the host. A clean tensor (host copy current) just gives its
    /// block back; a dirty one is copied out and its block freed pending the copy's event.
    pub(super) fn swap_out(&mut self, graph: &Graph, t: u32) -> Result<()> {
        let tensor = &graph.tensors()[t as usize];
        if self.mem[t as usize].host_valid() {
            let ptr = self.mem[t as usize].leave_device(false);
            self.note_residency(t, false);
            self.free_block(Buf::Tensor(t), ptr);
            return Ok(());
        }
        let host = match self.mem[t as usize].host() {
            Some(slot) => slot,
            None => match self
                .pinned
                .alloc(&PinnedBacking(self.device), tensor.size, StreamId(0))
            {
                Ok(slot) => {
                    self.mem[t as usize].set_host_slot(slot);
                    slot
                }
                Err(e) => {
                    return Err(super::store::pinned_error(e)
                        .context(format!("a host copy of {}", tensor.describe(t))));
                }
            },
        };
        let ptr = self.mem[t as usize].leave_device(true);
        let copy_out = self.streams.copy_out;
        self.copy_stream_waits_compute(copy_out, CopyStream::Out)?;
        // A collective queued on the communication stream may still write or read it (the
        // compute stream has not waited for it yet): the copy follows the collective.
        if let Some(event) = self.comm_busy.get(t as usize).copied().flatten() {
            self.device.stream_wait_event(copy_out, event)?;
        }
        // The slot's previous contents may still be read by a copy-in.
        if let Some(prev) = self.mem[t as usize].event(true) {
            self.copy_waits(Waiter::CopyOut, prev, true)?;
        }
        let timing = self.copy_timing_start(copy_out)?;
        // SAFETY: the slot is this tensor's and stays allocated until its copies' events pass.
        unsafe {
            self.device
                .copy_d2h_async(host as *mut u8, ptr, tensor.size, copy_out)?
        };
        self.copy_timing_end(timing, copy_out, (tensor.size, t), false)?;
        let event = self.event_of(t, false)?;
        self.device.record_event(event, copy_out)?;
        self.order.recorded(event, CopyStream::Out);
        self.note_copy_residency(t, false);
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.push(PoolCall::Free {
                buf: Buf::Tensor(t),
            });
        }
        self.pool.note_live(Action::SwapOut, ptr);
        self.pool
            .free_after_event(&DeviceBacking(self.device), ptr, event)?;
        self.counters.bytes_out += tensor.size;
        self.counters.tensors_out += 1;
        Ok(())
    }

    /// Before step `step`: the blocks of the copy-outs the release schedule says have ended go
    /// back to the pool, the compute stream waiting for each copy (free when the copy is done,
    /// as the schedule's model expects), so that the pool sees what its dry run saw. The waits
    /// come first, the newest copy first (it implies the older ones: `stream_order.rs`), then
    /// the blocks go back in the schedule's order.
    pub(super) fn release_copies(&mut self, step: usize) -> Result<()> {
        let Some(releases) = self.releases else {
            return Ok(());
        };
        let mut events = std::mem::take(&mut self.scratch_events);
        events.clear();
        for &t in releases.at(step) {
            if let Some(event) = self.mem[t as usize].event(false) {
                if self.pool.is_pending_on(event) {
                    events.push(event);
                }
            }
        }
        let waited = self.compute_waits_all(&events);
        if waited.is_ok() {
            for &event in &events {
                self.pool.assume_complete(event);
                self.counters.released += 1;
            }
        }
        self.scratch_events = events;
        waited
    }

    /// Makes every block pending on a copy free again for the compute stream, which waits for
    /// those copies. False when there was none.
    pub(super) fn take_back_all_pending(&mut self) -> Result<bool> {
        let pending = self.pool.pending_events();
        self.compute_waits_all(&pending)?;
        for &event in &pending {
            self.pool.assume_complete(event);
        }
        Ok(!pending.is_empty())
    }

    /// The compute stream waits for every one of `events`: the newest copy of each stream
    /// first, so that the others are implied.
    fn compute_waits_all(&mut self, events: &[EventId]) -> Result<()> {
        let mut order = events.to_vec();
        self.order.newest_first(&mut order);
        for event in order {
            self.compute_waits(event)?;
        }
        Ok(())
    }

    /// The compute stream waits for `event`, with the wait timed by a pair of events so the
    /// runtime can report how long compute stalled on copies (consecutive waits share a pair
    /// when syncs are elided; none with `time_stalls` off). A wait the streams' order implies
    /// is left out.
    pub(super) fn compute_waits(&mut self, event: EventId) -> Result<()> {
        if self.order.compute_has_waited(event) {
            // (Counted as the record, wait and record it would have queued.)
            self.counters.syncs_elided += 3;
            return Ok(());
        }
        let compute = self.streams.compute;
        if let Some(p) = self.profile.as_deref_mut() {
            p.compute_queued();
        }
        let shared = self.order.on();
        if !self.time_stalls {
            // (Counted as the two timing records it would have queued.)
            self.counters.syncs_elided += 2;
        } else if !(shared && self.wait_group_open) {
            let i = self.counters.stall_pairs_used;
            if i == self.stall_pairs.len() {
                self.stall_pairs
                    .push((self.device.create_event()?, self.device.create_event()?));
            }
            self.counters.stall_pairs_used += 1;
            self.device.record_event(self.stall_pairs[i].0, compute)?;
            self.synced_compute();
            self.wait_group_open = true;
        } else {
            self.counters.syncs_elided += 2;
        }
        self.device.stream_wait_event(compute, event)?;
        self.synced_compute();
        self.order.compute_waits(event);
        if !shared {
            self.close_waits()?;
        }
        Ok(())
    }

    /// Ends the open timing pair of the waits queued since the last launch.
    pub(super) fn close_waits(&mut self) -> Result<()> {
        if std::mem::take(&mut self.wait_group_open) {
            let (_, end) = self.stall_pairs[self.counters.stall_pairs_used - 1];
            self.device.record_event(end, self.streams.compute)?;
            self.synced_compute();
        }
        Ok(())
    }

    /// Copy stream `waiter` waits for `event` (a tensor's copy event when `copy_event`), unless
    /// the streams' order implies it (`stream_order.rs`).
    pub(super) fn copy_waits(
        &mut self,
        waiter: Waiter,
        event: EventId,
        copy_event: bool,
    ) -> Result<()> {
        if self.order.has_waited(waiter, event, copy_event) {
            self.counters.copy_waits_elided += 1;
            return Ok(());
        }
        let stream = match waiter {
            Waiter::CopyIn => self.streams.copy_in,
            Waiter::CopyOut => self.streams.copy_out,
            Waiter::Compute => return self.compute_waits(event),
        };
        self.device.stream_wait_event(stream, event)?;
        self.order.waits(waiter, event);
        self.counters.copy_waits += 1;
        Ok(())
    }

    /// One more record or wait queued on the compute stream (counted per run and per node).
    pub(super) fn synced_compute(&mut self) {
        self.counters.compute_syncs += 1;
        self.syncs_since_launch += 1;
    }

    /// In a profiled run: records the start of a copy on `stream` (after its waits).
    fn copy_timing_start(&mut self, stream: StreamId) -> Result<Option<(EventId, EventId)>> {
        let Some(profile) = self.profile.as_deref_mut() else {
            return Ok(None);
        };
        let pair = profile.pair(self.device)?;
        self.device.record_event(pair.0, stream)?;
        Ok(Some(pair))
    }

    fn copy_timing_end(
        &mut self,
        timing: Option<(EventId, EventId)>,
        stream: StreamId,
        (bytes, tensor): (u64, u32),
        incoming: bool,
    ) -> Result<()> {
        if let (Some((start, end)), Some(profile)) = (timing, self.profile.as_deref_mut()) {
            self.device.record_event(end, stream)?;
            profile.copies.push((start, end, bytes, incoming, tensor));
        }
        Ok(())
    }

    /// Profiled runs: `t` arrives on the device as the copy just queued starts (`on`), or
    /// leaves it as that copy ends.
    fn note_copy_residency(&mut self, t: u32, on: bool) {
        if let Some(p) = self.profile.as_deref_mut() {
            let Some(i) = p.copies.len().checked_sub(1) else {
                return;
            };
            let at = if on {
                Anchor::CopyStart(i as u32)
            } else {
                Anchor::CopyEnd(i as u32)
            };
            p.residency.push((t, at, on));
        }
    }

    /// Copy stream `copy` waits for the compute work queued so far, through the marker: recorded
    /// again only when compute work was queued since its last record, and waited for only when
    /// this copy stream has not waited for that record yet (`stream_order.rs`).
    fn copy_stream_waits_compute(&mut self, copy: StreamId, which: CopyStream) -> Result<()> {
        if self.order.marker_stale() {
            self.device
                .record_event(self.streams.marker, self.streams.compute)?;
            self.order.marker_recorded();
            self.synced_compute();
        } else {
            self.counters.syncs_elided += 1;
        }
        // (A copy stream's wait left out is not counted: `syncs_elided` counts the compute
        // stream's.)
        if self.order.copy_must_wait_marker(which) {
            self.device.stream_wait_event(copy, self.streams.marker)?;
            self.order.copy_waited_marker(which);
        }
        Ok(())
    }

    /// The tensor's copy-in (`incoming`) or copy-out event, created on first use.
    pub(super) fn event_of(&mut self, t: u32, incoming: bool) -> Result<EventId> {
        match self.mem[t as usize].event(incoming) {
            Some(e) => Ok(e),
            None => {
                // Only waited for and queried: without timing when syncs are lightened.
                let e = if self.order.on() {
                    self.device.create_sync_event()?
                } else {
                    self.device.create_event()?
                };
                self.mem[t as usize].set_event(incoming, e);
                Ok(e)
            }
        }
    }
}
