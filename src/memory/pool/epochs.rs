//! Epoch plans: a virtual range that empties and then fills again the same way is placed by an
//! offline plan of the last time it did.
//!
//! An *epoch* of a stream's range runs from the range empty (every block free) to empty again.
//! While the pool records one, it logs each allocation's rounded size and when it was made and
//! freed (a clock that ticks at every allocation and free of the stream). When the range empties
//! the log is kept, and when a later epoch starts with the log's first size it becomes an arena
//! problem (`crate::arena`): the smaller of two greedy plans gives every
//! allocation an offset from the range's base, its footprint within 1.05 of the epoch's peak of
//! live bytes on every recorded trace (most within a few thousandths) — where the online
//! placement, which cannot know the future, leaves holes that its later passes drift on
//! (ARCHITECTURE.md, "Epoch plans").
//!
//! The next epoch whose first request has the plan's first size *follows* it: that request first
//! gathers the range's mapped pages under the plan's footprint (free pages moved down, as
//! recycling moves them, then new ones only within the slack rule's cap or the most ever
//! mapped), then allocation k goes to its planned offset when
//! its rounded size is the log's and the place is free — found in O(1) from the planned block
//! just below it (live then by the plan, so the pool's block after it is the free one holding
//! the place). Anything else (another size, the place not free, the log longer than the epoch)
//! leaves the plan for the rest of the epoch: those allocations are placed as usual, and the
//! range records again after some epochs (each further miss doubles the wait), so a program
//! whose epochs differ pays a plan now and then, not every epoch.
//!
//! Only a stream whose range empties is concerned: a program keeping any block of a stream live
//! for good records one log (at most `LOG_MAX` allocations, then dropped) and never plans, unless
//! it puts such blocks in the stream's lasting lane (`stream.rs`: `Lane`; gkrt's graphs do so
//! with their persistent tensors), which makes no epochs.
//! Planning waits for that later epoch rather than running when the range empties: it takes
//! about 1 ms per 300 allocations (0.9 s for a log of `LOG_MAX` on the build machine), which a
//! program that empties the range once — at its end, or between phases that differ — would pay
//! for a plan it never follows. A kept epoch holds its log and, once planned, its plan: 36 bytes
//! an allocation, at most `LOG_MAX` allocations a stream.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::block::State;
use super::tlsf::NIL;
use super::{Pool, PoolBacking, PoolError};
use crate::arena::{plan_greedy_either, ArenaProblem, BufferSpec};
use crate::device::VirtualMemory;

/// Allocations one epoch may log: beyond, it is not planned and the log is dropped (bounds the
/// log's memory, 16 bytes an allocation, and the planner's time, O(n log n) in it: 30 ms for
/// 14,000 allocations on the build machine; the recorded traces' passes hold at most 51,000).
pub(super) const LOG_MAX: usize = 1 << 18;
/// Most epochs a stream waits before following or logging again after plans were left.
const MAX_WAIT: u32 = 1 << 10;
/// Plans a stream keeps (one per first size; their allocations at most `LOG_MAX` in all): a
/// program whose epochs take turns — requests of a few batch sizes, each emptying the range —
/// follows each one's own. The first allocation looks through them.
const PLANS: usize = 16;

/// What a stream's epochs are doing now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Mode {
    /// Not planned (`PoolConfig::epoch_plans` off, or page aliases on).
    #[default]
    Off,
    /// Logging this epoch.
    Recording,
    /// The plan was left in this epoch.
    Left,
    /// Neither logging nor following until the range has emptied `wait` more times.
    Waiting,
    /// The range is empty: the next allocation follows the plan that starts with its size, or
    /// starts logging when none does.
    Ready,
    /// Following a plan: `next` is its next allocation.
    Following,
}

impl Mode {
    /// `Ready` or `Following`: the allocation path asks `alloc_planned` (one comparison: they
    /// are the last two).
    #[inline(always)]
    pub(super) fn plans(self) -> bool {
        self >= Mode::Ready
    }
}

/// One logged allocation: rounded size, and the clock at its allocation and its free.
#[derive(Clone, Copy, Debug)]
struct Logged {
    size: u64,
    start: u32,
    end: u32,
}

/// The plan of an epoch, per allocation in order: rounded size, offset from the range's base,
/// and the planned allocation just below it when it is made (`NIL`: none, the range's first
/// block holds it).
#[derive(Debug)]
pub(super) struct Plan {
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    anchors: Vec<u32>,
    /// Bytes from the range's base that the plan uses.
    footprint: u64,
}

/// A logged epoch, kept for the next epoch that starts with its first size, and its plan, made
/// when the first such epoch starts (`None` inside: the planner refused it). Dry-run clones share
/// it, so an epoch is planned once.
#[derive(Debug)]
struct Kept {
    log: Vec<Logged>,
    plan: OnceLock<Option<Arc<Plan>>>,
}

impl Kept {
    fn first_size(&self) -> u64 {
        self.log[0].size
    }
}

/// A stream's epochs: the log being recorded, the plans kept, the one being followed.
#[derive(Debug, Default)]
pub(super) struct Epochs {
    pub(super) mode: Mode,
    log: Vec<Logged>,
    clock: u32,
    /// The log outgrew `LOG_MAX`: this epoch is not planned.
    overflow: bool,
    /// The latest logged epochs, oldest first, at most `PLANS`; at most one per first size.
    kept: Vec<Arc<Kept>>,
    /// The plan being followed (`Following`, `Left`).
    plan: Option<Arc<Plan>>,
    /// The plan's next allocation (`Following`), and the block each one followed so far took:
    /// how the next finds the one below it without a lookup by address.
    next: u32,
    placed: Vec<u32>,
    /// Epochs left to wait (`Waiting`), and plans left in a row (the wait doubles with each).
    wait: u32,
    misses: u32,
    /// Epochs followed to the end, and plans left (the host replay prints them).
    pub(super) followed: u64,
    pub(super) left: u64,
    /// Logged epochs planned (at most once each, when an epoch first starts like one).
    pub(super) planned: u64,
}

/// A clone (the pool's dry runs play on one) follows the same plans but logs nothing: its log
/// would be up to `LOG_MAX` entries copied per dry run, for an epoch the clone never plans.
impl Clone for Epochs {
    fn clone(&self) -> Epochs {
        Epochs {
            mode: self.mode,
            log: Vec::new(),
            clock: self.clock,
            overflow: true,
            kept: self.kept.clone(),
            plan: self.plan.clone(),
            next: self.next,
            placed: self.placed.clone(),
            wait: self.wait,
            misses: self.misses,
            followed: self.followed,
            left: self.left,
            planned: self.planned,
        }
    }
}

impl Epochs {
    pub(super) fn new(on: bool) -> Epochs {
        Epochs {
            mode: if on { Mode::Ready } else { Mode::Off },
            ..Epochs::default()
        }
    }

    /// Logs an allocation of `size` bytes; returns its index, for `log_free` (`NIL` past the
    /// log's limit).
    #[inline]
    pub(super) fn log_alloc(&mut self, size: u64) -> u32 {
        if self.overflow {
            return NIL;
        }
        if self.log.len() >= LOG_MAX || self.clock == u32::MAX {
            // Not planned: the log's memory goes back at once (a program that never empties
            // the range would otherwise keep it).
            self.overflow = true;
            self.log = Vec::new();
            return NIL;
        }
        self.clock += 1;
        self.log.push(Logged {
            size,
            start: self.clock,
            end: u32::MAX,
        });
        self.log.len() as u32 - 1
    }

    /// Logs the free of allocation `k` (from `log_alloc`).
    #[inline]
    pub(super) fn log_free(&mut self, k: u32) {
        if let Some(l) = self.log.get_mut(k as usize) {
            self.clock = self.clock.saturating_add(1);
            l.end = self.clock;
        }
    }

    /// At an epoch's first allocation (`Ready`), of `size` bytes: the plan of the kept epoch that
    /// starts with it (planned now, the first time) becomes the one followed (true); with none,
    /// this epoch is logged (false).
    fn choose(&mut self, size: u64, align: u64) -> bool {
        self.plan = None;
        if let Some(i) = self.kept.iter().rposition(|k| k.first_size() == size) {
            let k = &self.kept[i];
            let fresh = k.plan.get().is_none();
            self.plan = k
                .plan
                .get_or_init(|| plan(&k.log, align).map(Arc::new))
                .clone();
            self.planned += u64::from(fresh);
            if self.plan.is_none() {
                // Refused by the planner: this epoch is logged in its place.
                self.kept.remove(i);
            }
        }
        self.next = 0;
        self.placed.clear();
        if let Some(p) = &self.plan {
            self.placed.resize(p.sizes.len(), NIL);
        }
        self.mode = if self.plan.is_some() {
            Mode::Following
        } else {
            Mode::Recording
        };
        self.plan.is_some()
    }

    /// The range emptied: the epoch ends; a logged one is kept for `choose` to plan.
    pub(super) fn end_epoch(&mut self) {
        match self.mode {
            Mode::Off | Mode::Ready => {}
            Mode::Recording => {
                let log = std::mem::take(&mut self.log);
                let overflow = std::mem::replace(&mut self.overflow, false);
                self.clock = 0;
                if !overflow && !log.is_empty() {
                    // One per first size: the new one replaces an older one; the oldest go
                    // beyond the bounds.
                    let first = log[0].size;
                    self.kept.retain(|k| k.first_size() != first);
                    self.kept.push(Arc::new(Kept {
                        log,
                        plan: OnceLock::new(),
                    }));
                    let mut total: usize = self.kept.iter().map(|k| k.log.len()).sum();
                    while self.kept.len() > PLANS || total > LOG_MAX {
                        total -= self.kept.remove(0).log.len();
                    }
                }
                self.mode = Mode::Ready;
            }
            Mode::Following => {
                if self
                    .plan
                    .as_ref()
                    .is_some_and(|p| self.next as usize == p.sizes.len())
                {
                    self.followed += 1;
                    self.misses = 0;
                    self.plan = None;
                    self.mode = Mode::Ready;
                } else {
                    self.miss();
                }
            }
            Mode::Left => self.miss(),
            Mode::Waiting => {
                self.wait = self.wait.saturating_sub(1);
                if self.wait == 0 {
                    self.mode = Mode::Ready;
                }
            }
        }
    }

    /// The plan followed was left (or could not start): it is dropped, and 2^misses − 1 epochs
    /// (at most `MAX_WAIT`) pass before the next is followed or logged.
    fn miss(&mut self) {
        self.left += 1;
        if let Some(p) = self.plan.take() {
            // The kept epoch it came from: the one of its first size (a stream keeps one per
            // first size, and adds none while it follows).
            self.kept.retain(|k| k.first_size() != p.sizes[0]);
        }
        self.misses += 1;
        self.wait = (1u32 << self.misses.min(10)).min(MAX_WAIT) - 1;
        self.mode = if self.wait == 0 {
            Mode::Ready
        } else {
            Mode::Waiting
        };
    }
}

/// The plan of a logged epoch (every allocation freed), its offsets multiples of `align` as
/// the pool's blocks are. `None` when the planner refuses it.
fn plan(log: &[Logged], align: u64) -> Option<Plan> {
    let problem = ArenaProblem {
        buffers: log
            .iter()
            .map(|l| BufferSpec {
                start: l.start,
                end: l.end.max(l.start + 1),
                size: l.size,
                align,
            })
            .collect(),
        groups: Vec::new(),
    };
    let placed = plan_greedy_either(&problem).ok()?;
    // Anchors: the live planned block with the highest offset below each allocation's, swept in
    // clock order.
    let mut events: Vec<(u32, u32)> = Vec::with_capacity(2 * log.len());
    for (k, l) in log.iter().enumerate() {
        events.push((l.start, k as u32));
        events.push((l.end, k as u32));
    }
    events.sort_unstable();
    let mut live: BTreeMap<u64, u32> = BTreeMap::new();
    let mut anchors = vec![NIL; log.len()];
    for (t, k) in events {
        let off = placed.offsets[k as usize];
        if t == log[k as usize].start {
            anchors[k as usize] = live.range(..off).next_back().map_or(NIL, |(_, &j)| j);
            live.insert(off, k);
        } else {
            live.remove(&off);
        }
    }
    Some(Plan {
        sizes: log.iter().map(|l| l.size).collect(),
        offsets: placed.offsets,
        anchors,
        footprint: placed.size,
    })
}

impl Pool {
    /// The range `r` of stream `si` has emptied.
    #[inline(never)]
    pub(super) fn range_emptied(&mut self, si: u32) {
        self.streams[si as usize].epochs.end_epoch();
        if self.streams[si as usize].moved_at_start {
            // The range start-up moves held has emptied: its first step is over.
            self.moves.startup_over = true;
        }
    }

    /// Allocation `rounded` on stream `si` (range `r`) while its epochs are ready to follow a
    /// plan or following one: the planned block, or `None` (placed as usual; the plan is left).
    #[inline(never)]
    pub(super) fn alloc_planned(
        &mut self,
        backing: &dyn PoolBacking,
        si: u32,
        rounded: u64,
    ) -> Result<Option<u32>, PoolError> {
        let r = self.streams[si as usize].range;
        if self.streams[si as usize].epochs.mode == Mode::Ready {
            if r != NIL && !self.range_is_empty(r) {
                // Blocks came by another way since the range emptied (`take_at`): this epoch's
                // start was missed, so it is neither logged nor followed.
                self.streams[si as usize].epochs.mode = Mode::Left;
                return Ok(None);
            }
            let align = self.config.alignment;
            if !self.streams[si as usize].epochs.choose(rounded, align) {
                // Logged (`hand_out`), placed as usual.
                return Ok(None);
            }
            let gathered = match backing.vmm() {
                Some(vm) if r != NIL => self.gather_pages(backing, vm, si, r)?,
                _ => false,
            };
            let e = &mut self.streams[si as usize].epochs;
            if !gathered {
                e.mode = Mode::Left;
                return Ok(None);
            }
        }
        let placed = self.take_planned(si, r, rounded);
        let e = &mut self.streams[si as usize].epochs;
        match placed {
            Some(i) => {
                e.placed[e.next as usize] = i;
                e.next += 1;
                Ok(Some(i))
            }
            None => {
                e.mode = Mode::Left;
                Ok(None)
            }
        }
    }

    /// The plan's next allocation, carved at its planned place when it is `rounded` bytes and
    /// the place lies in one free block with its pages mapped.
    #[inline(always)]
    fn take_planned(&mut self, si: u32, r: u32, rounded: u64) -> Option<u32> {
        let e = &self.streams[si as usize].epochs;
        let plan = e.plan.as_ref()?;
        let k = e.next as usize;
        if *plan.sizes.get(k)? != rounded {
            return None;
        }
        let base = self.segs[r].base;
        let pos = base + plan.offsets[k];
        let anchor = plan.anchors[k];
        let cand = if anchor == NIL {
            self.segs[r].first
        } else {
            // The block the anchor took, if it still is that (freed, its record may be vacant
            // or reused: indexes stay valid, `slab.rs`).
            let below = &self.blocks[e.placed[anchor as usize]];
            if below.state != State::Allocated || below.addr != base + plan.offsets[anchor as usize]
            {
                return None;
            }
            below.next
        };
        if cand == NIL {
            return None;
        }
        let b = &self.blocks[cand];
        if b.state != State::Free || b.addr > pos || b.addr + b.size < pos + rounded {
            return None;
        }
        let total = b.unmapped as u64;
        if b.cold {
            let (p0, p1) = self.touched(r, pos, rounded);
            if !self.pages_of(r).all_mapped(p0, p1) {
                return None;
            }
        }
        let held = self.unlink_held(cand);
        Some(self.carve_cold(r, cand, pos, rounded, total, held))
    }

    /// Before following a plan in the empty range `r`: its footprint mapped, by free pages
    /// moved there (from blocks the device is done with, without waiting for it: recycling's
    /// victims, above the footprint first), then new pages as long as the pool maps no more than
    /// the slack rule allows or it ever has, within its limit. False when that is not enough,
    /// or the device has no more: the plan is not followed (what moved stays where it went).
    fn gather_pages(
        &mut self,
        backing: &dyn PoolBacking,
        vm: &dyn VirtualMemory,
        si: u32,
        r: u32,
    ) -> Result<bool, PoolError> {
        let Some(plan) = self.streams[si as usize].epochs.plan.clone() else {
            return Ok(false);
        };
        debug_assert!(self.range_is_empty(r), "gathering in a range in use");
        let t = self.segs[r].first;
        let page = self.page;
        let pp = plan.footprint.div_ceil(page);
        let pages = self.pages_of(r);
        if pp > pages.pages() {
            return Ok(false);
        }
        let need = pages.count_unmapped(0, pp);
        if need == 0 {
            return Ok(true);
        }
        let placing = Some((t, 0, pp));
        self.unlink(t);
        // Free pages moved first: they leave the counts below, and what they saved is mapped
        // again under the footprint.
        if let Err(e) = self.recycle(backing, vm, need, 0, placing, true, None) {
            self.relink_counted(r, t);
            return Err(e);
        }
        // Mapping up to the most ever mapped, or the slack rule's cap over the high-water mark of
        // bytes in use (which the epoch's peak, and so about the plan's footprint, is under):
        // what the usual placement may map without moving pages; and within the limit.
        let cap = self.slack_cap(self.high_water);
        let room = self.mapped_pages + need <= self.mapped_peak.max(cap)
            && self.stats.reserved_bytes + need * page <= self.config.memory_limit;
        if !room {
            // What moved stays unmapped: reserved fell, nothing is mapped in its place.
            self.relink_counted(r, t);
            vm.trim()?;
            return Ok(false);
        }
        let base = self.segs[r].base;
        let runs = self.pages_of(r).runs(0, pp, false);
        let mapped = self.map_runs(backing, vm, r, base, &runs, placing, pp * page);
        self.relink_counted(r, t);
        vm.trim()?;
        match mapped {
            Ok(()) => Ok(true),
            // The device has less than the footprint (it may be shared, or smaller than the
            // epoch that made the plan): the plan is not followed, and the request is placed as
            // usual, which needs only its own bytes. What did map stays, counted.
            Err(PoolError::OutOfMemory { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether range `r` is one free block.
    fn range_is_empty(&self, r: u32) -> bool {
        let t = self.segs[r].first;
        t == self.segs[r].tail && self.blocks[t].state == State::Free
    }
}

impl Pool {
    /// Epochs followed to the end of their plan, and plans left (or not started), over all
    /// streams so far.
    pub fn epoch_counts(&self) -> (u64, u64) {
        self.streams.iter().fold((0, 0), |(f, l), s| {
            (f + s.epochs.followed, l + s.epochs.left)
        })
    }
}
