//! Allocation at the range a dry run placed it in (`placement.rs`): free and pending parts taken
//! alike, the parts outside the range kept as they were, a range that is not free refused with
//! nothing changed; and over random sequences the real pool, whose copy-out frees are pending,
//! lands every allocation where the dry run (which frees them at once) did.

use super::*;
use crate::memory::pool::dry_run::DryRunStep;
use crate::memory::pool::placement::{Anchor, Placement};

/// A virtual range with `PAGE`s mapped well beyond what the tests use, all free again.
fn warm_range(mapped: u64) -> (Pool, Fake) {
    let f = Fake::virtual_memory();
    let mut p = vpool(u64::MAX);
    let all = p.alloc(&f, mapped, st(0)).unwrap();
    p.free(&f, all).unwrap();
    (p, f)
}

#[test]
fn a_range_over_free_and_pending_blocks_is_taken_and_their_rest_keeps_its_state() {
    let (mut p, f) = warm_range(64 * MIB);
    let a = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    let c = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    let _d = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    // a free, b pending on 7, c pending on 8: three blocks side by side, none coalesced.
    p.free(&f, a).unwrap();
    p.free_after_event(&f, b, EventId(7)).unwrap();
    p.free_after_event(&f, c, EventId(8)).unwrap();
    check(&p);
    // [a + 3 MiB, c + 1 MiB): the top of a, all of b, the bottom of c.
    let at = Placement {
        addr: a + 3 * MIB,
        anchor: Anchor::SegmentBase(a),
        above: None,
    };
    let mut events = Vec::new();
    let got = p.take_at(&f, at, 6 * MIB, st(0), &mut events);
    assert_eq!(got, Some(a + 3 * MIB));
    assert_eq!(events, vec![EventId(7), EventId(8)]);
    check(&p);
    // c's upper 3 MiB are still pending on 8; a's lower 3 MiB are free.
    assert_eq!(p.pending_free_bytes(), 3 * MIB);
    assert_eq!(p.block_size(a + 3 * MIB), Some(6 * MIB));
    assert_eq!(p.alloc(&f, 3 * MIB, st(0)).unwrap(), a);
    f.complete(EventId(8));
    p.free(&f, a + 3 * MIB).unwrap();
    assert_eq!(
        p.pending_free_bytes(),
        3 * MIB,
        "events are polled on allocation"
    );
    let _ = p.alloc(&f, 256, st(0)).unwrap();
    assert_eq!(p.pending_free_bytes(), 0);
    check(&p);
}

#[test]
fn a_range_that_is_not_free_is_refused_and_nothing_changes() {
    let (mut p, f) = warm_range(64 * MIB);
    let a = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    let _c = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    p.free_after_event(&f, a, EventId(7)).unwrap();
    let before = (p.stats(), p.pending_free_bytes(), p.pending_free_blocks());
    let mut events = Vec::new();
    // Overlaps live b.
    let at = Placement {
        addr: a + MIB,
        anchor: Anchor::SegmentBase(a),
        above: None,
    };
    assert_eq!(p.take_at(&f, at, 4 * MIB, st(0), &mut events), None);
    // An anchor that is not a live block, another stream, zero bytes.
    let lost = Placement {
        addr: a,
        anchor: Anchor::Block(a + 123 * 256),
        above: None,
    };
    assert_eq!(p.take_at(&f, lost, MIB, st(0), &mut events), None);
    let at = Placement {
        addr: a,
        anchor: Anchor::SegmentBase(a),
        above: None,
    };
    assert_eq!(p.take_at(&f, at, MIB, st(1), &mut events), None);
    assert_eq!(p.take_at(&f, at, 0, st(0), &mut events), None);
    assert!(events.is_empty());
    assert_eq!(
        (p.stats(), p.pending_free_bytes(), p.pending_free_blocks()),
        before
    );
    check(&p);
    // Unmapped memory (the range's tail beyond what was mapped) is refused too.
    let top = Placement {
        addr: b + 200 * MIB,
        anchor: Anchor::Block(b),
        above: None,
    };
    assert_eq!(p.take_at(&f, top, MIB, st(0), &mut events), None);
    check(&p);
}

#[test]
fn plain_segments_keep_their_busy_counts() {
    let f = Fake::plain();
    let mut p = pool();
    // One medium segment holding four blocks.
    let a = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    let c = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    let _d = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    p.free_after_event(&f, a, EventId(3)).unwrap();
    p.free_after_event(&f, b, EventId(4)).unwrap();
    p.free(&f, c).unwrap();
    // a's upper half and b's lower half.
    let mut events = Vec::new();
    let at = Placement {
        addr: a + MIB,
        anchor: Anchor::SegmentBase(a),
        above: None,
    };
    assert_eq!(
        p.take_at(&f, at, 2 * MIB, st(0), &mut events),
        Some(a + MIB)
    );
    assert_eq!(events, vec![EventId(3), EventId(4)]);
    check(&p);
    f.complete(EventId(3));
    f.complete(EventId(4));
    p.free(&f, a + MIB).unwrap();
    let _ = p.alloc(&f, 256, st(0)).unwrap();
    assert_eq!(p.pending_free_bytes(), 0);
    check(&p);
}

/// A tiny deterministic generator (the sequences must not change between runs).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random program of allocations and frees, some frees "copy-outs" (pending on an event in the
/// real pool, at once in the dry run): (steps, which frees are copy-outs).
fn random_program(rng: &mut Rng, len: usize) -> (Vec<DryRunStep>, Vec<bool>) {
    let mut steps = Vec::new();
    let mut copied = Vec::new();
    let mut live: Vec<usize> = Vec::new();
    for _ in 0..len {
        if live.len() < 3 || (rng.below(100) < 55 && live.len() < 24) {
            let bytes = match rng.below(4) {
                0 => (1 + rng.below(64)) * KIB,
                1 => (1 + rng.below(4)) * MIB,
                _ => (1 + rng.below(2048)) * 4 * KIB,
            };
            live.push(steps.len());
            steps.push(DryRunStep::Alloc {
                bytes,
                stream: st(0),
            });
            copied.push(false);
        } else {
            let step = live.swap_remove(rng.below(live.len() as u64) as usize);
            steps.push(DryRunStep::Free { step });
            copied.push(rng.below(100) < 60);
        }
    }
    (steps, copied)
}

/// Plays `steps` on the real pool: copy-out frees pending on an event of their own (completed at
/// random later), allocations at the dry run's placements when `follow`, else plain. Returns
/// how many allocations landed where the dry run put them, and how many there were.
fn replay(follow: bool, seed: u64) -> (usize, usize) {
    let (mut p, f) = warm_range(256 * MIB);
    let mut rng = Rng(seed);
    let (steps, copied) = random_program(&mut rng, 400);
    let mut placed = vec![None; steps.len()];
    let mut planned = vec![0u64; steps.len()];
    p.dry_run_placed(&steps, |i, sim, addr| {
        if let Some(addr) = addr {
            planned[i] = addr;
            placed[i] = sim.placement_of(addr);
        }
    })
    .unwrap();
    let mut addrs = vec![0u64; steps.len()];
    let mut in_flight: Vec<EventId> = Vec::new();
    let (mut same, mut allocs) = (0, 0);
    for (i, step) in steps.iter().enumerate() {
        // The device finishes some copies.
        if !in_flight.is_empty() && rng.below(100) < 30 {
            let e = in_flight.remove(0);
            f.complete(e);
        }
        match *step {
            DryRunStep::Alloc { bytes, stream } => {
                allocs += 1;
                let mut events = Vec::new();
                let taken = placed[i]
                    .filter(|_| follow)
                    .and_then(|at| p.take_at(&f, at, bytes, stream, &mut events));
                let addr = match taken {
                    Some(a) => a,
                    None => p.alloc(&f, bytes, stream).unwrap(),
                };
                // Whatever was waited for was a copy still in flight.
                for e in &events {
                    assert!(in_flight.contains(e), "step {i}: waited for {e:?}, done");
                }
                addrs[i] = addr;
                same += (addr == planned[i]) as usize;
            }
            DryRunStep::Free { step } => {
                if copied[i] {
                    let e = EventId(1000 + i as u32);
                    p.free_after_event(&f, addrs[step], e).unwrap();
                    in_flight.push(e);
                } else {
                    p.free(&f, addrs[step]).unwrap();
                }
            }
            DryRunStep::FreeLive { .. }
            | DryRunStep::FreePending { .. }
            | DryRunStep::Complete { .. }
            | DryRunStep::CompleteAll => unreachable!(),
        }
        check(&p);
    }
    (same, allocs)
}

#[test]
fn following_the_dry_runs_placements_lands_every_allocation_where_it_planned() {
    let mut diverged = 0;
    for seed in 1..=12u64 {
        let (same, allocs) = replay(true, seed * 0x9E37_79B9);
        assert_eq!(
            same, allocs,
            "seed {seed}: {same} of {allocs} where planned"
        );
        let (plain, _) = replay(false, seed * 0x9E37_79B9);
        diverged += (plain < allocs) as usize;
    }
    // Without the placements the pending copy-outs make the real pool place blocks elsewhere.
    assert!(
        diverged >= 6,
        "plain allocation diverged in {diverged} of 12 programs"
    );
}
