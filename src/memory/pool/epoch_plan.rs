//! The offline plan of a logged epoch (`epochs.rs`): its allocations placed by the arena's
//! greedy planners (`crate::arena`) around the floor's blocks, held where they are, and for each
//! allocation the block just below it when it is made — how following finds its place in O(1)
//! (`epoch_follow.rs`).

use std::collections::BTreeMap;

use super::epochs::Logged;
use super::tlsf::NIL;
use crate::arena::{plan_greedy_either, ArenaProblem, BufferSpec};

/// The plan of an epoch, per allocation in order: rounded size, offset from the range's base,
/// and the planned or floor block just below it when it is made (`NIL`: none, the range's first
/// block holds it). The floor's blocks follow the epoch's allocations in `sizes` and `offsets`.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) sizes: Vec<u64>,
    pub(super) offsets: Vec<u64>,
    pub(super) anchors: Vec<u32>,
    /// The epoch's allocations (the rest of `sizes` is the floor).
    pub(super) young: usize,
    /// Bytes from the range's base that the plan uses.
    pub(super) footprint: u64,
    /// Runs of pages `(first, count)` the epoch's allocations touch (gathered around a floor).
    pub(super) pages: Vec<(u64, u64)>,
    /// The floor's blocks some allocation is planned right above (their indexes here).
    pub(super) pins: Vec<u32>,
}

/// A logged epoch with its floor, kept for the next epoch that starts like it, and its plan,
/// made when the first such epoch starts (`None` inside: the planner refused it). Dry-run clones
/// share it, so an epoch is planned once.
/// The plan of a logged epoch (every allocation freed) around its floor (held where it is),
/// its offsets multiples of `align` as the pool's blocks are; `page` bytes a page. `None` when
/// the planner refuses it.
pub(super) fn plan(log: &[Logged], floor: &[(u64, u64)], align: u64, page: u64) -> Option<Plan> {
    let young = log.len();
    let until = log
        .iter()
        .map(|l| l.end)
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    let mut buffers: Vec<BufferSpec> = log
        .iter()
        .map(|l| BufferSpec {
            start: l.start,
            end: l.end.max(l.start + 1),
            size: l.size,
            align,
        })
        .collect();
    buffers.extend(floor.iter().map(|&(_, size)| BufferSpec {
        start: 0,
        end: until,
        size,
        align,
    }));
    let fixed: Vec<(usize, u64)> = floor
        .iter()
        .enumerate()
        .map(|(f, &(off, _))| (young + f, off))
        .collect();
    let problem = ArenaProblem {
        buffers,
        groups: Vec::new(),
    };
    let placed = plan_greedy_either(&problem, &fixed).ok()?;
    // Anchors: the live planned (or floor) block with the highest offset below each
    // allocation's, swept in clock order (the floor's from the start).
    let mut events: Vec<(u32, u32)> = Vec::with_capacity(2 * young + floor.len());
    for (k, b) in problem.buffers.iter().enumerate() {
        events.push((b.start, k as u32));
        if k < young {
            events.push((b.end, k as u32));
        }
    }
    events.sort_unstable();
    let mut live: BTreeMap<u64, u32> = BTreeMap::new();
    let mut anchors = vec![NIL; young];
    for (t, k) in events {
        let off = placed.offsets[k as usize];
        if t == problem.buffers[k as usize].start {
            if (k as usize) < young {
                anchors[k as usize] = live.range(..off).next_back().map_or(NIL, |(_, &j)| j);
            }
            live.insert(off, k);
        } else {
            live.remove(&off);
        }
    }
    // The pages the epoch's allocations touch, as runs.
    let mut spans: Vec<(u64, u64)> = (0..young)
        .filter(|&k| log[k].size > 0)
        .map(|k| {
            let o = placed.offsets[k];
            (o / page, (o + log[k].size).div_ceil(page))
        })
        .collect();
    spans.sort_unstable();
    let mut pages: Vec<(u64, u64)> = Vec::new();
    for (p0, p1) in spans {
        match pages.last_mut() {
            Some((q0, n)) if p0 <= *q0 + *n => *n = (*n).max(p1 - *q0),
            _ => pages.push((p0, p1 - p0)),
        }
    }
    let mut pins: Vec<u32> = anchors
        .iter()
        .copied()
        .filter(|&a| a != NIL && a as usize >= young)
        .collect();
    pins.sort_unstable();
    pins.dedup();
    Some(Plan {
        pins,
        sizes: problem.buffers.iter().map(|b| b.size).collect(),
        offsets: placed.offsets,
        anchors,
        young,
        footprint: placed.size,
        pages,
    })
}
