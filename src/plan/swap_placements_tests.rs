//! The GPT-2 shape's steady step through a pool with virtual memory as the executor meets it on
//! a GPU: the host far ahead of the device, so every copy-out's block is still pending while the
//! run is queued, and complete by the next run. With the pool placing blocks itself the layout
//! drifts from the dry run's and pages move under the limit; taking the dry run's placements
//! (`swap_placements`) it maps nothing where the dry run maps nothing — but its blocks then wait
//! for the copy-outs whose ranges they take, which the timeline model charges: every candidate
//! plan's estimated step grows (the default's from 96.4 to 114.4 ms with H200-like costs).
//! `cargo test --release --lib swap_placements_tests -- --nocapture` prints the figures.

use super::gpt2_shape_tests::{build, Step as Shape, SMALL};
use super::swap_placements::{placements, Placements, Start};
use super::swap_release::Releases;
use super::test_vmm::Device;
use crate::device::{EventId, StreamId};
use crate::graph::Liveness;
use crate::memory::pool::{Pool, PoolError};
use crate::plan::program::{Buf, PoolCall, PoolWalk, Program, Step};
use crate::plan::swap_candidates::{fitted_candidates_with, Knobs};
use crate::plan::swap_fit::{fits_pool, pool_moves};
use crate::plan::swap_model::{estimate, estimate_with_copy_waits};
use std::collections::HashMap;

const ALIGN: u64 = 256;
const S: StreamId = StreamId(0);

/// What one run did beside the plan's allocations.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct RunFigures {
    pub(super) maps: u64,
    pub(super) device_waits: u64,
    /// Allocations that found their placement taken.
    pub(super) misplaced: u64,
    /// Times every pending block was taken back (the compute stream waiting for every copy).
    pub(super) take_backs: u64,
    /// Pending blocks taken one at a time (`Pool::take_pending`).
    pub(super) pending_takes: u64,
    /// Copy-outs that copied where the schedule says they leave clean, or the other way round
    /// (only with `Emulator::lenient`).
    pub(super) off_schedule: u64,
}

/// The executor's run of `program` over `pool`, queued far ahead of the device: copy-outs of
/// tensors newer on the device than on the host park their blocks on an event that completes
/// only after the run, unless a release schedule gives them back earlier (as the executor does
/// with one: `swap_release`); allocations as `Executor::alloc` makes them (without evictions:
/// the plan fits), first at their placement when given one.
pub(super) struct Emulator<'a> {
    pub(super) s: &'a Shape,
    pub(super) program: &'a Program,
    pub(super) dev: Device,
    pub(super) pool: Pool,
    /// Where each buffer the graph holds is.
    pub(super) live: HashMap<Buf, u64>,
    /// Per tensor: newer on the device than on the host (leaving, it is copied).
    pub(super) newer: Vec<bool>,
    pub(super) next_event: u32,
    pub(super) releases: Option<&'a Releases>,
    /// Per tensor: the events of its copy-outs whose blocks may still be pending.
    pub(super) copy_events: HashMap<u32, Vec<EventId>>,
    /// A copy-out that copies where the schedule says it leaves clean (or the other way round)
    /// is counted (`RunFigures::off_schedule`) rather than failing the test: a plan's first run
    /// after its kept tensors came from the host, clean, as `Executor::bring_kept` brings them.
    pub(super) lenient: bool,
}

impl<'a> Emulator<'a> {
    /// `program`'s runs over `pool` with nothing of the graph on the device, every tensor as
    /// new on the host as on the device (callers set `newer` and `lenient` where a run starts
    /// otherwise), its copy-outs' blocks given back by `releases` when it has a schedule.
    pub(super) fn new(
        s: &'a Shape,
        program: &'a Program,
        dev: Device,
        pool: Pool,
        releases: Option<&'a Releases>,
    ) -> Self {
        Emulator {
            s,
            program,
            dev,
            pool,
            live: HashMap::new(),
            newer: vec![false; s.tensors.len()],
            next_event: 0,
            releases,
            copy_events: HashMap::new(),
            lenient: false,
        }
    }

    /// The canonical start: each kept tensor not yet on the device allocated, in the plan's
    /// order.
    pub(super) fn place_kept(&mut self) {
        for &t in &self.program.keep {
            if let std::collections::hash_map::Entry::Vacant(v) = self.live.entry(Buf::Tensor(t)) {
                let bytes = self.s.tensors[t as usize].size;
                v.insert(
                    self.pool
                        .alloc(&self.dev, bytes, S)
                        .expect("room for the kept"),
                );
            }
        }
    }
}

impl Emulator<'_> {
    fn alloc(&mut self, bytes: u64, f: &mut RunFigures) -> u64 {
        let dev = &self.dev;
        match self.pool.alloc_no_wait(dev, bytes, S) {
            Ok(a) => return a,
            Err(PoolError::OutOfMemory { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        if let Some((a, _)) = self.pool.take_pending(bytes, S) {
            f.pending_takes += 1;
            return a;
        }
        let pending = self.pool.pending_events();
        if !pending.is_empty() {
            f.take_backs += 1;
            for e in pending {
                self.pool.assume_complete(e);
            }
            if let Ok(a) = self.pool.alloc_no_wait(dev, bytes, S) {
                return a;
            }
        }
        self.pool.alloc(dev, bytes, S).expect("the plan fits")
    }

    pub(super) fn run(&mut self, placed: Option<&Placements>) -> RunFigures {
        let (s, program) = (self.s, self.program);
        let before = self.pool.stats();
        let mut f = RunFigures::default();
        let walk = PoolWalk::new(&s.tensors, &s.nodes, program);
        let mut c = walk.start_calls;
        for (i, step) in program.steps.iter().enumerate() {
            // The copies the schedule says have ended by now: their blocks go back.
            for &t in self.releases.map_or(&[][..], |r| r.at(i)) {
                for e in self.copy_events.remove(&t).unwrap_or_default() {
                    self.pool.assume_complete(e);
                }
            }
            while c < walk.calls.len() && walk.call_step[c] as usize == i {
                match walk.calls[c] {
                    PoolCall::Alloc { buf, bytes } => {
                        let mut events = Vec::new();
                        let at = placed.and_then(|p| p.get(i, buf));
                        let taken = at
                            .and_then(|at| self.pool.take_at(&self.dev, at, bytes, S, &mut events));
                        f.misplaced += (at.is_some() && taken.is_none()) as u64;
                        let addr = match taken {
                            Some(a) => a,
                            None => self.alloc(bytes, &mut f),
                        };
                        self.live.insert(buf, addr);
                    }
                    PoolCall::Free { buf } => {
                        let addr = self.live.remove(&buf).expect("allocated");
                        let copied = match (*step, buf) {
                            (Step::CopyOut(t) | Step::SendHome(t), Buf::Tensor(b)) if t == b => {
                                std::mem::take(&mut self.newer[t as usize])
                            }
                            _ => false,
                        };
                        if let (Some(r), Buf::Tensor(t)) = (self.releases, buf) {
                            // The schedule knows which copy-outs copy, from the model.
                            let known = r.copies(i as u32, t) == copied;
                            f.off_schedule += !known as u64;
                            assert!(known || self.lenient, "step {i} {step:?}, tensor {t}");
                        }
                        if copied {
                            self.next_event += 1;
                            let e = EventId(self.next_event);
                            self.pool.free_after_event(&self.dev, addr, e).unwrap();
                            if let Buf::Tensor(t) = buf {
                                self.copy_events.entry(t).or_default().push(e);
                            }
                        } else {
                            self.pool.free(&self.dev, addr).unwrap();
                        }
                    }
                }
                c += 1;
            }
            match *step {
                Step::Launch(n) => {
                    for &t in &s.nodes[n as usize].outputs {
                        self.newer[t as usize] = true;
                    }
                }
                Step::Recompute { tensor, .. } => self.newer[tensor as usize] = true,
                _ => {}
            }
        }
        // The run's end: every copy is done. With a schedule the blocks still pending go back
        // by tensor, as `RuntimeGraph::complete_last_copies` gives them back (and the dry run).
        self.dev.complete((1..=self.next_event).map(EventId));
        if self.releases.is_some() {
            let mut left: Vec<(u32, Vec<EventId>)> = self.copy_events.drain().collect();
            left.sort_unstable_by_key(|&(t, _)| t);
            for e in left.into_iter().flat_map(|(_, es)| es) {
                self.pool.assume_complete(e);
            }
        }
        self.pool.poll_pending(&self.dev);
        self.copy_events.clear();
        let after = self.pool.stats();
        f.maps = after.page_map_count - before.page_map_count;
        f.device_waits = after.device_wait_count - before.device_wait_count;
        f
    }

    /// The kept tensors where the last run left them, as `RuntimeGraph::refresh_placements`
    /// reads them.
    pub(super) fn start(&self) -> Vec<(u32, u64)> {
        self.program
            .keep
            .iter()
            .map(|&t| (t, self.live[&Buf::Tensor(t)]))
            .collect()
    }
}

/// The small shape at a third of its working set (`--recompute 2`): its default plan, fitted to
/// a primed pool as finalize fits it, run four times with the pool placing every block and four
/// times taking the dry run's placements (made before each run from the pool as it is).
fn runs(follow: bool) -> (Vec<RunFigures>, u64) {
    let s = build(super::gpt2_shape_tests::Config {
        recompute: 2,
        ..SMALL
    });
    let lv = Liveness::analyse(&s.tensors, &s.nodes, ALIGN);
    let limit = (lv.persistent_bytes + lv.peak_transient_bytes) / 3;
    let dev = Device::default();
    let pool = super::gpt2_shape_tests::pool_for(limit, true);
    let fits = |plan: &_| {
        let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(plan), None);
        fits_pool(&s.tensors, &s.nodes, &program, &pool, S, &[])
    };
    // The planner of session 11, which placements (an experiment knob, off) were written and
    // measured on: with the moved rebuilds' dead links pruned, the small shape's runs taking
    // their placements do not end where they started (not looked into: placements are off).
    let knobs = Knobs {
        prune_moved_links: false,
        pin_below: 0,
    };
    let graph = (&s.tensors[..], &s.nodes[..], &lv, &[][..]);
    let (plan, cands) = fitted_candidates_with(graph, limit, ALIGN, knobs, fits);
    if follow {
        // Every candidate by the model, without and with the waits for copy-outs.
        for (policy, p) in &cands {
            let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(p), None);
            let start = Start::Fresh { freed: &[] };
            let Ok(fitted) = placements(&s.tensors, &s.nodes, &program, &pool, S, start, 2) else {
                continue;
            };
            let (link, cost) = (super::gpt2_shape_tests::LINK, &s.cost_ms);
            let plain = estimate(&s.tensors, &s.nodes, &program, cost, link, ALIGN);
            let waits = fitted.copy_waits();
            let e =
                estimate_with_copy_waits(&s.tensors, &s.nodes, &program, cost, link, ALIGN, waits);
            println!(
                "  {policy:?}: {:.2} ms, with copy waits {:.2} ms",
                plain.step_ms, e.step_ms
            );
        }
    }
    let program = Program::compile(&s.tensors, &s.nodes, &lv, Some(&plan), None);
    let dry_maps: u64 = pool_moves(&s.tensors, &s.nodes, &program, &pool, S, &[])
        .unwrap()
        .iter()
        .map(|m| m.maps)
        .sum();
    if follow {
        // What the waits for copy-outs whose ranges blocks take cost the step, by the model.
        let fitted = placements(
            &s.tensors,
            &s.nodes,
            &program,
            &pool,
            S,
            Start::Fresh { freed: &[] },
            2,
        )
        .expect("fits");
        let (link, cost) = (super::gpt2_shape_tests::LINK, &s.cost_ms);
        let plain = estimate(&s.tensors, &s.nodes, &program, cost, link, ALIGN);
        let waits = fitted.copy_waits();
        let e = estimate_with_copy_waits(&s.tensors, &s.nodes, &program, cost, link, ALIGN, waits);
        println!(
            "the model's step: {:.2} ms, {:.2} ms with the {} waits for copy-outs whose ranges blocks take (nodes {:.2} ms)",
            plain.step_ms,
            e.step_ms,
            waits.len(),
            cost.iter().sum::<f64>()
        );
    }
    let mut emu = Emulator::new(&s, &program, dev, pool, None);
    emu.place_kept();
    let mut figures = Vec::new();
    for run in 0..4 {
        let made = std::time::Instant::now();
        let placed = follow.then(|| {
            let start = emu.start();
            placements(
                &s.tensors,
                &s.nodes,
                &program,
                &emu.pool,
                S,
                Start::Live(&start),
                1,
            )
            .expect("the plan fits from where the last run left the pool")
        });
        if let Some(p) = &placed {
            // From the second run on each ends with the kept tensors where it started, so the
            // runtime's placements hold for the next run (`refresh_placements` reuses them).
            assert!(run == 0 || p.start == p.end, "run {run} ends elsewhere");
        }
        let made = made.elapsed();
        let queued = std::time::Instant::now();
        figures.push(emu.run(placed.as_ref()));
        println!(
            "  run {run}: placements made in {:.2} ms, the run's pool calls took {:.2} ms",
            made.as_secs_f64() * 1e3,
            queued.elapsed().as_secs_f64() * 1e3
        );
    }
    (figures, dry_maps)
}

#[test]
fn the_gpt2_shape_maps_no_pages_in_its_steady_step_when_runs_take_their_placements() {
    let (left, dry_maps) = runs(false);
    let (following, _) = runs(true);
    println!("the dry run's steady state maps {dry_maps} pages");
    println!("pool places every block: {left:?}");
    println!("runs take their placements: {following:?}");
    assert_eq!(
        dry_maps, 0,
        "the plan was fitted to map nothing in its steady state"
    );
    for f in &following[1..] {
        assert_eq!((f.maps, f.device_waits, f.misplaced), (0, 0, 0), "{f:?}");
    }
    let moved: u64 = left[1..].iter().map(|f| f.maps + f.take_backs).sum();
    assert!(moved > 0, "the pool left to itself drifts: {left:?}");
}
