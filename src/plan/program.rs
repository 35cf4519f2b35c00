//! The step program: everything one run does, in the order the executor does it.
//!
//! Finalize compiles the graph's liveness, its swap plan (if any) and its arena layout (if
//! planned) into one flat list of steps. The executor (`exec`) interprets that list and nothing
//! else; the pool's dry run (`PoolWalk`, used by `swap_fit::check_with_pool`) and the timeline model
//! (`swap_model::estimate`) walk the same list, so "fits in the dry run" means "fits at run
//! time" and the model times the run that will happen. A new capability (a fused group, a
//! collective, a bound buffer) is a new step kind here, taught to those three walkers.
//!
//! How the step kinds map onto what a run does on the device:
//! - allocate: `Alloc` (a node's new outputs and workspaces, largest first, as one batch);
//! - wait for an event: `Ready` / `Settle` (a tensor's copy-in event on the compute stream);
//! - launch: `Launch`; record an event: every copy records its tensor's event;
//! - copy out: `CopyOut`, `SendHome`; copy in: `CopyIn` (ahead of time, may be deferred),
//!   `Ready` (on demand); drop: `Drop`; recompute: `Recompute`;
//! - free: `Free` (an intermediate after its last use), `FreeWorkspaces`;
//! - collectives: `Collective` (queued on the communication stream after the compute stream's
//!   work so far, its event recorded), `AwaitCollective` (the compute stream waits for that event
//!   before the first node that touches the collective's tensors, or at the run's end). A tensor freed while its
//!   collective may still run goes back to the pool pending on the collective's event: the pool
//!   calls are the same, which is all the dry run compares.
//!
//! - fused groups (`graph::fused`): the first producer of any member allocates the whole block
//!   (`Buf::Group` in its `Alloc` batch; every member is placed at its offset), a member's `Free`
//!   returns nothing, and `FreeGroup` after the last member's free returns the block (pending on
//!   the collective's event when that may still run).
//!
//! Steps whose effect depends on where a tensor is (`Ready` copies only a tensor on the host,
//! `Alloc` skips an output already on the device) read the tensor's residency; the dry run
//! tracks the same residency in bytes, starting from the plan's canonical run start.

use super::swap::SwapPlan;
use super::ArenaLayout;
use crate::graph::fused::fused_slot;
use crate::graph::{FusedGroup, Liveness, Node, Tensor, TensorKind};
use crate::memory::pool::DryRunStep;

/// A buffer a step allocates or frees: a tensor's block, or workspace `index` of node `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    Tensor(u32),
    Workspace {
        node: u32,
        index: u32,
    },
    /// Fused group `g`'s block (`Program::fused`): its members live inside it.
    Group(u32),
}

/// One buffer of an `Alloc` batch: pool memory, or (planned mode) a fixed arena offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocEntry {
    pub buf: Buf,
    pub bytes: u64,
    /// Offset in the graph's arena; `None`: from the pool.
    pub arena: Option<u64>,
}

/// One step of a run. Node indices are the graph's; `allocs` ranges index `Program::allocs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A persistent tensor that should be on the host goes there if it is on the device (a copy
    /// only when the host copy is stale): at a swapping run's start and end.
    SendHome(u32),
    /// Retry the returns that found no room earlier (they are needed sooner than later ones).
    RetryDeferred,
    /// Start copying a tensor back ahead of its reader if memory allows without evicting;
    /// otherwise it is deferred to the next `RetryDeferred`.
    CopyIn(u32),
    /// Rebuild a dropped tensor by running its producer again: the producer's inputs made
    /// ready, `allocs` taken (the tensor and the producer's workspaces), the producer queued
    /// (untimed), its workspaces returned. Skipped when the tensor is not dropped (the fallback
    /// sent it to the host instead: it is read back).
    Recompute {
        tensor: u32,
        producer: u32,
        first: u32,
        count: u32,
    },
    /// Make a tensor readable on the compute stream: wait for its copy-in, or copy it in now
    /// (evicting if needed).
    Ready(u32),
    /// An output still being copied in (a return the plan started): wait for that copy.
    Settle(u32),
    /// Memory for the node's new outputs and its workspaces, largest first, as one batch.
    Alloc { node: u32, first: u32, count: u32 },
    /// Queue the node's kernel on the compute stream.
    Launch(u32),
    /// Return the node's workspaces to the pool.
    FreeWorkspaces(u32),
    /// An intermediate after its last use: its block (and host slot) go back.
    Free(u32),
    /// Copy a tensor out to its host slot (if it is on the device); its block is freed pending
    /// the copy.
    CopyOut(u32),
    /// Drop a tensor the plan rebuilds later (if it is on the device): no copy.
    Drop(u32),
    /// Queue collective node `n` on the communication stream, after the compute work queued so
    /// far, and record its event.
    Collective(u32),
    /// The compute stream waits for collective node `n`'s event: emitted before the first later
    /// node that reads or writes one of its tensors (compute in between overlaps it), or at the
    /// run's end when none does.
    AwaitCollective(u32),
    /// Fused group `g`'s block goes back: its last member's last use has passed.
    FreeGroup(u32),
}

/// The compiled program of one graph under one plan.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub steps: Vec<Step>,
    /// Per step: the node it belongs to (the node count for the run's start and end), for
    /// error messages and timing.
    pub step_node: Vec<u32>,
    pub allocs: Vec<AllocEntry>,
    /// The plan's persistent tensors on the device when a run starts (sorted); empty without a
    /// swap plan.
    pub keep: Vec<u32>,
    /// The program belongs to a swap plan (runs start and end in its canonical state).
    pub swapping: bool,
    /// The swap plan's device budget (0 without one).
    pub budget: u64,
    /// The graph's fused groups (`Buf::Group` indexes them).
    pub fused: Vec<FusedGroup>,
}

/// A call the executor makes to the device pool, as a buffer: the log that the dry run of the
/// same program must reproduce call for call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolCall {
    Alloc { buf: Buf, bytes: u64 },
    Free { buf: Buf },
}

impl Program {
    /// Compiles a finalized graph's run: its liveness, its swap plan (if any) and its arena
    /// layout (if planned; a planned graph has no swap plan). The tests' shorthand for a graph
    /// without fused groups.
    #[cfg(test)]
    pub fn compile(
        tensors: &[Tensor],
        nodes: &[Node],
        lv: &Liveness,
        plan: Option<&SwapPlan>,
        layout: Option<&ArenaLayout>,
    ) -> Program {
        Self::compile_fused(tensors, nodes, lv, plan, layout, &[])
    }

    /// `compile` for a graph with fused groups (dynamic mode; planned mode places them in the
    /// arena).
    pub fn compile_fused(
        tensors: &[Tensor],
        nodes: &[Node],
        lv: &Liveness,
        plan: Option<&SwapPlan>,
        layout: Option<&ArenaLayout>,
        fused: &[FusedGroup],
    ) -> Program {
        debug_assert!(fused.is_empty() || layout.is_none());
        // Per group: its block is taken; members whose last use has not passed yet.
        let mut started = vec![false; fused.len()];
        let mut alive: Vec<usize> = fused.iter().map(|g| g.members.len()).collect();
        let mut p = Program {
            fused: fused.to_vec(),
            swapping: plan.is_some(),
            budget: plan.map_or(0, |p| p.budget),
            keep: plan.map(|p| p.keep.clone()).unwrap_or_default(),
            ..Program::default()
        };
        let start = nodes.len() as u32;
        let persistent_not_kept = |keep: &[u32]| {
            (0..tensors.len() as u32)
                .filter(|&t| tensors[t as usize].kind.persists() && keep.binary_search(&t).is_err())
                .collect::<Vec<_>>()
        };
        if let Some(plan) = plan {
            for t in persistent_not_kept(&plan.keep)
                .into_iter()
                .chain(plan.leave_at_start.iter().copied())
            {
                p.push(start, Step::SendHome(t));
            }
        }
        // Collectives queued and not yet waited for, with the tensors they read or write.
        let mut in_flight: Vec<(u32, Vec<u32>)> = Vec::new();
        for (n, node) in nodes.iter().enumerate() {
            let n32 = n as u32;
            if node.comm.is_none() {
                in_flight.retain(|(c, touched)| {
                    let clash = node
                        .inputs
                        .iter()
                        .chain(&node.outputs)
                        .any(|t| touched.contains(t));
                    if clash {
                        p.push(n32, Step::AwaitCollective(*c));
                    }
                    !clash
                });
            }
            if node.is_absorbed() {
                continue; // merged into a later node's bucket (`graph::buckets`)
            }
            if let Some(plan) = plan {
                p.push(n32, Step::RetryDeferred);
                for &t in &plan.prefetch_before[n] {
                    p.push(n32, Step::CopyIn(t));
                }
                for &x in &plan.recompute_before[n] {
                    let producer = tensors[x as usize]
                        .producer
                        .expect("a planned recompute has a producer");
                    let first = p.allocs.len() as u32;
                    let mut batch = vec![AllocEntry {
                        buf: Buf::Tensor(x),
                        bytes: tensors[x as usize].size,
                        arena: None,
                    }];
                    batch.extend(workspaces(nodes, producer, None));
                    let count = p.add_batch(batch);
                    p.push(
                        n32,
                        Step::Recompute {
                            tensor: x,
                            producer,
                            first,
                            count,
                        },
                    );
                }
            }
            for &t in &node.inputs {
                p.push(n32, Step::Ready(t));
            }
            if plan.is_some() {
                for &t in node.outputs.iter().filter(|t| !node.inputs.contains(t)) {
                    p.push(n32, Step::Settle(t));
                }
            }
            let first = p.allocs.len() as u32;
            let mut batch: Vec<AllocEntry> = Vec::new();
            for &t in &node.outputs {
                if let Some((g, _)) = fused_slot(fused, t) {
                    if !std::mem::replace(&mut started[g as usize], true) {
                        batch.push(AllocEntry {
                            buf: Buf::Group(g),
                            bytes: fused[g as usize].bytes,
                            arena: None,
                        });
                    }
                }
            }
            batch.extend(
                node.outputs
                    .iter()
                    .filter(|&&t| fused_slot(fused, t).is_none())
                    .map(|&t| {
                        let arena = match (layout, tensors[t as usize].kind) {
                            (Some(l), TensorKind::Intermediate) => {
                                Some(l.tensor_offsets[t as usize])
                            }
                            _ => None,
                        };
                        AllocEntry {
                            buf: Buf::Tensor(t),
                            bytes: tensors[t as usize].size,
                            arena,
                        }
                    }),
            );
            batch.extend(workspaces(nodes, n32, layout));
            let count = p.add_batch(batch);
            p.push(
                n32,
                Step::Alloc {
                    node: n32,
                    first,
                    count,
                },
            );
            if node.comm.is_some() {
                p.push(n32, Step::Collective(n32));
                let touched = node.inputs.iter().chain(&node.outputs).copied().collect();
                in_flight.push((n32, touched));
            } else {
                p.push(n32, Step::Launch(n32));
            }
            // Arena workspaces are not returned: their offsets are the node's for good.
            if !node.workspaces.is_empty() && layout.is_none() {
                p.push(n32, Step::FreeWorkspaces(n32));
            }
            for &t in &lv.frees[n] {
                p.push(n32, Step::Free(t));
                if let Some((g, _)) = fused_slot(fused, t) {
                    alive[g as usize] -= 1;
                    if alive[g as usize] == 0 {
                        p.push(n32, Step::FreeGroup(g));
                    }
                }
            }
            if let Some(plan) = plan {
                for &t in &plan.swap_out_after[n] {
                    p.push(n32, Step::CopyOut(t));
                }
                for &t in &plan.drop_after[n] {
                    p.push(n32, Step::Drop(t));
                }
                // Links of a recompute chain, rebuilt before this node for another recompute.
                for &t in plan.free_after.get(n).into_iter().flatten() {
                    p.push(n32, Step::Free(t));
                }
            }
        }
        // Collectives no later node waited for: the compute stream joins them before the run's
        // end, so a copy home of their tensors follows them and a capture of the compute stream
        // joins the communication stream back (its collectives are part of the replay).
        for (c, _) in in_flight {
            p.push(start, Step::AwaitCollective(c));
        }
        if let Some(plan) = plan {
            // The returns for the next run, then everything else persistent goes to the host.
            p.push(start, Step::RetryDeferred);
            for &t in &plan.prefetch_before[nodes.len()] {
                p.push(start, Step::CopyIn(t));
            }
            for t in persistent_not_kept(&plan.keep) {
                p.push(start, Step::SendHome(t));
            }
            // Returns that found no room get the room the sends home just made, so the next run
            // starts with the plan's kept tensors on the device.
            p.push(start, Step::RetryDeferred);
        }
        p
    }

    fn push(&mut self, node: u32, step: Step) {
        self.steps.push(step);
        self.step_node.push(node);
    }

    /// Appends a batch, largest first (small blocks must not split the space a large one
    /// needs); returns its length. The sort is stable: equal sizes keep the node's order.
    fn add_batch(&mut self, mut batch: Vec<AllocEntry>) -> u32 {
        batch.sort_by_key(|e| std::cmp::Reverse(e.bytes));
        let count = batch.len() as u32;
        self.allocs.extend(batch);
        count
    }

    /// The entries of an `Alloc` or `Recompute` step.
    pub fn batch(&self, first: u32, count: u32) -> &[AllocEntry] {
        &self.allocs[first as usize..(first + count) as usize]
    }

    /// The steps of the run's start (before the first node's).
    pub fn start_len(&self, nodes: usize) -> usize {
        self.step_node
            .iter()
            .take_while(|&&n| n as usize == nodes)
            .count()
    }
}

/// Node `node`'s workspaces as batch entries.
fn workspaces<'a>(
    nodes: &'a [Node],
    node: u32,
    layout: Option<&'a ArenaLayout>,
) -> impl Iterator<Item = AllocEntry> + 'a {
    nodes[node as usize]
        .workspaces
        .iter()
        .enumerate()
        .map(move |(i, &bytes)| AllocEntry {
            buf: Buf::Workspace {
                node,
                index: i as u32,
            },
            bytes,
            arena: layout.map(|l| l.workspace_offsets[node as usize][i]),
        })
}

/// The pool calls a program makes when every step goes as planned, from the plan's canonical
/// run start: the log the executor's run must reproduce, and the dry run's input. Residency is
/// tracked as "has a block" per tensor, which is all the executor's conditions read. The walk
/// never defers a return: one that does not fit fails the dry run instead.
pub struct PoolWalk {
    /// The blocks of the canonical start (the plan's kept tensors), then the run's calls.
    pub calls: Vec<PoolCall>,
    /// How many of `calls` make the start state rather than being calls of the run.
    pub start_calls: usize,
    /// Per call: the node of its step.
    pub call_node: Vec<u32>,
    /// Per call: the index of its step in `Program::steps` (`START_STEP` for the start calls).
    pub call_step: Vec<u32>,
    /// The step being walked (`push` tags calls with it).
    step: u32,
}

/// `PoolWalk::call_step` of the calls that make the canonical start.
pub(crate) const START_STEP: u32 = u32::MAX;

impl PoolWalk {
    pub fn new(tensors: &[Tensor], nodes: &[Node], program: &Program) -> PoolWalk {
        Self::runs(tensors, nodes, program, 1)
    }

    /// The walk of `runs` runs one after the other (each ends in the state the next starts
    /// from): the dry run checks the second too, which meets the pool as the first left it.
    pub fn runs(tensors: &[Tensor], nodes: &[Node], program: &Program, runs: usize) -> PoolWalk {
        Self::runs_with_starts(tensors, nodes, program, runs).0
    }

    /// `runs`, and the index of the call each run after the first starts at.
    pub fn runs_with_starts(
        tensors: &[Tensor],
        nodes: &[Node],
        program: &Program,
        runs: usize,
    ) -> (PoolWalk, Vec<usize>) {
        let mut has = vec![false; tensors.len()];
        let mut w = PoolWalk {
            calls: Vec::new(),
            start_calls: program.keep.len(),
            call_node: Vec::new(),
            call_step: Vec::new(),
            step: START_STEP,
        };
        let start = nodes.len() as u32;
        for &t in &program.keep {
            has[t as usize] = true;
            w.push(
                start,
                PoolCall::Alloc {
                    buf: Buf::Tensor(t),
                    bytes: tensors[t as usize].size,
                },
            );
        }
        let mut starts = Vec::new();
        for r in 0..runs {
            if r > 0 {
                starts.push(w.calls.len());
            }
            w.walk(tensors, nodes, program, &mut has);
        }
        (w, starts)
    }

    fn walk(&mut self, tensors: &[Tensor], nodes: &[Node], program: &Program, has: &mut [bool]) {
        let w = self;
        // Planned mode: tensors at arena offsets are never pool blocks (not even when read).
        let mut in_arena = vec![false; tensors.len()];
        for e in program.allocs.iter().filter(|e| e.arena.is_some()) {
            if let Buf::Tensor(t) = e.buf {
                in_arena[t as usize] = true;
            }
        }
        for (i, &step) in program.steps.iter().enumerate() {
            let n = program.step_node[i];
            w.step = i as u32;
            let fetch = |w: &mut PoolWalk, has: &mut [bool], t: u32| {
                if !has[t as usize] && !in_arena[t as usize] {
                    has[t as usize] = true;
                    w.push(
                        n,
                        PoolCall::Alloc {
                            buf: Buf::Tensor(t),
                            bytes: tensors[t as usize].size,
                        },
                    );
                }
            };
            match step {
                Step::RetryDeferred
                | Step::Settle(_)
                | Step::Launch(_)
                | Step::Collective(_)
                | Step::AwaitCollective(_) => {}
                Step::CopyIn(t) | Step::Ready(t) => fetch(w, has, t),
                Step::Recompute {
                    tensor,
                    producer,
                    first,
                    count,
                } => {
                    if !has[tensor as usize] {
                        for &y in &nodes[producer as usize].inputs {
                            fetch(w, has, y);
                        }
                        w.batch(n, program.batch(first, count), has, &program.fused);
                        w.free_workspaces(n, nodes, producer);
                    }
                }
                Step::Alloc { first, count, .. } => {
                    w.batch(n, program.batch(first, count), has, &program.fused)
                }
                Step::FreeWorkspaces(node) => w.free_workspaces(n, nodes, node),
                Step::FreeGroup(g) => w.push(n, PoolCall::Free { buf: Buf::Group(g) }),
                Step::Free(t) | Step::CopyOut(t) | Step::Drop(t) | Step::SendHome(t) => {
                    // (A planned graph's arena intermediates are never pool blocks, nor are
                    // fused members: their group's block is.)
                    let member = fused_slot(&program.fused, t).is_some();
                    if std::mem::take(&mut has[t as usize]) && !member {
                        w.push(
                            n,
                            PoolCall::Free {
                                buf: Buf::Tensor(t),
                            },
                        );
                    }
                }
            }
        }
    }

    /// The calls of the run itself (those the executor makes).
    pub fn run_calls(&self) -> &[PoolCall] {
        &self.calls[self.start_calls..]
    }

    fn push(&mut self, node: u32, call: PoolCall) {
        self.calls.push(call);
        self.call_node.push(node);
        self.call_step.push(self.step);
    }

    fn batch(&mut self, n: u32, entries: &[AllocEntry], has: &mut [bool], fused: &[FusedGroup]) {
        for e in entries.iter().filter(|e| e.arena.is_none()) {
            match e.buf {
                Buf::Tensor(t) => {
                    if std::mem::replace(&mut has[t as usize], true) {
                        continue; // already on the device (a persistent output of an earlier run)
                    }
                }
                Buf::Group(g) => {
                    for &m in &fused[g as usize].members {
                        has[m as usize] = true;
                    }
                }
                Buf::Workspace { .. } => {}
            }
            self.push(
                n,
                PoolCall::Alloc {
                    buf: e.buf,
                    bytes: e.bytes,
                },
            );
        }
    }

    /// Node `node`'s workspaces go back in index order.
    fn free_workspaces(&mut self, n: u32, nodes: &[Node], node: u32) {
        for index in 0..nodes[node as usize].workspaces.len() as u32 {
            self.push(
                n,
                PoolCall::Free {
                    buf: Buf::Workspace { node, index },
                },
            );
        }
    }

    /// The walk as pool dry-run steps on `stream`, each free naming its allocation.
    pub fn dry_run_steps(&self, stream: crate::device::StreamId) -> Vec<DryRunStep> {
        let mut live: std::collections::HashMap<Buf, usize> = std::collections::HashMap::new();
        self.calls
            .iter()
            .enumerate()
            .map(|(i, call)| match *call {
                PoolCall::Alloc { buf, bytes } => {
                    live.insert(buf, i);
                    DryRunStep::Alloc { bytes, stream }
                }
                PoolCall::Free { buf } => DryRunStep::Free {
                    step: live.remove(&buf).expect("freed after its allocation"),
                },
            })
            .collect()
    }
}
