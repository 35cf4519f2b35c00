//! Searching for a smaller arena than greedy's.
//!
//! 1. Greedy with a few different orders; keep the best.
//! 2. For problems of up to [`DFS_MAX_ITEMS`] items: a branch-and-bound over *canonical*
//!    placements, per independent component (a cut in time that no item crosses splits the
//!    problem), with restarts that vary the branching order.
//! 3. Otherwise (or when the search gives up): greedy with randomly perturbed orders.
//!
//! # The branch-and-bound
//!
//! Every placement can be *pushed down* (each item moved to the lowest offset that the items below
//! it allow, repeatedly) without growing, so it suffices to search pushed-down placements. The
//! state is a *skyline*: `floor[s]` for each section `s`, with the invariant that every unplaced
//! item lies above the floor of each of its sections, and `rem[s]`, the total size of the unplaced
//! items live in `s`. A node looks at the lowest floor `h` among sections with unplaced items, and
//! the maximal run `[a, b)` of sections around it at height `h`. In a pushed-down placement the
//! lowest unplaced item meeting the run either sits at `h` (then it lies inside the run: all its
//! sections are at `h`) or nothing sits at `h` in the run, and then everything over the run is at
//! least as high as the lower neighbour of the run. So the branches are:
//!
//! * for each *candidate* — an unplaced item lying inside `[a, b)` — place it at `h` (rounded up
//!   to its alignment) and raise its sections' floors to its top;
//! * the *gap*: raise the whole run to the lower of its two neighbours' floors.
//!
//! Candidates are tried in a heuristic order; when the `i`-th is tried, candidates `1..i` are
//! forbidden at height `h` (they were tried there already), and identical items (same sections,
//! size and alignment) are tried once. With a target arena size `T`, every floor change keeps
//! `floor[s] + rem[s] <= T`: placing an item exactly on the floor leaves that sum unchanged, so
//! only gaps (wasted space) and alignment padding can break it, and they are cut off at once.
//! Search with `T` = capacity, or = best so far - 1 to improve, restarting with growing node
//! limits (Luby) and different orders.

use super::{greedy, items_lower_bound, items_size, Item};
use std::time::Instant;

/// Largest problem for which the branch-and-bound is used (each node scans the sections).
const DFS_MAX_ITEMS: usize = 5_000;

/// Best placement found by `deadline`; stops early once its size is at most `target` or the
/// lower bound.
pub(crate) fn solve(items: &[Item], sections: usize, deadline: Instant, target: Option<u64>) -> Vec<u64> {
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
        bnb(items, sections, deadline, goal, &mut best);
        best_size = items_size(items, &best);
        if done(best_size) {
            return best;
        }
    }
    // Perturbed greedy until the deadline.
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
    let idx = || (0..items.len() as u32).collect::<Vec<u32>>();
    let it = |i: &u32| &items[*i as usize];
    let mut a = idx();
    a.sort_by_key(|i| (std::cmp::Reverse(it(i).size), std::cmp::Reverse(it(i).steps), it(i).ss, *i));
    let mut b = idx();
    b.sort_by_key(|i| (std::cmp::Reverse(it(i).size), std::cmp::Reverse(it(i).se), *i));
    let mut c = idx();
    c.sort_by_key(|i| (std::cmp::Reverse(it(i).size as u128 * it(i).steps as u128), it(i).ss, *i));
    let mut d = idx();
    d.sort_by_key(|i| (std::cmp::Reverse(it(i).steps), std::cmp::Reverse(it(i).size), *i));
    vec![a, b, c, d]
}

/// The size order with items swapped with near neighbours of similar size at random.
fn perturbed(items: &[Item], base: &[u32], rng: &mut Rng) -> Vec<u32> {
    let mut keyed: Vec<(f64, u32)> = base
        .iter()
        .enumerate()
        .map(|(pos, &i)| {
            let noise = 1.0 + 0.3 * (rng.unit() - 0.5);
            (-(items[i as usize].size as f64) * noise, pos as u32)
        })
        .collect();
    keyed.sort_by(|x, y| x.0.total_cmp(&y.0));
    keyed.iter().map(|&(_, pos)| base[pos as usize]).collect()
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

/// Branch-and-bound per component, improving `best` in place.
fn bnb(items: &[Item], sections: usize, deadline: Instant, goal: u64, best: &mut [u64]) {
    let comps = components(items, sections);
    let mut dfs: Vec<Dfs> = comps.iter().map(|c| Dfs::new(items, c)).collect();
    // Each component's best so far, from the global best.
    let mut cbest: Vec<(u64, Vec<u64>)> = comps
        .iter()
        .map(|c| {
            let offs: Vec<u64> = c.iter().map(|&i| best[i as usize]).collect();
            let size = c.iter().zip(&offs).map(|(&i, &o)| o + items[i as usize].size).max().unwrap_or(0);
            (size, offs)
        })
        .collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    // Per component: the goal is proven out of reach / its best is proven optimal.
    let mut goal_out = vec![false; comps.len()];
    let mut optimal = vec![false; comps.len()];
    let mut round = 0u32;
    loop {
        let worst = cbest.iter().map(|c| c.0).max().unwrap_or(0);
        if worst <= goal || Instant::now() >= deadline {
            break;
        }
        round += 1;
        let limit = 2_000 * luby(round);
        let mut active = false;
        for (k, d) in dfs.iter_mut().enumerate() {
            if cbest[k].0 <= goal || optimal[k] {
                continue;
            }
            active = true;
            // Mostly aim at the goal; every third round (or once the goal is out of reach) try
            // to improve on the component's own best.
            let improve = goal_out[k] || round % 3 == 0;
            let t = if improve { cbest[k].0 - 1 } else { goal };
            let heur = if round <= 2 { round as usize - 1 } else { 2 + rng.below(4) };
            d.set_order(heur, &mut rng);
            let t0 = Instant::now();
            let r = d.run(t, limit, deadline);
            if std::env::var("DBG").is_ok() { eprintln!("comp {k} n={} round {round} heur {heur} t {t} limit {limit} -> {} in {:.1}ms nodes {} maxdepth {}", d.ss.len(), match &r { Outcome::Found(_) => "found", Outcome::Infeasible => "infeasible", Outcome::Limit => "limit" }, t0.elapsed().as_secs_f64()*1e3, d.nodes, d.maxdepth); d.maxdepth = 0; }
            match r {
                Outcome::Found(offs) => {
                    let size = d.size_of(&offs);
                    if size < cbest[k].0 {
                        cbest[k] = (size, offs);
                    }
                }
                Outcome::Infeasible if improve => optimal[k] = true,
                Outcome::Infeasible => goal_out[k] = true,
                Outcome::Limit => {}
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        if !active {
            break;
        }
    }
    for (c, (_, offs)) in comps.iter().zip(&cbest) {
        for (&i, &o) in c.iter().zip(offs) {
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
fn components(items: &[Item], sections: usize) -> Vec<Vec<u32>> {
    let mut idx: Vec<u32> = (0..items.len() as u32).filter(|&i| items[i as usize].size > 0).collect();
    idx.sort_by_key(|&i| items[i as usize].ss);
    let _ = sections;
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

enum Outcome {
    Found(Vec<u64>),
    Infeasible,
    Limit,
}

#[derive(Clone, Copy)]
enum Undo {
    /// Item placed on a floor at this height.
    Place(u32, u64),
    /// Sections `[a, b)` raised from this height.
    Raise(u32, u32, u64),
    /// A class's forbidden height before.
    Forbid(u32, u64),
    /// A section's floor before.
    Floor(u32, u64),
}

struct Frame {
    h: u64,
    a: u32,
    b: u32,
    c0: usize,
    c1: usize,
    next: usize,
    gap: Option<u64>,
    base_log: usize,
    child_log: usize,
}

/// Branch-and-bound state for one component (sections renumbered from 0).
struct Dfs {
    m: usize,
    ss: Vec<u32>,
    se: Vec<u32>,
    size: Vec<u64>,
    align: Vec<u64>,
    steps: Vec<u32>,
    class: Vec<u32>,
    /// Items by first section, each list in branching order.
    by_start: Vec<Vec<u32>>,
    rank: Vec<u32>,
    floor: Vec<u64>,
    rem: Vec<u64>,
    placed: Vec<bool>,
    off: Vec<u64>,
    forbid: Vec<u64>,
    seen: Vec<u64>,
    stamp: u64,
    log: Vec<Undo>,
    cands: Vec<u32>,
    stack: Vec<Frame>,
    nodes: u64,
    depth: usize,
    maxdepth: usize,
    minm: Vec<u64>,
    lookahead: bool,
}

impl Dfs {
    fn new(items: &[Item], comp: &[u32]) -> Dfs {
        let s0 = comp.iter().map(|&i| items[i as usize].ss).min().unwrap_or(0);
        let m = comp.iter().map(|&i| items[i as usize].se).max().unwrap_or(0).saturating_sub(s0) as usize;
        let n = comp.len();
        let get = |f: &dyn Fn(&Item) -> u64| comp.iter().map(|&i| f(&items[i as usize])).collect::<Vec<u64>>();
        let ss: Vec<u32> = comp.iter().map(|&i| items[i as usize].ss - s0).collect();
        let se: Vec<u32> = comp.iter().map(|&i| items[i as usize].se - s0).collect();
        let size = get(&|it| it.size);
        let align = get(&|it| it.align);
        let steps: Vec<u32> = comp.iter().map(|&i| items[i as usize].steps).collect();
        let mut keys: Vec<(u32, u32, u64, u64, u32)> =
            (0..n as u32).map(|i| (ss[i as usize], se[i as usize], size[i as usize], align[i as usize], i)).collect();
        keys.sort_unstable();
        let mut class = vec![0u32; n];
        let mut nclass = 0u32;
        for w in 0..n {
            let k = keys[w];
            if w > 0 && (k.0, k.1, k.2, k.3) != (keys[w - 1].0, keys[w - 1].1, keys[w - 1].2, keys[w - 1].3) {
                nclass += 1;
            }
            class[k.4 as usize] = nclass;
        }
        let nclass = nclass as usize + 1;
        let mut d = Dfs {
            m,
            ss,
            se,
            size,
            align,
            steps,
            class,
            by_start: vec![Vec::new(); m],
            rank: vec![0; n],
            floor: vec![0; m],
            rem: vec![0; m],
            placed: vec![false; n],
            off: vec![0; n],
            forbid: vec![u64::MAX; nclass],
            seen: vec![0; nclass],
            stamp: 0,
            log: Vec::new(),
            cands: Vec::new(),
            stack: Vec::new(),
            nodes: 0,
            depth: 0,
            maxdepth: 0,
            minm: vec![0; m],
            lookahead: std::env::var("LOOK").is_ok(),
        };
        d.set_order(0, &mut Rng(1));
        d
    }

    /// Branching order: 0 longest lifetime first, 1 largest first, 2 largest area first,
    /// 3+ a random perturbation of 0 or 1.
    fn set_order(&mut self, heur: usize, rng: &mut Rng) {
        let n = self.ss.len();
        let mut key: Vec<(f64, f64, u32)> = (0..n)
            .map(|i| {
                let (st, sz) = (self.steps[i] as f64, self.size[i] as f64);
                let (a, b) = match heur {
                    0 => (st, sz),
                    1 => (sz, st),
                    2 => (st * sz, st),
                    3 => (st * (1.0 + 0.4 * (rng.unit() - 0.5)), sz),
                    _ => (sz * (1.0 + 0.4 * (rng.unit() - 0.5)), st),
                };
                (-a, -b, i as u32)
            })
            .collect();
        key.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1)).then(x.2.cmp(&y.2)));
        for (r, k) in key.iter().enumerate() {
            self.rank[k.2 as usize] = r as u32;
        }
        for l in &mut self.by_start {
            l.clear();
        }
        for k in &key {
            let i = k.2 as usize;
            self.by_start[self.ss[i] as usize].push(i as u32);
        }
    }

    fn size_of(&self, offs: &[u64]) -> u64 {
        offs.iter().zip(&self.size).map(|(&o, &s)| o + s).max().unwrap_or(0)
    }

    fn reset(&mut self) {
        self.floor.iter_mut().for_each(|f| *f = 0);
        self.rem.iter_mut().for_each(|r| *r = 0);
        for i in 0..self.ss.len() {
            for s in self.ss[i]..self.se[i] {
                self.rem[s as usize] += self.size[i];
            }
        }
        self.placed.iter_mut().for_each(|p| *p = false);
        self.forbid.iter_mut().for_each(|f| *f = u64::MAX);
        self.log.clear();
        self.cands.clear();
        self.stack.clear();
    }

    fn undo_to(&mut self, mark: usize) {
        while self.log.len() > mark {
            match self.log.pop().expect("len > mark") {
                Undo::Place(i, h) => {
                    let i = i as usize;
                    self.placed[i] = false;
                    for s in self.ss[i] as usize..self.se[i] as usize {
                        self.floor[s] = h;
                        self.rem[s] += self.size[i];
                    }
                }
                Undo::Raise(a, b, h) => {
                    for s in a as usize..b as usize {
                        self.floor[s] = h;
                    }
                }
                Undo::Forbid(c, old) => self.forbid[c as usize] = old,
                Undo::Floor(s, old) => self.floor[s as usize] = old,
            }
        }
    }

    /// Places item `i` on floor `h` if the target allows it.
    fn try_place(&mut self, i: usize, h: u64, t: u64) -> bool {
        let o = h.next_multiple_of(self.align[i]);
        let (a, b) = (self.ss[i] as usize, self.se[i] as usize);
        if o > h && (a..b).any(|s| o + self.rem[s] > t) {
            return false;
        }
        let top = o + self.size[i];
        for s in a..b {
            self.floor[s] = top;
            self.rem[s] -= self.size[i];
        }
        self.placed[i] = true;
        self.off[i] = o;
        self.log.push(Undo::Place(i as u32, h));
        true
    }

    /// Raises `[a, b)` from `h` to `nb` if the target allows it.
    fn try_raise(&mut self, a: usize, b: usize, h: u64, nb: u64, t: u64) -> bool {
        if (a..b).any(|s| nb + self.rem[s] > t) {
            return false;
        }
        for s in a..b {
            self.floor[s] = nb;
        }
        self.log.push(Undo::Raise(a as u32, b as u32, h));
        true
    }

    /// Opens a node for the current state: `Some(true)` if everything is placed, `Some(false)`
    /// if the node is a dead end, `None` if a frame was pushed.
    fn expand(&mut self, t: u64) -> Option<bool> {
        let m = self.m;
        if self.lookahead && !self.raise_floors(t) {
            return Some(false);
        }
        let (mut h, mut a) = (u64::MAX, usize::MAX);
        for s in 0..m {
            if self.rem[s] > 0 && self.floor[s] < h {
                h = self.floor[s];
                a = s;
            }
        }
        if a == usize::MAX {
            return Some(true);
        }
        let mut b = a + 1;
        while b < m && self.rem[b] > 0 && self.floor[b] == h {
            b += 1;
        }
        let left = if a > 0 && self.rem[a - 1] > 0 { self.floor[a - 1] } else { u64::MAX };
        let right = if b < m && self.rem[b] > 0 { self.floor[b] } else { u64::MAX };
        let nb = left.min(right);
        let mut gap = (nb != u64::MAX && (a..b).all(|s| nb + self.rem[s] <= t)).then_some(nb);
        self.stamp += 1;
        let c0 = self.cands.len();
        for s in a..b {
            for k in 0..self.by_start[s].len() {
                let i = self.by_start[s][k] as usize;
                if self.placed[i] || self.se[i] as usize > b {
                    continue;
                }
                // An item that fits under the neighbours could be moved down into the gap: the
                // gap branch is dominated by the candidate branches.
                if gap.is_some() && h.next_multiple_of(self.align[i]) + self.size[i] <= nb {
                    gap = None;
                }
                let c = self.class[i] as usize;
                if self.forbid[c] == h || self.seen[c] == self.stamp {
                    continue;
                }
                self.seen[c] = self.stamp;
                self.cands.push(i as u32);
            }
        }
        let c1 = self.cands.len();
        if c0 == c1 && gap.is_none() {
            return Some(false);
        }
        let rank = &self.rank;
        self.cands[c0..c1].sort_unstable_by_key(|&i| rank[i as usize]);
        let mark = self.log.len();
        self.stack.push(Frame { h, a: a as u32, b: b as u32, c0, c1, next: c0, gap, base_log: mark, child_log: mark });
        None
    }

    /// Every unplaced item will sit at least as high as the highest floor over its sections, so
    /// a section's floor can be raised to the lowest such height among the items live in it
    /// (repeated until nothing changes). False if that leaves a section over the target.
    fn raise_floors(&mut self, t: u64) -> bool {
        loop {
            for v in &mut self.minm {
                *v = u64::MAX;
            }
            for i in 0..self.ss.len() {
                if self.placed[i] {
                    continue;
                }
                let (a, b) = (self.ss[i] as usize, self.se[i] as usize);
                let mut hi = 0;
                for s in a..b {
                    hi = hi.max(self.floor[s]);
                }
                let hi = hi.next_multiple_of(self.align[i]);
                for s in a..b {
                    self.minm[s] = self.minm[s].min(hi);
                }
            }
            let mut changed = false;
            for s in 0..self.m {
                if self.rem[s] > 0 && self.minm[s] > self.floor[s] {
                    if self.minm[s] + self.rem[s] > t {
                        return false;
                    }
                    self.log.push(Undo::Floor(s as u32, self.floor[s]));
                    self.floor[s] = self.minm[s];
                    changed = true;
                }
            }
            if !changed {
                return true;
            }
        }
    }

    /// Depth-first search for a placement of size at most `t`.
    fn run(&mut self, t: u64, node_limit: u64, deadline: Instant) -> Outcome {
        self.reset();
        if self.rem.iter().any(|&r| r > t) {
            return Outcome::Infeasible;
        }
        let mut nodes = 0u64;
        match self.expand(t) {
            Some(true) => return Outcome::Found(self.off.clone()),
            Some(false) => return Outcome::Infeasible,
            None => {}
        }
        while let Some(f) = self.stack.last() {
            let (h, child_log) = (f.h, f.child_log);
            self.undo_to(child_log);
            let f = self.stack.last_mut().expect("non-empty");
            let opened = if f.next < f.c1 {
                let i = self.cands[f.next] as usize;
                if f.next > f.c0 {
                    // The previous candidate was tried at `h`: forbid its class there.
                    let prev = self.cands[f.next - 1] as usize;
                    let c = self.class[prev];
                    let old = self.forbid[c as usize];
                    self.forbid[c as usize] = h;
                    self.log.push(Undo::Forbid(c, old));
                    f.child_log = self.log.len();
                }
                f.next += 1;
                let ok = self.try_place(i, h, t);
                if ok { self.depth += 1; self.maxdepth = self.maxdepth.max(self.placed.iter().filter(|&&p| p).count()); }
                ok
            } else if let Some(nb) = f.gap.take() {
                let (a, b) = (f.a as usize, f.b as usize);
                self.try_raise(a, b, h, nb, t)
            } else {
                let (base, c0) = (f.base_log, f.c0);
                self.stack.pop();
                self.undo_to(base);
                self.cands.truncate(c0);
                continue;
            };
            if !opened {
                continue;
            }
            nodes += 1;
            self.nodes = nodes;
            if nodes % 1024 == 0 && (nodes >= node_limit || Instant::now() >= deadline) {
                return Outcome::Limit;
            }
            match self.expand(t) {
                Some(true) => return Outcome::Found(self.off.clone()),
                Some(false) => {}
                None => {}
            }
        }
        Outcome::Infeasible
    }
}
