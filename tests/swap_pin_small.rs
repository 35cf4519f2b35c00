//! `Policy::pin_below` (`RuntimeGraph::pin_small_tensors`; the runtime's default pins the
//! persistent tensors of at most a pool page, which the host backend does not have) on the host
//! backend: random training-like chains with a small parameter per layer, read by the layer's
//! forward node and updated in place at the run's end, and a small input the host writes before
//! every run, under budgets below the working set. Pinned (where they take at most a 64th of the
//! plan's budget), the small parameters stay on the device (kept, never copied) and every run's
//! results are bit-identical to the same runs without a limit; not pinned, some plans move them.

mod common;

use common::chains::{build_with, random_chain, Built, Chain, Rng, SmallParams};
use common::{bytes, floats};
use gkrt::runtime::RuntimeGraph;

const RUNS: usize = 6;
/// Floats in each small parameter.
const SMALL: usize = 4;
/// `swap::PIN_BELOW_SHARE`: pinned tensors take at most this share of a plan's budget.
const PIN_SHARE: u64 = 64;

/// The chain of `common::chains` with a small parameter per layer and a small input
/// (`build_with`), release schedules on as by default.
fn build(c: &Chain, limit: u64, pin: Option<u64>) -> Built {
    let small = SmallParams { floats: SMALL, pin };
    build_with(c, limit, true, Some(&small))
}

/// Writes run `run`'s small input.
fn feed(g: &mut Built, run: usize) {
    let v: Vec<f32> = (0..SMALL).map(|k| (k * 3 + run) as f32 / 256.0).collect();
    g.graph.write(g.input.unwrap(), &bytes(&v)).unwrap();
}

fn read_all(g: &mut RuntimeGraph, ids: &[u64]) -> Vec<Vec<u32>> {
    ids.iter()
        .map(|&id| {
            let t = g.graph.tensor_index(id).unwrap();
            let mut buf = vec![0u8; g.graph.tensors()[t as usize].size as usize];
            g.read(id, &mut buf).unwrap();
            floats(&buf).iter().map(|x| x.to_bits()).collect()
        })
        .collect()
}

/// Whether the plan copies or brings back any of `small`.
fn moves_any(g: &RuntimeGraph, small: &[u32]) -> bool {
    let Some(plan) = g.swap_plan() else {
        return false;
    };
    let moved = |lists: &[Vec<u32>]| lists.iter().flatten().any(|t| small.contains(t));
    moved(&plan.swap_out_after) || moved(&plan.prefetch_before) || moved(&plan.drop_after)
}

#[test]
fn pinned_small_parameters_stay_and_the_runs_match_the_unconstrained_ones() {
    let mut rng = Rng(41);
    let (mut pinned_plans, mut moved_unpinned) = (0, 0);
    // The runs' departures from their programs after tuning, pinned and not (printed: tiny
    // chains like these have some either way on the host backend's pool).
    let mut fallbacks = [0u64; 2];
    for _ in 0..16 {
        let c = random_chain(&mut rng);
        let size = c.size() as u64;
        let mut free = build(&c, 0, None);
        let want: Vec<_> = (0..RUNS)
            .map(|run| {
                feed(&mut free, run);
                free.graph.run().unwrap();
                read_all(&mut free.graph, &free.read)
            })
            .collect();
        // (The small parameters and their halves besides the chain's working set, as the pool
        // rounds them: written before the first run, they must fit beside the weights.)
        let small = (c.layers as u64 + 1) * (SMALL as u64 * 4).next_multiple_of(256);
        let working = (3 * c.layers as u64 + 2) * size + 2 * small;
        for divisor in [2, 3] {
            let limit = working / divisor + 4 * size + small;
            for pin in [Some(0), Some(SMALL as u64 * 4)] {
                let mut b = build(&c, limit, pin);
                if b.graph.swap_plan().is_none() {
                    continue;
                }
                for (run, want) in want.iter().enumerate() {
                    feed(&mut b, run);
                    b.graph.run().unwrap();
                    let what = format!(
                        "{} layers of {}, limit {limit}, pin {pin:?}, run {run}",
                        c.layers, c.side
                    );
                    assert_eq!(&read_all(&mut b.graph, &b.read), want, "{what}");
                    if run >= 2 {
                        fallbacks[usize::from(pin == Some(0))] += b.graph.last_run_fallbacks();
                    }
                }
                let (g, small) = (&b.graph, &b.small);
                let plan = g.swap_plan().unwrap();
                if pin == Some(0) {
                    moved_unpinned += moves_any(g, small) as usize;
                } else if (SMALL * 4 * (c.layers + 1)) as u64 <= plan.budget / PIN_SHARE {
                    pinned_plans += 1;
                    let what = format!("{} layers of {}, limit {limit}", c.layers, c.side);
                    assert!(!moves_any(g, small), "{what}: a pinned tensor moves");
                    assert!(small.iter().all(|t| plan.keep.contains(t)), "{what}");
                }
            }
        }
    }
    println!(
        "{pinned_plans} pinned plans; {moved_unpinned} unpinned plans move a small parameter; \
         fallbacks after tuning: pinned {}, not {}",
        fallbacks[0], fallbacks[1]
    );
    assert!(pinned_plans >= 8, "{pinned_plans} pinned plans");
    assert!(
        moved_unpinned > 0,
        "no unpinned plan moves a small parameter"
    );
}
