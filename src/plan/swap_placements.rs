//! Where the pool's dry run of a swap plan's program places each allocation, for the run to take
//! the same ranges (`Pool::take_at`), and which copy-outs those ranges come from, for the
//! timeline model to wait for them.
//!
//! The plan is fitted on a dry run that frees a copy-out's block at once (`swap_fit`); the real
//! pool finds it still pending on the copy and, left to itself, places the next blocks elsewhere
//! and drifts from the dry run until it moves pages under the limit (GPT-2 at a third of its
//! working set on the H200: ~460 page maps and 4 waits for the device a step where the dry run
//! had none). Following the dry run's placements keeps the layout it checked; the price is that
//! a block taking a copy-out's range waits for that copy, which the model charges
//! (`Placements::copy_waits`).

use crate::device::StreamId;
use crate::graph::{Node, Tensor};
use crate::memory::pool::{DryRunStep, Placement, Pool};
use crate::plan::program::{Buf, PoolCall, PoolWalk, Program, Step, START_STEP};
use std::collections::HashMap;

/// The placements of one run of a program, by step.
#[derive(Clone, Debug, Default)]
pub struct Placements {
    /// Per step of the program: its placements are `entries[first[i]..first[i + 1]]`.
    first: Vec<u32>,
    entries: Vec<(Buf, Placement)>,
    /// (step, tensor): an allocation of the step takes (part of) the range that tensor's
    /// copy-out freed earlier in the run, so it waits for that copy. Sorted by step.
    copy_waits: Vec<(u32, u32)>,
    /// The graph's blocks the run starts from: (tensor, address), by tensor.
    pub start: Vec<(u32, u64)>,
    /// Where the kept tensors are when the run ends: (tensor, address), by tensor.
    pub end: Vec<(u32, u64)>,
}

impl Placements {
    /// Where the dry run placed `buf`'s allocation at step `step`.
    #[inline]
    pub fn get(&self, step: usize, buf: Buf) -> Option<Placement> {
        let (a, b) = (*self.first.get(step)?, *self.first.get(step + 1)?);
        self.entries[a as usize..b as usize]
            .iter()
            .find(|(e, _)| *e == buf)
            .map(|&(_, p)| p)
    }

    /// (step, tensor) pairs: the step's allocations wait for that tensor's copy-out.
    pub fn copy_waits(&self) -> &[(u32, u32)] {
        &self.copy_waits
    }
}

/// Where the dry run starts.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// From the plan's canonical start made afresh: the live blocks `freed` (the graph's own)
    /// given back, the kept tensors allocated (as `swap_fit::check_with_pool`).
    Fresh { freed: &'a [u64] },
    /// From the real pool as it is: the kept tensors live at these (tensor, address) pairs.
    Live(&'a [(u32, u64)]),
}

/// The placements of the last of `runs` dry runs of `program` from `start` on `pool` (the steady
/// state when `runs` is 2), or `Err(node)` where the dry run fails (the run's end, node
/// `nodes.len()`, when `start` does not hold exactly the plan's kept tensors).
pub fn placements(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    pool: &Pool,
    stream: StreamId,
    start: Start<'_>,
    runs: usize,
) -> Result<Placements, u32> {
    let runs = runs.max(1);
    let walk = PoolWalk::runs(tensors, nodes, program, runs);
    let last_run = PoolWalk::runs(tensors, nodes, program, runs - 1)
        .calls
        .len();
    // The dry run's steps, and per step the walk's call (None: a block given back first).
    let mut steps: Vec<DryRunStep> = Vec::new();
    let mut call_of: Vec<Option<usize>> = Vec::new();
    // Per live buffer: where its allocation is (a dry-run step, or a real address).
    let mut live: HashMap<Buf, Result<usize, u64>> = HashMap::new();
    let mut first_call = 0;
    let mut start_blocks = Vec::new();
    match start {
        Start::Fresh { freed } => {
            steps.extend(freed.iter().map(|&addr| DryRunStep::FreeLive { addr }));
            call_of.resize(freed.len(), None);
        }
        Start::Live(at) => {
            let mut kept: Vec<u32> = at.iter().map(|&(t, _)| t).collect();
            kept.sort_unstable();
            if kept != program.keep {
                return Err(nodes.len() as u32);
            }
            for &(t, addr) in at {
                live.insert(Buf::Tensor(t), Err(addr));
            }
            start_blocks = at.to_vec();
            start_blocks.sort_unstable();
            first_call = walk.start_calls;
        }
    }
    for (c, call) in walk.calls.iter().enumerate().skip(first_call) {
        let step = match *call {
            PoolCall::Alloc { buf, bytes } => {
                live.insert(buf, Ok(steps.len()));
                DryRunStep::Alloc { bytes, stream }
            }
            PoolCall::Free { buf } => match live.remove(&buf) {
                Some(Ok(step)) => DryRunStep::Free { step },
                Some(Err(addr)) => DryRunStep::FreeLive { addr },
                None => return Err(walk.call_node[c]),
            },
        };
        steps.push(step);
        call_of.push(Some(c));
    }
    let mut out = Placements {
        start: start_blocks,
        ..Placements::default()
    };
    let mut placed: Vec<(u32, Buf, Placement)> = Vec::new();
    // Where each live buffer's block is in the dry run, and the ranges copy-outs freed that no
    // later block has taken yet: (start, end, tensor).
    let mut blocks: HashMap<Buf, (u64, u64)> = HashMap::new();
    for &(t, addr) in &out.start {
        blocks.insert(Buf::Tensor(t), (addr, pool.block_size(addr).unwrap_or(0)));
    }
    let mut copied: Vec<(u64, u64, u32)> = Vec::new();
    let result = pool.dry_run_placed(&steps, |i, sim, addr| {
        let Some(c) = call_of[i] else {
            return;
        };
        let step = walk.call_step[c];
        match (walk.calls[c], addr) {
            (PoolCall::Alloc { buf, .. }, Some(addr)) => {
                let end = addr + sim.block_size(addr).unwrap_or(0);
                blocks.insert(buf, (addr, end));
                let mut kept = Vec::with_capacity(copied.len());
                for &(a, b, t) in &copied {
                    if a < end && addr < b {
                        if c >= last_run && step != START_STEP {
                            out.copy_waits.push((step, t));
                        }
                        // The block takes that part: later blocks wait for it, not the copy.
                        if a < addr {
                            kept.push((a, addr, t));
                        }
                        if end < b {
                            kept.push((end, b, t));
                        }
                    } else {
                        kept.push((a, b, t));
                    }
                }
                copied = kept;
                if c >= last_run && step != START_STEP {
                    if let Some(p) = sim.placement_of(addr) {
                        placed.push((step, buf, p));
                    }
                }
            }
            (PoolCall::Free { buf }, _) => {
                let range = blocks.remove(&buf);
                let copy_out = match program.steps.get(step as usize) {
                    Some(Step::CopyOut(t)) | Some(Step::SendHome(t)) => Some(*t),
                    _ => None,
                };
                if let (Some((a, b)), Some(t)) = (range, copy_out) {
                    copied.push((a, b, t));
                }
            }
            _ => {}
        }
    });
    if let Err((i, _)) = result {
        return Err(call_of[i].map_or(0, |c| walk.call_node[c]));
    }
    out.copy_waits.sort_unstable();
    out.copy_waits.dedup();
    out.first = vec![0; program.steps.len() + 1];
    for &(step, _, _) in &placed {
        out.first[step as usize + 1] += 1;
    }
    for i in 0..program.steps.len() {
        out.first[i + 1] += out.first[i];
    }
    // (Calls come in step order within a run: `placed` is sorted by step already.)
    out.entries = placed.into_iter().map(|(_, b, p)| (b, p)).collect();
    out.end = program
        .keep
        .iter()
        .filter_map(|&t| blocks.get(&Buf::Tensor(t)).map(|&(a, _)| (t, a)))
        .collect();
    Ok(out)
}
