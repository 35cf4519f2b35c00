//! Swap tuning: the first `TUNING_RUNS` successful runs of a swapping graph are timed, and the
//! plan the timeline model finds fastest on their warmest timings replaces the default; `GKRT_SWAP_TIMELINE`'s file.

use super::RuntimeGraph;
use crate::device::EventId;
use crate::memory::pool::Pool;
use crate::plan::program::Program;
use crate::plan::swap::{Policy, SwapPlan, Timings};
use crate::plan::swap_candidates::{fitted_timed_candidates_with, Knobs};
use crate::plan::swap_fit::{fits_pool, pool_moves, PoolMoves};
use crate::plan::swap_model::{choose_feasible, estimate_with_copy_waits, Estimate, Link};
use crate::plan::swap_placements::{placements, Start};
use crate::plan::swap_refine::{estimate_plan, refine, RefineInput, Refined};
use crate::plan::swap_release::{SEARCH_STEADY_RUNS, STEADY_RUNS};
use crate::plan::swap_search::search;
use crate::runtime::{Error, Result, ALIGNMENT};

/// The chosen plan's predicted run: the timeline model's estimate on the timed runs' timings,
/// and the page maps and device waits of the pool's dry run (steady state), per node.
pub(super) struct SwapPrediction {
    estimate: Estimate,
    /// The node times the estimate used (`RunTimings::warmest`).
    cost: Vec<f64>,
    /// Per node the steady runs' moves: the plain dry run's, or with a release schedule its
    /// pending-aware dry run's (summed over its steady runs: `released_moves`).
    moves: Vec<PoolMoves>,
    /// With a release schedule, the pending-aware dry run's first run (what the plan's first run
    /// should do); empty without.
    first_moves: Vec<PoolMoves>,
}

impl SwapPrediction {
    /// The pending-aware dry run's runs (`swap_release::released_moves`: the first, then the
    /// steady ones) in place of the plain dry run's moves.
    pub(super) fn released(&mut self, mut runs: Vec<Vec<PoolMoves>>) {
        if runs.is_empty() {
            return;
        }
        self.first_moves = runs.remove(0);
        let mut by_node: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
        for m in runs.iter().flatten() {
            let e = by_node.entry(m.node).or_default();
            (e.0, e.1) = (e.0 + m.maps, e.1 + m.waits);
        }
        self.moves = by_node
            .into_iter()
            .map(|(node, (maps, waits))| PoolMoves { node, maps, waits })
            .collect();
    }
}

/// How many runs of the default plan are timed before the swap plan is chosen. A first run's
/// node times include first-use costs (cuBLAS handles and heuristics, module loads, first
/// touches): GPT-2 small at a third of its working set timed 196.6 ms of nodes on the H200 where
/// its steady step computes 85 ms, so the link looked 2.3 times faster against the nodes than it
/// is and copies lost to rebuilds. A second run is warm; more would only delay the choice.
pub(super) const TUNING_RUNS: usize = 2;

/// One timed run of the default plan: per node its time, per direction (out, in) the bytes
/// copied and the copies' summed time.
pub(super) struct RunTimings {
    node_ms: Vec<f64>,
    moved: [(u64, f64); 2],
}

impl RunTimings {
    /// The timings the plan is chosen on: per node the least time of the runs (a first-use
    /// cost only ever lengthens a node, whatever the graph), per direction the fastest run's
    /// link speed (a direction no run used takes the other's). `None` when nothing moved.
    fn warmest(runs: &[RunTimings]) -> Option<(Vec<f64>, Link)> {
        let first = runs.first()?;
        let node_ms: Vec<f64> = (0..first.node_ms.len())
            .map(|n| {
                runs.iter()
                    .filter_map(|r| r.node_ms.get(n).copied())
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let gbps = |dir: usize| {
            runs.iter()
                .filter(|r| r.moved[dir].1 > 0.0)
                .map(|r| r.moved[dir].0 as f64 / (r.moved[dir].1 * 1e6))
                .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))))
        };
        let (out, inc) = (gbps(0), gbps(1));
        let either = out.or(inc)?;
        let link = Link {
            in_gbps: inc.unwrap_or(either),
            out_gbps: out.unwrap_or(either),
        };
        Some((node_ms, link))
    }
}

impl RuntimeGraph {
    /// The planner's knobs as the environment sets them (`GKRT_SWAP_PRUNE_LINKS`,
    /// `GKRT_SWAP_PIN_SMALL`) for this graph's `pool`: finalize's candidates, the tuning's and
    /// the release schedule's refit all use them.
    pub(super) fn swap_knobs(&self, pool: &Pool) -> Knobs {
        let page = pool.page_size(self.runtime.device().virtual_memory());
        let pin_below = match self.pin_below {
            Some(bytes) => bytes,
            None if crate::runtime::env::swap_pin_small() => page,
            None => 0,
        };
        Knobs {
            prune_moved_links: crate::runtime::env::swap_prune_links(),
            pin_below,
        }
    }

    /// Keeps this graph's persistent tensors of at most `bytes` on the device in every swap
    /// plan from the next one made on (`Policy::pin_below`; 0: none), whatever the pool's page
    /// and `GKRT_SWAP_PIN_SMALL`; `None`: as they say. Call before `finalize`: for tests (the
    /// host backend has no pages) and experiments.
    pub fn pin_small_tensors(&mut self, bytes: Option<u64>) {
        self.pin_below = bytes;
    }

    /// The swap policies among which the timed runs' timings choose (default first); empty
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
        // (A prediction made for the tuned plan no longer says anything about this one.)
        self.swap_prediction = None;
        Ok(())
    }

    /// After each of the first `TUNING_RUNS` timed runs: keeps their timings, and after the
    /// last estimates every candidate plan with the warm node times and link speeds
    /// (`RunTimings::warmest`) and switches to the fastest (the executor moves persistent
    /// tensors to the new plan's starting state at the next run). Returns whether it tuned.
    pub(super) fn tune_swap_plan(
        &mut self,
        device: &dyn crate::device::Device,
        pool: &Pool,
    ) -> bool {
        let Some(timings) = self.read_run_timings(device) else {
            // (Logged where it happened; the plan stays the default.)
            return true;
        };
        self.swap_timings.push(timings);
        if self.swap_timings.len() < TUNING_RUNS {
            return false;
        }
        let Some((cost, link)) = RunTimings::warmest(&self.swap_timings) else {
            return true; // nothing moved: every plan is as good
        };
        self.swap_timings.clear();
        // With a release schedule, every candidate is fitted again with blocks pending until
        // their copies end (`releases.rs`), the timed ones included.
        let released = self.releases.on && self.refit_released(&cost, link, pool);
        if !released {
            // (No plan fits so: this graph's runs keep blocks pending until taken.)
            self.releases.on = false;
            self.add_timed_candidates(&cost, link, pool);
        }
        let candidates = &self.swap_candidates;
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        // Runs that take their dry run's placements wait for the copy-outs whose ranges they
        // take (`swap_placements`): each candidate is estimated with those waits.
        let freed: Vec<u64> = self.store.iter().filter_map(|m| m.device()).collect();
        let stream = self.runtime.compute;
        let mut copy_waits = Vec::with_capacity(candidates.len());
        let estimates: Vec<_> = candidates
            .iter()
            .map(|(_, p)| {
                let fused = self.graph.fused_groups();
                let program = Program::compile_fused(tensors, nodes, lv, Some(p), None, fused);
                let waits = if self.placements.on {
                    let start = Start::Fresh { freed: &freed };
                    placements(tensors, nodes, &program, pool, stream, start, 2)
                        .map(|p| p.copy_waits().to_vec())
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
                copy_waits.push(waits.len());
                estimate_with_copy_waits(tensors, nodes, &program, &cost, link, ALIGNMENT, &waits)
            })
            .collect();
        let infeasible: Vec<usize> = candidates
            .iter()
            .map(|(_, p)| p.infeasible_nodes.len())
            .collect();
        let best = choose_feasible(&estimates, &infeasible);
        let refined = self.refine_swap_plan(best, &estimates[best], &cost, link, pool);
        let candidates = &self.swap_candidates;
        let (chosen, chosen_estimate) = match &refined {
            Some(r) => (&r.plan, &r.estimate),
            None => (&candidates[best].1, &estimates[best]),
        };
        let moves = self.dry_run_moves(chosen, pool);
        for ((policy, plan), e) in candidates.iter().zip(&estimates) {
            log::debug!(
                "swap candidate {policy:?}: estimated step {:.2} ms (compute waits {:.2} ms), {} bytes out, {} in",
                e.step_ms,
                e.compute_waited_ms,
                plan.bytes_out,
                plan.bytes_in
            );
        }
        let e = chosen_estimate;
        let (maps, waits) = moves
            .iter()
            .fold((0, 0), |(m, w), p| (m + p.maps, w + p.waits));
        log::info!(
            "swap plan tuned on the first {TUNING_RUNS} runs' warmest timings (nodes {:.2} ms, link in {:.1} / out {:.1} GB/s): {:?}, estimated \
             step {:.2} ms (compute {:.2} ms of which rebuilds {:.2}, compute waits {:.2}) against {:.2} ms for the \
             default plan; per run {} bytes out, {} in; the pool's dry run maps {maps} pages and waits for the \
             device {waits} times a run; its blocks wait {} times for copy-outs whose ranges they take",
            cost.iter().sum::<f64>(),
            link.in_gbps,
            link.out_gbps,
            candidates[best].0,
            e.step_ms,
            e.compute_ms,
            e.compute_ms - cost.iter().sum::<f64>(),
            e.compute_waited_ms,
            estimates[0].step_ms,
            chosen.bytes_out,
            chosen.bytes_in,
            copy_waits[best]
        );
        // (After a released refit the first candidate need not be the plan the runs follow.)
        let plan = (refined.is_some() || best != 0 || self.swap.as_ref() != Some(chosen))
            .then(|| chosen.clone());
        self.swap_prediction = Some(SwapPrediction {
            estimate: chosen_estimate.clone(),
            cost: cost.clone(),
            moves,
            first_moves: Vec::new(),
        });
        if let Some(plan) = plan {
            self.set_swap_plan(plan);
        }
        if released {
            self.schedule_releases(&cost, link, pool);
        }
        true
    }

    /// The chosen candidate `best` (estimated `base`) refined on the timed runs' figures
    /// (the better of `swap_search::search` and `swap_refine::refine`, or with
    /// `GKRT_SWAP_REFINE_SEARCH=0` the latter alone), each change fitted to the pool as the timed
    /// candidates are;
    /// `None` when no change shortened its estimate or `GKRT_SWAP_REFINE` is 0. The refinement
    /// judges plans on the model without waits for copy-outs whose ranges placed blocks take
    /// (`GKRT_SWAP_PLACEMENTS=1`), so `base` is estimated again that way: like with like.
    fn refine_swap_plan(
        &self,
        best: usize,
        base: &Estimate,
        cost: &[f64],
        link: Link,
        pool: &Pool,
    ) -> Option<Refined> {
        if !crate::runtime::env::swap_refine() {
            return None;
        }
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let fused = self.graph.fused_groups();
        let freed: Vec<u64> = self.store.iter().filter_map(|m| m.device()).collect();
        let stream = self.runtime.compute;
        let released = self.releases.on;
        let searched = crate::runtime::env::swap_refine_search();
        // (A search keeps the best of hundreds of plans: its fits look further ahead.)
        let steady = if searched {
            SEARCH_STEADY_RUNS
        } else {
            STEADY_RUNS
        };
        let fits = |plan: &SwapPlan| {
            if released {
                return self.fits_released_over(plan, pool, (cost, link), steady);
            }
            let program = Program::compile_fused(tensors, nodes, lv, Some(plan), None, fused);
            fits_pool(tensors, nodes, &program, pool, stream, &freed)
        };
        let input = RefineInput {
            tensors,
            nodes,
            lv,
            fused,
            align: ALIGNMENT,
            timings: Timings {
                node_ms: cost,
                link,
            },
        };
        let (policy, plan) = &self.swap_candidates[best];
        let started = std::time::Instant::now();
        let unwaited;
        let base = if self.placements.on {
            unwaited = estimate_plan(&input, plan);
            &unwaited
        } else {
            base
        };
        let r = if searched {
            // Budgets up to the largest a candidate got at finalize.
            let most = self
                .swap_candidates
                .iter()
                .map(|(_, p)| p.budget)
                .max()
                .unwrap_or(plan.budget);
            // The search's moves are not a superset of the greedy refinement's (its slack and
            // linger steps, tried one victim at a time): of the two, the shorter estimate.
            let searched = search(&input, *policy, plan, base, most, fits);
            let greedy = refine(&input, *policy, plan, base, fits);
            searched.shorter(greedy)
        } else {
            refine(&input, *policy, plan, base, fits)
        };
        log::info!(
            "swap plan refined{} in {:.1} ms: {} plans tried, {} changes kept; estimated step {:.2} -> {:.2} ms \
             (rebuilds {:.2} -> {:.2} ms)",
            if searched { " (searched)" } else { "" },
            started.elapsed().as_secs_f64() * 1e3,
            r.tried,
            r.kept,
            base.step_ms,
            r.estimate.step_ms,
            base.compute_ms - cost.iter().sum::<f64>(),
            r.estimate.compute_ms - cost.iter().sum::<f64>()
        );
        (r.kept > 0).then_some(r)
    }

    /// The last profiled run's node times and per-direction copy totals; `None` (logged) when
    /// not every node was timed or an event could not be read.
    fn read_run_timings(&self, device: &dyn crate::device::Device) -> Option<RunTimings> {
        let nodes = self.graph.nodes();
        let timed = |(a, b): (EventId, EventId)| device.event_elapsed_ms(a, b).map(f64::from);
        let pairs = self.profile.nodes.get(..nodes.len())?;
        // (A node absorbed into a later collective's bucket never runs: it costs nothing.)
        let cost: std::result::Result<Vec<f64>, _> = pairs
            .iter()
            .zip(nodes)
            .map(|(&p, node)| {
                if node.is_absorbed() {
                    Ok(0.0)
                } else {
                    timed(p)
                }
            })
            .collect();
        let mut moved = [(0u64, 0.0f64); 2]; // (bytes, ms): out, in
        let mut copies_ok = true;
        for &(a, b, bytes, incoming, _) in &self.profile.copies {
            match timed((a, b)) {
                Ok(ms) => {
                    moved[incoming as usize].0 += bytes;
                    moved[incoming as usize].1 += ms;
                }
                Err(_) => copies_ok = false,
            }
        }
        match (cost, copies_ok) {
            (Ok(node_ms), true) => Some(RunTimings { node_ms, moved }),
            _ => {
                log::warn!("swap plan not tuned: a timed run's events could not be read");
                None
            }
        }
    }

    /// The pool's page maps and device waits per node for `plan` in the steady state
    /// (`swap_fit::pool_moves`, from the graph's blocks given back as `add_timed_candidates`
    /// fits its plans); empty, logged, when the dry run fails.
    fn dry_run_moves(&self, plan: &SwapPlan, pool: &Pool) -> Vec<PoolMoves> {
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let fused = self.graph.fused_groups();
        let freed: Vec<u64> = self.store.iter().filter_map(|m| m.device()).collect();
        let program = Program::compile_fused(tensors, nodes, lv, Some(plan), None, fused);
        let stream = self.runtime.compute;
        pool_moves(tensors, nodes, &program, pool, stream, &freed).unwrap_or_else(|node| {
            log::debug!("the chosen swap plan's dry run fails at node {node}");
            Vec::new()
        })
    }

    /// Adds the plans that weigh each rebuild against its copies on the timed runs' node times
    /// and link speeds (`swap_candidates::fitted_timed_candidates_with`), each fitted to the pool as
    /// finalize fits the others: its dry run starts with this graph's blocks given back (the run
    /// ended with the plan's kept tensors on the device; a new plan starts from its own).
    fn add_timed_candidates(&mut self, cost: &[f64], link: Link, pool: &Pool) {
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let freed: Vec<u64> = self.store.iter().filter_map(|m| m.device()).collect();
        let stream = self.runtime.compute;
        let fused = self.graph.fused_groups();
        let fits = |plan: &SwapPlan| {
            let program = Program::compile_fused(tensors, nodes, lv, Some(plan), None, fused);
            fits_pool(tensors, nodes, &program, pool, stream, &freed)
        };
        // The largest budget a candidate got: what the limit left at finalize, unless no
        // policy fit it whole.
        let available = self
            .swap_candidates
            .iter()
            .map(|(_, p)| p.budget)
            .max()
            .unwrap_or(0);
        let known: Vec<SwapPlan> = self
            .swap_candidates
            .iter()
            .map(|(_, p)| p.clone())
            .collect();
        let most_infeasible = known[0].infeasible_nodes.len();
        let timings = Timings {
            node_ms: cost,
            link,
        };
        let graph = (tensors, nodes, lv, fused);
        let knobs = self.swap_knobs(pool);
        let timed = fitted_timed_candidates_with(
            graph,
            available,
            ALIGNMENT,
            timings,
            knobs,
            &known,
            most_infeasible,
            fits,
        );
        log::debug!("{} timed swap candidates", timed.len());
        self.swap_candidates.extend(timed);
    }

    /// Whether runs are timed for `GKRT_SWAP_TIMELINE`: set, and the graph swaps or runs in
    /// dynamic mode (an unconstrained run's timeline is the baseline a swapping run's is
    /// compared with; a planned graph's is not written, its runs may replay a capture).
    pub(super) fn writes_timeline(&self) -> bool {
        crate::runtime::env::swap_timeline().is_some()
            && (self.swap.is_some() || !self.is_planned())
    }

    /// Appends the last profiled run's measured timeline to `path` (CSV: run, kind, key, a, b),
    /// for `scripts/gpu/timeline.py`. Kinds: `node` (node index, start and end in ms from the
    /// first node's start), `in` / `out` (a copy: bytes, start, end), `re` (a rebuild: the
    /// node run again, start, end), `pool` (node before whose launch the pool mapped `a` pages
    /// and waited for the device `b` times), `host` (node, the host's time in ms from the run's
    /// start when its launch was queued, the compute-stream syncs queued since the previous
    /// node's), `syncs` (0, the run's compute-stream syncs queued and those left out as
    /// implied: `GKRT_EXEC_ELIDE`), `polled` (0, the events the executor queried to give back
    /// blocks pending on copies: `GKRT_EXEC_POLL_IN_ORDER`), `copy_waits` (0, the copy streams'
    /// waits for other copies queued and left out as implied), `deferred` (0, returns the run
    /// started later than their step for lack of room, its departures from its program). Once
    /// the plan was tuned, the
    /// prediction for it
    /// too: `pred` (node, modelled start and end), `pred_step` (0, modelled step and compute
    /// waits in ms), `pred_pool` (as `pool`, from the pool's dry run: with a release schedule
    /// its pending-aware steady runs', summed), `pred_pool_first` (the pending-aware dry run's
    /// first run: the plan's first run should match it).
    pub(super) fn write_timeline(
        &self,
        device: &dyn crate::device::Device,
        path: &str,
    ) -> Result<()> {
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
        for &(a, b, bytes, incoming, _) in &self.profile.copies {
            let dir = if incoming { "in" } else { "out" };
            text += &format!("{run},{dir},{bytes},{:.4},{:.4}\n", at(a)?, at(b)?);
        }
        let stamps = self.profile.stamps();
        for &(a, b, node, _) in &self.profile.recomputes {
            if let (Some(&a), Some(&b)) = (stamps.get(a as usize), stamps.get(b as usize)) {
                text += &format!("{run},re,{node},{:.4},{:.4}\n", at(a)?, at(b)?);
            }
        }
        for &(node, maps, waits) in &self.profile.pool_moves {
            text += &format!("{run},pool,{node},{maps},{waits}\n");
        }
        for &(node, ns, syncs) in &self.profile.host_launches {
            text += &format!("{run},host,{node},{:.4},{syncs}\n", ns as f64 / 1e6);
        }
        let (syncs, elided) = self.last_syncs;
        text += &format!("{run},syncs,0,{syncs},{elided}\n");
        text += &format!("{run},polled,0,{},0\n", self.last_polled);
        let (waits, elided) = self.last_copy_waits;
        text += &format!("{run},copy_waits,0,{waits},{elided}\n");
        let (deferred, fallbacks) = self.last_deferred;
        text += &format!("{run},deferred,0,{deferred},{fallbacks}\n");
        if let Some(p) = &self.swap_prediction {
            text += &prediction_rows(run, p, self.graph.nodes().len());
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::InvalidArgument(format!("{path}: {e}")))?;
        f.write_all(text.as_bytes())
            .map_err(|e| Error::InvalidArgument(format!("{path}: {e}")))
    }
}

/// The CSV rows of a prediction (`write_timeline`): the step, per node its modelled start and
/// end (the estimate's starts are in launch order, one per node), the dry run's pool moves.
fn prediction_rows(run: u64, p: &SwapPrediction, nodes: usize) -> String {
    let e = &p.estimate;
    let mut text = format!(
        "{run},pred_step,0,{:.4},{:.4}\n",
        e.step_ms, e.compute_waited_ms
    );
    if e.starts.len() == nodes && p.cost.len() == nodes {
        for (n, (&(start, _), ms)) in e.starts.iter().zip(&p.cost).enumerate() {
            text += &format!("{run},pred,{n},{start:.4},{:.4}\n", start + ms);
        }
    }
    for m in &p.moves {
        text += &format!("{run},pred_pool,{},{},{}\n", m.node, m.maps, m.waits);
    }
    for m in &p.first_moves {
        text += &format!("{run},pred_pool_first,{},{},{}\n", m.node, m.maps, m.waits);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::RunTimings;

    fn run(node_ms: &[f64], out: (u64, f64), inc: (u64, f64)) -> RunTimings {
        RunTimings {
            node_ms: node_ms.to_vec(),
            moved: [out, inc],
        }
    }

    #[test]
    fn warmest_takes_each_nodes_least_time_and_each_directions_fastest_run() {
        // A first run slowed by first-use costs at nodes 0 and 2, its copies slower too.
        let cold = run(&[9.0, 1.0, 5.0], (1_000_000, 1.0), (2_000_000, 4.0));
        let warm = run(&[2.0, 1.5, 1.0], (1_000_000, 0.5), (2_000_000, 2.0));
        let (node_ms, link) = RunTimings::warmest(&[cold, warm]).unwrap();
        assert_eq!(node_ms, vec![2.0, 1.0, 1.0]);
        assert!((link.out_gbps - 2.0).abs() < 1e-12, "{}", link.out_gbps);
        assert!((link.in_gbps - 1.0).abs() < 1e-12, "{}", link.in_gbps);
    }

    #[test]
    fn a_direction_no_run_used_takes_the_others_speed_and_no_copies_give_none() {
        let a = run(&[1.0], (0, 0.0), (3_000_000, 1.0));
        let b = run(&[1.0], (0, 0.0), (3_000_000, 2.0));
        let (_, link) = RunTimings::warmest(&[a, b]).unwrap();
        assert!((link.in_gbps - 3.0).abs() < 1e-12 && (link.out_gbps - 3.0).abs() < 1e-12);
        let idle = run(&[1.0], (0, 0.0), (0, 0.0));
        assert!(RunTimings::warmest(&[idle]).is_none());
        assert!(RunTimings::warmest(&[]).is_none());
    }
}
