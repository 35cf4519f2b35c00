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
        mut after: impl FnMut(usize, &Pool, Option<u64>),
    ) -> Result<PoolStats, (usize, PoolError)> {
        let mut sim = self.clone();
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
                    let addr = sim.alloc(&backing, bytes, stream).map_err(|e| (i, e))?;
                    addrs[i] = Some(addr);
                    placed = Some(addr);
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
            after(i, &sim, placed);
        }
        Ok(sim.stats)
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
    fn quiesce(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn trim(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}
