//! Whether a swap plan fits the real pool: the pool calls of the plan's compiled step program are
//! replayed through a dry run of the pool, so a plan that fits on paper fits at run time. The
//! runtime lowers the budget and replans when it does not, or when it fits only by the pool
//! waiting for the device (`fits_pool`).

use crate::device::StreamId;
use crate::graph::{Node, Tensor};
use crate::memory::pool::{DryRunStep, Pool};
use crate::plan::program::{PoolWalk, Program};

/// Replays the pool calls of `program` (compiled for a swap plan) through a dry run of the real
/// pool, after freeing the live blocks `freed` (the graph's own, when it holds some: a plan
/// checked between runs starts from nothing of its graph on the device). Returns how many times
/// the dry run waited for the device (recycling pages freed by work it counts as unfinished),
/// or `Err(node)`, the node of the first call that fails. The walk is the executor's own order,
/// so a program that passes makes the same calls at run time.
pub fn check_with_pool(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    pool: &Pool,
    stream: StreamId,
    freed: &[u64],
) -> Result<u64, u32> {
    let walk = PoolWalk::runs(tensors, nodes, program, 2);
    let (steps, first) = dry_run_steps(&walk, stream, freed);
    let before = pool.stats().device_wait_count;
    match pool.dry_run(&steps) {
        Ok(stats) => Ok(stats.device_wait_count - before),
        // A live block that would not free is the first node's problem.
        Err((i, _)) => Err(i.checked_sub(first).map_or(0, |i| walk.call_node[i])),
    }
}

/// The dry run of `walk` after freeing the live blocks `freed`, and where the walk's own steps
/// start in it (its frees renumbered past the `FreeLive` steps).
fn dry_run_steps(walk: &PoolWalk, stream: StreamId, freed: &[u64]) -> (Vec<DryRunStep>, usize) {
    let first = freed.len();
    let mut steps: Vec<DryRunStep> = freed
        .iter()
        .map(|&addr| DryRunStep::FreeLive { addr })
        .collect();
    steps.extend(
        walk.dry_run_steps(stream)
            .into_iter()
            .map(|step| match step {
                DryRunStep::Free { step } => DryRunStep::Free { step: step + first },
                other => other,
            }),
    );
    (steps, first)
}

/// What the pool does beside the plan's allocations at one node of a run: pages it maps (moved
/// from free holes to where a block needs them, or new) and times it waits for the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolMoves {
    pub node: u32,
    pub maps: u64,
    pub waits: u64,
}

/// The pool's page maps and device waits per node in the second of two runs of `program` (the
/// steady state: it meets the pool as the first run left it), from the same dry run as
/// `check_with_pool`; nodes with none are left out, the run's end is node `nodes.len()`. On
/// the H200 each mapped page held the compute stream up (GPT-2 at a third: 535 maps a step,
/// 6 ms of idle device before the logits and their gradient): the timeline model charges them.
/// `Err(node)`: the dry run fails there.
pub fn pool_moves(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    pool: &Pool,
    stream: StreamId,
    freed: &[u64],
) -> Result<Vec<PoolMoves>, u32> {
    let one = PoolWalk::runs(tensors, nodes, program, 1).calls.len();
    let walk = PoolWalk::runs(tensors, nodes, program, 2);
    let (steps, first) = dry_run_steps(&walk, stream, freed);
    let mut moves: Vec<PoolMoves> = Vec::new();
    let start = pool.stats();
    let mut last = (start.page_map_count, start.device_wait_count);
    let result = pool.dry_run_each(&steps, |i, stats| {
        let now = (stats.page_map_count, stats.device_wait_count);
        let call = i.wrapping_sub(first);
        if i >= first && call >= one && now != last {
            let node = walk.call_node[call];
            let (maps, waits) = (now.0 - last.0, now.1 - last.1);
            match moves.last_mut() {
                Some(m) if m.node == node => {
                    m.maps += maps;
                    m.waits += waits;
                }
                _ => moves.push(PoolMoves { node, maps, waits }),
            }
        }
        last = now;
    });
    match result {
        Ok(_) => Ok(moves),
        Err((i, _)) => Err(i.checked_sub(first).map_or(0, |i| walk.call_node[i])),
    }
}

/// Why a plan does not fit the pool (`fits_pool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMisfit {
    /// A call of this node's fails.
    Fails { node: u32 },
    /// Every call succeeds, but only by waiting for the device this many times (two runs).
    Waits { count: u64 },
    /// With its copy-outs' blocks pending until the model's copies end (`swap_release`), its
    /// steady runs map pages or wait for the device.
    PendingMoves { maps: u64, waits: u64 },
}

impl std::fmt::Display for PoolMisfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolMisfit::Fails { node } => write!(f, "fails the pool's dry run at node {node}"),
            PoolMisfit::Waits { count } => write!(
                f,
                "passes the pool's dry run only by waiting for the device {count} times"
            ),
            PoolMisfit::PendingMoves { maps, waits } => write!(
                f,
                "with its copy-outs' blocks pending until their copies end, maps {maps} pages and \
                 waits for the device {waits} times in its steady runs"
            ),
        }
    }
}

/// Whether a plan fits the pool without the pool ever waiting for the device: `check_with_pool`
/// with no waits. Moving pages under the limit waits for the device (a synchronisation of the
/// whole context on CUDA) when the frees on them may not have run yet, which on a swapping run,
/// queued far ahead of the device, is nearly always; the host then stops queueing copies ahead
/// and the compute stream idles until the copy streams drain. The timeline model cannot see
/// that, so a plan needing it is refused here (the budget is lowered instead).
pub fn fits_pool(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    pool: &Pool,
    stream: StreamId,
    freed: &[u64],
) -> Result<(), PoolMisfit> {
    match check_with_pool(tensors, nodes, program, pool, stream, freed) {
        Ok(0) => Ok(()),
        Ok(count) => Err(PoolMisfit::Waits { count }),
        Err(node) => Err(PoolMisfit::Fails { node }),
    }
}
