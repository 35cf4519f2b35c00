//! A swapping graph's runs keep the pool layout its plan's dry run checked
//! (`plan::swap_placements`): before a run, the placements of a dry run of it from the pool as
//! it is, reused for later runs while each starts from the same state (the kept tensors where
//! the placements began, the pool's counts unchanged, the last run missing none).

use super::RuntimeGraph;
use crate::device::StreamId;
use crate::exec::RunCounters;
use crate::memory::pool::{Pool, PoolBacking};
use crate::plan::swap_placements::{placements, Placements, Start};

/// The placements the next run follows and when they hold.
#[derive(Default)]
pub(super) struct FollowPlacements {
    /// Follow them at all (`GKRT_SWAP_PLACEMENTS`, read at finalize; `follow_placements`).
    pub(super) on: bool,
    pub(super) current: Option<Placements>,
    /// The pool's counts when `current` was made (`pool_stamp`).
    stamp: [u64; 5],
    /// The last run left the placements (a miss or a fallback): make them again.
    stale: bool,
    /// Dry runs made for runs so far.
    pub(super) made: u64,
}

/// What must not have changed in the pool for placements made earlier to hold: its allocated
/// and reserved bytes, segments, and every page mapped or unmapped since.
fn pool_stamp(pool: &Pool) -> [u64; 5] {
    let s = pool.stats();
    [
        s.allocated_bytes,
        s.reserved_bytes,
        s.segment_count,
        s.page_map_count,
        s.page_unmap_count,
    ]
}

impl RuntimeGraph {
    /// Whether runs take the ranges the plan's dry run placed their blocks in (off by default,
    /// `GKRT_SWAP_PLACEMENTS=1` on): for tests and side-by-side measurements.
    pub fn follow_placements(&mut self, on: bool) {
        self.placements.on = on;
        self.placements.current = None;
    }

    /// Dry runs made so far to place the runs' blocks (0 when no run followed placements).
    pub fn placement_dry_runs(&self) -> u64 {
        self.placements.made
    }

    /// Before a run: the placements it follows, made again unless the last ones still hold.
    /// None for a graph that does not swap or a run that does not start from its plan's
    /// canonical state (its kept tensors on the device): the pool places those blocks.
    pub(super) fn refresh_placements(
        &mut self,
        pool: &mut Pool,
        backing: &dyn PoolBacking,
        stream: StreamId,
    ) {
        let program = &self.program;
        let f = &mut self.placements;
        if !f.on || !program.swapping {
            f.current = None;
            return;
        }
        let start: Vec<(u32, u64)> = program
            .keep
            .iter()
            .filter_map(|&t| self.store.get(t).device().map(|a| (t, a)))
            .collect();
        if start.len() != program.keep.len() {
            f.current = None;
            return;
        }
        // (The last run's copies are done: its blocks pending on them are free.)
        pool.poll_pending(backing);
        let stamp = pool_stamp(pool);
        if let Some(p) = &f.current {
            if !f.stale && p.start == start && f.stamp == stamp {
                return;
            }
        }
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        f.made += 1;
        f.stamp = stamp;
        f.stale = false;
        // From the pool as it is; when the plan does not fit from there (the first run of a
        // plan just chosen starts with the kept tensors where the old plan left them), the
        // steady state the plan was fitted in (the graph's blocks given back, second of two
        // runs): what of it is free is taken, the rest placed by the pool, and the run ends
        // nearer the layout the plan was checked in. The next run makes them again.
        let live = placements(
            tensors,
            nodes,
            program,
            pool,
            stream,
            Start::Live(&start),
            1,
        );
        f.current = match live {
            Ok(p) => Some(p),
            Err(node) => {
                let freed: Vec<u64> = start.iter().map(|&(_, a)| a).collect();
                let fitted = Start::Fresh { freed: &freed };
                f.stale = true;
                log::debug!(
                    "placements: the run's dry run from the pool as it is fails at node {node}; \
                     following the plan's steady state"
                );
                placements(tensors, nodes, program, pool, stream, fitted, 2)
                    .map_err(|node| {
                        log::debug!("placements: the plan's own dry run fails at node {node}")
                    })
                    .ok()
            }
        };
    }

    /// After a run: placements it left (or a fallback it took) are made again for the next.
    pub(super) fn placements_after_run(&mut self, counters: &RunCounters) {
        let f = &mut self.placements;
        if counters.misplaced > 0 || counters.fallbacks > 0 {
            f.stale = true;
        }
        if counters.misplaced > 0 {
            log::info!(
                "swap run {}: {} blocks placed where the plan's dry run put them, {} elsewhere",
                self.successful_runs + 1,
                counters.placed,
                counters.misplaced
            );
        }
    }
}
