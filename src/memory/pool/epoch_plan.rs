//! The offline plan of a logged epoch (`epochs.rs`): its allocations placed by the arena's
//! greedy planners (`crate::arena`) around the floor's blocks, held where they are, and for each
//! allocation the block just below it when it is made — how following finds its place in O(1)
//! (`epoch_follow.rs`).

use std::collections::BTreeMap;

use super::epochs::Logged;
use super::tlsf::NIL;
use crate::arena::{
    check_placement, lower_bound, plan_greedy_either, ArenaProblem, BufferSpec, Placement,
};

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
    /// The most bytes live at once, the floor's with the epoch's (`arena::lower_bound`): under
    /// any plan's footprint.
    pub(super) peak: u64,
    /// Runs of pages `(first, count)` the epoch's allocations touch (gathered around a floor).
    pub(super) pages: Vec<(u64, u64)>,
    /// The floor's blocks some allocation is planned right above (their indexes here).
    pub(super) pins: Vec<u32>,
    /// A period's plan (`epochs/periodic.rs`): its turn ends with its last allocation, its carry
    /// live.
    pub(super) periodic: bool,
}

/// What plans are made to: offsets in multiples of `align` (the pool's blocks'), pages of
/// `page` bytes, and the footprint a plan holding a variant's shared start may take over the
/// same epoch's plan made alone, in thousandths (`PoolConfig::plan_room_permille`: the room a
/// plan may take over the high-water mark).
#[derive(Clone, Copy, Debug)]
pub(super) struct Terms {
    pub(super) align: u64,
    pub(super) page: u64,
    pub(super) room_permille: u64,
}

/// The plan of a logged epoch (every allocation freed) around its floor (held where it is),
/// its offsets multiples of `align` as the pool's blocks are; `page` bytes a page. `None` when
/// the planner refuses it. A period's (`periodic.rs`) also says when each floor block is freed
/// (`floor_ends`, `u32::MAX`: never; empty: none is) and which allocations outlive it
/// (`carried`: each held at the offset of the floor block it replaces). An epoch that starts
/// as another kept epoch did may hold its first allocations where that one's plan has them
/// (`prefix`, offsets), so that an epoch following either can go on with the other where they
/// part (`Epochs::variant_at`); `None` too when those places overlap in this epoch's lifetimes.
pub(super) fn plan(
    log: &[Logged],
    floor: &[(u64, u64)],
    (floor_ends, carried): (&[u32], &[(u32, u64)]),
    prefix: &[u64],
    align: u64,
    page: u64,
) -> Option<Plan> {
    let young = log.len();
    let finite = |e: u32| (e != u32::MAX).then_some(e);
    let until = log
        .iter()
        .map(|l| finite(l.end).unwrap_or(l.start))
        .chain(floor_ends.iter().filter_map(|&e| finite(e)))
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    let mut buffers: Vec<BufferSpec> = log
        .iter()
        .map(|l| BufferSpec {
            start: l.start,
            end: finite(l.end).unwrap_or(until).max(l.start + 1),
            size: l.size,
            align,
        })
        .collect();
    buffers.extend(floor.iter().enumerate().map(|(f, &(_, size))| BufferSpec {
        start: 0,
        end: floor_ends.get(f).and_then(|&e| finite(e)).unwrap_or(until),
        size,
        align,
    }));
    let fixed: Vec<(usize, u64)> = floor
        .iter()
        .enumerate()
        .map(|(f, &(off, _))| (young + f, off))
        .chain(carried.iter().map(|&(k, off)| (k as usize, off)))
        .chain(prefix.iter().copied().enumerate())
        .collect();
    if !prefix.is_empty() {
        // Held where the other plan has them, they must not overlap in this epoch's lifetimes.
        let head = ArenaProblem {
            buffers: buffers[..prefix.len()].to_vec(),
            groups: Vec::new(),
        };
        let top = prefix
            .iter()
            .zip(&head.buffers)
            .map(|(&o, b)| o + b.size)
            .max();
        let held = Placement {
            offsets: prefix.to_vec(),
            size: top.unwrap_or(0),
        };
        check_placement(&head, &held).ok()?;
    }
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
        if b.end < until {
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
        peak: lower_bound(&problem),
        pages,
        periodic: !carried.is_empty(),
    })
}

/// Where a period's carried allocations lie best (`sizes`, in their order): each at the lowest
/// place, a multiple of `align`, that the floor's blocks that stay (`floor`, offset and size)
/// and the carry placed before leave free. The carry becomes part of the floor — between turns
/// it is all that is live besides it — so it lies with it, below the turn's allocations, where
/// it does not split the memory the turn's large blocks take. A turn that starts with its carry
/// there follows a plan that keeps it there.
pub(super) fn carry_slots(floor: &[(u64, u64)], sizes: &[u64], align: u64) -> Vec<u64> {
    let mut taken: Vec<(u64, u64)> = floor.iter().filter(|b| b.1 > 0).copied().collect();
    let mut slots = Vec::with_capacity(sizes.len());
    for &size in sizes {
        taken.sort_unstable();
        let mut at = 0;
        for &(off, len) in &taken {
            if at + size <= off {
                break;
            }
            at = at.max((off + len).next_multiple_of(align));
        }
        slots.push(at);
        taken.push((at, size.max(1)));
    }
    slots
}
