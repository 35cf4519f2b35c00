//! Dry runs: a list of steps played on a clone of the pool over a backing that grants any
//! memory, to learn whether they would succeed from the current state.

use super::{round_up, Pool, PoolBacking, PoolError, PoolStats};
use crate::device::{DeviceError, EventId, StreamId, VirtualMemory};

/// One step of [`Pool::dry_run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DryRunStep {
    Alloc {
        bytes: u64,
        stream: StreamId,
    },
    /// Free (stream-ordered) the block allocated by the `Alloc` at index `step` of the same list.
    Free {
        step: usize,
    },
    /// Free (stream-ordered) a block that is live in the real pool.
    FreeLive {
        addr: u64,
    },
    /// Free the block allocated by the `Alloc` at index `step`, pending on copy `copy` (a
    /// copy-out still reading it; one id per tensor, as the executor records one copy-out event
    /// per tensor) until a `Complete` of that copy or a `CompleteAll`. A list with such steps
    /// allocates as the executor does when blocks are pending (`Pool::dry_run_pending`).
    FreePending {
        step: usize,
        copy: u32,
    },
    /// Copy `copy` has ended (the executor's stream waits for it): its pending blocks are free.
    Complete {
        copy: u32,
    },
    /// Every copy has ended: a run's end, after which the host synchronises.
    CompleteAll,
}

/// How often a pending-aware dry run (`Pool::dry_run_pending`) took pending blocks, as the
/// executor's `alloc` does when the free memory does not hold a request: one block whose copy
/// the stream then waits for (`Pool::take_pending`), or every one (the compute stream waiting
/// for every copy in flight).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingTakes {
    pub one: u64,
    pub all: u64,
}

impl Pool {
    /// Dry run: would these steps succeed from the current state? Simulated on a clone with a
    /// fake backing that grants any memory within `memory_limit` (the device's own capacity is
    /// not modelled) and treats every pending event as incomplete (conservative). Returns the
    /// statistics after the last step, or the index of the first failing step and its error.
    pub fn dry_run(&self, steps: &[DryRunStep]) -> Result<PoolStats, (usize, PoolError)> {
        self.dry_run_each(steps, |_, _| {})
    }

    /// `dry_run`, calling `after(i, stats)` with the statistics after each step `i`: where the
    /// pool would map pages or wait for the device (the swap plan's timeline model charges them).
    pub fn dry_run_each(
        &self,
        steps: &[DryRunStep],
        mut after: impl FnMut(usize, &PoolStats),
    ) -> Result<PoolStats, (usize, PoolError)> {
        self.dry_run_placed(steps, |i, sim, _| after(i, &sim.stats))
    }

    /// `dry_run`, calling `after(i, pool, addr)` after each step `i` with the simulated pool
    /// and, for an allocation, its address: `Pool::placement_of` there says where it landed,
    /// for the real run to take the same range (`Pool::take_at`).
    pub fn dry_run_placed(
        &self,
        steps: &[DryRunStep],
        after: impl FnMut(usize, &Pool, Option<u64>),
    ) -> Result<PoolStats, (usize, PoolError)> {
        let mut after = after;
        self.dry_run_pending(steps, |i, sim, addr, _| after(i, sim, addr))
            .map(|(stats, _)| stats)
    }

    /// `dry_run_placed`, also counting the pending blocks taken. Without `FreePending` steps an
    /// allocation is `Pool::alloc` (which may wait for the device to move pages). With them,
    /// blocks freed pending on a copy stay out of reach until their copy is `Complete`d, and an
    /// allocation goes the executor's way (`Executor::alloc`): without waiting for the device,
    /// else one pending block that fits closely, else every pending block taken back, else
    /// waiting for the device. Copy ids are mapped to events no pending block of this pool
    /// uses. `after` also gets the pending blocks taken so far.
    pub fn dry_run_pending(
        &self,
        steps: &[DryRunStep],
        mut after: impl FnMut(usize, &Pool, Option<u64>, PendingTakes),
    ) -> Result<(PoolStats, PendingTakes), (usize, PoolError)> {
        let mut sim = self.clone();
        let pending_aware = steps
            .iter()
            .any(|s| matches!(s, DryRunStep::FreePending { .. }));
        // Events above every event the real pool's blocks are pending on.
        let first_event = self
            .pending_events()
            .iter()
            .map(|e| e.0.saturating_add(1))
            .max()
            .unwrap_or(1);
        let event = |copy: u32| {
            first_event
                .checked_add(copy)
                .map(EventId)
                .ok_or((0, PoolError::UnknownPointer(0)))
        };
        let mut takes = PendingTakes::default();
        let base = self
            .segs
            .iter()
            .filter(|s| s.live)
            .map(|s| s.base.saturating_add(s.size))
            .max()
            .unwrap_or(0);
        let backing = SimBacking {
            align: self.config.alignment.max(512),
            next: std::cell::Cell::new(base),
            page: self.page,
        };
        let mut addrs: Vec<Option<u64>> = vec![None; steps.len()];
        for (i, step) in steps.iter().enumerate() {
            let mut placed = None;
            match *step {
                DryRunStep::Alloc { bytes, stream } => {
                    let addr = if pending_aware {
                        sim.alloc_as_executor(&backing, bytes, stream, &mut takes)
                    } else {
                        sim.alloc(&backing, bytes, stream)
                    }
                    .map_err(|e| (i, e))?;
                    addrs[i] = Some(addr);
                    placed = Some(addr);
                }
                DryRunStep::FreePending { step, copy } => {
                    let addr = addrs
                        .get_mut(step)
                        .and_then(Option::take)
                        .ok_or((i, PoolError::UnknownPointer(0)))?;
                    let e = event(copy).map_err(|(_, e)| (i, e))?;
                    sim.park(addr, e).map_err(|e| (i, e))?;
                }
                DryRunStep::Complete { copy } => {
                    sim.assume_complete(event(copy).map_err(|(_, e)| (i, e))?)
                }
                DryRunStep::CompleteAll => {
                    for e in sim.pending_events() {
                        sim.assume_complete(e);
                    }
                }
                DryRunStep::Free { step } => {
                    let addr = addrs
                        .get_mut(step)
                        .and_then(Option::take)
                        .ok_or((i, PoolError::UnknownPointer(0)))?;
                    sim.free(&backing, addr).map_err(|e| (i, e))?;
                }
                DryRunStep::FreeLive { addr } => sim.free(&backing, addr).map_err(|e| (i, e))?,
            }
            after(i, &sim, placed, takes);
        }
        Ok((sim.stats, takes))
    }

    /// An allocation as `Executor::alloc` makes it when blocks are pending on copies (its
    /// first try, a pending block fitting more closely than any free one, is off by default:
    /// `PoolConfig::pending_best_fit`).
    fn alloc_as_executor(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
        takes: &mut PendingTakes,
    ) -> Result<u64, PoolError> {
        if let Some((addr, _)) = self.take_pending_if_closer(backing, bytes, stream) {
            takes.one += 1;
            return Ok(addr);
        }
        match self.alloc_no_wait(backing, bytes, stream) {
            Err(PoolError::OutOfMemory { .. }) => {}
            other => return other,
        }
        if let Some((addr, _)) = self.take_pending(bytes, stream) {
            takes.one += 1;
            return Ok(addr);
        }
        let pending = self.pending_events();
        if !pending.is_empty() {
            takes.all += 1;
            for e in pending {
                self.assume_complete(e);
            }
            match self.alloc_no_wait(backing, bytes, stream) {
                Err(PoolError::OutOfMemory { .. }) => {}
                other => return other,
            }
        }
        self.alloc(backing, bytes, stream)
    }
}

/// Backing for dry runs: hands out fresh addresses above every real segment, frees anything,
/// maps anything, and reports every event incomplete.
struct SimBacking {
    align: u64,
    next: std::cell::Cell<u64>,
    /// Page size of the real pool's ranges; 0: no virtual memory.
    page: u64,
}

impl SimBacking {
    pub(super) fn fresh(&self, bytes: u64, align: u64) -> Result<u64, DeviceError> {
        let oom = || DeviceError::OutOfMemory {
            requested: bytes,
            message: "dry run address space exhausted".into(),
        };
        let base = round_up(self.next.get(), align).ok_or_else(oom)?;
        let end = base.checked_add(bytes).ok_or_else(oom)?;
        self.next.set(end);
        Ok(base)
    }
}

impl PoolBacking for SimBacking {
    fn alloc_segment(&self, bytes: u64) -> Result<u64, DeviceError> {
        self.fresh(bytes, self.align)
    }
    fn free_segment(&self, _addr: u64, _bytes: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn event_complete(&self, _event: EventId) -> bool {
        false
    }
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        (self.page != 0).then_some(self as &dyn VirtualMemory)
    }
}

impl VirtualMemory for SimBacking {
    fn granularity(&self) -> u64 {
        self.page
    }
    fn reserve(&self, bytes: u64) -> Result<u64, DeviceError> {
        self.fresh(bytes, self.page)
    }
    fn unreserve(&self, _base: u64, _bytes: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn map(&self, _addr: u64, _page: u64, _count: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn unmap(&self, _addr: u64, _page: u64, _count: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    // As the device's own pool would: a dry run with page aliases on places what the real
    // pool places.
    fn supports_aliases(&self) -> bool {
        true
    }
    fn map_alias(&self, _addr: u64, _from: u64, _page: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn trim(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}
