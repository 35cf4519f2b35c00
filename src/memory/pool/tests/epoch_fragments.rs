//! A step whose first epoch found is a fragment of it (a few temporaries freed early, found
//! before the step has reached its peak), whose plan is then left at once by the next fragment
//! like it: the recording goes on, so the whole step is found and its later repeats follow
//! the step's plan.

use super::epochs::idle_pool;
use super::*;

const MIB: u64 = 1 << 20;

/// One step over the weights: an input that lives through it, two fragments that start with
/// the same size over the same floor and part at their second allocation (the second's first
/// block lives to the step's end), then the step's large temporaries. Returns the addresses
/// it got.
fn step(p: &mut Pool, f: &fake::Fake) -> Vec<u64> {
    let mut got = Vec::new();
    let x = p.alloc(f, 8 * MIB, st(0)).unwrap();
    got.push(x);
    let mut held = Vec::new();
    for (second, keep) in [(4 * MIB, false), (2 * MIB, true)] {
        let t1 = p.alloc(f, 4 * MIB, st(0)).unwrap();
        let t2 = p.alloc(f, second, st(0)).unwrap();
        got.extend([t1, t2]);
        p.free(f, t2).unwrap();
        if keep {
            held.push(t1);
        } else {
            p.free(f, t1).unwrap();
        }
    }
    for k in 0..6u64 {
        let a = p.alloc(f, (12 + 4 * (k % 3)) * MIB, st(0)).unwrap();
        let b = p.alloc(f, 3 * MIB, st(0)).unwrap();
        got.extend([a, b]);
        p.free(f, b).unwrap();
        held.push(a);
    }
    for a in held {
        p.free(f, a).unwrap();
    }
    p.free(f, x).unwrap();
    check(p);
    got
}

#[test]
fn a_fragments_plan_left_at_once_does_not_stop_the_recording_of_its_step() {
    let (mut p, f) = idle_pool();
    let weights = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    let mut last = Vec::new();
    for _ in 0..12 {
        last = step(&mut p, &f);
    }
    let (followed, _) = p.epoch_counts();
    assert!(
        followed >= 4,
        "the step's plan followed {followed} times in 12 steps"
    );
    // From then on each step is placed as the last one was.
    let maps = f.map_calls();
    for _ in 0..4 {
        assert_eq!(step(&mut p, &f), last);
    }
    assert_eq!(f.map_calls(), maps);
    p.free(&f, weights).unwrap();
    check(&p);
}
