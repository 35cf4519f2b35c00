//! The branch-and-bound over canonical placements of one component (see `search/mod.rs` for
//! how it is driven).
//!
//! # The branch-and-bound
//!
//! Every placement can be *pushed down* (each item moved to the lowest offset that the items below
//! it allow, repeatedly) without growing, so it suffices to search pushed-down placements. The
//! state is a *skyline*: `floor[s]` for each section `s`, with the invariant that every unplaced
//! item lies above the floor of each of its sections, and `rem[s]`, the total size of the unplaced
//! items live in `s`. A node takes the lowest floor `h` among sections with unplaced items, and a
//! maximal run `[a, b)` of sections at height `h`. In a pushed-down placement the lowest unplaced
//! item meeting the run either sits at `h` (and then lies inside the run: its sections are all at
//! `h`) or nothing sits at `h` there, and then everything over the run is at least as high as the
//! lower of the run's two neighbours. So the branches are:
//!
//! * for each *candidate* — an unplaced item lying inside `[a, b)` — place it at `h` (rounded up
//!   to its alignment) and raise its sections' floors to its top;
//! * the *gap*: raise the whole run to the lower neighbour. Skipped when some unplaced item inside
//!   the run fits under that neighbour (it could be moved down into the gap: dominated).
//!
//! Candidates are tried in order; when the `i`-th is tried, candidates `1..i` are forbidden at
//! height `h` (they were tried there already), and identical items (same sections, size and
//! alignment) are tried once. This enumerates the canonical placements without repeats (a unit
//! test checks it finds the optimum of small problems found by brute force).
//!
//! Inference at every node, for a target size `T` (see [`Dfs::infer`]): every unplaced item will
//! sit at or above its *viable offset* (the highest floor over its sections), which raises section
//! floors; and in each section the unplaced items, stacked above their viable offsets in the best
//! order, must end at or below `T`. When the unplaced items split into groups that share no
//! section, each group is searched on its own (a failure of one fails the node without trying
//! other choices for the others). Failed states are remembered by hash.
//!
//! Search order: candidates in decreasing *weight*, then a static order (by the largest total
//! live size over the item's sections, lifetime, area, size — several orders are rotated). When a
//! section cannot be packed, the unplaced items live in it gain weight, so restarts (with node
//! limits growing in the Luby sequence) place the items of hard sections first. This is what
//! makes the hard TPU instances of MiniMalloc (Moffitt, ASPLOS'23), whose pruning ideas this
//! follows, fit in their capacity in seconds.

use super::{Item, Rng, RAISE_ROUNDS};
use std::collections::HashSet;
use std::time::Instant;

pub(super) enum Outcome {
    Found(Vec<u64>),
    Infeasible,
    Limit,
}

/// Result of searching one region.
#[derive(PartialEq)]
pub(super) enum Res {
    Found,
    Fail,
    Abort,
}

#[derive(Clone, Copy)]
pub(super) enum Undo {
    /// Item placed on a floor at this height.
    Place(u32, u64),
    /// Sections `[a, b)` raised from this height.
    Raise(u32, u32, u64),
    /// A class's forbidden height before.
    Forbid(u32, u64),
    /// A section's floor before.
    Floor(u32, u64),
}

/// Most failed states remembered (then the memory starts afresh).
pub(super) const FAIL_MEMO_MAX: usize = 1 << 20;

/// Floor of log2 of `x > 0`.
fn log2(x: usize) -> usize {
    (usize::BITS - 1 - x.leading_zeros()) as usize
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Number of static orders [`Dfs::set_order`] knows.
pub(super) const ORDERS: usize = 6;

/// Branch-and-bound state for one component (sections renumbered from 0).
pub(super) struct Dfs {
    m: usize,
    ss: Vec<u32>,
    se: Vec<u32>,
    size: Vec<u64>,
    align: Vec<u64>,
    steps: Vec<u32>,
    /// Largest total live size over the item's sections.
    total: Vec<u64>,
    /// Items with the same sections, size and alignment share a class.
    class: Vec<u32>,
    /// Items by first section, each list in branching order.
    by_start: Vec<Vec<u32>>,
    rank: Vec<u32>,
    floor: Vec<u64>,
    rem: Vec<u64>,
    placed: Vec<bool>,
    off: Vec<u64>,
    /// Per class: the height at which it is forbidden (`u64::MAX`: none).
    forbid: Vec<u64>,
    /// Per class: `stamp` when last seen while collecting candidates.
    seen: Vec<u64>,
    stamp: u64,
    log: Vec<Undo>,
    /// Candidate lists of the nodes on the path, stacked.
    cands: Vec<u32>,
    /// Per section scratch: lowest viable offset, or stack top.
    minm: Vec<u64>,
    /// Per item scratch: viable offset.
    vo: Vec<u64>,
    /// Scratch: the unplaced items of the region being inferred on.
    pending: Vec<u32>,
    /// Scratch: sparse tables.
    table: Vec<u64>,
    /// Per item: conflict weight (see [`Dfs::bump`]).
    weight: Vec<u32>,
    /// Per item: a random key for state hashes.
    zob: Vec<u64>,
    /// Hashes of states (target included) proven to fail.
    failed: HashSet<u64>,
    nodes: u64,
    limit: u64,
    deadline: Instant,
}

impl Dfs {
    pub(super) fn new(items: &[Item], comp: &[u32]) -> Dfs {
        let s0 = comp
            .iter()
            .map(|&i| items[i as usize].ss)
            .min()
            .unwrap_or(0);
        let m = comp
            .iter()
            .map(|&i| items[i as usize].se)
            .max()
            .unwrap_or(0)
            .saturating_sub(s0) as usize;
        let n = comp.len();
        let it = |k: usize| &items[comp[k] as usize];
        let ss: Vec<u32> = (0..n).map(|k| it(k).ss - s0).collect();
        let se: Vec<u32> = (0..n).map(|k| it(k).se - s0).collect();
        let size: Vec<u64> = (0..n).map(|k| it(k).size).collect();
        let align: Vec<u64> = (0..n).map(|k| it(k).align).collect();
        let steps: Vec<u32> = (0..n).map(|k| it(k).steps).collect();
        let mut live = vec![0u64; m];
        for k in 0..n {
            for s in ss[k]..se[k] {
                live[s as usize] += size[k];
            }
        }
        let total = (0..n)
            .map(|k| (ss[k]..se[k]).map(|s| live[s as usize]).max().unwrap_or(0))
            .collect();
        let mut keys: Vec<(u32, u32, u64, u64, u32)> = (0..n as u32)
            .map(|k| {
                (
                    ss[k as usize],
                    se[k as usize],
                    size[k as usize],
                    align[k as usize],
                    k,
                )
            })
            .collect();
        keys.sort_unstable();
        let mut class = vec![0u32; n];
        let mut nclass = 0u32;
        for w in 0..n {
            let k = keys[w];
            if w > 0
                && (k.0, k.1, k.2, k.3)
                    != (keys[w - 1].0, keys[w - 1].1, keys[w - 1].2, keys[w - 1].3)
            {
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
            total,
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
            minm: vec![0; m],
            vo: vec![0; n],
            pending: Vec::new(),
            table: Vec::new(),
            weight: vec![0; n],
            zob: (0..n as u64)
                .map(|i| mix(i.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x51))
                .collect(),
            failed: HashSet::new(),
            nodes: 0,
            limit: 0,
            deadline: Instant::now(),
        };
        d.set_order(0, 0.0, &mut Rng(1));
        d
    }

    /// Branching order among candidates, by keys compared in turn, all descending (T: largest
    /// total live size over the item's sections, W: lifetime, A: area = size x lifetime, S: size):
    /// 0 TWA, 1 WAT, 2 TAW, 3 AWT, 4 SWT, 5 WST. `noise` > 0 perturbs the first key at random by
    /// up to that fraction.
    pub(super) fn set_order(&mut self, order: usize, noise: f64, rng: &mut Rng) {
        let n = self.ss.len();
        let mut key: Vec<([f64; 3], u32)> = (0..n)
            .map(|i| {
                let (t, w, s) = (
                    self.total[i] as f64,
                    self.steps[i] as f64,
                    self.size[i] as f64,
                );
                let a = w * s;
                let mut k = match order % ORDERS {
                    0 => [t, w, a],
                    1 => [w, a, t],
                    2 => [t, a, w],
                    3 => [a, w, t],
                    4 => [s, w, t],
                    _ => [w, s, t],
                };
                if noise > 0.0 {
                    k[0] *= 1.0 + noise * (rng.unit() - 0.5);
                }
                (k, i as u32)
            })
            .collect();
        key.sort_by(|x, y| {
            y.0[0]
                .total_cmp(&x.0[0])
                .then(y.0[1].total_cmp(&x.0[1]))
                .then(y.0[2].total_cmp(&x.0[2]))
                .then(x.1.cmp(&y.1))
        });
        for (r, k) in key.iter().enumerate() {
            self.rank[k.1 as usize] = r as u32;
        }
        for l in &mut self.by_start {
            l.clear();
        }
        for k in &key {
            let i = k.1 as usize;
            self.by_start[self.ss[i] as usize].push(i as u32);
        }
    }

    /// The largest total size live in one section.
    pub(super) fn lower_bound(&self) -> u64 {
        let mut live = vec![0u64; self.m];
        for i in 0..self.ss.len() {
            for l in &mut live[self.ss[i] as usize..self.se[i] as usize] {
                *l += self.size[i];
            }
        }
        live.into_iter().max().unwrap_or(0)
    }

    pub(super) fn size_of(&self, offs: &[u64]) -> u64 {
        offs.iter()
            .zip(&self.size)
            .map(|(&o, &s)| o + s)
            .max()
            .unwrap_or(0)
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

    /// Inference before branching, over the unplaced items of sections `[lo, hi)`. Every such
    /// item will sit at or above its *viable offset*, the highest floor over its sections
    /// (aligned). So:
    /// * a section's floor can be raised to the lowest viable offset among the items live in it
    ///   (repeated while that changes something, up to a few rounds);
    /// * in each section, the items live there must be stacked above their viable offsets: as
    ///   a single machine scheduling jobs with release times, the earliest-release-first order
    ///   gives the lowest possible top, which must not exceed the target.
    ///
    /// False if the target cannot be met.
    fn infer(&mut self, lo: usize, hi: usize, t: u64) -> bool {
        let mut fresh = false;
        for _round in 0..RAISE_ROUNDS {
            self.viable_offsets(lo, hi);
            self.lowest_viable(lo, hi);
            let mut changed = false;
            for s in lo..hi {
                if self.rem[s] > 0 && self.minm[s] > self.floor[s] {
                    if self.minm[s] + self.rem[s] > t {
                        self.bump(s);
                        return false;
                    }
                    self.log.push(Undo::Floor(s as u32, self.floor[s]));
                    self.floor[s] = self.minm[s];
                    changed = true;
                }
            }
            if !changed {
                fresh = true;
                break;
            }
        }
        if !fresh {
            self.viable_offsets(lo, hi);
        }
        let vo = &self.vo;
        self.pending.sort_unstable_by_key(|&i| vo[i as usize]);
        self.minm[lo..hi].copy_from_slice(&self.floor[lo..hi]);
        for &i in &self.pending {
            let i = i as usize;
            let (v, size) = (self.vo[i], self.size[i]);
            for s in self.ss[i] as usize..self.se[i] as usize {
                let top = self.minm[s].max(v) + size;
                self.minm[s] = top;
                if top > t {
                    self.bump(s);
                    return false;
                }
            }
        }
        true
    }

    /// Section `s` could not be packed: the unplaced items live there become more urgent.
    fn bump(&mut self, s: usize) {
        for k in 0..self.pending.len() {
            let i = self.pending[k] as usize;
            if self.ss[i] as usize <= s && s < self.se[i] as usize {
                self.weight[i] += 1;
            }
        }
    }

    /// Lists the unplaced items of `[lo, hi)` in `pending` and computes their viable offsets,
    /// with range maxima of the floors from a sparse table.
    fn viable_offsets(&mut self, lo: usize, hi: usize) {
        self.pending.clear();
        let w = hi - lo;
        let levels = usize::BITS as usize - w.leading_zeros() as usize;
        self.table.resize(levels * w, 0);
        self.table[..w].copy_from_slice(&self.floor[lo..hi]);
        for k in 1..levels {
            let half = 1 << (k - 1);
            for i in 0..=w - (1 << k) {
                let v = self.table[(k - 1) * w + i].max(self.table[(k - 1) * w + i + half]);
                self.table[k * w + i] = v;
            }
        }
        for s0 in lo..hi {
            for &i in &self.by_start[s0] {
                let i = i as usize;
                if self.placed[i] {
                    continue;
                }
                let (a, b) = (s0 - lo, self.se[i] as usize - lo);
                let k = log2(b - a);
                let top = self.table[k * w + a].max(self.table[k * w + b - (1 << k)]);
                self.vo[i] = top.next_multiple_of(self.align[i]);
                self.pending.push(i as u32);
            }
        }
    }

    /// `minm[s]` for `s` in `[lo, hi)`: the lowest viable offset among the pending items live in
    /// `s` (`u64::MAX` if none), by range-minimum updates on a sparse table pushed down.
    fn lowest_viable(&mut self, lo: usize, hi: usize) {
        let w = hi - lo;
        let levels = usize::BITS as usize - w.leading_zeros() as usize;
        self.table.clear();
        self.table.resize(levels * w, u64::MAX);
        for &i in &self.pending {
            let i = i as usize;
            let (a, b) = (self.ss[i] as usize - lo, self.se[i] as usize - lo);
            let k = log2(b - a);
            let v = self.vo[i];
            let x = &mut self.table[k * w + a];
            *x = (*x).min(v);
            let y = &mut self.table[k * w + b - (1 << k)];
            *y = (*y).min(v);
        }
        for k in (1..levels).rev() {
            let half = 1 << (k - 1);
            for i in 0..=w - (1 << k) {
                let v = self.table[k * w + i];
                if v != u64::MAX {
                    let x = &mut self.table[(k - 1) * w + i];
                    *x = (*x).min(v);
                    let y = &mut self.table[(k - 1) * w + i + half];
                    *y = (*y).min(v);
                }
            }
        }
        self.minm[lo..hi].copy_from_slice(&self.table[..w]);
    }

    /// Splits the unplaced items of sections `[lo, hi)` into groups that share no section:
    /// appends the section range of each group to `parts`.
    fn split(&self, lo: usize, hi: usize, parts: &mut Vec<(u32, u32, u64)>) {
        let (mut start, mut reach) = (usize::MAX, 0usize);
        for s in lo..hi {
            for &i in &self.by_start[s] {
                let i = i as usize;
                if self.placed[i] {
                    continue;
                }
                if start == usize::MAX || s >= reach {
                    if start != usize::MAX {
                        parts.push((start as u32, reach as u32, 0));
                    }
                    start = s;
                }
                reach = reach.max(self.se[i] as usize);
            }
        }
        if start != usize::MAX {
            parts.push((start as u32, reach as u32, 0));
        }
    }

    /// Searches the unplaced items of sections `[lo, hi)` (none of which crosses out of it) for
    /// a placement of size at most `t`. On `Found` the placements stay; on `Fail` the caller
    /// undoes what was logged since it called.
    fn search(&mut self, lo: usize, hi: usize, t: u64) -> Res {
        self.nodes += 1;
        if self.nodes.is_multiple_of(256)
            && (self.nodes >= self.limit || Instant::now() >= self.deadline)
        {
            return Res::Abort;
        }
        let key = self.state_key(lo, hi, t);
        if self.failed.contains(&key) {
            return Res::Fail;
        }
        let r = self.search_node(lo, hi, t);
        if r == Res::Fail {
            if self.failed.len() >= FAIL_MEMO_MAX {
                self.failed.clear();
            }
            self.failed.insert(key);
        }
        r
    }

    /// A hash of what the outcome of searching `[lo, hi)` depends on: the floors there, which
    /// of its items are unplaced, their forbidden heights and the target.
    fn state_key(&self, lo: usize, hi: usize, t: u64) -> u64 {
        let mut k = mix(mix(lo as u64 ^ (hi as u64) << 32) ^ t);
        let mut h = u64::MAX;
        for s in lo..hi {
            k ^= mix((s as u64) << 48 ^ self.floor[s]);
            if self.rem[s] > 0 {
                h = h.min(self.floor[s]);
            }
        }
        for s0 in lo..hi {
            for &i in &self.by_start[s0] {
                let i = i as usize;
                if !self.placed[i] {
                    k ^= self.zob[i];
                    let f = self.forbid[self.class[i] as usize];
                    // Forbidden below every floor: moot.
                    if f != u64::MAX && f >= h {
                        k ^= mix(self.zob[i] ^ f);
                    }
                }
            }
        }
        k
    }

    fn search_node(&mut self, lo: usize, hi: usize, t: u64) -> Res {
        if !self.infer(lo, hi, t) {
            return Res::Fail;
        }
        let mut parts = Vec::new();
        self.split(lo, hi, &mut parts);
        if parts.is_empty() {
            return Res::Found;
        }
        if parts.len() > 1 {
            // Independent parts: each must succeed; the tightest first.
            for p in &mut parts {
                p.2 = (p.0..p.1)
                    .map(|s| t.saturating_sub(self.floor[s as usize] + self.rem[s as usize]))
                    .min()
                    .unwrap_or(0);
            }
            parts.sort_by_key(|p| p.2);
            for &(a, b, _) in &parts {
                match self.search(a as usize, b as usize, t) {
                    Res::Found => {}
                    r => return r,
                }
            }
            return Res::Found;
        }
        let (lo, hi) = (parts[0].0 as usize, parts[0].1 as usize);
        // The leftmost run at the lowest floor.
        let (mut h, mut a) = (u64::MAX, usize::MAX);
        for s in lo..hi {
            if self.rem[s] > 0 && self.floor[s] < h {
                h = self.floor[s];
                a = s;
            }
        }
        let mut b = a + 1;
        while b < hi && self.rem[b] > 0 && self.floor[b] == h {
            b += 1;
        }
        let left = if a > lo && self.rem[a - 1] > 0 {
            self.floor[a - 1]
        } else {
            u64::MAX
        };
        let right = if b < hi && self.rem[b] > 0 {
            self.floor[b]
        } else {
            u64::MAX
        };
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
        let (w, rank) = (&self.weight, &self.rank);
        self.cands[c0..c1]
            .sort_unstable_by_key(|&i| (std::cmp::Reverse(w[i as usize]), rank[i as usize]));
        let mut result = Res::Fail;
        for k in c0..c1 {
            let i = self.cands[k] as usize;
            if k > c0 {
                // The previous candidate was tried at `h`: forbid its class there.
                let c = self.class[self.cands[k - 1] as usize];
                self.log.push(Undo::Forbid(c, self.forbid[c as usize]));
                self.forbid[c as usize] = h;
            }
            let mark = self.log.len();
            if self.try_place(i, h, t) {
                match self.search(lo, hi, t) {
                    Res::Fail => self.undo_to(mark),
                    r => {
                        result = r;
                        break;
                    }
                }
            }
        }
        if result == Res::Fail {
            if let Some(nb) = gap {
                let mark = self.log.len();
                if self.try_raise(a, b, h, nb, t) {
                    result = self.search(lo, hi, t);
                    if result == Res::Fail {
                        self.undo_to(mark);
                    }
                }
            }
        }
        self.cands.truncate(c0);
        result
    }

    /// Depth-first search for a placement of size at most `t`.
    pub(super) fn run(&mut self, t: u64, node_limit: u64, deadline: Instant) -> Outcome {
        self.reset();
        if self.rem.iter().any(|&r| r > t) {
            return Outcome::Infeasible;
        }
        (self.nodes, self.limit, self.deadline) = (0, node_limit, deadline);
        match self.search(0, self.m, t) {
            Res::Found => Outcome::Found(self.off.clone()),
            Res::Fail => Outcome::Infeasible,
            Res::Abort => Outcome::Limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::items_lower_bound;
    use super::*;

    /// Smallest arena for tiny problems by brute force over all offsets.
    fn brute_optimum(items: &[Item]) -> u64 {
        let lb = items_lower_bound(items, 64);
        let total: u64 = items.iter().map(|i| i.size + i.align).sum();
        for t in lb..=total {
            let mut offs = vec![0u64; items.len()];
            if brute_fits(items, t, 0, &mut offs) {
                return t;
            }
        }
        total
    }

    fn brute_fits(items: &[Item], t: u64, k: usize, offs: &mut Vec<u64>) -> bool {
        if k == items.len() {
            return true;
        }
        let it = &items[k];
        let mut o = 0;
        while o + it.size <= t {
            let ok = (0..k).all(|j| {
                let jt = &items[j];
                jt.se <= it.ss || it.se <= jt.ss || offs[j] + jt.size <= o || o + it.size <= offs[j]
            });
            if ok {
                offs[k] = o;
                if brute_fits(items, t, k + 1, offs) {
                    return true;
                }
            }
            o += it.align;
        }
        false
    }

    #[test]
    fn dfs_is_exact_on_tiny_problems() {
        let mut rng = Rng(12345);
        for case in 0..1000 {
            let n = 2 + rng.below(7);
            let items: Vec<Item> = (0..n)
                .map(|_| {
                    let ss = rng.below(6) as u32;
                    let se = ss + 1 + rng.below(4) as u32;
                    Item {
                        ss,
                        se,
                        steps: se - ss,
                        size: 1 + rng.below(5) as u64,
                        align: if rng.below(4) == 0 { 2 } else { 1 },
                    }
                })
                .collect();
            let opt = brute_optimum(&items);
            let comp: Vec<u32> = (0..n as u32).collect();
            let mut d = Dfs::new(&items, &comp);
            for order in 0..ORDERS {
                d.set_order(order, 0.0, &mut Rng(7));
                let far = Instant::now() + std::time::Duration::from_secs(10);
                match d.run(opt, u64::MAX, far) {
                    Outcome::Found(offs) => assert!(d.size_of(&offs) <= opt),
                    _ => panic!("case {case} order {order}: optimum {opt} not found: {items:?}"),
                }
                if opt > 0 {
                    assert!(
                        matches!(d.run(opt - 1, u64::MAX, far), Outcome::Infeasible),
                        "case {case}: found below the optimum {opt}"
                    );
                }
            }
        }
    }
}
