//! A graph bound to its runtime: the memory of its tensors (residency, device blocks, host
//! slots), its plans (arena, swap), its captured replay, and the run / write / read entry points.

use super::{Error, MemoryMode, Result, Runtime, ALIGNMENT};
use crate::device::{DevPtr, DeviceError, EventId, GraphExecId};
use crate::exec::{ExecTarget, Executor, RunProfile};
use crate::graph::{Graph, TensorKind};
use crate::kernels::Kernel;
use crate::memory::residency::{Residency, TensorMemory};
use crate::memory::{DeviceBacking, PinnedBacking};
use crate::plan::program::{PoolCall, PoolWalk, Program};
use crate::plan::swap::{candidates, check_with_pool, plan_swaps, Policy, SwapPlan};
use crate::plan::swap_model::{choose, estimate, Link};
use crate::plan::{plan_graph_arena, ArenaLayout};
use std::sync::Arc;

/// How long finalize may search for a smaller arena than the greedy one.
const ARENA_SEARCH_TIME: std::time::Duration = std::time::Duration::from_millis(50);

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
    /// Where each tensor is; persistent tensors keep their memory until the graph is released.
    mem: Vec<TensorMemory>,
    /// Per tensor: holds meaningful contents (written by the host, or produced by a run).
    has_contents: Vec<bool>,
    /// Planned mode: the layout chosen at finalize, and the arena once the first run took it.
    arena: Option<(ArenaLayout, Option<DevPtr>)>,
    /// Made at finalize when the working set exceeds the budget.
    swap: Option<SwapPlan>,
    /// The plans of the other swap policies (each passed the pool's dry run), default first:
    /// the first successful run is timed and the plan the timeline model finds fastest on
    /// those timings replaces the default (`tune_swap_plan`).
    swap_candidates: Vec<(Policy, SwapPlan)>,
    /// Timing events of that run.
    profile: RunProfile,
    /// The plan was chosen (by the timed run, or by `use_swap_policy`).
    swap_chosen: bool,
    replay: Replay,
    successful_runs: u64,
    /// What a run executes: compiled at finalize, and again whenever the swap plan changes.
    program: Program,
    /// The pool calls of the last run, while `record_pool_calls` is on.
    pool_calls: Option<Vec<PoolCall>>,
}

impl RuntimeGraph {
    pub fn new(runtime: Arc<Runtime>) -> RuntimeGraph {
        RuntimeGraph {
            runtime,
            graph: Graph::new(),
            mem: Vec::new(),
            has_contents: Vec::new(),
            arena: None,
            swap: None,
            swap_candidates: Vec::new(),
            profile: RunProfile::default(),
            swap_chosen: false,
            replay: Replay::NotYet,
            successful_runs: 0,
            program: Program::default(),
            pool_calls: None,
        }
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    pub fn add_tensor(&mut self, size: u64, kind: TensorKind, name: &str) -> Result<u64> {
        let id = self.graph.add_tensor(size, kind, name)?;
        self.mem.push(TensorMemory::default());
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
        let arena = self
            .arena
            .as_ref()
            .and_then(|(l, base)| base.map(|_| l.size))
            .unwrap_or(0);
        let tensors = self.graph.tensors();
        self.mem
            .iter()
            .zip(tensors)
            .filter(|(m, t)| m.device().is_some() && t.kind.persists())
            .map(|(_, t)| crate::graph::liveness::round_up(t.size, ALIGNMENT))
            .sum::<u64>()
            + crate::graph::liveness::round_up(arena, ALIGNMENT)
    }

    /// The swap plan, when the graph's working set exceeds the budget.
    pub fn swap_plan(&self) -> Option<&SwapPlan> {
        self.swap.as_ref()
    }

    /// Finalizes the graph: liveness, then the arena or swap plan. On failure the graph is left
    /// as it was, unfinalized, so that it can neither run a half-made plan nor hide the error.
    pub fn finalize(&mut self) -> Result<()> {
        if self.graph.is_finalized() {
            return Err(Error::InvalidState(
                "the graph is finalized already; it can no longer be changed".into(),
            ));
        }
        let result = self.compile();
        if result.is_err() {
            self.graph.unfinalize();
            self.arena = None;
            self.swap = None;
            self.swap_candidates.clear();
            self.replay = Replay::NotYet;
            self.program = Program::default();
        }
        result
    }

    /// Compiles the step program for the current liveness, arena and swap plan.
    fn recompile(&mut self) {
        let lv = self.graph.liveness().expect("finalized");
        self.program = Program::compile(
            self.graph.tensors(),
            self.graph.nodes(),
            lv,
            self.swap.as_ref(),
            self.arena.as_ref().map(|(layout, _)| layout),
        );
    }

    /// The swap plan `plan` from now on, and its program.
    fn set_swap_plan(&mut self, plan: SwapPlan) {
        self.swap = Some(plan);
        self.recompile();
    }

    /// Starts (or stops) recording the pool calls each run makes (`last_pool_calls`).
    pub fn record_pool_calls(&mut self, on: bool) {
        self.pool_calls = on.then(Vec::new);
    }

    /// The pool calls the last run made, while recording.
    pub fn last_pool_calls(&self) -> Option<&[PoolCall]> {
        self.pool_calls.as_deref()
    }

    /// The pool calls the dry run of the current program makes: what a run that goes as planned
    /// makes, from the plan's canonical start (a swapping graph's runs after its first).
    pub fn planned_pool_calls(&self) -> Vec<PoolCall> {
        PoolWalk::new(self.graph.tensors(), self.graph.nodes(), &self.program)
            .run_calls()
            .to_vec()
    }

    fn compile(&mut self) -> Result<()> {
        let rt = Arc::clone(&self.runtime);
        let limit = rt.lock_for_call()?.pool.memory_limit();
        let lv = self.graph.finalize(ALIGNMENT)?;
        let (persistent, peak) = (lv.persistent_bytes, lv.peak_transient_bytes);
        if rt.config().memory_mode == MemoryMode::Planned {
            let layout = plan_graph_arena(&self.graph, ALIGNMENT, ARENA_SEARCH_TIME)
                .map_err(Error::Internal)?;
            if persistent + layout.size > limit {
                log::warn!(
                    "planned mode: arena of {} bytes plus {persistent} persistent bytes exceeds the memory limit \
                     {limit}; this graph runs in dynamic mode (with swapping)",
                    layout.size
                );
            } else {
                log::info!(
                    "planned mode: arena of {} bytes for a transient peak of {} bytes ({:.4}x)",
                    layout.size,
                    layout.lower_bound,
                    layout.size as f64 / layout.lower_bound.max(1) as f64
                );
                self.arena = Some((layout, None));
            }
        }
        if self.arena.is_none() && persistent + peak > limit {
            let (plan, candidates) = self.make_swap_plan(limit)?;
            self.swap = Some(plan);
            self.swap_candidates = candidates;
        }
        if !self.is_planned() || !rt.device.supports_capture() {
            self.replay = Replay::Off;
        } else if self
            .graph
            .nodes()
            .iter()
            .any(|n| matches!(n.kernel, Kernel::Callback(_)))
        {
            log::info!(
                "planned graph not captured for replay: host callbacks run on the host when a node is queued, \
                 so a replayed capture would skip them"
            );
            self.replay = Replay::Off;
        }
        self.recompile();
        Ok(())
    }

    /// Plans swaps for what the pool leaves this graph, checked by a dry run of the pool; when
    /// the dry run fails (fragmentation), plans again for a smaller budget.
    fn make_swap_plan(&self, limit: u64) -> Result<(SwapPlan, Vec<(Policy, SwapPlan)>)> {
        let rt = &self.runtime;
        let st = rt.lock_for_call()?;
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let available = limit.saturating_sub(st.pool.stats().allocated_bytes);
        let mut budget = available;
        let mut plan = plan_swaps(tensors, nodes, lv, budget, ALIGNMENT);
        let check = |plan: &SwapPlan| {
            let program = Program::compile(tensors, nodes, lv, Some(plan), None);
            check_with_pool(tensors, nodes, &program, &st.pool, rt.compute)
        };
        for _ in 0..8 {
            match check(&plan) {
                Ok(()) => break,
                Err(node) => {
                    log::debug!("swap plan for {budget} bytes fails the pool's dry run at node {node}; replanning");
                    budget -= budget / 16;
                    plan = plan_swaps(tensors, nodes, lv, budget, ALIGNMENT);
                }
            }
        }
        for &n in &plan.infeasible_nodes {
            log::warn!("node {n}: its own inputs, outputs and workspaces exceed the memory budget; runs will fail there");
        }
        log::info!(
            "swap plan: working set {} bytes over a budget of {} bytes (planned for {}); per run {} bytes out, {} in",
            lv.persistent_bytes + lv.peak_transient_bytes,
            available,
            plan.budget,
            plan.bytes_out,
            plan.bytes_in
        );
        let mut candidates = candidates(tensors, nodes, lv, plan.budget, ALIGNMENT);
        candidates.retain(|(_, p)| {
            *p == plan
                || (p.infeasible_nodes.len() <= plan.infeasible_nodes.len() && check(p).is_ok())
        });
        if candidates.len() < 2 {
            candidates.clear();
        }
        Ok((plan, candidates))
    }

    /// The swap policies among which the first run's timings choose (default first); empty
    /// when the graph does not swap or only one plan exists.
    pub fn swap_policies(&self) -> Vec<Policy> {
        self.swap_candidates.iter().map(|(p, _)| *p).collect()
    }

    /// Runs with the plan of `policy` (one of `swap_policies`) from the next run on, and stops
    /// the choice by timings: for experiments, and for tests that must cover every plan.
    pub fn use_swap_policy(&mut self, policy: Policy) -> Result<()> {
        let Some(i) = self.swap_candidates.iter().position(|(p, _)| *p == policy) else {
            return Err(Error::InvalidArgument(format!(
                "swap policy {policy:?} is not among this graph's candidates {:?}",
                self.swap_policies()
            )));
        };
        self.set_swap_plan(self.swap_candidates[i].1.clone());
        self.swap_chosen = true;
        Ok(())
    }

    /// After the timed first run: estimate every candidate plan with the measured node times
    /// and link bandwidths, and switch to the fastest (the executor moves persistent tensors
    /// to the new plan's starting state at the next run).
    fn tune_swap_plan(&mut self, device: &dyn crate::device::Device) {
        let candidates = &self.swap_candidates;
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let timed = |(a, b): (EventId, EventId)| device.event_elapsed_ms(a, b).map(f64::from);
        let Some(pairs) = self.profile.nodes.get(..nodes.len()) else {
            return; // not every node was timed
        };
        let cost: std::result::Result<Vec<f64>, _> = pairs.iter().map(|&p| timed(p)).collect();
        let mut moved = [(0u64, 0.0f64); 2]; // (bytes, ms): out, in
        let mut copies_ok = true;
        for &(a, b, bytes, incoming) in &self.profile.copies {
            match timed((a, b)) {
                Ok(ms) => {
                    moved[incoming as usize].0 += bytes;
                    moved[incoming as usize].1 += ms;
                }
                Err(_) => copies_ok = false,
            }
        }
        let gbps = |(bytes, ms): (u64, f64)| (ms > 0.0).then(|| bytes as f64 / (ms * 1e6));
        let (Ok(cost), true) = (cost, copies_ok) else {
            log::warn!("swap plan not tuned: the first run's timing events could not be read");
            return;
        };
        let (out, inc) = (gbps(moved[0]), gbps(moved[1]));
        let Some(either) = out.or(inc) else {
            return; // nothing moved: every plan is as good
        };
        let link = Link {
            in_gbps: inc.unwrap_or(either),
            out_gbps: out.unwrap_or(either),
        };
        let estimates: Vec<_> = candidates
            .iter()
            .map(|(_, p)| {
                let program = Program::compile(tensors, nodes, lv, Some(p), None);
                estimate(tensors, nodes, &program, &cost, link, ALIGNMENT)
            })
            .collect();
        let best = choose(&estimates);
        for ((policy, plan), e) in candidates.iter().zip(&estimates) {
            log::debug!(
                "swap candidate {policy:?}: estimated step {:.2} ms (compute waits {:.2} ms), {} bytes out, {} in",
                e.step_ms,
                e.compute_waited_ms,
                plan.bytes_out,
                plan.bytes_in
            );
        }
        log::info!(
            "swap plan tuned on the first run (nodes {:.2} ms, link in {:.1} / out {:.1} GB/s): {:?}, estimated \
             step {:.2} ms against {:.2} ms for the default plan; per run {} bytes out, {} in",
            cost.iter().sum::<f64>(),
            link.in_gbps,
            link.out_gbps,
            candidates[best].0,
            estimates[best].step_ms,
            estimates[0].step_ms,
            candidates[best].1.bytes_out,
            candidates[best].1.bytes_in
        );
        if best != 0 {
            self.set_swap_plan(candidates[best].1.clone());
        }
    }

    /// Appends the last profiled run's measured timeline to `path` (CSV: run, `node` / `in` /
    /// `out`, node index or copy bytes, start and end in ms from the first node's start), for
    /// `scripts/gpu/timeline.py`.
    fn write_timeline(&self, device: &dyn crate::device::Device, path: &str) -> Result<()> {
        use std::io::Write;
        let Some(&(zero, _)) = self.profile.nodes.first() else {
            return Ok(());
        };
        let at = |e: EventId| -> Result<f64> {
            // Events before the first node's start give negative offsets.
            match device.event_elapsed_ms(zero, e) {
                Ok(ms) => Ok(f64::from(ms)),
                Err(_) => Ok(-f64::from(device.event_elapsed_ms(e, zero)?)),
            }
        };
        let run = self.successful_runs;
        let mut text = String::new();
        let n = self.graph.nodes().len().min(self.profile.nodes.len());
        for (i, &(a, b)) in self.profile.nodes[..n].iter().enumerate() {
            text += &format!("{run},node,{i},{:.4},{:.4}\n", at(a)?, at(b)?);
        }
        for &(a, b, bytes, incoming) in &self.profile.copies {
            let dir = if incoming { "in" } else { "out" };
            text += &format!("{run},{dir},{bytes},{:.4},{:.4}\n", at(a)?, at(b)?);
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::InvalidArgument(format!("{path}: {e}")))?;
        f.write_all(text.as_bytes())
            .map_err(|e| Error::InvalidArgument(format!("{path}: {e}")))
    }

    fn persistent_index(&self, id: u64, verb: &str) -> Result<u32> {
        let t = self.graph.tensor_index(id)?;
        let tensor = &self.graph.tensors()[t as usize];
        if !tensor.kind.persists() {
            return Err(Error::InvalidArgument(format!(
                "cannot {verb} {}: intermediates live only inside a run; make it an output to read it",
                tensor.describe(t)
            )));
        }
        Ok(t)
    }

    /// Checks a host copy of `size` bytes against a persistent tensor before any host memory
    /// is touched (the C API calls this before it makes a slice of the caller's buffer).
    pub fn check_io(&self, id: u64, size: u64, verb: &str) -> Result<()> {
        let t = self.persistent_index(id, verb)?;
        self.check_size(t, size, verb)
    }

    fn check_size(&self, t: u32, size: u64, verb: &str) -> Result<()> {
        let tensor = &self.graph.tensors()[t as usize];
        if size != tensor.size {
            return Err(Error::InvalidArgument(format!(
                "{verb} of {size} bytes does not match {}",
                tensor.describe(t)
            )));
        }
        Ok(())
    }

    /// Waits (on the host) until no copy of `t` is in flight, so its host slot and device
    /// block can be touched directly.
    fn settle(&mut self, t: u32) -> Result<()> {
        let rt = &self.runtime;
        let m = &mut self.mem[t as usize];
        for event in [m.event(false), m.event(true)].into_iter().flatten() {
            rt.device.event_synchronize(event)?;
        }
        m.land();
        Ok(())
    }

    /// Copies `data` into a persistent tensor. A tensor on the device is written there; one on
    /// the host (or, in a swapping graph, one never written) is written into its pinned slot.
    pub fn write(&mut self, id: u64, data: &[u8]) -> Result<()> {
        let t = self.persistent_index(id, "write")?;
        self.check_size(t, data.len() as u64, "write")?;
        self.settle(t)?;
        let rt = Arc::clone(&self.runtime);
        let mut st = rt.lock_for_call()?;
        let bytes = data.len() as u64;
        let to_host = match self.mem[t as usize].state() {
            Residency::OnHost => true,
            Residency::Unallocated => self.swap.is_some(),
            _ => false,
        };
        let m = &mut self.mem[t as usize];
        if to_host {
            let slot = match m.host() {
                Some(slot) => slot,
                None => {
                    let slot = st.pinned.alloc(
                        &PinnedBacking(rt.device()),
                        bytes,
                        crate::device::StreamId(0),
                    )?;
                    m.give_host_slot(slot);
                    slot
                }
            };
            // SAFETY: the slot holds `bytes` bytes and no copy uses it (settled above).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), slot as *mut u8, data.len()) };
            m.written_on_host();
        } else {
            let ptr = match m.device() {
                Some(p) => p,
                None => st
                    .pool
                    .alloc(&DeviceBacking(rt.device()), bytes, rt.compute)?,
            };
            m.placed(ptr);
            m.overwritten();
            // SAFETY: `data` outlives the copy: the stream is synchronised before we return.
            unsafe {
                rt.device
                    .copy_h2d_async(ptr, data.as_ptr(), bytes, rt.compute)?
            };
            rt.device.stream_synchronize(rt.compute)?;
        }
        self.has_contents[t as usize] = true;
        Ok(())
    }

    /// Copies a persistent tensor's contents into `out`, from wherever they are.
    pub fn read(&mut self, id: u64, out: &mut [u8]) -> Result<()> {
        let t = self.persistent_index(id, "read")?;
        self.check_size(t, out.len() as u64, "read")?;
        if !self.has_contents[t as usize] {
            return Err(Error::InvalidState(format!(
                "{} has no contents yet: write it or run the graph first",
                self.graph.tensors()[t as usize].describe(t)
            )));
        }
        self.settle(t)?;
        let rt = &self.runtime;
        let _st = rt.lock_for_call()?;
        let m = &self.mem[t as usize];
        match (m.state(), m.device(), m.host()) {
            (Residency::OnDevice, Some(ptr), _) => {
                // SAFETY: `out` outlives the copy: the stream is synchronised before we return.
                unsafe {
                    rt.device
                        .copy_d2h_async(out.as_mut_ptr(), ptr, out.len() as u64, rt.compute)?
                };
                rt.device.stream_synchronize(rt.compute)?;
            }
            (Residency::OnHost, _, Some(slot)) if m.host_valid() => {
                // SAFETY: the slot holds the tensor's bytes and no copy uses it (settled above).
                unsafe {
                    std::ptr::copy_nonoverlapping(slot as *const u8, out.as_mut_ptr(), out.len())
                };
            }
            (state, _, _) => {
                return Err(Error::Internal(format!(
                    "{} is marked as holding contents but is {state:?}",
                    self.graph.tensors()[t as usize].describe(t)
                )))
            }
        }
        Ok(())
    }

    /// Runs the graph once. On failure no node is re-run, every transient buffer is back in the
    /// pool, and the runtime and graph stay usable.
    pub fn run(&mut self) -> Result<()> {
        if !self.graph.is_finalized() {
            return Err(Error::InvalidState(
                "the graph must be finalized before it runs".into(),
            ));
        }
        let lv = self.graph.liveness().expect("finalized");
        for (t, tensor) in self.graph.tensors().iter().enumerate() {
            let read_first = lv.first_use[t]
                .is_some_and(|n| self.graph.nodes()[n as usize].inputs.contains(&(t as u32)));
            if tensor.kind.host_written() && read_first && !self.has_contents[t] {
                return Err(Error::InvalidState(format!(
                    "{} is read by node {} but was never written",
                    tensor.describe(t as u32),
                    lv.first_use[t].unwrap()
                )));
            }
        }
        let rt = Arc::clone(&self.runtime);
        let mut guard = rt.lock_for_call()?;
        let st = &mut *guard;
        // Planned mode takes its arena from the pool once, at the first run, and keeps it.
        if let Some((layout, base @ None)) = &mut self.arena {
            if layout.size > 0 {
                *base = Some(
                    st.pool
                        .alloc(&DeviceBacking(rt.device()), layout.size, rt.compute)
                        .map_err(|e| {
                            Error::from(e).context(format!(
                                "allocating the planned arena of {} bytes",
                                layout.size
                            ))
                        })?,
                );
            }
        }
        let capture =
            self.replay == Replay::NotYet && self.successful_runs > 0 && begin_capture(&rt);
        if self.replay == Replay::NotYet && self.successful_runs > 0 && !capture {
            self.replay = Replay::Off;
        }
        let mut counters;
        let mut queued = match self.replay {
            Replay::Captured(exec_graph) => {
                counters = crate::exec::RunCounters {
                    nodes: self.graph.nodes().len() as u64,
                    ..Default::default()
                };
                rt.device
                    .launch_graph(exec_graph, rt.compute)
                    .map_err(Error::from)
            }
            _ => {
                let r;
                (r, counters) = self.execute(&rt, st);
                r
            }
        };
        if capture {
            match (rt.device.end_capture(rt.compute), &queued) {
                (Ok(exec_graph), Ok(())) => {
                    self.replay = Replay::Captured(exec_graph);
                    queued = rt
                        .device
                        .launch_graph(exec_graph, rt.compute)
                        .map_err(Error::from);
                }
                (Ok(exec_graph), Err(_)) => {
                    let _ = rt.device.destroy_graph(exec_graph);
                }
                (Err(e), _) => {
                    // The work was recorded, not run: run it the ordinary way.
                    log::warn!("planned graph not captured for replay: {e}");
                    self.replay = Replay::Off;
                    (queued, counters) = self.execute(&rt, st);
                }
            }
        }
        // Wait even after a queueing error: asynchronous failures must be collected now, and
        // copies must be done before their tensors are touched again.
        let mut finished = Ok(());
        for s in [rt.streams.compute, rt.streams.copy_in, rt.streams.copy_out] {
            let r = rt.device.stream_synchronize(s).map_err(|e| match e {
                DeviceError::Async(m) => Error::CallbackFailed(m),
                other => Error::from(other),
            });
            if finished.is_ok() {
                finished = r;
            }
        }
        let mut wait_ms = 0.0f64;
        for &(start, end) in &st.stall_pairs[..counters.stall_pairs_used] {
            wait_ms += rt.device.event_elapsed_ms(start, end).unwrap_or(0.0) as f64;
        }
        st.counters.add_run(&counters, (wait_ms * 1e6) as u64);
        // Every copy is done: in-flight states have landed.
        for m in &mut self.mem {
            m.land();
        }
        queued?;
        finished?;
        self.successful_runs += 1;
        if let (Some(path), Some(_)) = (super::env::swap_timeline(), &self.swap) {
            if let Err(e) = self.write_timeline(rt.device(), path) {
                log::warn!("swap timeline not written to {path}: {e}");
            }
        }
        if self.swap.is_some() && !self.swap_candidates.is_empty() && !self.swap_chosen {
            self.swap_chosen = true;
            self.tune_swap_plan(rt.device());
            // Runs end in the plan's start state, a new plan's too. The run itself succeeded:
            // a failure here is only logged (the next run's start retries the move).
            let (r, _) =
                self.execute_with(&rt, st, |exec, graph| exec.enter_start_state(graph), false);
            let synced = rt.device.stream_synchronize(rt.streams.copy_out);
            if let Err(e) = r.and(synced.map_err(Error::from)) {
                log::warn!("moving tensors to the tuned swap plan's starting state: {e}");
            }
            for m in &mut self.mem {
                m.land();
            }
        }
        for (t, tensor) in self.graph.tensors().iter().enumerate() {
            if tensor.kind.persists() && self.mem[t].has_data() {
                self.has_contents[t] = true;
            }
        }
        Ok(())
    }
}

impl RuntimeGraph {
    /// Queues one run through the executor (the state lock is held by the caller).
    fn execute(
        &mut self,
        rt: &Runtime,
        st: &mut super::State,
    ) -> (Result<()>, crate::exec::RunCounters) {
        let profiled = self.swap.is_some()
            && ((!self.swap_candidates.is_empty() && !self.swap_chosen)
                || super::env::swap_timeline().is_some());
        self.execute_with(rt, st, |exec, graph| exec.run(graph), profiled)
    }

    /// `what` through an executor over this graph's state (the state lock is held by the caller).
    fn execute_with(
        &mut self,
        rt: &Runtime,
        st: &mut super::State,
        what: impl FnOnce(&mut Executor<'_>, &Graph) -> Result<()>,
        profiled: bool,
    ) -> (Result<()>, crate::exec::RunCounters) {
        if let Some(calls) = &mut self.pool_calls {
            calls.clear();
        }
        let mut exec = Executor::new(
            ExecTarget {
                device: rt.device(),
                streams: rt.streams,
                pool: &mut st.pool,
                pinned: &mut st.pinned,
                program: &self.program,
                arena: self.arena.as_ref().and_then(|(_, base)| *base),
                mem: &mut self.mem,
                stall_pairs: &mut st.stall_pairs,
            },
            profiled.then_some(&mut self.profile),
            self.pool_calls.as_mut(),
        );
        let r = what(&mut exec, &self.graph);
        (r, exec.counters)
    }
}

/// Starts capturing the compute stream; on failure logs why and returns false.
fn begin_capture(rt: &Runtime) -> bool {
    match rt.device.begin_capture(rt.compute) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("planned graph not captured for replay: {e}");
            false
        }
    }
}

impl Drop for RuntimeGraph {
    fn drop(&mut self) {
        let rt = Arc::clone(&self.runtime);
        let _ = rt.drain();
        if let Replay::Captured(exec_graph) = self.replay {
            let _ = rt.device.destroy_graph(exec_graph);
        }
        let mut st = rt.lock();
        let st = &mut *st;
        let arena = self.arena.as_mut().and_then(|(_, base)| base.take());
        for event in self.profile.events() {
            let _ = rt.device.destroy_event(event);
        }
        let mut blocks: Vec<DevPtr> = arena.into_iter().collect();
        for m in &mut self.mem {
            for event in m.take_events() {
                let _ = rt.device.destroy_event(event);
            }
            let (device, host) = m.discard();
            blocks.extend(device);
            if let Some(slot) = host {
                if let Err(e) = st.pinned.free(&PinnedBacking(rt.device()), slot) {
                    log::error!("releasing a graph's host slot: {e}");
                }
            }
        }
        for ptr in blocks {
            if let Err(e) = st.pool.free(&DeviceBacking(rt.device()), ptr) {
                log::error!("releasing a graph's tensor: {e}");
            }
        }
        // Blocks freed pending on this graph's (now destroyed, completed) events are free.
        for event in st.pool.pending_events() {
            st.pool.assume_complete(event);
        }
        for event in st.pinned.pending_events() {
            st.pinned.assume_complete(event);
        }
    }
}
