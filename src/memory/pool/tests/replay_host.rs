//! The traces recorded on a machine without a GPU (`benches/traces_host/`, written by
//! `benches/record_host_traces.py`): programs of kinds the pool's rules were not chosen on —
//! weights shared between layers, a state-space scan, a static key/value cache, a recurrent
//! model, checkpointing under bf16, a 12 MiB heap, among others. They check the rules; a rule
//! is never chosen on them.

use super::replay::{goal, load_trace, replay_with, CostModel, Figures};
use super::*;

/// A host-recorded trace with the defaults at the slow pace, as `trace_replay --passes 5`.
fn replay_host(name: &str) -> Figures {
    let path = format!(
        "{}/benches/traces_host/{name}.trace.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    let (evs, unfreed) = load_trace(&path);
    let p = Pool::new(PoolConfig::default());
    replay_with(
        &evs,
        &unfreed,
        p,
        (true, 11),
        CostModel::at_pace(false),
        false,
    )
}

/// Host traces over their goal, each held to the figures it has: its peak reserved over peak
/// live, and the page moves of its median later pass (BENCHMARKS.md, sessions 40 and 41).
/// - maml_meta_train's tasks of one shot (39 MiB) lay out 1.2 MiB activations that start and
///   end inside pages; its first task of five shots (75 MiB, 2.4 and 7.2 MiB activations) then
///   finds 12 MiB free in holes holding no whole page, so no move can take them and its 7.2 MiB
///   requests map new pages: 84 MiB reserved for 75.1 MiB live (1.1183, goal 1.05; PyTorch's
///   caching allocator 1.3579 on an H100); its later steps follow plans and map nothing.
///   Since session 51 a block whose position lived long in the last epoch over its floor is not
///   sent to the range's tail for its size (`tail_first.rs`): its 512-byte blocks that live
///   through a task, of a size that mostly lives a few allocations, take best fit's holes from
///   its 10,608th allocation on, and two 7.2 MiB requests of a later task (events 37,895 and
///   37,898) map 4 MiB more: 88 MiB (1.1715).
/// - treelstm_train's embedding gradient (4.9 MiB, dense) comes back at every depth of the
///   trees and is summed into a new block each time, its input projection's (1.5 MiB) too; its
///   first step, placed as it comes, leaves 3.5 MiB in holes of 0.5–1.5 MiB between them, and
///   its last 4.9 MiB sum maps pages at the top: 38 MiB for 33.4 MiB live (1.1381; goal 36 MiB,
///   a heap under 64 MiB; a clairvoyant placement 34; PyTorch's caching allocator 1.5574 on an
///   H100). Its later steps map nothing. Since session 50 its small step-lived blocks (2 KiB, in
///   holes of 3–5 KiB amid the step's blocks that best fit takes too) go to those holes' high
///   ends, as other small blocks do, and a later sum of its first pass maps one page more: 40
///   MiB (1.1980).
/// - early_exit_infer's batches shrink layer by layer as rows leave, by a share drawn per layer,
///   so no two of its requests are alike: its first pass reserves 488 MiB for 472.8 MiB live
///   (1.032), then in two later passes a request's move may not take the free pages an earlier
///   move placed (`allows_repeat`), so it maps new pages (526 MiB, 1.1126; 1.0322 at 5 µs per
///   physical allocation; PyTorch's caching allocator 1.6879 on an H100). A placement that
///   never moves pages needs 1.1153 (clairvoyant). Its later passes map 41, 25, 13 and 2
///   physical allocations, then none but 9 in the pass that starts to follow a plan of the
///   whole pass (the median of ten: 2). Since session 50 (step-lived blocks placed as usual in
///   best fit's own hole above the lowest) its later passes reach 512 and then 514 MiB (1.0872,
///   within its goal); six of its ten map 2 to 41 physical allocations (the median: 4).
/// - lbfgs_train (session 43) keeps 20 vectors of the model's size (7.11 MiB: L-BFGS's 10
///   pairs), each for ten iterations, first in, first out, between 8 MiB activations; a freed
///   vector's hole cannot hold an activation. Moves take the chunks that lie wholly inside
///   holes; just before its first peak 4 MiB stay mapped inside free blocks, in chunks that
///   reach under live neighbours, and each hole keeps the pages it shares with them: 386 MiB
///   reserved at that peak, 396 later, for 358.1 MiB live (1.1057). A clairvoyant placement
///   that moves no page needs 1.0610.
/// - wgan_gp_train (session 43): at its first critic step's peak an 8 MiB request finds 9.9
///   MiB free, 4 MiB of it just below the range's tail but kept from joining it by a 1 KiB
///   block (allocated at event 450, freed at 750) placed at the tail's start while the 4 MiB
///   block below it was live (freed at 465), the rest in holes of 1.0–1.5 MiB between live
///   blocks: it maps 8 MiB (152 MiB, then 154, for 144.6 live: 1.0648; clairvoyant 1.0371).
/// - kfac_train (session 53) keeps each layer's covariances and their inverses (up to 4 MiB
///   each) and makes the inverses anew every fourth step, through eigendecompositions whose
///   blocks come and go between them: 128 MiB for 112.7 MiB live (1.1354). A clairvoyant
///   placement that moves no page needs 1.0822; moves without a time limit give the same.
///
/// Recorded in session 58 (`host_workloads_inner.py`), over as they came:
/// - fedavg_train: each client's batch (8-48 images) gives its activations sizes of their own,
///   and its gradients and momentum (made at its first update, dropped with it) take holes
///   between them. A later client's 23.6 MiB activation finds 40 MiB free in two holes split
///   by a 1.1 MiB block and smaller ones; the moves that would take the free pages are
///   declined, those pages having been placed by earlier moves (`allows_repeat`: the replay,
///   with no work between calls, earns almost no share), so it maps new pages: 148 MiB for
///   114.5 MiB live (1.2928). A clairvoyant placement needs 1.0133; moves without a time
///   limit give 1.0832.
/// - mc_dropout_infer: 8-16 stochastic passes a batch of drawn shape; each layer's 30.8 MiB
///   blocks come back beside 7.7 MiB blocks that live through the whole pass, and their pages
///   move between a hole and the range's top, pass after pass, until repeated moves are
///   declined and new pages are mapped: 190 MiB for 165.2 MiB live (1.1498, goal 1.10). A
///   clairvoyant placement and moves without a time limit both give 1.0530.
/// - style_transfer_train: each step's image has its sides drawn anew (128-224 pixels), so no
///   two steps' feature maps are alike; the first iteration already reserves 126 MiB for
///   111.4 MiB live, holes of 0.3-5.6 MiB between the feature maps, and a later step reaches
///   136 MiB for 113.2 (1.2014). Over for any placement that moves no page (clairvoyant
///   1.1417); moves without a time limit give 1.1131.
const OVER: [(&str, f64, u64); 9] = [
    ("maml_meta_train", 1.1716, 0),
    ("treelstm_train", 1.1981, 0),
    ("early_exit_infer", 1.0873, 4),
    ("lbfgs_train", 1.1058, 0),
    ("wgan_gp_train", 1.0649, 0),
    ("kfac_train", 1.1355, 0),
    ("fedavg_train", 1.2929, 0),
    ("mc_dropout_infer", 1.1499, 0),
    ("style_transfer_train", 1.2015, 0),
];

/// Every host-recorded trace replayed as `trace_replay --passes 5` replays it, at both paces:
/// its peak reserved within the goal, and its median later pass mapping nothing (the
/// pool's recycling settles rather than moving pages every step); those of `OVER` within their
/// figures.
#[test]
fn traces_recorded_on_the_cpu_stay_within_their_goals() {
    set_within_goals("benches/traces_host", 72, &OVER);
}

/// GPU recordings of host programs over their goal, each held to its figures at the slower of
/// the two paces (peak reserved over peak live, median later pass's physical allocations
/// mapped; BENCHMARKS.md, sessions 42 and 44). Each one's clairvoyant placement (`trace_steps.py`):
/// - early_exit_infer 1.1030: over its goal (1.10) for any placement that moves no page; the
///   pool's first pass leaves its layout at 1.1513, no later pass moving a page (until session
///   45 the share of the time since the replay's start let later passes move the pages earlier
///   moves placed, 16 a pass at the 8 µs pace, and map new ones too until pass 7: 1.2441).
/// - unet3d_train 1.0542: its first step's plan needs more than the plan's room over the
///   high-water mark (5%), so its second and third steps are placed as they come; the third,
///   the moves at the peak having spent their allowance and the pages earlier moves placed not
///   moving again, maps 32 MiB more (1.0844; 34 since session 50, 1.0877).
/// - treelstm_train 1.0112 and maml_meta_train 1.0046: as in their CPU recordings, their first
///   steps leave free memory in holes that hold no whole page, which no move can take (1.0707,
///   1.0597).
///
/// Recorded in session 44 (H100):
/// - vqvae_train 1.2178: any placement that moves no page is far over its goal (its 96.5 MiB
///   and 67 MiB requests come and go between the codebook's large temporaries); the pool's moves
///   bring it to 1.1040, and moving in every pass would give 1.0401 for 84 physical allocations
///   unmapped a pass, which the time share declines.
/// - bilstm_crf_train 1.0000: its last step's 78 MiB request maps 39 pages while 24 MiB lie
///   mapped in free blocks, the moves that would take them declined by the time bucket, which
///   at the replay's pace (400 ns of work an operation) earns 4 ns an operation (1.0965; with
///   the share unlimited 1.0446, as `trace_replay` on the H100, whose real clock earns more).
/// - lbfgs_train 1.0550: as its CPU recording, vectors kept first in, first out leave holes an
///   activation cannot use (1.1201).
///
/// Recorded in session 54 (H100):
/// - kfac_train 1.0655: over its goal for any placement that moves no page, as its CPU
///   recording is; 202 MiB for 176.4 MiB live (1.1448, PyTorch's caching allocator the same in
///   the same replay on the H100).
/// - prefetch_stream_train 1.0582: over its goal for any placement that moves no page. Its
///   second pass, which allocates the trace's opening blocks again over the layout the first
///   pass left, raises the peak from 436 to 446 MiB (1.0678; 1.0725 at the fast pace; 1.1156
///   before `own_stream_moves`, when the side stream's batches took pages from the model's
///   range and gave them back in every pass: 14 physical allocations each way with the trace's
///   opening blocks kept). The side stream still moves one or two of its own pages a pass.
///
/// Recorded in session 55 (H100):
/// - mean_teacher_side_train 1.0095: its first full step, the student's activations on one
///   stream and the teacher's forward on another interleaving, maps 456 MiB for 405 live, and a
///   later one 464 (1.1424; 1.1621 without `own_stream_moves`).
///
/// Recorded in session 58 (H100):
/// - mc_dropout_infer 1.0430: as its CPU recording, each stochastic pass's largest blocks (23
///   and 31 MiB) come back pass after pass, and once the moves that would take the pages
///   earlier moves placed are declined they map new ones: a 31 MiB request (event 2340) maps
///   30 MiB while 48 MiB of mapped pages lie free in whole chunks, all placed by earlier moves
///   (254 MiB for 207.1 live, 1.2265; PyTorch's caching allocator 1.3423 in the same replay on
///   the H100; moves without a time limit 1.0526).
/// - style_transfer_train 1.0717: over its goal for any placement that moves no page, and the
///   pool reserves what that clairvoyant placement needs, to the granule (196 MiB for 182.9
///   live, 1.0717; PyTorch's caching allocator 1.2576; moves without a time limit 1.0607).
const OVER_GPU: [(&str, f64, u64); 12] = [
    ("early_exit_infer_gpu", 1.1514, 0),
    ("unet3d_train_gpu", 1.0878, 0),
    ("treelstm_train_gpu", 1.0708, 0),
    ("maml_meta_train_gpu", 1.0598, 0),
    ("vqvae_train_gpu", 1.1041, 0),
    ("bilstm_crf_train_gpu", 1.0966, 0),
    ("lbfgs_train_gpu", 1.1202, 0),
    ("kfac_train_gpu", 1.1449, 0),
    ("prefetch_stream_train_gpu", 1.0726, 1),
    ("mean_teacher_side_train_gpu", 1.1425, 0),
    ("mc_dropout_infer_gpu", 1.2266, 0),
    ("style_transfer_train_gpu", 1.0718, 0),
];

/// The GPU recordings of host programs (`benches/traces_hostgpu/`, `run.sh hostgpu`), replayed
/// as the CPU recordings are: within their goals, or within their figures (`OVER_GPU`).
#[test]
fn traces_recorded_on_a_gpu_stay_within_their_goals() {
    set_within_goals("benches/traces_hostgpu", 42, &OVER_GPU);
}

/// Every trace in `dir` (under the crate), at least `least` of them, replayed at both paces:
/// peak reserved within its goal and a median later pass mapping nothing, or, for those in
/// `over`, within the figures held there.
fn set_within_goals(dir: &str, least: usize, over: &[(&str, f64, u64)]) {
    let dir = format!("{}/{dir}", env!("CARGO_MANIFEST_DIR"));
    let mut paths: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .filter(|p| p.ends_with(".trace.gz"))
        .collect();
    paths.sort();
    assert!(paths.len() >= least, "{} traces in {dir}", paths.len());
    let mut missed = Vec::new();
    for path in &paths {
        let (evs, unfreed) = load_trace(path);
        let name = path
            .rsplit('/')
            .next()
            .unwrap()
            .trim_end_matches(".trace.gz");
        for fast in [false, true] {
            let cfg = PoolConfig::default();
            let f = replay_with(
                &evs,
                &unfreed,
                Pool::new(cfg),
                (true, 11),
                CostModel::at_pace(fast),
                false,
            );
            let mut later = f.steady_maps.clone();
            later.sort_unstable();
            let ratio = f.peak_reserved as f64 / f.peak_live as f64;
            let (g, moves) = match over.iter().find(|o| o.0 == name) {
                Some(&(_, held, moves)) => ((held * f.peak_live as f64) as u64, moves),
                None => (goal(name, f.peak_live), 0),
            };
            if f.peak_reserved > g || later[later.len() / 2] > moves {
                missed.push(format!(
                    "{name} (fast {fast}): {ratio:.4} of its peak live, goal {:.4}; maps per later pass {later:?}",
                    g as f64 / f.peak_live as f64
                ));
            }
        }
    }
    assert!(missed.is_empty(), "{missed:#?}");
}

/// An epoch or period found again is planned once (the planner costs about 2 µs an
/// allocation). deit_infer_batches finds its layers' period again in every request: 8 plans in
/// 11 passes, where each finding replaced the period kept and its plan was made anew (19 in
/// all; the planner was then 56% of the pool's instructions). gptj_generate_sampling's pass is
/// an epoch of 70,866 allocations whose plan's pages the pool may not map: planned once, where
/// it was planned anew after each wait (3 times; 130 ms each on the build machine).
#[test]
fn epochs_and_periods_found_again_are_planned_once() {
    for (name, most) in [("deit_infer_batches", 8), ("gptj_generate_sampling", 1)] {
        let f = replay_host(name);
        assert!(f.plans <= most, "{name}: {} plans", f.plans);
        assert!(f.epochs.0 + f.epochs.1 > 0, "{name}: no plan chosen");
    }
}

/// A sampler whose inner loop is found as a period near its end, so that the turn steering its
/// carry outlasts the step (dit_sample): its steps still follow plans, where before the steering
/// hid every step's end (no plan followed, 979 placements by search in every later pass).
#[test]
fn a_sampler_steering_past_its_steps_end_follows_step_plans() {
    let f = replay_host("dit_sample");
    assert!(f.epochs.0 >= 10, "epochs followed, left: {:?}", f.epochs);
    let mut cold = f.cold_per_op.clone();
    cold.sort_by(f64::total_cmp);
    assert_eq!(
        cold[cold.len() / 2],
        0.0,
        "placements by search an operation: {cold:?}"
    );
}

/// dit_sample's denoising loop is found as a period whose turns carry blocks into the next. A
/// turn right after a steering turn that must steer again does not (`epochs/periodic.rs`): the
/// carry came off its slots, so steering would not end in a followed turn, and each steering
/// turn holds slots the turn then maps memory beside. One turn steers in the whole replay, and
/// the first pass reserves 1.0444 of the peak live (nine turns and 1.0662 before: BENCHMARKS.md,
/// session 40).
#[test]
fn a_period_whose_carry_comes_off_its_slots_again_is_not_steered_again() {
    let f = replay_host("dit_sample");
    assert_eq!(f.turns_steered, 1);
    let ratio = f.peak_reserved as f64 / f.peak_live as f64;
    assert!(ratio < 1.045, "{ratio}");
    assert_eq!(f.peak_pass, 0);
}

/// A trace's file name names it in every report (`scripts/host_replay.py compare`, the GPU
/// replay's tables): no two sets may hold the same name. Session 43 recorded a second
/// `dlrm_train` into `traces_host/` before this was checked.
#[test]
fn trace_names_are_unique_across_the_sets() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut seen: std::collections::HashMap<String, String> = Default::default();
    for dir in [
        "../shared/traces",
        "benches/traces",
        "benches/traces_heldout",
        "benches/traces_host",
        "benches/traces_hostgpu",
    ] {
        let Ok(entries) = std::fs::read_dir(format!("{root}/{dir}")) else {
            assert_eq!(dir, "../shared/traces", "{dir} is missing");
            continue;
        };
        for e in entries {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".trace.gz") {
                if let Some(other) = seen.insert(stem.to_string(), dir.to_string()) {
                    panic!("{stem} is in both {other} and {dir}");
                }
            }
        }
    }
    assert!(seen.len() >= 90, "{} traces", seen.len());
}
