//! Finalize: liveness, then the arena or the swap plan, and the step program compiled from them.

use super::{Replay, RuntimeGraph};
use crate::kernels::Kernel;
use crate::plan::plan_graph_arena;
use crate::plan::program::Program;
use crate::plan::swap::{candidates_fused, check_with_pool, plan_swaps_fused, Policy, SwapPlan};
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
    /// the dry run fails (fragmentation), plans again for a smaller budget.
    pub(super) fn make_swap_plan(&self, limit: u64) -> Result<(SwapPlan, Vec<(Policy, SwapPlan)>)> {
        let rt = &self.runtime;
        let st = rt.lock_for_call()?;
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        // Collectives' tensors and fused blocks stay on the device while a collective may
        // touch them (`plan::swap_holds`).
        let fused = self.graph.fused_groups();
        let available = limit.saturating_sub(st.pool.stats().allocated_bytes);
        let mut budget = available;
        let mut plan = plan_swaps_fused(tensors, nodes, lv, fused, budget, ALIGNMENT);
        let check = |plan: &SwapPlan| {
            let program = Program::compile_fused(tensors, nodes, lv, Some(plan), None, fused);
            check_with_pool(tensors, nodes, &program, &st.pool, rt.compute)
        };
        for _ in 0..8 {
            match check(&plan) {
                Ok(()) => break,
                Err(node) => {
                    log::debug!("swap plan for {budget} bytes fails the pool's dry run at node {node}; replanning");
                    budget -= budget / 16;
                    plan = plan_swaps_fused(tensors, nodes, lv, fused, budget, ALIGNMENT);
                }
            }
        }
        // A node the plan could not fit may still run (the fallback makes room); only one whose
        // own buffers exceed what the limit leaves cannot.
        for &n in &plan.infeasible_nodes {
            let node = &nodes[n as usize];
            let own = crate::plan::min_limit::node_own_bytes(tensors, node, ALIGNMENT);
            if own <= available {
                continue;
            }
            log::warn!(
                "{}: its own inputs, outputs and workspaces take {own} bytes, more than \
                 the {available} bytes the memory limit of {limit} leaves this graph; runs will fail there",
                node.describe(n)
            );
        }
        log::info!(
            "swap plan: working set {} bytes over a budget of {} bytes (planned for {}); per run {} bytes out, {} in",
            lv.persistent_bytes + lv.peak_transient_bytes,
            available,
            plan.budget,
            plan.bytes_out,
            plan.bytes_in
        );
        let mut candidates = candidates_fused(tensors, nodes, lv, fused, plan.budget, ALIGNMENT);
        candidates.retain(|(_, p)| {
            *p == plan
                || (p.infeasible_nodes.len() <= plan.infeasible_nodes.len() && check(p).is_ok())
        });
        if candidates.len() < 2 {
            candidates.clear();
        }
        Ok((plan, candidates))
    }
}
