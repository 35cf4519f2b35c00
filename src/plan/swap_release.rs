//! Releasing copy-outs' blocks when the timeline model says their copies end, so that the pool's
//! dry run and the run itself see the same pending blocks.
//!
//! The executor frees a copied-out tensor's block pending on the copy's event; the host queues
//! far ahead of the device, so the pool never sees that event complete while a run is queued
//! and, left to itself, places the next blocks elsewhere. The plain dry run (`swap_fit`) frees
//! such a block at once: the two drift apart and the run moves pages under the limit (GPT-2
//! at a third of its working set on the H200: 400–500 page maps and 4–6 waits for the device a
//! step where the dry run had none). With a release schedule both keep each block pending until
//! the step by which the model has its copy ended, and there the run's compute stream waits for
//! the copy's event (free when the model is right: the copy is done) and gives the block back
//! (`Pool::assume_complete`); the dry run gives it back at the same step. The pool then makes
//! the same calls from the same state in both, so it places every block where the dry run did,
//! without the run taking the placements, and the dry run's fit counts the memory that copies
//! in flight hold.

use crate::device::StreamId;
use crate::graph::{Node, Tensor};
use crate::memory::pool::{DryRunStep, PendingTakes, Pool};
use crate::plan::program::{Buf, PoolCall, PoolWalk, Program, Step, START_STEP};
use crate::plan::swap::{Policy, SwapPlan};
use crate::plan::swap_fit::{PoolMisfit, PoolMoves};
use crate::plan::swap_model::{estimate, Estimate, Link};
use std::collections::HashMap;

/// How long after the model's end of a copy its block is given back, in milliseconds of the
/// compute stream's clock: none, the first step at or past the end (a node's length is slack
/// enough where the model is right). The plans the pending-aware fit accepts shift with it: at
/// 0.25 ms the GPT-2 small shape's best was 1.270x of its nodes' sum, at 0 1.210x. Where the
/// device's copies run later than the model's, the compute stream waits for them at the release
/// (counted in the runs' copy waits).
pub(crate) const RELEASE_MARGIN_MS: f64 = 0.0;

/// Per step of a program: the tensors whose copy-out blocks are given back before the step
/// runs, and which copy-outs copy (their blocks go back pending).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Releases {
    /// Per step: its releases are `tensors[first[i]..first[i + 1]]`.
    first: Vec<u32>,
    tensors: Vec<u32>,
    /// (step, tensor): the copy-outs that copy, sorted.
    copies: Vec<(u32, u32)>,
    /// (step, tensor): of those, the ones that leave clean in a first run whose tensors all
    /// start clean (`clean_start`), sorted; empty for a run that starts as a steady one.
    clean_first: Vec<(u32, u32)>,
}

impl Releases {
    /// The schedule for `program` from the model's `estimate` of it: each copy's block goes
    /// back at the first later step whose compute clock is at least `margin_ms` past the copy's
    /// end; a copy no step of the run outlasts stays pending until the run's end. A release is
    /// left out when the tensor is copied out again before it (the executor's copy-out event is
    /// per tensor: waiting for it would wait for the later copy).
    pub fn from_estimate(program: &Program, estimate: &Estimate, margin_ms: f64) -> Releases {
        let steps = program.steps.len();
        let clock = &estimate.step_clock;
        let mut copies: Vec<(u32, u32)> =
            estimate.copy_ends.iter().map(|&(s, t, _)| (s, t)).collect();
        copies.sort_unstable();
        let mut at: Vec<(u32, u32)> = Vec::new();
        for &(s, t, end) in &estimate.copy_ends {
            let from = (s as usize + 1).min(clock.len());
            let r = from + clock[from..].partition_point(|&c| c < end + margin_ms);
            if r >= steps.min(clock.len()) {
                continue;
            }
            let again = estimate
                .copy_ends
                .iter()
                .any(|&(s2, t2, _)| t2 == t && s2 > s && (s2 as usize) < r);
            if !again {
                at.push((r as u32, t));
            }
        }
        at.sort_unstable();
        let mut first = vec![0u32; steps + 1];
        for &(r, _) in &at {
            first[r as usize + 1] += 1;
        }
        for i in 0..steps {
            first[i + 1] += first[i];
        }
        Releases {
            first,
            tensors: at.into_iter().map(|(_, t)| t).collect(),
            copies,
            clean_first: Vec::new(),
        }
    }

    /// The schedule for runs whose first starts with every tensor clean on the device (its
    /// host copy current), as after the tuning emptied the pool and brought the kept tensors
    /// back from the host (`Executor::bring_kept`): there a copy-out before the run itself
    /// writes the tensor leaves without a copy, its block free at once, where the model (which
    /// starts every run as a steady one: `swap_model::dirty_at_end`) has it copy. The plan
    /// that keeps the embedding's AdamW state copies both out at the next run's first nodes;
    /// dry runs that kept those blocks pending in the first run too left another layout than
    /// the real first run, and the steady runs after the real one mapped pages
    /// (`plan/pool_fidelity_tests.rs`).
    pub fn clean_start(mut self, program: &Program, nodes: &[Node]) -> Releases {
        let mut written = std::collections::HashSet::new();
        for (i, step) in program.steps.iter().enumerate() {
            match *step {
                Step::Launch(n) | Step::Collective(n) => {
                    written.extend(nodes[n as usize].outputs.iter().copied());
                }
                Step::Recompute { tensor, .. } => {
                    written.insert(tensor);
                }
                Step::CopyOut(t) | Step::SendHome(t)
                    if self.copies(i as u32, t) && !written.contains(&t) =>
                {
                    self.clean_first.push((i as u32, t));
                }
                _ => {}
            }
        }
        self
    }

    /// Whether the copy-out of `tensor` at step `step` copies in the first run
    /// (`clean_start`), else in every run.
    fn copies_in_first(&self, step: u32, tensor: u32) -> bool {
        self.copies(step, tensor) && self.clean_first.binary_search(&(step, tensor)).is_err()
    }

    /// The tensors whose copy-out blocks are given back before step `step`.
    pub fn at(&self, step: usize) -> &[u32] {
        match (self.first.get(step), self.first.get(step + 1)) {
            (Some(&a), Some(&b)) => &self.tensors[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Whether the copy-out of `tensor` at step `step` copies (its block goes back pending).
    pub fn copies(&self, step: u32, tensor: u32) -> bool {
        self.copies.binary_search(&(step, tensor)).is_ok()
    }

    /// How many blocks the schedule gives back in a run.
    pub fn count(&self) -> usize {
        self.tensors.len()
    }
}

/// The walk of `runs` runs of `program` and the call indices where its second and later runs
/// start.
pub fn walk_runs(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    runs: usize,
) -> (PoolWalk, Vec<usize>) {
    PoolWalk::runs_with_starts(tensors, nodes, program, runs)
}

/// The pool dry run of `walk` (runs of `program`; `run_starts` as `walk_runs` gives them) with
/// the schedule: blocks the walk's copy-outs free go back pending on their copy, given back at
/// their release step or at the run's end. Returns the steps and, per step, the walk's call it
/// makes (`None`: a release, or one of `before`). `before` are steps to start with (e.g. the
/// graph's live blocks given back); the walk's calls from `from_call` on follow.
pub fn pending_dry_run_steps(
    walk: &PoolWalk,
    run_starts: &[usize],
    releases: &Releases,
    stream: StreamId,
    before: Vec<DryRunStep>,
    from_call: usize,
) -> (Vec<DryRunStep>, Vec<Option<usize>>) {
    let mut steps = before;
    let mut call_of: Vec<Option<usize>> = vec![None; steps.len()];
    let mut live: HashMap<Buf, usize> = HashMap::new();
    // The next program step whose releases are still to be made, in the walk's current run.
    let mut next_release = 0u32;
    for (c, call) in walk.calls.iter().enumerate().skip(from_call) {
        let step = walk.call_step[c];
        if run_starts.contains(&c) {
            // Every copy of the last run has ended (the host synchronised).
            steps.push(DryRunStep::CompleteAll);
            call_of.push(None);
            next_release = 0;
        }
        if step != START_STEP {
            for s in next_release..=step {
                for &t in releases.at(s as usize) {
                    steps.push(DryRunStep::Complete { copy: t });
                    call_of.push(None);
                }
            }
            next_release = next_release.max(step + 1);
        }
        let dry = match *call {
            PoolCall::Alloc { buf, bytes } => {
                live.insert(buf, steps.len());
                DryRunStep::Alloc { bytes, stream }
            }
            PoolCall::Free { buf } => {
                let Some(at) = live.remove(&buf) else {
                    // (A block of the start the caller gave back in `before`.)
                    continue;
                };
                // (The first run's calls come before the second run's start.)
                let first = run_starts.first().is_none_or(|&second| c < second);
                let copies = match buf {
                    Buf::Tensor(_) if step == START_STEP => None,
                    Buf::Tensor(t) if first => releases.copies_in_first(step, t).then_some(t),
                    Buf::Tensor(t) => releases.copies(step, t).then_some(t),
                    _ => None,
                };
                match copies {
                    Some(t) => DryRunStep::FreePending { step: at, copy: t },
                    None => DryRunStep::Free { step: at },
                }
            }
        };
        steps.push(dry);
        call_of.push(Some(c));
    }
    steps.push(DryRunStep::CompleteAll);
    call_of.push(None);
    (steps, call_of)
}

/// What the pool does in the steady run (the second of two) of a program with its release
/// schedule, from the plan's canonical start after giving back the live blocks `freed`: the
/// two runs' counts less the first's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteadyRun {
    pub page_maps: u64,
    pub device_waits: u64,
    pub takes: PendingTakes,
}

/// How many runs the steady state is checked over, after the first: with blocks pending longer
/// the pool's layout need not repeat after one run (GPT-2 small at a third: 269, 289 and 458
/// page maps in the emulated runs 2–4 of a plan whose second dry run mapped 269).
pub(crate) const STEADY_RUNS: usize = 3;

/// The first run and the `STEADY_RUNS` steady ones of `program` as the pool's pending-aware dry
/// run replays them, the blocks at `freed` given back first.
struct StepsOfRuns {
    walk: PoolWalk,
    starts: Vec<usize>,
    steps: Vec<DryRunStep>,
    call_of: Vec<Option<usize>>,
}

fn steps_of_runs(
    (tensors, nodes, program): (&[Tensor], &[Node], &Program),
    releases: &Releases,
    stream: StreamId,
    freed: &[u64],
    steady: usize,
) -> StepsOfRuns {
    let (walk, starts) = walk_runs(tensors, nodes, program, 1 + steady);
    let before = freed
        .iter()
        .map(|&addr| DryRunStep::FreeLive { addr })
        .collect();
    let (steps, call_of) = pending_dry_run_steps(&walk, &starts, releases, stream, before, 0);
    StepsOfRuns {
        walk,
        starts,
        steps,
        call_of,
    }
}

/// The node of the dry run's failing step `i` (0 where the step is no node's call).
fn failing_node(walk: &PoolWalk, call_of: &[Option<usize>], i: usize) -> u32 {
    call_of
        .get(i)
        .copied()
        .flatten()
        .map_or(0, |c| walk.call_node[c])
}

/// The steady runs (`STEADY_RUNS` after the first) of `program` with `releases` through the
/// pool's dry run, their counts summed, or `Err(node)`: the node of the first call that fails.
pub fn steady_run(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    releases: &Releases,
    pool: &Pool,
    stream: StreamId,
    freed: &[u64],
) -> Result<SteadyRun, u32> {
    let graph = (tensors, nodes, program);
    steady_run_over(graph, releases, pool, stream, freed, STEADY_RUNS)
}

/// `steady_run` over `steady` steady runs.
fn steady_run_over(
    graph: (&[Tensor], &[Node], &Program),
    releases: &Releases,
    pool: &Pool,
    stream: StreamId,
    freed: &[u64],
    steady: usize,
) -> Result<SteadyRun, u32> {
    let StepsOfRuns {
        walk,
        steps,
        call_of,
        ..
    } = steps_of_runs(graph, releases, stream, freed, steady);
    // The counts as the first run ends: at the step that completes its copies.
    let first_end = call_of
        .iter()
        .zip(&steps)
        .position(|(c, s)| c.is_none() && *s == DryRunStep::CompleteAll)
        .expect("every run ends with its copies completed");
    let mut first = (0, 0, PendingTakes::default());
    let result = pool.dry_run_pending(&steps, |i, sim, _, takes| {
        if i == first_end {
            let s = sim.stats();
            first = (s.page_map_count, s.device_wait_count, takes);
        }
    });
    match result {
        Ok((stats, takes)) => Ok(SteadyRun {
            page_maps: stats.page_map_count - first.0,
            device_waits: stats.device_wait_count - first.1,
            takes: PendingTakes {
                one: takes.one - first.2.one,
                all: takes.all - first.2.all,
            },
        }),
        Err((i, _)) => Err(failing_node(&walk, &call_of, i)),
    }
}

/// Per run of `steady_run`'s dry run (the first, then the `STEADY_RUNS` steady ones) the nodes
/// before which the pool maps pages or waits for the device, for the measured timeline to be
/// read against (`GKRT_SWAP_TIMELINE`: a tuned plan's first run against the first, the later
/// ones against the steady ones); the canonical start's calls are left out. `Err(node)`: the
/// node of the first call that fails.
pub fn released_moves(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    releases: &Releases,
    pool: &Pool,
    stream: StreamId,
    freed: &[u64],
) -> Result<Vec<Vec<PoolMoves>>, u32> {
    let StepsOfRuns {
        walk,
        starts,
        steps,
        call_of,
    } = steps_of_runs(
        (tensors, nodes, program),
        releases,
        stream,
        freed,
        STEADY_RUNS,
    );
    let mut runs: Vec<Vec<PoolMoves>> = vec![Vec::new(); 1 + STEADY_RUNS];
    let s = pool.stats();
    let mut last = (s.page_map_count, s.device_wait_count);
    let result = pool.dry_run_pending(&steps, |i, sim, _, _| {
        let s = sim.stats();
        let now = (s.page_map_count, s.device_wait_count);
        let call = call_of[i].filter(|&c| walk.call_step[c] != START_STEP);
        if let (Some(c), true) = (call, now != last) {
            let run = &mut runs[starts.partition_point(|&first| first <= c)];
            let (node, maps, waits) = (walk.call_node[c], now.0 - last.0, now.1 - last.1);
            match run.last_mut() {
                Some(m) if m.node == node => {
                    m.maps += maps;
                    m.waits += waits;
                }
                _ => run.push(PoolMoves { node, maps, waits }),
            }
        }
        last = now;
    });
    match result {
        Ok(_) => Ok(runs),
        Err((i, _)) => Err(failing_node(&walk, &call_of, i)),
    }
}

/// Whether `program` fits the pool with its copy-outs' blocks pending until the model's copies
/// end: the schedule from the model's estimate on `cost` and `link`, and steady runs that map no
/// page and never wait for the device (as `swap_fit::fits_pool` asks of the plain dry run).
/// `clean_start`: the first run starts with every tensor clean (`Releases::clean_start`; the
/// runtime's tuning after emptying the pool). Returns the schedule.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(test), allow(dead_code))] // (the runtime fits with `fits_pool_released_over`)
pub fn fits_pool_released(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    pool: &Pool,
    stream: StreamId,
    freed: &[u64],
    rates: (&[f64], Link, u64),
    clean_start: bool,
) -> Result<Releases, PoolMisfit> {
    let graph = (tensors, nodes, program);
    fits_pool_released_over(
        graph,
        (pool, stream, freed),
        rates,
        clean_start,
        STEADY_RUNS,
    )
}

/// `fits_pool_released` over `steady` steady runs: a search that keeps the best of hundreds of
/// plans that fit (`swap_search`) finds among them plans whose layout repeats only within
/// `STEADY_RUNS` (GPT-2 small at a third: page maps and a device wait in the emulated runs 5
/// and 6 of one), so it looks further ahead (`SEARCH_STEADY_RUNS`).
pub fn fits_pool_released_over(
    (tensors, nodes, program): (&[Tensor], &[Node], &Program),
    (pool, stream, freed): (&Pool, StreamId, &[u64]),
    (cost, link, align): (&[f64], Link, u64),
    clean_start: bool,
    steady: usize,
) -> Result<Releases, PoolMisfit> {
    let e = estimate(tensors, nodes, program, cost, link, align);
    let mut releases = Releases::from_estimate(program, &e, RELEASE_MARGIN_MS);
    if clean_start {
        releases = releases.clean_start(program, nodes);
    }
    let graph = (tensors, nodes, program);
    match steady_run_over(graph, &releases, pool, stream, freed, steady) {
        Ok(s) if s.page_maps == 0 && s.device_waits == 0 => Ok(releases),
        Ok(s) => Err(PoolMisfit::PendingMoves {
            maps: s.page_maps,
            waits: s.device_waits,
        }),
        Err(node) => Err(PoolMisfit::Fails { node }),
    }
}

/// The steady runs a search's plans are fitted over (`fits_pool_released_over`).
pub(crate) const SEARCH_STEADY_RUNS: usize = 8;

/// The candidates a release schedule's refit keeps (`fitted_candidates_with` with the pending-aware
/// fit: the default policy's plan first, whether it fits or not, then the other policies' plans
/// that fit), or `None` when the runs must keep the plans fitted with blocks free at once. The
/// default policy's plan fits only at a low budget on GPT-2 small at a third (below 0.75 of the
/// limit, infeasible at the logits' gradient), and at some shares never within `fitted`'s
/// rounds while most other policies' plans fit; with `any_fit` those are kept (the default's
/// plan left out), without it every plan falls back, as the refit did before
/// (`GKRT_SWAP_RELEASE_ANY_FIT`).
pub fn released_candidates(
    default_fits: bool,
    mut candidates: Vec<(Policy, SwapPlan)>,
    any_fit: bool,
) -> Option<Vec<(Policy, SwapPlan)>> {
    if default_fits {
        return Some(candidates);
    }
    if !any_fit || candidates.len() < 2 {
        return None;
    }
    candidates.remove(0);
    Some(candidates)
}
