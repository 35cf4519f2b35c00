//! The device data queue: a ring of `capacity` device slots, each one batch of buffers of fixed
//! sizes, filled by host threads (`push`) on the queue's own copy stream and emptied by graph
//! runs (`RuntimeGraph`'s queue pop, `graph/queue_pop.rs`) whose tensors are bound to the
//! slot's buffers — no copy after the push's one.
//!
//! Ordering is on the device: a push's copy into a slot waits (on the copy stream) for the
//! `consumed` event the last run that popped that slot recorded on the compute stream; a pop
//! makes the compute stream wait for the slot's `filled` event. The host blocks only for room
//! (push on a full ring) or a batch (pop on an empty one), up to a timeout. A slot is free for
//! the next push once the run that popped it is queued (its copy then waits on the device).
//! Pageable pushes go through a pinned staging area per slot (the copy is asynchronous and the
//! push returns once it is queued); pinned pushes copy directly and return when the copy is
//! done, so the caller may reuse its buffer at once.

use super::{Error, Result, Runtime};
use crate::device::{DevPtr, EventId, StreamId};
use crate::memory::DeviceBacking;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Counters of one queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueStats {
    pub pushes: u64,
    pub pops: u64,
    pub bytes_pushed: u64,
    /// Time pushes spent waiting for a free slot, in nanoseconds.
    pub push_wait_ns: u64,
    /// Time pops spent waiting for a filled slot, in nanoseconds.
    pub pop_wait_ns: u64,
}

struct Slot {
    buffers: Vec<DevPtr>,
    /// Recorded on the copy stream after the slot's last push.
    filled: EventId,
    /// Recorded on the compute stream after the last run that popped the slot.
    consumed: EventId,
}

struct Ring {
    pushed: u64,
    popped: u64,
    /// A run between its pop and its queueing holds the head slot.
    popping: bool,
    closed: bool,
    /// Per slot: `consumed` was recorded (a push into it must wait for it).
    consumed_recorded: Vec<bool>,
    stats: QueueStats,
}

/// The push side's own state, held for a whole push (pushes are ordered).
struct PushSide {
    /// Per slot: its pinned staging area (all its buffers back to back), made at the first
    /// pageable push into it.
    staging: Vec<Option<usize>>,
}

pub struct DeviceQueue {
    runtime: Arc<Runtime>,
    name: String,
    sizes: Vec<u64>,
    batch_bytes: u64,
    pop_timeout: Duration,
    copy: StreamId,
    slots: Vec<Slot>,
    push_side: Mutex<PushSide>,
    ring: Mutex<Ring>,
    changed: Condvar,
}

/// A slot a run has taken from the head of the ring, until `finish_pop` or `cancel_pop`.
pub struct PoppedSlot {
    pub index: usize,
}

impl DeviceQueue {
    /// A queue of `capacity` slots of buffers of `sizes` bytes on `runtime` (the slots' device
    /// memory from its pool, counted against its limit).
    pub fn new(
        runtime: Arc<Runtime>,
        name: &str,
        capacity: usize,
        sizes: &[u64],
        pop_timeout: Duration,
    ) -> Result<Arc<DeviceQueue>> {
        let what = || format!("queue '{name}'");
        if capacity == 0 || capacity > 1 << 16 {
            return Err(Error::InvalidArgument(format!(
                "{}: capacity {capacity} (must be between 1 and 65536)",
                what()
            )));
        }
        if sizes.is_empty() || sizes.len() > 1024 {
            return Err(Error::InvalidArgument(format!(
                "{}: {} buffers per batch (must be between 1 and 1024)",
                what(),
                sizes.len()
            )));
        }
        let mut batch_bytes = 0u64;
        for (i, &s) in sizes.iter().enumerate() {
            if s == 0 || s > crate::graph::MAX_BUFFER_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "{}: buffer {i} of {s} bytes (must be between 1 and {})",
                    what(),
                    crate::graph::MAX_BUFFER_BYTES
                )));
            }
            batch_bytes += s;
        }
        let device = runtime.device();
        let copy = device.create_stream()?;
        let mut slots: Vec<Slot> = Vec::with_capacity(capacity);
        let made = (|| -> Result<()> {
            for _ in 0..capacity {
                // Only ever waited for and queried: untimed.
                let filled = device.create_sync_event()?;
                let consumed = match device.create_sync_event() {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = device.destroy_event(filled);
                        return Err(e.into());
                    }
                };
                slots.push(Slot {
                    buffers: Vec::new(),
                    filled,
                    consumed,
                });
                let mut st = runtime.lock_for_call()?;
                for &s in sizes {
                    let p = st
                        .pool
                        .alloc(&DeviceBacking(device), s, runtime.compute)
                        .map_err(|e| {
                            Error::from(e)
                                .context(format!("{}: a slot's buffer of {s} bytes", what()))
                        })?;
                    slots.last_mut().expect("pushed").buffers.push(p);
                }
            }
            Ok(())
        })();
        let queue = DeviceQueue {
            runtime: Arc::clone(&runtime),
            name: name.to_string(),
            sizes: sizes.to_vec(),
            batch_bytes,
            pop_timeout,
            copy,
            slots,
            push_side: Mutex::new(PushSide {
                staging: vec![None; capacity],
            }),
            ring: Mutex::new(Ring {
                pushed: 0,
                popped: 0,
                popping: false,
                closed: false,
                consumed_recorded: vec![false; capacity],
                stats: QueueStats::default(),
            }),
            changed: Condvar::new(),
        };
        // On failure, dropping the partial queue gives back what was made.
        made?;
        Ok(Arc::new(queue))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn stats(&self) -> QueueStats {
        self.lock_ring().stats
    }

    fn lock_ring(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks a push of buffers of `lens` bytes before any host memory is read.
    pub fn check_push(&self, lens: &[u64]) -> Result<()> {
        if lens.len() != self.sizes.len() {
            return Err(Error::InvalidArgument(format!(
                "queue '{}': a push of {} buffers; its batches have {}",
                self.name,
                lens.len(),
                self.sizes.len()
            )));
        }
        Ok(())
    }

    /// Waits on `cond` until `ready`, the queue closes, or `timeout` passes; returns the guard
    /// and the time waited. `what` names the wait in the timeout's message.
    fn wait_for<'a>(
        &'a self,
        mut ring: MutexGuard<'a, Ring>,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Ring) -> bool,
    ) -> Result<(MutexGuard<'a, Ring>, u64)> {
        let start = Instant::now();
        while !ready(&ring) && !ring.closed {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::InvalidState(format!(
                    "queue '{}': timed out after {} ms waiting for {what}",
                    self.name,
                    timeout.as_millis()
                )));
            }
            ring = self
                .changed
                .wait_timeout(ring, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok((ring, start.elapsed().as_nanos() as u64))
    }

    /// Copies one batch from host memory into the next free slot, waiting up to `timeout` for
    /// one. `pinned`: the buffers are pinned (page-locked) host memory, copied directly.
    pub fn push(&self, batch: &[&[u8]], pinned: bool, timeout: Duration) -> Result<()> {
        let lens: Vec<u64> = batch.iter().map(|b| b.len() as u64).collect();
        self.check_push(&lens)?;
        for (i, (&len, &size)) in lens.iter().zip(&self.sizes).enumerate() {
            if len != size {
                return Err(Error::InvalidArgument(format!(
                    "queue '{}': buffer {i} of a push has {len} bytes; the queue's has {size}",
                    self.name
                )));
            }
        }
        let closed =
            |name: &str| Error::InvalidState(format!("queue '{name}' is closed: no more pushes"));
        let mut side = self.push_side.lock().unwrap_or_else(|p| p.into_inner());
        let cap = self.slots.len() as u64;
        let ring = self.lock_ring();
        if ring.closed {
            return Err(closed(&self.name));
        }
        let (mut ring, waited) =
            self.wait_for(ring, timeout, "a free slot (the queue is full)", |r| {
                r.pushed - r.popped < cap
            })?;
        ring.stats.push_wait_ns += waited;
        if ring.closed {
            return Err(closed(&self.name));
        }
        let index = (ring.pushed % cap) as usize;
        let must_wait = ring.consumed_recorded[index];
        drop(ring);
        self.copy_in(&mut side, index, batch, pinned, must_wait)?;
        let mut ring = self.lock_ring();
        ring.pushed += 1;
        ring.stats.pushes += 1;
        ring.stats.bytes_pushed += self.batch_bytes;
        self.changed.notify_all();
        Ok(())
    }

    /// The copies of one push into slot `index`, queued on the copy stream.
    fn copy_in(
        &self,
        side: &mut PushSide,
        index: usize,
        batch: &[&[u8]],
        pinned: bool,
        must_wait: bool,
    ) -> Result<()> {
        let device = self.runtime.device();
        let slot = &self.slots[index];
        if must_wait {
            device.stream_wait_event(self.copy, slot.consumed)?;
        }
        if pinned {
            for (data, &dst) in batch.iter().zip(&slot.buffers) {
                // SAFETY: `data` outlives the copy: the event is waited for below.
                unsafe { device.copy_h2d_async(dst, data.as_ptr(), data.len() as u64, self.copy)? };
            }
            device.record_event(slot.filled, self.copy)?;
            device.event_synchronize(slot.filled)?;
            return Ok(());
        }
        // The slot's last copy from its staging area has finished long ago (the slot was
        // popped since); wait for it anyway before the staging area is overwritten.
        device.event_synchronize(slot.filled)?;
        let staging = match side.staging[index] {
            Some(p) => p,
            None => {
                let p = device.alloc_pinned(self.batch_bytes)? as usize;
                side.staging[index] = Some(p);
                p
            }
        };
        let mut offset = 0usize;
        for (data, &dst) in batch.iter().zip(&slot.buffers) {
            let src = (staging + offset) as *mut u8;
            // SAFETY: the staging area holds the whole batch and no copy reads it (waited above).
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), src, data.len());
                device.copy_h2d_async(dst, src, data.len() as u64, self.copy)?;
            }
            offset += data.len();
        }
        device.record_event(slot.filled, self.copy)?;
        Ok(())
    }

    /// Takes the head slot for a run, waiting up to the pop timeout for a batch; the compute
    /// stream is made to wait for the slot's copy. The batch stays in the queue until
    /// `finish_pop` (or goes back with `cancel_pop`).
    pub fn begin_pop(&self) -> Result<PoppedSlot> {
        let ring = self.lock_ring();
        let (mut ring, waited) = self.wait_for(
            ring,
            self.pop_timeout,
            "a batch (the queue is empty)",
            |r| r.pushed > r.popped && !r.popping,
        )?;
        ring.stats.pop_wait_ns += waited;
        if ring.pushed == ring.popped || ring.popping {
            return Err(Error::InvalidState(format!(
                "queue '{}' is closed and empty: no more batches",
                self.name
            )));
        }
        ring.popping = true;
        let index = (ring.popped % self.slots.len() as u64) as usize;
        drop(ring);
        let rt = &self.runtime;
        if let Err(e) = rt
            .device()
            .stream_wait_event(rt.compute, self.slots[index].filled)
        {
            self.cancel_pop();
            return Err(e.into());
        }
        Ok(PoppedSlot { index })
    }

    /// The buffers of a popped slot.
    pub fn buffers(&self, slot: &PoppedSlot) -> &[DevPtr] {
        &self.slots[slot.index].buffers
    }

    /// The run that popped `slot` is queued: the slot is free for the next push, whose copy
    /// waits for the run on the device.
    pub fn finish_pop(&self, slot: PoppedSlot) -> Result<()> {
        let rt = &self.runtime;
        let recorded = rt
            .device()
            .record_event(self.slots[slot.index].consumed, rt.compute);
        if recorded.is_err() {
            // Without the event a push could overwrite the slot under the run: wait instead.
            rt.device().stream_synchronize(rt.compute)?;
        }
        let mut ring = self.lock_ring();
        ring.consumed_recorded[slot.index] = recorded.is_ok();
        ring.popped += 1;
        ring.popping = false;
        ring.stats.pops += 1;
        self.changed.notify_all();
        Ok(())
    }

    /// The run that took the head slot failed before it was queued: the batch stays at the head.
    pub fn cancel_pop(&self) {
        let mut ring = self.lock_ring();
        ring.popping = false;
        self.changed.notify_all();
    }

    /// Closes the queue: pushes fail from now on, pops take what is left, then fail; every
    /// waiter wakes.
    pub fn close(&self) {
        let mut ring = self.lock_ring();
        ring.closed = true;
        self.changed.notify_all();
    }
}

impl Drop for DeviceQueue {
    fn drop(&mut self) {
        let rt = &self.runtime;
        let device = rt.device();
        // Every graph that popped from it is gone (each holds the queue): only copies remain.
        let _ = device.stream_synchronize(self.copy);
        let mut st = rt.lock();
        let _ = device.stream_synchronize(rt.compute);
        let side = self.push_side.get_mut().unwrap_or_else(|p| p.into_inner());
        for slot in &self.slots {
            for &p in &slot.buffers {
                if let Err(e) = st.pool.free(&DeviceBacking(device), p) {
                    log::error!("releasing queue '{}': {e}", self.name);
                }
            }
            let _ = device.destroy_event(slot.filled);
            let _ = device.destroy_event(slot.consumed);
        }
        for p in side.staging.iter().flatten() {
            // SAFETY: made by alloc_pinned(batch_bytes); the copy stream has drained.
            let _ = unsafe { device.free_pinned(*p as *mut u8, self.batch_bytes) };
        }
        drop(st);
        let _ = device.destroy_stream(self.copy);
    }
}
