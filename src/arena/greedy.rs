//! Greedy lowest-fit placement over an interval structure.
//!
//! Items are placed one by one in a given order (decreasing size for [`size_order`]), each at the
//! lowest aligned offset whose byte range is free over the item's whole section range.
//!
//! The structure is a `FAN`-ary segment tree over sections. Every node keeps coalesced, sorted
//! lists of occupied byte ranges `[lo, hi)`:
//! * `own`: ranges of placed items for which the node is a canonical node (the item covers the
//!   node's whole section range, but not its parent's);
//! * `sub`: ranges of placed items with a canonical node in the node's subtree (itself included),
//!   i.e. items that intersect the node's range without covering its parent's (at a leaf, the
//!   same as `own`).
//!
//! The items intersecting a query range are exactly those in `sub` of the query's canonical nodes
//! plus those in `own` of their proper ancestors; a query leapfrogs over those few lists. Because
//! the lists are unions, neighbouring ranges coalesce and stay short when the arena is packed
//! tight. Long-lived items fragment the `own` lists of high nodes, so those are also merged per
//! node of one *merge level* (see [`Tree`]). Offsets are kept in units of the greatest common
//! divisor of the sizes and alignments, as `u32` when they fit.

use super::Item;

/// An offset type: the lists use `u32` when every offset fits (in units of the greatest common
/// divisor of the sizes and alignments), halving their memory traffic.
trait Off: Copy + Ord + Default {
    fn from64(v: u64) -> Self;
    fn to64(self) -> u64;
}

impl Off for u32 {
    fn from64(v: u64) -> Self {
        v as u32
    }
    fn to64(self) -> u64 {
        self as u64
    }
}

impl Off for u64 {
    fn from64(v: u64) -> Self {
        v
    }
    fn to64(self) -> u64 {
        self
    }
}

type Ranges<T> = Vec<(T, T)>;

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Decreasing size, then earlier start, then longer lifetime, then index.
pub(crate) fn size_order(items: &[Item]) -> Vec<u32> {
    let mut ord: Vec<u32> = (0..items.len() as u32).collect();
    ord.sort_unstable_by(|&a, &b| {
        let (x, y) = (&items[a as usize], &items[b as usize]);
        y.size
            .cmp(&x.size)
            .then(x.ss.cmp(&y.ss))
            .then(y.steps.cmp(&x.steps))
            .then(a.cmp(&b))
    });
    ord
}

/// Places the items in `order` (indices into `items`); returns one offset per item.
pub(crate) fn place(items: &[Item], sections: usize, order: &[u32]) -> Vec<u64> {
    place_around(items, sections, order, &[])
}

/// [`place`] with the items of `fixed` — `(item, offset)`, none of them in `order` — held at
/// their offsets first: the others are placed around them.
pub(crate) fn place_around(
    items: &[Item],
    sections: usize,
    order: &[u32],
    fixed: &[(u32, u64)],
) -> Vec<u64> {
    if sections == 0 {
        let mut offs = vec![0; items.len()];
        for &(i, o) in fixed {
            offs[i as usize] = o;
        }
        return offs;
    }
    // Every offset is a multiple of the common divisor of sizes, alignments and fixed offsets,
    // and below the sum of all sizes and alignments past the highest fixed end.
    let unit = items.iter().fold(0, |g, it| gcd(gcd(g, it.size), it.align));
    let unit = fixed.iter().fold(unit, |g, &(_, o)| gcd(g, o)).max(1);
    let top = fixed
        .iter()
        .map(|&(i, o)| (o + items[i as usize].size) / unit)
        .max()
        .unwrap_or(0);
    let bound = items.iter().fold(top, |b, it| {
        b.saturating_add(it.size / unit)
            .saturating_add(it.align / unit)
    });
    let mut offs = if bound < u32::MAX as u64 {
        place_in::<u32>(items, sections, order, fixed, unit)
    } else {
        place_in::<u64>(items, sections, order, fixed, unit)
    };
    for o in &mut offs {
        *o *= unit;
    }
    offs
}

/// [`place`] with offsets and sizes in units of `unit`, stored as `T`.
fn place_in<T: Off>(
    items: &[Item],
    sections: usize,
    order: &[u32],
    fixed: &[(u32, u64)],
    unit: u64,
) -> Vec<u64> {
    let mut offs = vec![0u64; items.len()];
    let mut t = Tree::<T>::new(sections);
    // The lists hold unions, touching ranges merged: fixed items over the same sections whose
    // bytes touch make one range whichever way they are inserted. Inserted as one, a floor of
    // many adjacent blocks (a program's weights, around which the pool plans an epoch) costs a
    // few inserts, each of which may add to every `up` list, rather than one per block.
    let mut held: Vec<(u32, u32, u64, u64)> = Vec::with_capacity(fixed.len());
    for &(i, o) in fixed {
        let it = &items[i as usize];
        let o = o / unit;
        offs[i as usize] = o;
        if it.size > 0 {
            held.push((it.ss, it.se, o, o + it.size / unit));
        }
    }
    held.sort_unstable();
    let mut k = 0;
    while k < held.len() {
        let (ss, se, lo, mut hi) = held[k];
        k += 1;
        while k < held.len() && (held[k].0, held[k].1) == (ss, se) && held[k].2 <= hi {
            hi = hi.max(held[k].3);
            k += 1;
        }
        t.insert(
            t.top,
            0,
            ss as usize,
            se as usize,
            T::from64(lo),
            T::from64(hi),
        );
    }
    let mut lists: Vec<u32> = Vec::with_capacity(64);
    let mut cursors: Vec<usize> = Vec::with_capacity(64);
    for &i in order {
        let it = &items[i as usize];
        if it.size == 0 {
            continue;
        }
        let (qs, qe) = (it.ss as usize, it.se as usize);
        let (size, align) = (it.size / unit, it.align / unit);
        lists.clear();
        t.collect(t.top, 0, qs, qe, &mut lists);
        let o = lowest_fit(&t.ranges, &lists, size, align, &mut cursors);
        offs[i as usize] = o;
        t.insert(t.top, 0, qs, qe, T::from64(o), T::from64(o + size));
    }
    offs
}

/// Lowest offset `o` (a multiple of `align`) with `[o, o + size)` disjoint from every range of
/// every list. Leapfrogs over the lists until all of them accept the same `o`.
fn lowest_fit<T: Off>(
    ranges: &[Ranges<T>],
    lists: &[u32],
    size: u64,
    align: u64,
    cur: &mut Vec<usize>,
) -> u64 {
    let k = lists.len();
    cur.clear();
    cur.resize(k, 0);
    let (mut o, mut passed, mut i) = (0u64, 0usize, 0usize);
    while passed < k {
        let l = &ranges[lists[i] as usize][..];
        let c = gallop(l, cur[i], T::from64(o));
        cur[i] = c;
        if c < l.len() && l[c].0.to64() < o + size {
            o = l[c].1.to64().next_multiple_of(align);
            passed = 0;
        } else {
            passed += 1;
            i += 1;
            if i == k {
                i = 0;
            }
        }
    }
    o
}

/// First index at or after `from` whose range ends above `o` (exponential then binary search).
#[inline]
fn gallop<T: Off>(l: &[(T, T)], from: usize, o: T) -> usize {
    if from >= l.len() || l[from].1 > o {
        return from;
    }
    // l[lo].1 <= o
    let (mut lo, mut step) = (from, 1usize);
    loop {
        let probe = lo + step;
        if probe >= l.len() || l[probe].1 > o {
            let hi = probe.min(l.len());
            return lo + 1 + l[lo + 1..hi].partition_point(|r| r.1 <= o);
        }
        lo = probe;
        step *= 2;
    }
}

/// Adds `[lo, hi)` to a sorted list of disjoint ranges, merging those it touches.
fn add_range<T: Off>(l: &mut Ranges<T>, lo: T, hi: T) {
    let i = l.partition_point(|r| r.1 < lo);
    // Few ranges lie inside a new one: scan.
    let mut j = i;
    while j < l.len() && l[j].0 <= hi {
        j += 1;
    }
    if i == j {
        if l.capacity() == 0 {
            l.reserve_exact(RESERVE);
        }
        l.insert(i, (lo, hi));
    } else {
        let nlo = lo.min(l[i].0);
        let nhi = hi.max(l[j - 1].1);
        l[i] = (nlo, nhi);
        l.drain(i + 1..j);
    }
}

/// Fan-out of the tree: a short item has few ancestors.
const FAN: usize = 8;
/// The *merge level* is the lowest level with at most this many nodes.
const MERGE_NODES: usize = 256;
/// Capacity of a list when first used.
const RESERVE: usize = 8;

/// A `FAN`-ary segment tree over sections. Node `j` of level `l` covers sections
/// `[j * FAN^l, (j + 1) * FAN^l)`; with `id = base[l] + j`, `ranges[2 * id]` is its `own` list and
/// `ranges[2 * id + 1]` its `sub` list.
///
/// Long items make the `own` lists of high nodes fragmented, and a query would leapfrog through
/// all of them. So each node `j` of the merge level `K` also has an `up` list,
/// `ranges[2 * total + j]`: the union of `own` of the node and of all its ancestors. A query then
/// reads one `up` list instead of the `own` lists above level `K`; an insert with a canonical node
/// at level `L >= K` adds to the `FAN^(L-K)` `up` lists below it (there are few level-`K` nodes).
struct Tree<T> {
    /// First node id of each level.
    base: Vec<usize>,
    /// Sections covered by a node of each level: `FAN^level`.
    width: Vec<usize>,
    /// The level of the root.
    top: usize,
    /// The merge level.
    k: usize,
    /// Number of nodes of the merge level.
    k_nodes: usize,
    /// Total number of nodes.
    total: usize,
    ranges: Vec<Ranges<T>>,
}

impl<T: Off> Tree<T> {
    fn new(sections: usize) -> Tree<T> {
        let (mut base, mut count, mut total) = (Vec::new(), sections, 0usize);
        let (mut k, mut k_nodes) = (usize::MAX, 0);
        loop {
            if k == usize::MAX && count <= MERGE_NODES {
                (k, k_nodes) = (base.len(), count);
            }
            base.push(total);
            total += count;
            if count == 1 {
                break;
            }
            count = count.div_ceil(FAN);
        }
        let top = base.len() - 1;
        let width = (0..base.len()).map(|l| FAN.pow(l as u32)).collect();
        Tree {
            base,
            width,
            top,
            k,
            k_nodes,
            total,
            ranges: vec![Vec::new(); 2 * total + k_nodes],
        }
    }

    fn push_nonempty(&self, list: usize, out: &mut Vec<u32>) {
        if !self.ranges[list].is_empty() {
            out.push(list as u32);
        }
    }

    /// Lists to consult for a query of sections `[qs, qe)`, starting at node `j` of level `lv`:
    /// `sub` of the canonical nodes and `own` of their proper ancestors, those above the merge
    /// level through `up` lists (empty lists left out).
    fn collect(&self, lv: usize, j: usize, qs: usize, qe: usize, out: &mut Vec<u32>) {
        let w = self.width[lv];
        let (l, r) = (j * w, (j + 1) * w);
        let id = self.base[lv] + j;
        if qs <= l && r <= qe {
            // A leaf's `sub` is its `own` (only kept separately above the leaves).
            self.push_nonempty(2 * id + (lv > 0) as usize, out);
            if lv >= self.k {
                // Ancestors' `own` lists through the `up` of the first merge-level descendant.
                let d = j * self.width[lv - self.k];
                self.push_nonempty(2 * self.total + d, out);
            }
            return;
        }
        match lv.cmp(&self.k) {
            std::cmp::Ordering::Less => self.push_nonempty(2 * id, out),
            std::cmp::Ordering::Equal => self.push_nonempty(2 * self.total + j, out),
            std::cmp::Ordering::Greater => {}
        }
        let cw = w / FAN;
        let c0 = qs.max(l) / cw;
        let c1 = (qe.min(r) - 1) / cw;
        let mut up_done = false;
        for c in c0..=c1 {
            let (cl, cr) = (c * cw, (c + 1) * cw);
            if lv > self.k && qs <= cl && cr <= qe {
                // A canonical child at or above the merge level: its `sub`, and (once per
                // parent: siblings share their ancestors) an `up` list below it.
                let cid = self.base[lv - 1] + c;
                self.push_nonempty(2 * cid + (lv > 1) as usize, out);
                if !up_done {
                    up_done = true;
                    let d = c * self.width[lv - 1 - self.k];
                    self.push_nonempty(2 * self.total + d, out);
                }
            } else {
                self.collect(lv - 1, c, qs, qe, out);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(&mut self, lv: usize, j: usize, qs: usize, qe: usize, lo: T, hi: T) {
        let w = self.width[lv];
        let (l, r) = (j * w, (j + 1) * w);
        let id = self.base[lv] + j;
        if lv > 0 {
            add_range(&mut self.ranges[2 * id + 1], lo, hi);
        }
        if qs <= l && r <= qe {
            add_range(&mut self.ranges[2 * id], lo, hi);
            if lv >= self.k {
                let span = self.width[lv - self.k];
                let d1 = ((j + 1) * span).min(self.k_nodes);
                for d in j * span..d1 {
                    add_range(&mut self.ranges[2 * self.total + d], lo, hi);
                }
            }
            return;
        }
        let cw = w / FAN;
        let c0 = qs.max(l) / cw;
        let c1 = (qe.min(r) - 1) / cw;
        for c in c0..=c1 {
            self.insert(lv - 1, c, qs, qe, lo, hi);
        }
    }
}
