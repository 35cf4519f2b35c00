//! Step-lived blocks (`epochs/step_lived.rs`, `step_lived.rs`): an allocation that, at its
//! position in the last epoch over the same floor, lived through the epoch is placed at the
//! lowest free place of the range in an epoch that follows no plan, not in the hole best fit
//! finds for it.

use super::*;

const MIB: u64 = 1 << 20;

fn pool(step_lived_low: bool) -> (Pool, Fake) {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let p = Pool::new(PoolConfig {
        vmm_reserve_bytes: 4 << 30,
        vmm_page_bytes: PAGE,
        step_lived_low,
        ..PoolConfig::default()
    });
    (p, f)
}

/// A step at scale `s` over the floor: four blocks, the first and third freed, then a block of
/// the third's size it keeps to its end (position 4), a temporary, the rest freed, and a last
/// small allocation. Returns the first block's address and the kept one's.
fn step(p: &mut Pool, f: &Fake, s: u64) -> (u64, u64) {
    let t: Vec<u64> = [12, 8, 8, 8]
        .iter()
        .map(|&m| p.alloc(f, m * MIB * s, st(0)).unwrap())
        .collect();
    p.free(f, t[0]).unwrap();
    p.free(f, t[2]).unwrap();
    let keep = p.alloc(f, 8 * MIB * s, st(0)).unwrap();
    let u = p.alloc(f, 2 * MIB * s, st(0)).unwrap();
    p.free(f, t[1]).unwrap();
    p.free(f, t[3]).unwrap();
    let last = p.alloc(f, MIB, st(0)).unwrap();
    p.free(f, u).unwrap();
    p.free(f, last).unwrap();
    p.free(f, keep).unwrap();
    check(p);
    (t[0], keep)
}

/// The first step teaches that its fifth allocation lives to its end; the next, at another
/// scale (so it follows no plan), places it in the lowest hole that holds it — the first
/// block's — where best fit takes the third's, of its size.
#[test]
fn a_block_that_lived_through_the_last_step_goes_to_the_lowest_free_place() {
    let mut placed = Vec::new();
    for on in [false, true] {
        let (mut p, f) = pool(on);
        let weights = p.alloc(&f, 10 * MIB, st(0)).unwrap();
        step(&mut p, &f, 1);
        let (low, keep) = step(&mut p, &f, 2);
        placed.push((low, keep));
        p.free(&f, weights).unwrap();
        check(&p);
    }
    let ((low_off, keep_off), (low_on, keep_on)) = (placed[0], placed[1]);
    assert_ne!(keep_off, low_off, "best fit took the lowest hole too");
    assert_eq!(keep_on, low_on);
}

/// A step over a floor with a 10 MiB hole in it: four blocks of `12 × s` MiB, two freed, then
/// a block of `keep` MiB it keeps to its end (position 4), which the hole holds and they do not,
/// the rest freed, and a last small allocation. Returns the kept block's address.
fn step_beside(p: &mut Pool, f: &Fake, s: u64, keep: u64) -> u64 {
    let t: Vec<u64> = (0..4)
        .map(|_| p.alloc(f, 12 * MIB * s, st(0)).unwrap())
        .collect();
    p.free(f, t[0]).unwrap();
    p.free(f, t[2]).unwrap();
    let k = p.alloc(f, keep * MIB, st(0)).unwrap();
    p.free(f, t[1]).unwrap();
    p.free(f, t[3]).unwrap();
    let last = p.alloc(f, MIB, st(0)).unwrap();
    p.free(f, last).unwrap();
    p.free(f, k).unwrap();
    check(p);
    k
}

/// A step no larger than one before does not move pages under its step-lived block: the pages
/// there went away since (here the cache is emptied before every step), and mapping them again
/// every step would be churn. The lowest free place is a hole in the floor, without pages: the
/// steps whose kept block is larger than any before map it; the one after a larger one puts
/// its block where best fit does.
#[test]
fn pages_are_gathered_for_a_step_lived_block_only_when_it_is_larger_than_before() {
    let (mut p, f) = pool(true);
    let weights = p.alloc(&f, 10 * MIB, st(0)).unwrap();
    let hole = p.alloc(&f, 10 * MIB, st(0)).unwrap();
    let more = p.alloc(&f, 2 * MIB, st(0)).unwrap();
    p.free(&f, hole).unwrap();
    // Each step at its own scale: none follows another's plan.
    step_beside(&mut p, &f, 1, 5);
    let mut low = Vec::new();
    for (s, keep) in [(2, 6), (3, 5), (4, 7)] {
        p.release_cached(&f).unwrap();
        low.push((keep, step_beside(&mut p, &f, s, keep) == hole));
    }
    assert_eq!(low, vec![(6, true), (5, false), (7, true)]);
    p.free(&f, more).unwrap();
    p.free(&f, weights).unwrap();
    check(&p);
}

/// Over a floor of many blocks, an epoch's first walk for a low place passes them all; the
/// next starts above the floor that walk found, so two step-lived blocks cost one pass over
/// the floor, not two.
#[test]
fn the_walks_after_an_epochs_first_start_above_its_floor() {
    let (mut p, f) = pool(true);
    let floor: Vec<u64> = (0..300)
        .map(|_| p.alloc(&f, 4 * KIB, st(0)).unwrap())
        .collect();
    // A step making two blocks it keeps to its end (positions 1 and 3) among temporaries, and as
    // many more as the floor has blocks.
    let step = |p: &mut Pool, s: u64| {
        let a = p.alloc(&f, 8 * MIB * s, st(0)).unwrap();
        let k1 = p.alloc(&f, MIB * s, st(0)).unwrap();
        let b = p.alloc(&f, 8 * MIB * s, st(0)).unwrap();
        let k2 = p.alloc(&f, MIB * s, st(0)).unwrap();
        let walked = p.streams[0].epochs.lowest_walked();
        p.free(&f, a).unwrap();
        p.free(&f, b).unwrap();
        // As many allocations again as the floor has blocks: an epoch is learnt from only then.
        for _ in 0..300 {
            let t = p.alloc(&f, 64 * KIB, st(0)).unwrap();
            p.free(&f, t).unwrap();
        }
        let last = p.alloc(&f, MIB, st(0)).unwrap();
        p.free(&f, last).unwrap();
        p.free(&f, k1).unwrap();
        p.free(&f, k2).unwrap();
        check(p);
        (k1, k2, walked)
    };
    step(&mut p, 1);
    let (k1, k2, walked) = step(&mut p, 2);
    // Both went above the floor, the first walk passing its 300 blocks and the second not.
    let top = floor.iter().max().unwrap() + 4 * KIB;
    assert!(top <= k1 && k1 < k2, "{k1:x} {k2:x} above {top:x}");
    assert!((300..400).contains(&walked), "walked {walked}");
    for a in floor {
        p.free(&f, a).unwrap();
    }
    check(&p);
}

/// A step: two blocks of `a` bytes, the first freed, then one of `keep` bytes it keeps to its
/// end (position 2), which the first one's hole holds, the second freed, and a last small
/// allocation. Returns the first block's address, the kept one's, and the blocks the walks for
/// a low place had visited when the kept one was placed.
fn step_in_a_hole(p: &mut Pool, f: &Fake, a: u64, keep: u64) -> (u64, u64, u64) {
    let x = p.alloc(f, a, st(0)).unwrap();
    let y = p.alloc(f, a, st(0)).unwrap();
    p.free(f, x).unwrap();
    let k = p.alloc(f, keep, st(0)).unwrap();
    let walked = p.streams[0].epochs.lowest_walked();
    p.free(f, y).unwrap();
    let last = p.alloc(f, 4 * KIB, st(0)).unwrap();
    p.free(f, last).unwrap();
    p.free(f, k).unwrap();
    check(p);
    (x, k, walked)
}

/// Where a step-lived block's lowest hole is the one best fit takes anyway, it goes to the
/// hole's low end only when that hole is the first free block above the floor. With a smaller
/// hole in the floor below, its hole lies amid the step's blocks, and it is placed as any other:
/// a request of at most a page takes the hole's high end, the rest of the hole staying beside
/// the block below, whose free grows it.
#[test]
fn a_step_lived_block_in_best_fits_own_hole_goes_low_only_beside_the_floor() {
    let (a, keep) = (1792 * KIB, 1280 * KIB);
    for gap in [false, true] {
        let (mut p, f) = pool(true);
        let weights = p.alloc(&f, 10 * MIB, st(0)).unwrap();
        let hole = p.alloc(&f, 64 * KIB, st(0)).unwrap();
        let more = p.alloc(&f, MIB, st(0)).unwrap();
        if gap {
            p.free(&f, hole).unwrap();
        }
        step_in_a_hole(&mut p, &f, 1536 * KIB, MIB);
        // Other sizes: the step follows no plan, and its kept block is predicted step-lived.
        let (x, k, walked) = step_in_a_hole(&mut p, &f, a, keep);
        assert!(
            walked > 0,
            "no walk for a low place: not predicted step-lived"
        );
        let high = x + a - keep;
        assert_eq!(k, if gap { high } else { x }, "gap {gap}: hole at {x:x}");
        if !gap {
            p.free(&f, hole).unwrap();
        }
        p.free(&f, more).unwrap();
        p.free(&f, weights).unwrap();
        check(&p);
    }
}
