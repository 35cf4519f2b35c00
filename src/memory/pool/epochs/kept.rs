//! A kept epoch (`epochs.rs`): its log until it is first planned, what matches a later epoch to
//! it (its first size, length and floor's hash; its sizes' hash tells variants apart), and its
//! plan, made once.

use std::sync::{Arc, Mutex, OnceLock};

use super::super::epoch_plan::{plan, Plan, Terms};
use super::Logged;

/// An epoch (or a period's turn, `periodic.rs`) kept to be planned when a later one starts like
/// it.
#[derive(Debug)]
pub(super) struct Kept {
    /// Its allocations until it is planned: the plan then holds what following needs (each
    /// allocation's size, offset and anchor), and the log goes.
    pub(super) log: Mutex<Vec<Logged>>,
    /// The log's first size and length, kept with it gone: how a later epoch is matched.
    first: u64,
    pub(super) len: usize,
    /// The live blocks when it started (and ended): offset from the range's base, size.
    floor: Vec<(u64, u64)>,
    /// `Epochs::hash` of those blocks.
    pub(super) hash: u64,
    /// A period's (`periodic.rs`): when each floor block is freed, on the log's clock
    /// (`u32::MAX`: not in the epoch), and the allocations that outlive it, each with the offset
    /// of the floor block it replaces. Empty for an epoch.
    floor_ends: Vec<u32>,
    carried: Vec<(u32, u64)>,
    /// A hash of the log (each allocation's size, start and end), which outlives it: with the
    /// rest compared as it is, how the same epoch or turn found again is told (`same_as`).
    sig: u64,
    /// A hash of its sizes alone: how an epoch of the same requests is told from a variant
    /// (`logs`), whatever the order of its frees.
    sizes: u64,
    pub(super) plan: OnceLock<Option<Arc<Plan>>>,
}

impl Kept {
    pub(super) fn new(
        log: Vec<Logged>,
        floor: Vec<(u64, u64)>,
        hash: u64,
        floor_ends: Vec<u32>,
        carried: Vec<(u32, u64)>,
    ) -> Kept {
        Kept {
            first: log.first().map_or(0, |l| l.size),
            len: log.len(),
            sig: signature(&log),
            sizes: size_signature(&log),
            log: Mutex::new(log),
            floor,
            hash,
            floor_ends,
            carried,
            plan: OnceLock::new(),
        }
    }

    pub(super) fn first_size(&self) -> u64 {
        self.first
    }

    /// The same epoch or turn as `other`, as far as its plan goes: the same log (by its hash),
    /// floor, floor ends and carry — so the same plan. A hash that collides is harmless:
    /// following checks every allocation's size against the plan and leaves it on a mismatch.
    pub(super) fn same_as(&self, other: &Kept) -> bool {
        (self.first, self.len, self.hash, self.sig)
            == (other.first, other.len, other.hash, other.sig)
            && self.floor == other.floor
            && self.floor_ends == other.floor_ends
            && self.carried == other.carried
    }

    /// Whether its log (not planned yet) starts with allocations of `sizes`, then one of
    /// `next` bytes.
    pub(super) fn starts_as(&self, sizes: &[u64], next: u64) -> bool {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.len() > sizes.len()
            && log[sizes.len()].size == next
            && log.iter().zip(sizes).all(|(l, &s)| l.size == s)
    }

    /// An epoch's, not a period's turn.
    pub(super) fn is_epoch(&self) -> bool {
        self.floor_ends.is_empty() && self.carried.is_empty()
    }

    /// An epoch of the same requests as the ended `log` over a floor of hash `hash`: the same
    /// sizes in the same order (their frees may differ a little from step to step, and its
    /// plan serves them still; `Kept::sig` would tell those apart).
    pub(super) fn logs(&self, log: &[Logged], hash: u64) -> bool {
        (self.first, self.len, self.hash) == (log.first().map_or(0, |l| l.size), log.len(), hash)
            && self.is_epoch()
            && self.sizes == size_signature(log)
    }

    /// Its plan, made from its log the first time (the log then goes); `None` when the
    /// planner refuses it. An epoch planned beside a variant of it (`base`: the same first
    /// size and floor) holds the allocations they start with where `base` has them, when that
    /// fits its own lifetimes and costs at most `Terms::room_permille` over its plan made alone,
    /// or no more than `base`'s footprint (pages the range maps for `base` anyway): an epoch
    /// following either plan then goes on with the other where they part.
    pub(super) fn plan(&self, terms: Terms, base: Option<&Plan>) -> Option<Arc<Plan>> {
        self.plan
            .get_or_init(|| {
                // A poisoned lock still holds the log: nothing panics while it is held.
                let log = std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()));
                let ends = (self.floor_ends.as_slice(), self.carried.as_slice());
                let (align, page) = (terms.align, terms.page);
                let alone = || plan(&log, &self.floor, ends, &[], align, page);
                let base = base.filter(|b| self.is_epoch() && !b.periodic);
                let shared = base.map_or(0, |b| {
                    let n = log.len().min(b.young);
                    (0..n).find(|&k| log[k].size != b.sizes[k]).unwrap_or(n)
                });
                let held = base
                    .filter(|_| shared > 0)
                    .and_then(|b| plan(&log, &self.floor, ends, &b.offsets[..shared], align, page));
                let Some(held) = held else {
                    return alone().map(Arc::new);
                };
                let room = |bytes: u64| u128::from(bytes) * u128::from(1000 + terms.room_permille);
                // Within the room over the epoch's peak of live bytes, it is within the room over
                // its plan alone (no smaller): that plan is not made. Within the base's
                // footprint, it maps no page following the base does not: a smaller variant
                // (images of a smaller size) holding a larger one's start above its large blocks.
                if u128::from(held.footprint) * 1000 <= room(held.peak)
                    || base.is_some_and(|b| held.footprint <= b.footprint)
                {
                    return Some(Arc::new(held));
                }
                match alone() {
                    Some(a) if u128::from(held.footprint) * 1000 > room(a.footprint) => {
                        Some(Arc::new(a))
                    }
                    _ => Some(Arc::new(held)),
                }
            })
            .clone()
    }
}

/// `Kept::sig` of a log.
fn signature(log: &[Logged]) -> u64 {
    log.iter().fold(0x243f_6a88_85a3_08d3, |h, l| {
        let word = l.size ^ (u64::from(l.start) << 32 | u64::from(l.end)).rotate_left(7);
        (h ^ word)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29)
    })
}

/// `Kept::sizes` of a log.
fn size_signature(log: &[Logged]) -> u64 {
    log.iter().fold(0x1319_8a2e_0370_7344, |h, l| {
        (h ^ l.size)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29)
    })
}
