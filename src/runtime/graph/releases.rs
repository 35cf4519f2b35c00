//! A swapping graph's copy-outs given back when the timeline model says their copies end
//! (`GKRT_SWAP_RELEASE`, `plan::swap_release`). Once the first runs have timed the nodes and the
//! link, the candidates are fitted again with the pool's dry run holding each copy-out's block
//! pending until then (their steady runs must map no page and never wait for the device), and
//! the chosen plan's runs give those blocks back at the same steps, the pool holding every other
//! pending block as its dry run did: it then places each block where the dry run placed it.

use super::RuntimeGraph;
use crate::memory::pool::{Pool, PoolBacking};
use crate::plan::program::Program;
use crate::plan::swap::{SwapPlan, Timings};
use crate::plan::swap_candidates::{fitted_candidates_with, fitted_timed_candidates_with};
use crate::plan::swap_fit::PoolMisfit;
use crate::plan::swap_model::{estimate, Link};
use crate::plan::swap_release::{
    fits_pool_released_over, released_candidates, released_moves, steady_run, Releases,
    RELEASE_MARGIN_MS, STEADY_RUNS,
};
use crate::runtime::ALIGNMENT;

/// Whether runs follow a release schedule, and the current program's.
#[derive(Default)]
pub(super) struct ReleaseCopies {
    /// `GKRT_SWAP_RELEASE` (read at finalize; `release_copies`).
    pub(super) on: bool,
    /// The schedule of the current program; `None` before the plan is tuned (and for a plan
    /// chosen by hand, `use_swap_policy`).
    pub(super) current: Option<Releases>,
    /// Blocks the last run gave back while still pending, as its schedule said.
    pub(super) last_released: u64,
    /// The tuning emptied the pool before its refit (`empty_for_tuning`).
    pub(super) tuned_empty: bool,
    /// `GKRT_SWAP_RELEASE_HOLD_MARKERS` (read at finalize): the pool holds its markers while a
    /// run follows the schedule (`Pool::hold_markers`), so which pages it may move without
    /// waiting for the device is what its dry run knew, not what the device has passed.
    pub(super) hold_markers: bool,
    /// `GKRT_SWAP_RELEASE_CLEAN_START` (read at finalize): after the tuning emptied the pool,
    /// the released fits and the schedule's dry run start their first run clean
    /// (`Releases::clean_start`), as the executor's first run then starts.
    pub(super) clean_start: bool,
}

impl RuntimeGraph {
    /// Whether a tuned swapping graph's plan is fitted and run with its copy-outs' blocks given
    /// back at the model's copy ends (on by default, `GKRT_SWAP_RELEASE=0` off): for tests and
    /// side-by-side measurements. Takes effect at the next tuning; on, runs do not take the
    /// dry run's placements (`follow_placements`): the pool finds them itself.
    pub fn release_copies(&mut self, on: bool) {
        self.releases.on = on;
        self.releases.current = None;
        if on {
            self.follow_placements(false);
        }
    }

    /// Copy-outs' blocks the last run gave back while still pending, as its release schedule
    /// said (0 without one).
    pub fn last_run_released(&self) -> u64 {
        self.releases.last_released
    }

    /// Whether the tuning sent the graph's tensors home and gave the pool's free pages back
    /// before fitting the candidates (`GKRT_SWAP_TUNE_EMPTY`).
    pub fn tuned_from_empty_pool(&self) -> bool {
        self.releases.tuned_empty
    }

    /// Blocks the current release schedule gives back in a run (`None`: no schedule).
    pub fn release_schedule_len(&self) -> Option<usize> {
        self.releases.current.as_ref().map(Releases::count)
    }

    /// Before the tuning that refits the candidates with a release schedule
    /// (`GKRT_SWAP_TUNE_EMPTY`): every tensor of the graph on the device goes home and the pool
    /// gives its free pages back, so the refit's dry runs start from a pool that holds nothing
    /// of the graph, where the chosen plan's runs will start too (`bring_kept` after the
    /// choice). Fitted around the blocks the first runs left (their plan moving pages every
    /// run), GPT-2 small at a third found no plan above 0.74 of the limit but in a window at
    /// 0.81 that maps no page in its steady runs; fitted to the empty pool, the one at 0.92 the
    /// model puts 6 ms faster (`plan/gpt2_choice_tests.rs`). Returns whether the pool was
    /// emptied (failures are logged: the runs then bring the tensors back as they need them).
    pub(super) fn empty_for_tuning(
        &mut self,
        rt: &crate::runtime::Runtime,
        st: &mut crate::runtime::State,
    ) -> bool {
        if !self.releases.on || !crate::runtime::env::swap_tune_empty() {
            return false;
        }
        // (The counters stay the last run's.)
        let last = (
            self.last_syncs,
            self.last_polled,
            self.last_copy_waits,
            self.last_deferred,
        );
        let (r, _) = self.execute_with(rt, st, |exec, graph| exec.send_all_home(graph), false);
        (
            self.last_syncs,
            self.last_polled,
            self.last_copy_waits,
            self.last_deferred,
        ) = last;
        let synced = rt.device.stream_synchronize(rt.streams.copy_out);
        self.store.land_all();
        let backing = crate::memory::DeviceBacking(rt.device());
        st.pool.poll_pending(&backing);
        let released = r
            .and(synced.map_err(crate::runtime::Error::from))
            .and_then(|()| st.pool.release_cached(&backing).map_err(Into::into));
        match released {
            Ok(bytes) => {
                self.releases.tuned_empty = true;
                log::info!(
                    "GKRT_SWAP_TUNE_EMPTY: the graph's tensors sent home and {bytes} bytes of free \
                     pages given back before the refit"
                );
                true
            }
            Err(e) => {
                log::warn!("GKRT_SWAP_TUNE_EMPTY: emptying the pool before the refit: {e}");
                false
            }
        }
    }

    /// Whether the tuned plan's first run starts with every tensor clean and its dry runs say
    /// so: the tuning emptied the pool (the kept tensors come back from the host) and
    /// `GKRT_SWAP_RELEASE_CLEAN_START` is on.
    fn first_run_clean(&self) -> bool {
        self.releases.tuned_empty && self.releases.clean_start
    }

    /// Before a run that follows the schedule: the blocks the last run's copy-outs left pending
    /// go back as its dry run gives them back at a run's end (`DryRunStep::CompleteAll`: by
    /// tensor), each once its copy is seen done (the host synchronised the streams as the run
    /// ended). Polled, they went back in the order of their events, made as each tensor first
    /// left: the free blocks then coalesce into the same holes, but the records, free lists and
    /// victims' order may differ from the dry run's. Blocks on other events are polled after.
    pub(super) fn complete_last_copies(&self, pool: &mut Pool, backing: &dyn PoolBacking) {
        for m in self.store.iter() {
            if let Some(e) = m.event(false) {
                if pool.is_pending_on(e) && backing.event_complete(e) {
                    pool.assume_complete(e);
                }
            }
        }
    }

    /// Whether `plan` fits `pool` with its copy-outs' blocks pending until the model's copy
    /// ends on `cost` and `link` (from the graph's blocks given back, as the timed candidates
    /// are fitted).
    pub(super) fn fits_released(
        &self,
        plan: &SwapPlan,
        pool: &Pool,
        rates: (&[f64], Link),
    ) -> Result<(), PoolMisfit> {
        self.fits_released_over(plan, pool, rates, STEADY_RUNS)
    }

    /// `fits_released` over `steady` steady runs of the dry run (`fits_pool_released_over`).
    pub(super) fn fits_released_over(
        &self,
        plan: &SwapPlan,
        pool: &Pool,
        (cost, link): (&[f64], Link),
        steady: usize,
    ) -> Result<(), PoolMisfit> {
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let fused = self.graph.fused_groups();
        let program = Program::compile_fused(tensors, nodes, lv, Some(plan), None, fused);
        let freed: Vec<u64> = self.store.iter().filter_map(|m| m.device()).collect();
        let stream = self.runtime.compute;
        let rates = (cost, link, ALIGNMENT);
        let clean = self.first_run_clean();
        let graph = (tensors, nodes, &program);
        fits_pool_released_over(graph, (pool, stream, &freed), rates, clean, steady).map(|_| ())
    }

    /// Replaces the candidates with the same policies' plans (and the timed ones) fitted by
    /// `fits_released`, from the largest budget a candidate got; when the default policy's plan
    /// does not fit so, the others that do (`released_candidates`, `GKRT_SWAP_RELEASE_ANY_FIT`).
    /// False, the candidates left as they were, when no plan fits so.
    pub(super) fn refit_released(&mut self, cost: &[f64], link: Link, pool: &Pool) -> bool {
        let lv = self.graph.liveness().expect("finalized");
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let fused = self.graph.fused_groups();
        let available = self
            .swap_candidates
            .iter()
            .map(|(_, p)| p.budget)
            .max()
            .unwrap_or(0);
        let started = std::time::Instant::now();
        let fits = |plan: &SwapPlan| self.fits_released(plan, pool, (cost, link));
        let graph = (tensors, nodes, lv, fused);
        let knobs = self.swap_knobs(pool);
        let (default, refit) = fitted_candidates_with(graph, available, ALIGNMENT, knobs, fits);
        let default_fits = fits(&default).is_ok();
        let any_fit = crate::runtime::env::swap_release_any_fit();
        let Some(mut candidates) = released_candidates(default_fits, refit, any_fit) else {
            log::warn!(
                "GKRT_SWAP_RELEASE: no plan {}fits with copy-outs' blocks pending until their \
                 copies end; the runs keep the plans fitted with blocks free at once",
                if any_fit {
                    ""
                } else {
                    "of the default policy "
                }
            );
            return false;
        };
        if !default_fits {
            log::info!(
                "GKRT_SWAP_RELEASE: the default policy's plan does not fit with copy-outs' blocks \
                 pending; {} other policies' plans do",
                candidates.len()
            );
        }
        let known: Vec<SwapPlan> = candidates.iter().map(|(_, p)| p.clone()).collect();
        let most_infeasible = known[0].infeasible_nodes.len();
        let timings = Timings {
            node_ms: cost,
            link,
        };
        candidates.extend(fitted_timed_candidates_with(
            graph,
            available,
            ALIGNMENT,
            timings,
            knobs,
            &known,
            most_infeasible,
            fits,
        ));
        log::info!(
            "GKRT_SWAP_RELEASE: {} candidates fitted with copy-outs' blocks pending until their \
             copies end in {:.1} ms (the default plan at {} of {available} bytes)",
            candidates.len(),
            started.elapsed().as_secs_f64() * 1e3,
            default.budget
        );
        self.swap_candidates = candidates;
        true
    }

    /// The current program's release schedule from the model on `cost` and `link`, logged with
    /// what the pool's dry run does in its steady runs.
    pub(super) fn schedule_releases(&mut self, cost: &[f64], link: Link, pool: &Pool) {
        let (tensors, nodes) = (self.graph.tensors(), self.graph.nodes());
        let program = &self.program;
        let e = estimate(tensors, nodes, program, cost, link, ALIGNMENT);
        let mut releases = Releases::from_estimate(program, &e, RELEASE_MARGIN_MS);
        if self.first_run_clean() {
            // (The plan's first run starts with its kept tensors brought clean from the host.)
            releases = releases.clean_start(program, nodes);
        }
        let freed: Vec<u64> = self.store.iter().filter_map(|m| m.device()).collect();
        let stream = self.runtime.compute;
        match steady_run(tensors, nodes, program, &releases, pool, stream, &freed) {
            Ok(s) => log::info!(
                "GKRT_SWAP_RELEASE: {} of {} copy-outs' blocks given back at the model's copy \
                 ends (+{RELEASE_MARGIN_MS} ms); the pool's dry run over {} steady runs maps {} \
                 pages, waits for the device {} times, takes {} pending blocks and takes back \
                 every one {} times",
                releases.count(),
                e.copy_ends.len(),
                STEADY_RUNS,
                s.page_maps,
                s.device_waits,
                s.takes.one,
                s.takes.all
            ),
            Err(node) => log::warn!(
                "GKRT_SWAP_RELEASE: the chosen plan's pending-aware dry run fails at node {node}"
            ),
        }
        // The timeline reads its runs against this dry run's, node by node.
        let runs = self
            .writes_timeline()
            .then(|| released_moves(tensors, nodes, program, &releases, pool, stream, &freed).ok())
            .flatten();
        if let (Some(p), Some(runs)) = (&mut self.swap_prediction, runs) {
            p.released(runs);
        }
        self.releases.current = Some(releases);
    }
}
