//! Greedy lowest-fit placement over an interval structure.
//!
//! Items are placed one by one in a given order (decreasing size for [`size_order`]), each at the
//! lowest aligned offset whose byte range is free over the item's whole section range.
//!
//! The structure is a segment tree over sections. Every node keeps two coalesced, sorted lists of
//! occupied byte ranges `[lo, hi)`:
//! * `own`: ranges of placed items for which the node is a canonical node (the item covers the
//!   node's whole section range, but not its parent's);
//! * `sub`: ranges of placed items with a canonical node in the node's subtree (itself included),
//!   i.e. items that intersect the node's range without covering its parent's.
//!
//! The items intersecting a query range are exactly those in `sub` of the query's canonical nodes
//! plus those in `own` of their proper ancestors; a query merges those few lists. Because the
//! lists are unions, neighbouring ranges coalesce and stay short when the arena is packed tight.

use super::Item;

type Ranges = Vec<(u64, u64)>;

/// Decreasing size, then earlier start, then longer lifetime, then index.
pub(crate) fn size_order(items: &[Item]) -> Vec<u32> {
    let mut ord: Vec<u32> = (0..items.len() as u32).collect();
    ord.sort_unstable_by(|&a, &b| {
        let (x, y) = (&items[a as usize], &items[b as usize]);
        y.size.cmp(&x.size).then(x.ss.cmp(&y.ss)).then(y.steps.cmp(&x.steps)).then(a.cmp(&b))
    });
    ord
}

/// Places the items in `order` (indices into `items`); returns one offset per item.
pub(crate) fn place(items: &[Item], sections: usize, order: &[u32]) -> Vec<u64> {
    let mut offs = vec![0u64; items.len()];
    if sections == 0 {
        return offs;
    }
    let mut t = Tree::new(sections);
    let mut lists: Vec<u32> = Vec::with_capacity(64);
    let mut cursors: Vec<usize> = Vec::with_capacity(64);
    for &i in order {
        let it = &items[i as usize];
        if it.size == 0 {
            continue;
        }
        let (qs, qe) = (it.ss as usize, it.se as usize);
        lists.clear();
        t.collect(t.top, 0, qs, qe, &mut lists);
        let o = lowest_fit(&t.ranges, &lists, it.size, it.align, &mut cursors);
        offs[i as usize] = o;
        t.insert(t.top, 0, qs, qe, o, o.saturating_add(it.size));
    }
    offs
}

/// Lowest offset `o` (a multiple of `align`) with `[o, o + size)` disjoint from every range of
/// every list. Leapfrogs over the lists until all of them accept the same `o`.
fn lowest_fit(ranges: &[Ranges], lists: &[u32], size: u64, align: u64, cur: &mut Vec<usize>) -> u64 {
    let k = lists.len();
    cur.clear();
    cur.resize(k, 0);
    let (mut o, mut passed, mut i) = (0u64, 0usize, 0usize);
    while passed < k {
        let l = &ranges[lists[i] as usize][..];
        let c = gallop(l, cur[i], o);
        cur[i] = c;
        if c < l.len() && l[c].0 < o.saturating_add(size) {
            o = l[c].1.next_multiple_of(align);
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
fn gallop(l: &[(u64, u64)], from: usize, o: u64) -> usize {
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
fn add_range(l: &mut Ranges, lo: u64, hi: u64) {
    let i = l.partition_point(|r| r.1 < lo);
    let j = i + l[i..].partition_point(|r| r.0 <= hi);
    if i == j {
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

/// A `FAN`-ary segment tree over sections. Node `j` of level `l` covers sections
/// `[j * FAN^l, (j + 1) * FAN^l)`; with `id = base[l] + j`, `ranges[2 * id]` is its `own` list and
/// `ranges[2 * id + 1]` its `sub` list.
///
/// Long items make the `own` lists of high nodes fragmented, and a query would leapfrog through
/// all of them. So each node `j` of the merge level `K` also has an `up` list,
/// `ranges[2 * total + j]`: the union of `own` of the node and of all its ancestors. A query then
/// reads one `up` list instead of the `own` lists above level `K`; an insert with a canonical node
/// at level `L >= K` adds to the `FAN^(L-K)` `up` lists below it (there are few level-`K` nodes).
struct Tree {
    /// First node id of each level.
    base: Vec<usize>,
    /// The level of the root.
    top: usize,
    /// The merge level.
    k: usize,
    /// Number of nodes of the merge level.
    k_nodes: usize,
    /// Total number of nodes.
    total: usize,
    ranges: Vec<Ranges>,
}

impl Tree {
    fn new(sections: usize) -> Tree {
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
        Tree { base, top, k, k_nodes, total, ranges: vec![Vec::new(); 2 * total + k_nodes] }
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
        let w = FAN.pow(lv as u32);
        let (l, r) = (j * w, (j + 1) * w);
        let id = self.base[lv] + j;
        if qs <= l && r <= qe {
            self.push_nonempty(2 * id + 1, out);
            if lv >= self.k {
                // Ancestors' `own` lists through the `up` of the first merge-level descendant.
                let d = j * FAN.pow((lv - self.k) as u32);
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
            if lv - 1 >= self.k && qs <= cl && cr <= qe {
                // A canonical child at or above the merge level: its `sub`, and (once per
                // parent: siblings share their ancestors) an `up` list below it.
                let cid = self.base[lv - 1] + c;
                self.push_nonempty(2 * cid + 1, out);
                if !up_done {
                    up_done = true;
                    let d = c * FAN.pow((lv - 1 - self.k) as u32);
                    self.push_nonempty(2 * self.total + d, out);
                }
            } else {
                self.collect(lv - 1, c, qs, qe, out);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(&mut self, lv: usize, j: usize, qs: usize, qe: usize, lo: u64, hi: u64) {
        let w = FAN.pow(lv as u32);
        let (l, r) = (j * w, (j + 1) * w);
        let id = self.base[lv] + j;
        add_range(&mut self.ranges[2 * id + 1], lo, hi);
        if qs <= l && r <= qe {
            add_range(&mut self.ranges[2 * id], lo, hi);
            if lv >= self.k {
                let span = FAN.pow((lv - self.k) as u32);
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
