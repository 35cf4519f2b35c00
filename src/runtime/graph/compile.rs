//! Finalize: liveness, then the arena or the swap plan, and the step program compiled from them.

use super::{Replay, RuntimeGraph};
use crate::kernels::Kernel;
use crate::plan::plan_graph_arena;
use crate::plan::program::Program;
use crate::plan::swap::{Policy, SwapPlan};
use crate::plan::swap_candidates::fitted_candidates_with;
use crate::plan::swap_fit::fits_pool;
use crate::runtime::{Error, MemoryMode, Result, ALIGNMENT};
use std::sync::Arc;

/// How long finalize may search for a smaller arena than the greedy one.
const ARENA_SEARCH_TIME: std::time::Duration = std::time::Duration::from_millis(50);
impl RuntimeGraph {
    /// Finalizes the graph: liveness, then the arena or swap plan. On failure the graph is left
    /// as it was, unfinalized, so that it can neither run a half-made plan nor hide the error.
    pub fn finalize(&mut self) -> Result<()> {
        if self.graph.is_finalized() {
            return Err(Error::InvalidState(
                "the graph is finalized already; it can no longer be changed".into(),
            ));
        }
        let mut result = self.compile();
        if result.is_ok() {
            // The names its blocks carry in snapshots.
            result = self.runtime.lock_for_call().map(|mut st| {
                let base = st.labels.register(&self.graph);
                self.store.set_label_base(base);
            });
        }
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
    pub(super) fn recompile(&mut self) {
        // (Placements and release schedules belong to a program: the next run makes its own.)
        self.placements.current = None;
        self.releases.current = None;
        let lv = self.graph.liveness().expect("finalized");
        self.program = Program::compile_fused(
            self.graph.tensors(),
            self.graph.nodes(),
            lv,
            self.swap.as_ref(),
            self.arena.as_ref(),
            // In planned mode fused members are arena intermediates at their group's offsets.
            if self.arena.is_some() {
                &[]
            } else {
                self.graph.fused_groups()
            },
        );
    }

    /// The swap plan `plan` from now on, and its program.
    pub(super) fn set_swap_plan(&mut self, plan: SwapPlan) {
        self.swap = Some(plan);
        self.recompile();
    }

    pub(super) fn compile(&mut self) -> Result<()> {
        let rt = Arc::clone(&self.runtime);
        // (Runs that give copy-outs' blocks back as scheduled find the dry run's placements.)
        self.releases.on = crate::runtime::env::swap_release();
        self.releases.hold_markers = crate::runtime::env::swap_release_hold_markers();
        self.releases.clean_start = crate::runtime::env::swap_release_clean_start();
        self.elide_syncs = crate::runtime::env::exec_elide();
        self.time_stalls = crate::runtime::env::exec_time_stalls();
        self.poll_in_order = crate::runtime::env::exec_poll_in_order();
        self.placements.on = crate::runtime::env::swap_placements() && !self.releases.on;
        let limit = rt.lock_for_call()?.pool.memory_limit();
        let (first, cap) = self.bucket_bytes;
        let absorbed = self.graph.fuse_all_reduces(first, cap);
        if absorbed > 0 {
            log::info!("{absorbed} all-reduce nodes fused into the buckets of later ones");
        }
        let lv = self.graph.finalize(ALIGNMENT)?;
        let (persistent, peak) = (lv.persistent_bytes, lv.peak_transient_bytes);
        let collectives = self.graph.has_collectives();
        if collectives {
            self.make_collective_events()?;
        }
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
                self.arena = Some(layout);
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
        // (Collectives are captured too: the events ordering the communication stream after the
        // compute stream, and the compute stream's waits for them, bring it into the capture.)
        self.recompile();
        Ok(())
    }

    /// Plans swaps for what the pool leaves this graph, checked by a dry run of the pool; when
    /// the dry run fails (fragmentation), plans again for a smaller budget. Each candidate
    /// policy is lowered the same way, on its own, so that a dry run failed by the default
    /// plan's budget does not take the better plans out of the choice.
    pub(super) fn make_swap_plan(&self, limit: u64) -> Result<(SwapPlan, Vec<(Policy, SwapPlan)>)> {
        let rt = &self.runtime;
        let mut st = rt.lock_for_call()?;
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        // Collectives' tensors and fused blocks stay on the device while a collective may
        // touch them (`plan::swap_holds`).
        let fused = self.graph.fused_groups();
        prime_virtual_range(rt, &mut st)?;
        // (`GKRT_SWAP_BUDGET_PERMILLE` may keep some of it back as headroom for the pool.)
        let left = limit.saturating_sub(st.pool.stats().allocated_bytes);
        let permille = crate::runtime::env::swap_budget_permille();
        let available = (left as u128 * permille as u128 / 1000) as u64;
        let check = |plan: &SwapPlan| {
            let program = Program::compile_fused(tensors, nodes, lv, Some(plan), None, fused);
            fits_pool(tensors, nodes, &program, &st.pool, rt.compute, &[])
        };
        let graph = (tensors, nodes, lv, fused);
        let knobs = self.swap_knobs(&st.pool);
        let (plan, mut candidates) =
            fitted_candidates_with(graph, available, ALIGNMENT, knobs, check);
        // A node the plan could not fit may still run (the fallback makes room); only one whose
        // own buffers exceed what the limit leaves cannot.
        for &n in &plan.infeasible_nodes {
            let node = &nodes[n as usize];
            let own = crate::plan::min_limit::node_own_bytes(tensors, node, ALIGNMENT);
            if own <= left {
                continue;
            }
            log::warn!(
                "{}: its own inputs, outputs and workspaces take {own} bytes, more than \
                 the {left} bytes the memory limit of {limit} leaves this graph; runs will fail there",
                node.describe(n)
            );
        }
        log::info!(
            "swap plan: working set {} bytes over a budget of {} bytes ({permille}/1000 of the {left} the limit \
             leaves; planned for {}); per run {} bytes out, {} in",
            lv.persistent_bytes + lv.peak_transient_bytes,
            available,
            plan.budget,
            plan.bytes_out,
            plan.bytes_in
        );
        if candidates.len() < 2 {
            candidates.clear();
        }
        Ok((plan, candidates))
    }
}

/// On a device with virtual memory, gives the pool its address range before the swap plan's
/// dry run if it has none yet (one small block taken and given back), so the dry run simulates
/// the virtual range the run will allocate from. A fresh pool's dry run would simulate plain
/// segments (one per large tensor, each released and taken again under the limit): on GPT-2's
/// training step at a third of its working set that failed until the budget was lowered to 72%
/// of the limit (`plan::gpt2_shape_tests`), while the range fits at 94%.
fn prime_virtual_range(rt: &crate::runtime::Runtime, st: &mut crate::runtime::State) -> Result<()> {
    let device = rt.device();
    if !st.pool.config().vmm
        || device.virtual_memory().is_none()
        || st.pool.stats().segment_count > 0
    {
        return Ok(());
    }
    let backing = crate::memory::DeviceBacking(device);
    let block = st.pool.alloc(&backing, ALIGNMENT, rt.compute)?;
    st.pool.free(&backing, block)?;
    Ok(())
}
