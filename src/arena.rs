//! Static arena planning: give every buffer an offset in one arena so that no two buffers that are
//! live at the same step overlap in memory, and make the arena as small as possible.
//!
//! # The problem
//!
//! A [`BufferSpec`] is live over the half-open step interval `[start, end)` and needs `size` bytes at
//! an offset that is a multiple of `align`. Two buffers *conflict* when their intervals intersect;
//! conflicting buffers must get disjoint byte ranges `[offset, offset + size)`. The cost of a
//! [`Placement`] is the largest `offset + size`. [`lower_bound`] is the largest sum of sizes live at
//! one step; no placement is smaller.
//!
//! # Contiguity groups
//!
//! A collective kernel needs its inputs in one contiguous block (and its outputs in another). A
//! group lists buffer indices that must lie back to back in that order. Let `A` be the largest
//! alignment among the group's members and the *padded size* of a member be its size rounded up to
//! a multiple of `A`. Then `offset[g[i + 1]] == offset[g[i]] + padded(g[i])` and `offset[g[0]]` is a
//! multiple of `A` (so every member is aligned). The planner treats a group as **one combined
//! buffer** whose size is the sum of the padded sizes (the last member unpadded) and whose live
//! interval is the *union* hull of the members' intervals: every member's bytes are reserved from
//! the first member's birth to the last member's death. A buffer may belong to at most one group,
//! once; groups must not be empty.
//!
//! # Paths
//!
//! * [`plan_greedy`]: greedy by size, lowest fit — buffers in decreasing size, each at the lowest
//!   aligned offset free over its whole interval. An interval structure (a segment tree over time
//!   whose nodes hold coalesced unions of occupied byte ranges, `arena/greedy.rs`) keeps it
//!   within the goal on 20,000 buffers (timings: BENCHMARKS.md §4).
//! * [`plan_search`]: the greedy result, then a search for something smaller within the caller's
//!   time limit: greedy with other orders, then a branch-and-bound over *canonical* (pushed-down)
//!   placements in the style of MiniMalloc (Moffitt, ASPLOS'23) with conflict-weighted restarts
//!   for problems of up to a few thousand buffers, then randomly perturbed greedy orders
//!   (`arena/search/` has the details). It stops at the lower bound or at the caller's target.
//! * [`check_placement`]: an independent checker that shares no code with the planners.
//!
//! `gkrt-plans` (`src/bin/gkrt-plans.rs`) runs all three on the instances of `../shared/plans`.

mod greedy;
mod search;

use std::time::{Duration, Instant};

/// One buffer: live over steps `[start, end)`, `size` bytes, offset a multiple of `align`.
#[derive(Clone, Debug)]
pub struct BufferSpec {
    /// First step at which the buffer is live.
    pub start: u32,
    /// First step at which it is no longer live (exclusive, `> start`).
    pub end: u32,
    /// Bytes (0 is allowed: such a buffer occupies nothing).
    pub size: u64,
    /// Required alignment of the offset: a power of two, at least 1.
    pub align: u64,
}

/// What the planner is asked to place.
#[derive(Clone, Debug, Default)]
pub struct ArenaProblem {
    /// The buffers, indexed by position.
    pub buffers: Vec<BufferSpec>,
    /// Each group: buffer indices that must be laid out back to back in this order
    /// (`offset[g[i+1]] == offset[g[i]] + padded size of g[i]`, see the module docs). A group is
    /// planned as one combined buffer spanning the union of its members' intervals.
    pub groups: Vec<Vec<usize>>,
}

/// Offsets for every buffer of a problem, and the arena size they need.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// `offsets[i]` is the byte offset of buffer `i`.
    pub offsets: Vec<u64>,
    /// Largest `offset + size` (0 when there is nothing to place).
    pub size: u64,
}

/// Why a problem could not be planned.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanError {
    /// The problem is malformed; the text names the buffer, group or line and what is wrong.
    Invalid(String),
    /// The arena would exceed `u64` bytes.
    Overflow,
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::Invalid(s) => write!(f, "invalid arena problem: {s}"),
            PlanError::Overflow => write!(f, "arena size overflows u64"),
        }
    }
}

impl std::error::Error for PlanError {}

/// Largest sum of sizes of buffers live at one step (a sweep over the interval ends, O(n log n)).
/// Groups are not taken into account (their padding and hull only make a placement larger), so
/// this bounds every valid placement from below.
pub fn lower_bound(p: &ArenaProblem) -> u64 {
    let mut ev: Vec<(u32, bool, u64)> = Vec::with_capacity(2 * p.buffers.len());
    for b in &p.buffers {
        if b.end > b.start && b.size > 0 {
            ev.push((b.start, true, b.size));
            ev.push((b.end, false, b.size));
        }
    }
    // At equal steps, ends (false) sort before starts (true): [a, t) and [t, b) do not meet.
    ev.sort_unstable_by_key(|&(t, is_start, _)| (t, is_start));
    let (mut cur, mut best) = (0u64, 0u64);
    for (_, is_start, s) in ev {
        if is_start {
            cur = cur.saturating_add(s);
            best = best.max(cur);
        } else {
            cur -= s;
        }
    }
    best
}

/// The fast path: greedy by size, lowest fit.
pub fn plan_greedy(p: &ArenaProblem) -> Result<Placement, PlanError> {
    let prep = Prepared::new(p)?;
    let offs = greedy::place(&prep.items, prep.sections, &greedy::size_order(&prep.items));
    prep.expand(p, &offs)
}

/// Greedy by size and greedy in order of start (each buffer at the lowest offset free over its
/// interval), the smaller arena of the two. The second is what an allocator that knew each
/// buffer's end would do placing them as they come; it wins where buffers grow a little at a time
/// (a cache grown a row per step: 1.33 of the lower bound by size, 1.03 in order of start), the
/// first nearly everywhere else. Buffers may be placed already: `fixed` lists `(buffer,
/// offset)` pairs, held there while the others are placed around them (a pool planning the
/// next use of a range whose lasting blocks stay where they are). Not for problems with groups.
pub fn plan_greedy_either(
    p: &ArenaProblem,
    fixed: &[(usize, u64)],
) -> Result<Placement, PlanError> {
    if !fixed.is_empty() && !p.groups.is_empty() {
        return Err(PlanError::Invalid(
            "fixed offsets are not supported with groups".into(),
        ));
    }
    let prep = Prepared::new(p)?;
    let n = prep.items.len();
    let mut held = vec![false; n];
    let mut pins = Vec::with_capacity(fixed.len());
    for &(b, o) in fixed {
        if b >= n || held[b] {
            return Err(PlanError::Invalid(format!(
                "fixed buffer {b}: out of range ({n} buffers) or listed twice"
            )));
        }
        held[b] = true;
        pins.push((b as u32, o));
    }
    let free = |i: &u32| !held[*i as usize];
    let size_first: Vec<u32> = greedy::size_order(&prep.items)
        .into_iter()
        .filter(free)
        .collect();
    let mut start_first: Vec<u32> = (0..n as u32).filter(free).collect();
    start_first.sort_by_key(|&i| (prep.items[i as usize].ss, i));
    let place = |order: &[u32]| greedy::place_around(&prep.items, prep.sections, order, &pins);
    let (by_size, by_start) = both(n, || place(&size_first), || place(&start_first));
    let offs = if items_size(&prep.items, &by_start) < items_size(&prep.items, &by_size) {
        by_start
    } else {
        by_size
    };
    prep.expand(p, &offs)
}

/// Items from which `both` runs its two placements on two threads. A greedy placement takes
/// about half a µs an item on the build machine (an epoch of 2,116 allocations over 545 kept
/// blocks: 1.2–1.5 ms each order), so from this many on it takes more than starting a thread
/// (some tens of µs).
const PARALLEL_ITEMS: usize = 256;

/// `a()` and `b()`, on two threads when there are at least `PARALLEL_ITEMS` items (and a thread
/// can be started), else one after the other: the same two results either way. A pool plans
/// inside the allocation that starts an epoch, so the program waits for both
/// (deeplab_train_sizes in PyTorch: 15–30% slower steps in the turns that plan; BENCHMARKS.md,
/// session 46).
fn both<A: Send, B>(items: usize, a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B) -> (A, B) {
    if items < PARALLEL_ITEMS {
        return (a(), b());
    }
    // `a` in a cell, so that it can still run here when no thread starts.
    let a = std::sync::Mutex::new(Some(a));
    let take_a = || {
        let f = a.lock().unwrap_or_else(|e| e.into_inner()).take();
        f.map(|f| f())
    };
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new().spawn_scoped(s, take_a);
        let rb = b();
        let ra = match spawned {
            // `a` does not panic but on a bug: rethrown here, as it would have been.
            Ok(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
            Err(_) => None,
        };
        match ra.or_else(take_a) {
            Some(ra) => (ra, rb),
            None => unreachable!("`a` is taken once, by the thread or here"),
        }
    })
}

/// Greedy, then a search for a smaller arena until `time_limit` has passed. Stops early on
/// reaching the lower bound, or `target` if given (e.g. a capacity: any arena of at most `target`
/// bytes is good enough). Returns the best placement found, never one larger than greedy's.
pub fn plan_search(
    p: &ArenaProblem,
    time_limit: Duration,
    target: Option<u64>,
) -> Result<Placement, PlanError> {
    let t0 = Instant::now();
    let prep = Prepared::new(p)?;
    let offs = search::solve(&prep.items, prep.sections, t0 + time_limit, target);
    prep.expand(p, &offs)
}

/// Independent checker: every offset aligned, every group contiguous as documented, no two buffers
/// whose intervals intersect overlap in `[offset, offset + size)`, and `pl.size` is the largest
/// `offset + size`. Returns that size. Deliberately simple; shares no code with the planners.
pub fn check_placement(p: &ArenaProblem, pl: &Placement) -> Result<u64, String> {
    let n = p.buffers.len();
    if pl.offsets.len() != n {
        return Err(format!("{} offsets for {} buffers", pl.offsets.len(), n));
    }
    let mut top = 0u64;
    for (i, (b, &o)) in p.buffers.iter().zip(&pl.offsets).enumerate() {
        if b.align == 0 || o % b.align != 0 {
            return Err(format!(
                "buffer {i}: offset {o} not a multiple of align {}",
                b.align
            ));
        }
        let end = o
            .checked_add(b.size)
            .ok_or_else(|| format!("buffer {i}: offset {o} + size {} overflows", b.size))?;
        top = top.max(end);
    }
    if top != pl.size {
        return Err(format!(
            "placement says size {} but buffers reach {}",
            pl.size, top
        ));
    }
    for (gi, g) in p.groups.iter().enumerate() {
        if let Some(&bad) = g.iter().find(|&&i| i >= n) {
            return Err(format!("group {gi}: buffer index {bad} out of range"));
        }
        let a = g.iter().map(|&i| p.buffers[i].align).max().unwrap_or(1);
        for w in g.windows(2) {
            let (x, y) = (w[0], w[1]);
            let padded = p.buffers[x].size.div_ceil(a).saturating_mul(a);
            if Some(pl.offsets[y]) != pl.offsets[x].checked_add(padded) {
                return Err(format!(
                    "group {gi}: buffer {y} at {} does not follow buffer {x} at {} (+{padded})",
                    pl.offsets[y], pl.offsets[x]
                ));
            }
        }
    }
    // Two intervals intersect iff the one that starts later starts before the other ends. Sort by
    // start and compare each buffer with every later-starting one that starts before it ends.
    let mut idx: Vec<usize> = (0..n).filter(|&i| p.buffers[i].size > 0).collect();
    idx.sort_by_key(|&i| p.buffers[i].start);
    for (k, &i) in idx.iter().enumerate() {
        let bi = &p.buffers[i];
        for &j in &idx[k + 1..] {
            let bj = &p.buffers[j];
            if bj.start >= bi.end {
                break;
            }
            let (oi, oj) = (pl.offsets[i], pl.offsets[j]);
            if oi < oj + bj.size && oj < oi + bi.size {
                return Err(format!(
                    "buffers {i} [{}..{}) at [{oi}..{}) and {j} [{}..{}) at [{oj}..{}) overlap",
                    bi.start,
                    bi.end,
                    oi + bi.size,
                    bj.start,
                    bj.end,
                    oj + bj.size
                ));
            }
        }
    }
    Ok(top)
}

/// Parses `id,lower,upper,size` CSV text (a header line first; blank lines are skipped) into a
/// problem with alignment 1. Buffer `i` is the `i`-th data line; the `id` column is not
/// interpreted. Steps may be negative (if any is, all are shifted so the earliest is 0). Errors
/// name the 1-based line number.
pub fn parse_csv(text: &str) -> Result<ArenaProblem, PlanError> {
    let mut lines = text.lines().enumerate();
    let header = loop {
        match lines.next() {
            Some((_, l)) if l.trim().is_empty() => continue,
            Some((i, l)) => break (i + 1, l),
            None => return Err(PlanError::Invalid("empty input: no header line".into())),
        }
    };
    let cols: Vec<String> = header
        .1
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    if cols.len() < 4 || cols[..4] != ["id", "lower", "upper", "size"] {
        return Err(PlanError::Invalid(format!(
            "line {}: expected header `id,lower,upper,size`, got `{}`",
            header.0,
            header.1.trim()
        )));
    }
    let ncols = cols.len();
    let mut rows: Vec<(usize, i64, i64, u64)> = Vec::new();
    for (i, line) in lines {
        let ln = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != ncols {
            return Err(PlanError::Invalid(format!(
                "line {ln}: expected {ncols} fields, got {} in `{line}`",
                f.len()
            )));
        }
        let int = |k: usize, what: &str| -> Result<i64, PlanError> {
            f[k].parse::<i64>().map_err(|_| {
                PlanError::Invalid(format!("line {ln}: {what} `{}` is not an integer", f[k]))
            })
        };
        let (lo, hi) = (int(1, "lower")?, int(2, "upper")?);
        let size = f[3].parse::<u64>().map_err(|_| {
            PlanError::Invalid(format!(
                "line {ln}: size `{}` is not a non-negative integer",
                f[3]
            ))
        })?;
        if hi <= lo {
            return Err(PlanError::Invalid(format!(
                "line {ln}: upper {hi} must be greater than lower {lo}"
            )));
        }
        rows.push((ln, lo, hi, size));
    }
    // Steps may start below zero (some traces use -1 for "before the first step"): shift them.
    let base = rows.iter().map(|r| r.1).min().unwrap_or(0).min(0);
    let mut buffers = Vec::with_capacity(rows.len());
    for (ln, lo, hi, size) in rows {
        let to32 = |v: i64| {
            u32::try_from(v - base).map_err(|_| {
                PlanError::Invalid(format!("line {ln}: step {v} out of range (span over u32)"))
            })
        };
        buffers.push(BufferSpec {
            start: to32(lo)?,
            end: to32(hi)?,
            size,
            align: 1,
        });
    }
    Ok(ArenaProblem {
        buffers,
        groups: Vec::new(),
    })
}

/// A unit the planners place: a lone buffer or a whole group, with its steps compressed to
/// *sections* (the intervals between consecutive distinct interval ends).
#[derive(Clone, Debug)]
pub(crate) struct Item {
    /// First section.
    pub ss: u32,
    /// One past the last section.
    pub se: u32,
    /// Steps of the original interval (for ordering heuristics).
    pub steps: u32,
    pub size: u64,
    pub align: u64,
}

/// A validated problem in planner form.
struct Prepared {
    items: Vec<Item>,
    sections: usize,
    /// For each item: (buffer index, offset relative to the item).
    members: Vec<Vec<(usize, u64)>>,
}

impl Prepared {
    fn new(p: &ArenaProblem) -> Result<Prepared, PlanError> {
        let n = p.buffers.len();
        for (i, b) in p.buffers.iter().enumerate() {
            if b.end <= b.start {
                return Err(PlanError::Invalid(format!(
                    "buffer {i}: end {} must be greater than start {}",
                    b.end, b.start
                )));
            }
            if b.align == 0 || !b.align.is_power_of_two() {
                return Err(PlanError::Invalid(format!(
                    "buffer {i}: align {} is not a power of two",
                    b.align
                )));
            }
        }
        let mut group_of = vec![usize::MAX; n];
        let mut spans: Vec<(u32, u32, u64, u64)> = Vec::with_capacity(n); // start, end, size, align
        let mut members: Vec<Vec<(usize, u64)>> = Vec::with_capacity(n);
        for (gi, g) in p.groups.iter().enumerate() {
            if g.is_empty() {
                return Err(PlanError::Invalid(format!("group {gi} is empty")));
            }
            for &b in g {
                if b >= n {
                    return Err(PlanError::Invalid(format!(
                        "group {gi}: buffer index {b} out of range ({n} buffers)"
                    )));
                }
                if group_of[b] != usize::MAX {
                    return Err(PlanError::Invalid(format!(
                        "buffer {b}: listed in group {} and again in group {gi}",
                        group_of[b]
                    )));
                }
                group_of[b] = gi;
            }
            let a = g.iter().map(|&b| p.buffers[b].align).max().unwrap_or(1);
            let (mut rel, mut mem) = (0u64, Vec::with_capacity(g.len()));
            for (k, &b) in g.iter().enumerate() {
                mem.push((b, rel));
                let s = p.buffers[b].size;
                let step = if k + 1 == g.len() {
                    s
                } else {
                    s.checked_next_multiple_of(a).ok_or(PlanError::Overflow)?
                };
                rel = rel.checked_add(step).ok_or(PlanError::Overflow)?;
            }
            let start = g.iter().map(|&b| p.buffers[b].start).min().unwrap_or(0);
            let end = g.iter().map(|&b| p.buffers[b].end).max().unwrap_or(1);
            spans.push((start, end, rel, a));
            members.push(mem);
        }
        for (i, b) in p.buffers.iter().enumerate() {
            if group_of[i] == usize::MAX {
                spans.push((b.start, b.end, b.size, b.align));
                members.push(vec![(i, 0)]);
            }
        }
        let mut cuts: Vec<u32> = spans.iter().flat_map(|s| [s.0, s.1]).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let sec = |t: u32| cuts.binary_search(&t).unwrap_or(0) as u32;
        let items = spans
            .iter()
            .map(|&(s, e, size, align)| Item {
                ss: sec(s),
                se: sec(e),
                steps: e - s,
                size,
                align,
            })
            .collect();
        Ok(Prepared {
            items,
            sections: cuts.len().saturating_sub(1),
            members,
        })
    }

    fn expand(&self, p: &ArenaProblem, offs: &[u64]) -> Result<Placement, PlanError> {
        let mut offsets = vec![0u64; p.buffers.len()];
        let mut size = 0u64;
        for (mem, &o) in self.members.iter().zip(offs) {
            for &(b, rel) in mem {
                let off = o.checked_add(rel).ok_or(PlanError::Overflow)?;
                offsets[b] = off;
                size = size.max(
                    off.checked_add(p.buffers[b].size)
                        .ok_or(PlanError::Overflow)?,
                );
            }
        }
        Ok(Placement { offsets, size })
    }
}

/// Largest `offset + size` of items placed at `offs`.
pub(crate) fn items_size(items: &[Item], offs: &[u64]) -> u64 {
    items
        .iter()
        .zip(offs)
        .map(|(it, &o)| o + it.size)
        .max()
        .unwrap_or(0)
}

/// Lower bound of an item set: the largest sum of sizes live in one section.
pub(crate) fn items_lower_bound(items: &[Item], sections: usize) -> u64 {
    let mut d = vec![0i128; sections + 1];
    for it in items {
        d[it.ss as usize] += it.size as i128;
        d[it.se as usize] -= it.size as i128;
    }
    let (mut cur, mut best) = (0i128, 0i128);
    for v in d {
        cur += v;
        best = best.max(cur);
    }
    best as u64
}

#[cfg(test)]
mod tests;
