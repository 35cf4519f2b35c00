//! Searching for a smaller arena than greedy's.
//!
//! 1. Greedy with a few other orders; keep the best.
//! 2. For problems of up to [`DFS_MAX_ITEMS`] items: a branch-and-bound over *canonical*
//!    placements, per independent component (a step that no item spans splits the problem), with
//!    restarts.
//! 3. Otherwise, or if time remains: greedy with randomly perturbed orders.
//!
//! The branch-and-bound itself (one component, one target) is in `dfs.rs`; this file drives it:
//! components, restarts, targets, and the greedy orders around it.

mod dfs;

use super::{greedy, items_lower_bound, items_size, Item};
use dfs::{Dfs, Outcome, ORDERS};
use std::time::Instant;

/// Largest problem for which the branch-and-bound is used.
const DFS_MAX_ITEMS: usize = 5_000;
/// Stack for the search thread (the search recurses about once per node on its path).
const SEARCH_STACK: usize = 256 << 20;
/// Node limit of a restart: this times the Luby sequence.
const RESTART_BASE: u64 = 500;
/// Rounds of floor raising per node.
const RAISE_ROUNDS: usize = 8;

/// Best placement found by `deadline`; stops early once its size is at most `target` or the
/// lower bound.
pub(crate) fn solve(
    items: &[Item],
    sections: usize,
    deadline: Instant,
    target: Option<u64>,
) -> Vec<u64> {
    let lb = items_lower_bound(items, sections);
    let goal = target.map_or(lb, |t| t.max(lb));
    let mut best = greedy::place(items, sections, &greedy::size_order(items));
    let mut best_size = items_size(items, &best);
    let done = |size: u64| size <= goal || Instant::now() >= deadline;
    if done(best_size) {
        return best;
    }
    for ord in greedy_orders(items) {
        let offs = greedy::place(items, sections, &ord);
        let size = items_size(items, &offs);
        if size < best_size {
            (best, best_size) = (offs, size);
        }
        if done(best_size) {
            return best;
        }
    }
    if items.len() <= DFS_MAX_ITEMS {
        let improve_every = if target.is_some() { 8 } else { 2 };
        let spawned = std::thread::scope(|sc| {
            std::thread::Builder::new()
                .stack_size(SEARCH_STACK)
                .spawn_scoped(sc, || {
                    let mut b = best.clone();
                    bnb(items, deadline, goal, improve_every, &mut b);
                    b
                })
                .ok()
                .and_then(|h| h.join().ok())
        });
        match spawned {
            Some(b) => best = b,
            None => bnb(items, deadline, goal, improve_every, &mut best),
        }
        best_size = items_size(items, &best);
        if done(best_size) {
            return best;
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let base = greedy::size_order(items);
    while !done(best_size) {
        let ord = perturbed(items, &base, &mut rng);
        let offs = greedy::place(items, sections, &ord);
        let size = items_size(items, &offs);
        if size < best_size {
            (best, best_size) = (offs, size);
        }
    }
    best
}

/// A few deterministic alternatives to the default greedy order.
fn greedy_orders(items: &[Item]) -> Vec<Vec<u32>> {
    use std::cmp::Reverse;
    let idx = || (0..items.len() as u32).collect::<Vec<u32>>();
    let it = |i: &u32| &items[*i as usize];
    let mut a = idx();
    a.sort_by_key(|i| (Reverse(it(i).size), Reverse(it(i).steps), it(i).ss, *i));
    let mut b = idx();
    b.sort_by_key(|i| (Reverse(it(i).size), Reverse(it(i).se), *i));
    let mut c = idx();
    c.sort_by_key(|i| {
        (
            Reverse(it(i).size as u128 * it(i).steps as u128),
            it(i).ss,
            *i,
        )
    });
    let mut d = idx();
    d.sort_by_key(|i| (Reverse(it(i).steps), Reverse(it(i).size), *i));
    vec![a, b, c, d]
}

/// The size order with each size scaled by a random factor in [0.85, 1.15).
fn perturbed(items: &[Item], base: &[u32], rng: &mut Rng) -> Vec<u32> {
    let mut keyed: Vec<(f64, u32)> = base
        .iter()
        .map(|&i| {
            let noise = 1.0 + 0.3 * (rng.unit() - 0.5);
            (-(items[i as usize].size as f64) * noise, i)
        })
        .collect();
    keyed.sort_by(|x, y| x.0.total_cmp(&y.0));
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One component's search state and results.
struct Comp {
    items: Vec<u32>,
    dfs: Dfs,
    /// Best size and offsets (indexed like `items`).
    best: (u64, Vec<u64>),
    /// No placement of this component is smaller than this (grows when a target is refuted).
    lower: u64,
}

/// Branch-and-bound per component, improving `best` in place. Rounds of restarts: in each, every
/// component above what is needed runs once with a node limit, aiming at the goal, or (every
/// `improve_every`-th round, or always once the goal is refuted) at an improvement: alternately
/// its best minus one and halfway between its lower bound and its best.
fn bnb(items: &[Item], deadline: Instant, goal: u64, improve_every: u32, best: &mut [u64]) {
    let mut comps: Vec<Comp> = components(items)
        .into_iter()
        .map(|c| {
            let offs: Vec<u64> = c.iter().map(|&i| best[i as usize]).collect();
            let size = c
                .iter()
                .zip(&offs)
                .map(|(&i, &o)| o + items[i as usize].size)
                .max()
                .unwrap_or(0);
            let dfs = Dfs::new(items, &c);
            let lower = dfs.lower_bound();
            Comp {
                items: c,
                dfs,
                best: (size, offs),
                lower,
            }
        })
        .collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut round = 0u32;
    loop {
        // Nothing needs to be smaller than the goal or than any component's lower bound.
        let need = comps.iter().map(|c| c.lower).max().unwrap_or(0).max(goal);
        if comps.iter().all(|c| c.best.0 <= need) || Instant::now() >= deadline {
            break;
        }
        round += 1;
        let limit = RESTART_BASE * luby(round);
        let r = round as usize - 1;
        let (order, noise) = if r < ORDERS {
            (r, 0.0)
        } else {
            (rng.below(3), 0.3)
        };
        for c in comps.iter_mut() {
            if c.best.0 <= need {
                continue;
            }
            let aim_goal = c.lower <= need && !round.is_multiple_of(improve_every);
            let t = if aim_goal {
                need
            } else if (round / improve_every).is_multiple_of(2) {
                c.best.0 - 1
            } else {
                c.lower + (c.best.0 - 1 - c.lower) / 2
            };
            c.dfs.set_order(order, noise, &mut rng);
            match c.dfs.run(t, limit, deadline) {
                Outcome::Found(offs) => {
                    let size = c.dfs.size_of(&offs);
                    if size < c.best.0 {
                        c.best = (size, offs);
                    }
                }
                Outcome::Infeasible => c.lower = c.lower.max(t + 1),
                Outcome::Limit => {}
            }
            if Instant::now() >= deadline {
                break;
            }
        }
    }
    for c in &comps {
        for (&i, &o) in c.items.iter().zip(&c.best.1) {
            best[i as usize] = o;
        }
    }
}

/// 1, 1, 2, 1, 1, 2, 4, 1, 1, 2, 1, 1, 2, 4, 8, ... (the Luby restart sequence, 1-based).
fn luby(mut i: u32) -> u64 {
    loop {
        let mut k = 1u32;
        while (1u64 << k) - 1 < i as u64 {
            k += 1;
        }
        if (1u64 << k) - 1 == i as u64 {
            return 1u64 << (k - 1);
        }
        i -= (1u32 << (k - 1)) - 1;
    }
}

/// Groups of item indices (size > 0) no two of which are linked by a chain of items overlapping
/// in time.
fn components(items: &[Item]) -> Vec<Vec<u32>> {
    let mut idx: Vec<u32> = (0..items.len() as u32)
        .filter(|&i| items[i as usize].size > 0)
        .collect();
    idx.sort_by_key(|&i| items[i as usize].ss);
    let mut comps: Vec<Vec<u32>> = Vec::new();
    let mut reach = 0u32;
    for i in idx {
        let it = &items[i as usize];
        if comps.is_empty() || it.ss >= reach {
            comps.push(Vec::new());
        }
        reach = reach.max(it.se);
        comps.last_mut().expect("pushed").push(i);
    }
    comps
}
