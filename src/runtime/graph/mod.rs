//! A graph bound to its runtime: the memory of its tensors (residency, device blocks, host
//! slots), its plans (arena, swap), its captured replay, and the run / write / read entry points.
//!
//! - `mod.rs` (here): [`RuntimeGraph`], `new`, accessors, the pool-call record.
//! - `compile.rs`: finalize — liveness, arena, swap plan, step program.
//! - `io.rs`: tensor writes and reads from the host, and the one check of such a copy.
//! - `tune.rs`: choosing among swap plans by the first two runs' warm timings; the timeline file.
//! - `run.rs`: runs — execute, replay capture.
//! - `placements.rs`: a swapping graph's runs take the ranges its plan's dry run placed blocks in.
//! - `releases.rs`: a tuned swapping graph's runs give copy-outs' blocks back at the model's copy
//!   ends (`GKRT_SWAP_RELEASE`).
//! - `trace_run.rs`: a run's slices, counters and instants in the runtime's trace.
//! - `drop.rs`: teardown: the graph's memory back to the pools.
//! - `binding.rs`: persistent tensors bound to the host's device memory.
//! - `async_run.rs`: runs queued on the host's stream, and their wait.
//! - `queue_pop.rs`: input tensors each run takes from a device data queue.
//! - `collective.rs`: collective nodes: adding them, their events, what a failed run does to
//!   their communicators.
//! - `digest.rs`: at the first run, the ranks compare their graphs' collective sequences.

mod async_run;
mod binding;
mod collective;
mod compile;
mod digest;
mod drop;
mod io;
mod placements;
mod queue_pop;
mod releases;
mod run;
mod trace_run;
mod tune;

use super::{Result, Runtime, ALIGNMENT};
use crate::device::GraphExecId;
use crate::exec::RunProfile;
use crate::exec::TensorStore;
use crate::graph::{Graph, TensorKind};
use crate::plan::program::{PoolCall, PoolWalk, Program};
use crate::plan::swap::{Policy, SwapPlan};
use crate::plan::ArenaLayout;
use std::sync::Arc;

/// When a traced run began (host time on the trace's clock) and whether it was a CUDA-graph
/// replay or capture (traced as one slice).
pub(super) struct TraceMark {
    pub began_us: f64,
    pub replayed: bool,
}

/// Whole-step replay of a planned graph (CUDA graphs): captured at the second run, once every
/// address is fixed, and replayed from then on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Replay {
    NotYet,
    Captured(GraphExecId),
    /// Not captured; the reason was logged once.
    Off,
}

pub struct RuntimeGraph {
    runtime: Arc<Runtime>,
    pub graph: Graph,
    /// Where each tensor is, and the arena: the one owner of the graph's tensor memory
    /// (persistent tensors keep theirs until the graph is released).
    store: TensorStore,
    /// Per tensor: holds meaningful contents (written by the host, or produced by a run).
    has_contents: Vec<bool>,
    /// Planned mode: the layout chosen at finalize (the store holds the arena itself).
    arena: Option<ArenaLayout>,
    /// Made at finalize when the working set exceeds the budget.
    swap: Option<SwapPlan>,
    /// The plans of the other swap policies (each passed the pool's dry run), default first:
    /// the first successful runs are timed and the plan the timeline model finds fastest on
    /// their warmest timings replaces the default (`tune_swap_plan`).
    swap_candidates: Vec<(Policy, SwapPlan)>,
    /// Timing events of that run.
    profile: RunProfile,
    /// Its tensors' and nodes' names for traces, made at its first traced run.
    trace_names: Option<Arc<super::trace::GraphNames>>,
    /// The plan was chosen (by the timed runs, or by `use_swap_policy`).
    swap_chosen: bool,
    /// The timings of the runs timed so far for that choice (`tune::TUNING_RUNS` are).
    swap_timings: Vec<tune::RunTimings>,
    /// What the timeline model and the pool's dry run predicted for the plan the timed run
    /// chose (`tune.rs`), written beside each later run's measured timeline.
    swap_prediction: Option<tune::SwapPrediction>,
    replay: Replay,
    successful_runs: u64,
    /// What a run executes: compiled at finalize, and again whenever the swap plan changes.
    program: Program,
    /// The pool calls of the last run, while `record_pool_calls` is on.
    pool_calls: Option<Vec<PoolCall>>,
    /// The last run's departures from its program (`RunCounters::fallbacks`).
    last_fallbacks: u64,
    /// Captured replays dropped because a bound address changed (`binding.rs`).
    captures_dropped: u64,
    /// Launches of a captured replay (`run.rs`).
    replays: u64,
    /// A run (of either kind) was queued at least once: a wait means something.
    ever_run: bool,
    /// The ranks agreed on the graph's collective sequence (`digest.rs`, at the first run).
    digest_checked: bool,
    /// Fusion of consecutive all-reduces at finalize: (first bucket, later buckets) in bytes;
    /// 0 for later buckets: off (`graph::buckets`).
    bucket_bytes: (u64, u64),
    /// An asynchronous run was queued and not yet waited for.
    async_in_flight: bool,
    /// The events joining asynchronous runs to the host's stream (`async_run.rs`).
    async_events: Option<async_run::AsyncEvents>,
    /// Captures for other sets of bound addresses than the current one (`binding.rs`).
    replay_cache: Vec<(Vec<u64>, GraphExecId)>,
    /// The queues each run pops a batch from (`queue_pop.rs`).
    pops: Vec<queue_pop::QueuePop>,
    /// Per node: a collective node's event (made at finalize; empty without collectives).
    collective_events: Vec<Option<crate::device::EventId>>,
    /// Set by a traced run's `enqueue`, taken by its `finish_run` (`trace_run.rs`).
    trace_mark: Option<TraceMark>,
    /// `pin_small_tensors`: the size under which the swap plans keep persistent tensors on the
    /// device, in place of the pool's page (`tune::swap_knobs`).
    pin_below: Option<u64>,
    /// The dry-run placements a swapping graph's runs follow (`placements.rs`).
    placements: placements::FollowPlacements,
    /// When a tuned swapping graph's runs give copy-outs' blocks back (`releases.rs`).
    releases: releases::ReleaseCopies,
    /// Runs leave out the syncs the streams' order implies (`GKRT_EXEC_ELIDE`, read at
    /// finalize; `exec/stream_order.rs`).
    elide_syncs: bool,
    /// Runs time the compute stream's waits on copies (`GKRT_EXEC_TIME_STALLS`, read at
    /// finalize): the runtime's `copy_wait_ns`.
    time_stalls: bool,
    /// The last run's compute-stream syncs queued and left out (`RunCounters`).
    last_syncs: (u64, u64),
    /// Swapping runs without a release schedule poll the copies' events oldest first
    /// (`GKRT_EXEC_POLL_IN_ORDER`, read at finalize; `exec/poll.rs`), and whether this one does.
    poll_in_order: bool,
    polling_in_order: bool,
    /// The events the last run's executor queried for that (`RunCounters::events_polled`).
    last_polled: u64,
    /// The last run's copy-stream waits queued and left out (`RunCounters::copy_waits`).
    last_copy_waits: (u64, u64),
    /// The last run's deferred returns and departures from its program (`RunCounters`).
    last_deferred: (u64, u64),
}

impl RuntimeGraph {
    /// The smallest memory limit the graph can run under in dynamic mode, swapping
    /// (`plan/min_limit.rs`; once finalized, counting what its collectives hold).
    pub fn min_memory_limit(&self) -> u64 {
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        match self.graph.liveness() {
            Some(lv) => crate::plan::min_limit::min_memory_limit_held(
                tensors,
                nodes,
                lv,
                self.graph.fused_groups(),
                ALIGNMENT,
            ),
            None => crate::plan::min_limit::min_memory_limit(tensors, nodes, ALIGNMENT),
        }
    }

    pub fn new(runtime: Arc<Runtime>) -> RuntimeGraph {
        RuntimeGraph {
            runtime,
            graph: Graph::new(),
            store: TensorStore::default(),
            has_contents: Vec::new(),
            arena: None,
            swap: None,
            swap_candidates: Vec::new(),
            profile: RunProfile::default(),
            trace_names: None,
            swap_chosen: false,
            swap_timings: Vec::new(),
            swap_prediction: None,
            replay: Replay::NotYet,
            successful_runs: 0,
            program: Program::default(),
            pool_calls: None,
            last_fallbacks: 0,
            captures_dropped: 0,
            replays: 0,
            ever_run: false,
            digest_checked: false,
            bucket_bytes: (
                crate::graph::buckets::DEFAULT_FIRST_BUCKET_BYTES,
                crate::graph::buckets::DEFAULT_BUCKET_BYTES,
            ),
            async_in_flight: false,
            async_events: None,
            replay_cache: Vec::new(),
            pops: Vec::new(),
            collective_events: Vec::new(),
            trace_mark: None,
            pin_below: None,
            placements: placements::FollowPlacements::default(),
            releases: releases::ReleaseCopies::default(),
            elide_syncs: true,
            time_stalls: false,
            last_syncs: (0, 0),
            poll_in_order: true,
            polling_in_order: false,
            last_polled: 0,
            last_copy_waits: (0, 0),
            last_deferred: (0, 0),
        }
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    pub fn add_tensor(&mut self, size: u64, kind: TensorKind, name: &str) -> Result<u64> {
        let id = self.graph.add_tensor(size, kind, name)?;
        self.store.add_tensor();
        self.has_contents.push(false);
        Ok(id)
    }

    /// True when the graph runs from a planned arena (planned mode and the plan fits).
    pub fn is_planned(&self) -> bool {
        self.arena.is_some()
    }

    /// Pool bytes this graph's tensors hold on the device between runs (persistent tensors on
    /// the device, rounded as the pool rounds) — what `allocated_bytes` returns to after a run.
    pub fn resident_bytes(&self) -> u64 {
        let arena = match (&self.arena, self.store.arena()) {
            (Some(layout), Some(_)) => layout.size,
            _ => 0,
        };
        let tensors = self.graph.tensors();
        self.store
            .iter()
            .zip(tensors)
            .filter(|(m, t)| m.device().is_some() && !m.is_bound() && t.kind.persists())
            .map(|(_, t)| crate::graph::liveness::round_up(t.size, ALIGNMENT))
            .sum::<u64>()
            + crate::graph::liveness::round_up(arena, ALIGNMENT)
    }

    /// How many runs replayed a captured CUDA graph (a planned graph's second run captures and
    /// replays; later runs replay). 0 on backends without capture.
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// The swap plan, when the graph's working set exceeds the budget.
    pub fn swap_plan(&self) -> Option<&SwapPlan> {
        self.swap.as_ref()
    }

    /// Starts (or stops) recording the pool calls each run makes (`last_pool_calls`).
    pub fn record_pool_calls(&mut self, on: bool) {
        self.pool_calls = on.then(Vec::new);
    }

    /// The pool calls the last run made, while recording.
    pub fn last_pool_calls(&self) -> Option<&[PoolCall]> {
        self.pool_calls.as_deref()
    }

    /// How often the last run left its program's order (the fallback: evictions, a batch taken
    /// again, deferred returns); 0 means it made exactly the program's pool calls.
    /// Whether runs leave out the compute-stream records and waits the streams' order implies
    /// (`exec/stream_order.rs`; `GKRT_EXEC_ELIDE` at finalize, on by default): for tests and
    /// side-by-side measurements. Results are the same bits either way.
    pub fn elide_implied_syncs(&mut self, on: bool) {
        self.elide_syncs = on;
    }

    /// Whether runs time the compute stream's waits on copies (`GKRT_EXEC_TIME_STALLS` at
    /// finalize, off by default): for tests and side-by-side measurements. Off, the runtime's
    /// `copy_wait_ns` does not grow; results are the same bits either way.
    pub fn time_copy_waits(&mut self, on: bool) {
        self.time_stalls = on;
    }

    /// The last run's records and waits queued on the compute stream besides its kernels, and
    /// those left out as implied (`RunCounters::compute_syncs`, `syncs_elided`).
    pub fn last_run_syncs(&self) -> (u64, u64) {
        self.last_syncs
    }

    /// The last run's waits on the copy streams for other copies, queued and left out as
    /// implied (`RunCounters::copy_waits`, `copy_waits_elided`).
    pub fn last_run_copy_waits(&self) -> (u64, u64) {
        self.last_copy_waits
    }

    /// Whether swapping runs without a release schedule poll the copies' events oldest first
    /// and stop at the first still running (`exec/poll.rs`; `GKRT_EXEC_POLL_IN_ORDER` at
    /// finalize, on by default), or leave polling to the pool (every pending event before every
    /// allocation). For tests and side-by-side measurements.
    pub fn poll_copies_in_order(&mut self, on: bool) {
        self.poll_in_order = on;
    }

    /// The events the last run's executor queried to give back blocks pending on copies (0
    /// when the pool polled them itself).
    pub fn last_run_events_polled(&self) -> u64 {
        self.last_polled
    }

    pub fn last_run_fallbacks(&self) -> u64 {
        self.last_fallbacks
    }

    /// The pool calls the dry run of the current program makes: what a run that goes as planned
    /// makes, from the plan's canonical start (a swapping graph's runs after its first).
    pub fn planned_pool_calls(&self) -> Vec<PoolCall> {
        PoolWalk::new(self.graph.tensors(), self.graph.nodes(), &self.program)
            .run_calls()
            .to_vec()
    }
}
