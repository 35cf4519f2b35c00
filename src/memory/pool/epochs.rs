//! Epoch plans: a virtual range whose blocks of some time all go again, and that then fills
//! again the same way, is placed by an offline plan of the last time it did.
//!
//! An *epoch* of a stream's range runs from a time its live blocks are some set — its *floor*:
//! none when the range is empty, a program's weights and optimizer state when it never empties —
//! to the first time every block allocated since is free again. While the pool records, it
//! logs each allocation's rounded size and when it was made and freed (a clock that ticks at
//! every allocation and free of the stream), and finds the epochs in the log as they end
//! (`Start`, below). An ended epoch is kept with its floor (the live blocks' offsets and sizes,
//! read as it ends), and when a later epoch starts with the log's first size over the same
//! floor (a hash of the live blocks; those an allocation is planned right above are looked up
//! too) it becomes an
//! arena problem (`crate::arena`): the smaller of two greedy plans gives every allocation an
//! offset from the range's base around the floor's blocks, its footprint within 1.05 of the
//! epoch's peak of live bytes on every recorded trace (most within a few thousandths) — where
//! the online placement, which cannot know the future, leaves holes that its later passes drift
//! on (ARCHITECTURE.md, "Epoch plans").
//!
//! The next epoch whose first request has the plan's first size over the plan's floor
//! *follows* it: that request first gathers mapped pages under the plan (into an empty range,
//! free pages moved down, as recycling moves them, then new ones only within the slack rule's
//! cap or the most ever mapped; around a floor, free pages moved from outside the span of the
//! plan's pages, then new ones within the same cap), then allocation
//! k goes to its planned offset when its rounded size is the log's and the place is free —
//! found in O(1) from the planned or floor block just below it (live then by the plan, so the
//! pool's block after it is the free one holding the place). Another size there goes on with
//! the plan of a kept *variant* — an epoch over the same floor that started with the same
//! requests and parts here (up to `VARIANTS` a first size and floor, each planned once, holding
//! the allocations it shares with the newest planned one at that plan's places:
//! `epochs/keeping.rs`). Anything else (no such variant, the place not free, the log longer
//! than the epoch) leaves the plan for the rest of the epoch: those allocations are placed as
//! usual, and the range records again after some epochs (each further miss doubles the wait),
//! so a program whose epochs differ pays a plan now and then, not every epoch.
//!
//! Finding epochs: after each allocation the log's newest live entry is the allocation; when
//! the newest live entry is freed the pointer walks down to the next live one (each entry
//! passed once). Every allocation may start an epoch, which ends when the newest live entry is
//! older than it: the starts form a stack ordered by that mark, a free that lowers the newest
//! live entry ends every start above it, and the lowest of those is the epoch found, provided
//! no older block was freed during it (its floor stayed), its allocations reached at least
//! half of the range's most live bytes above that floor (a step, not a temporary inside one) or
//! it parted from a plan of its first size and floor (a step of another shape: `parted`), and it
//! made at least as many allocations as the floor has blocks (reading the floor then costs at
//! most a step an allocation). An epoch over an empty floor is kept whatever its
//! size, as it always was. A trace replayed with a block held on each stream
//! (`GKRT_REPLAY_HOLD`, as a program keeps its weights) thus follows plans from its second or
//! third step: a first step that makes the optimizer's state adds it to the floor. An epoch
//! found again (already kept) makes the stream ready for its plan as a new one does. PyTorch
//! programs on the pool follow plans where their steps repeat (BENCHMARKS.md, session 27).
//!
//! Planning waits for that later epoch rather than running when the epoch ends: it takes
//! milliseconds for a step (2.2 ms for 2,116 allocations over 545 kept blocks on the build
//! machine, its two greedy orders on two threads: `arena::plan_greedy_either`; 0.9 s for a log
//! of `LOG_MAX` in session 23), which a program that ends the epoch once — at its end, or
//! between phases that differ — would pay for a plan it never follows. A kept epoch holds its
//! log (16 bytes an allocation) until it is planned, then its plan (20: size, offset, anchor)
//! and not the log, at most `LOG_MAX` allocations a stream. Recording costs a push per allocation
//! (the log's entry, a start) and a store per free; a log filled without finding an epoch
//! pauses the recording, longer each time (`pause`).
//!
//! A loop whose turns carry a block into the next never ends an epoch; the recording finds its
//! turns as a *period* instead, kept and followed the same way (`epochs/periodic.rs`). An epoch
//! found also teaches which of its allocations live through it, so that an epoch over the same
//! floor that follows no plan places them out of the way (`epochs/step_lived.rs`).

use std::sync::Arc;

use super::epoch_plan::{Plan, Terms};
use super::tlsf::NIL;
use kept::Kept;
use periodic::Periods;
use step_lived::StepLived;

mod keeping;
mod kept;
mod leaving;
mod periodic;
mod step_lived;

/// Allocations one recording may log: beyond, it starts over (bounds the log's memory, 16 bytes
/// an allocation, and the planner's time, O(n log n) in it: 30 ms for 14,000 allocations on the
/// build machine; the recorded traces' passes hold at most 51,000).
pub(super) const LOG_MAX: usize = 1 << 18;
/// Log entries (and starts) whose memory a stream keeps while it does not record (`drop_log`):
/// at most 64 KiB of log and 192 KiB of starts, against `LOG_MAX`'s 4 MiB of log.
pub(super) const LOG_KEPT: usize = 1 << 12;
/// Most epochs a stream waits before following or logging again after plans were left.
const MAX_WAIT: u32 = 1 << 10;
/// Plans over a floor followed to the end in a row after which the recording stops while
/// following. It goes on to find an epoch holding the ones followed (a pass of a few steps
/// that empties the range); after this many steps followed none is likely, and recording
/// costs a tenth again per operation (callgrind, lstm_train held: 459 instructions an
/// operation with this, 611 recording for good).
const SURE: u32 = 8;
/// What a stream's epochs are doing now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Mode {
    /// Not planned (`PoolConfig::epoch_plans` off, or page aliases on).
    #[default]
    Off,
    /// Logging, and finding epochs in the log.
    Recording,
    /// The plan was left in this epoch.
    Left,
    /// Neither logging nor following until `wait` more epochs have ended.
    Waiting,
    /// An epoch ended: the next allocation follows the plan that starts with its size over the
    /// range's live blocks, or logs when none does.
    Ready,
    /// Recording a turn of a period, its carried allocations steered to their slots
    /// (`periodic.rs`).
    Steering,
    /// Following a plan: `next` is its next allocation.
    Following,
}

impl Mode {
    /// `Ready`, `Steering` or `Following`: the allocation path asks `alloc_planned` (one
    /// comparison: they are the last three).
    #[inline(always)]
    pub(super) fn plans(self) -> bool {
        self >= Mode::Ready
    }
}

/// One logged allocation: rounded size, and the clock at its allocation and its free.
#[derive(Clone, Copy, Debug)]
pub(super) struct Logged {
    pub(super) size: u64,
    pub(super) start: u32,
    pub(super) end: u32,
}

/// A point an epoch may start at: before the allocation logged at `pos`, when the newest live
/// logged allocation was `mark` (−1: none). The epoch ends when the newest live one is at most
/// `mark` again. Starts above it on the stack fold what they saw into it when they end.
#[derive(Clone, Copy, Debug)]
struct Start {
    mark: i64,
    pos: u32,
    clock: u32,
    /// The range's live bytes at the start, and the most since; its live blocks at the start.
    live: u64,
    peak: u64,
    count: u64,
    /// The oldest logged allocation freed since (−1: a block older than the log).
    oldest_freed: i64,
}

/// A stream's epochs: the log being recorded and its starts, the plans kept, the one being
/// followed, and the range's live bytes and live-set hash.
#[derive(Debug, Default)]
pub(super) struct Epochs {
    pub(super) mode: Mode,
    log: Vec<Logged>,
    clock: u32,
    /// The allocation order (`Pool::hand_out`'s sequence) before the log's first entry: older
    /// blocks are not in it.
    log_from: u64,
    /// The newest live entry of the log (−1: none).
    newest: i64,
    /// Where epochs may start, their marks increasing upwards.
    starts: Vec<Start>,
    /// The log is kept (`Recording`, or `Ready` after an epoch it found).
    recording: bool,
    /// A dry-run clone: logs nothing.
    quiet: bool,
    /// The search for loops that carry a block from turn to turn (`periodic.rs`).
    periods: Periods,
    /// Which allocations of an epoch live through it (`step_lived.rs`).
    step_lived: StepLived,
    /// Epochs the recording found since its log started.
    found: u32,
    /// Nothing to do per operation: off, or following a plan over an empty floor (and leaving
    /// it, and waiting after), whose epoch ends when the range empties (`range_emptied`), not
    /// by a count. Then `young` counts allocations only, for `force_end`.
    quick: bool,
    /// The live figures below missed blocks (`force_end`).
    stale: bool,
    /// An epoch found at a free, to keep with its floor (`keep_ended`).
    ended: Option<Vec<Logged>>,
    /// The range's live bytes, their most (while recording), its live blocks, and a hash of
    /// them (addresses and sizes).
    live: u64,
    peak_live: u64,
    count: u64,
    hash: u64,
    /// The latest logged epochs, oldest first (an epoch found again or followed to its end is
    /// the newest again), at most `PLANS`, and `VARIANTS` per first size and floor.
    kept: Vec<Arc<Kept>>,
    /// The kept epoch whose plan is being followed (`Following`, `Left`), and that plan.
    following: Option<Arc<Kept>>,
    pub(super) plan: Option<Arc<Plan>>,
    /// The plan's next allocation (`Following`), and the block each one followed so far took
    /// (then the floor's blocks): how the next finds the one below it without a lookup by
    /// address.
    pub(super) next: u32,
    pub(super) placed: Vec<u32>,
    /// Outside recording: the allocation order before this epoch's first allocation (`u64::MAX`:
    /// it has not come yet), and its allocations still live — none, and the epoch ends.
    since: u64,
    young: u64,
    /// Epochs left to wait (`Waiting`), and plans left in a row (the wait doubles with each);
    /// plans followed to the end in a row.
    wait: u32,
    misses: u32,
    in_row: u32,
    /// The plan followed was left where its place was not free (`leave`): its kept epoch goes.
    outdated: bool,
    /// A plan over an empty floor was left outside recording: the next epoch of its first size
    /// and floor is logged, not followed.
    relearn: Option<(u64, u64)>,
    /// The first size and floor of the epoch plan left last, until an epoch of them is found
    /// (kept as a variant whatever its size: `drop_newest`) or the stream next chooses a plan.
    parted: Option<(u64, u64)>,
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
            log_from: self.log_from,
            newest: -1,
            starts: Vec::new(),
            recording: false,
            quiet: true,
            // The held slots are the clone's blocks too.
            periods: self.periods.clone(),
            step_lived: self.step_lived.for_clone(),
            found: 0,
            quick: self.quick,
            stale: self.stale,
            ended: None,
            live: self.live,
            peak_live: self.peak_live,
            count: self.count,
            hash: self.hash,
            kept: self.kept.clone(),
            following: self.following.clone(),
            plan: self.plan.clone(),
            next: self.next,
            placed: self.placed.clone(),
            since: self.since,
            young: self.young,
            wait: self.wait,
            misses: self.misses,
            in_row: self.in_row,
            outdated: self.outdated,
            relearn: self.relearn,
            parted: self.parted,
            followed: self.followed,
            left: self.left,
            planned: self.planned,
        }
    }
}

/// A live block's share of `Epochs::hash`.
#[inline(always)]
fn mix(addr: u64, size: u64) -> u64 {
    (addr ^ size.rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Epochs {
    /// Epochs planned (`on`), periods found too (`periods`, `periodic.rs`), and step-lived
    /// allocations predicted (`step_lived`, `step_lived.rs`).
    pub(super) fn new(on: bool, periods: bool, step_lived: bool) -> Epochs {
        Epochs {
            mode: if on { Mode::Ready } else { Mode::Off },
            quick: !on,
            newest: -1,
            since: u64::MAX,
            periods: Periods::new(periods),
            step_lived: StepLived::new(on && step_lived),
            ..Epochs::default()
        }
    }

    /// Allocation `seq` (the pool's order) of a `size`-byte block at `addr` in the range;
    /// returns its index in the log, for `on_free` (`NIL`: not logged).
    ///
    /// The range's live bytes, blocks and hash count every block while the stream records or is
    /// ready, but outside recording only the blocks older than the epoch: the epoch's own all go
    /// before it ends (what following costs stays a count), so the figures are whole again then.
    #[inline(always)]
    pub(super) fn on_alloc(&mut self, addr: u64, size: u64, seq: u64) -> u32 {
        if self.quick {
            self.young += 1;
            if self.young > LOG_MAX as u64 && self.mode != Mode::Off {
                self.force_end(seq);
                self.young = 1;
            }
            return NIL;
        }
        match self.mode {
            Mode::Following | Mode::Left | Mode::Waiting => {
                if self.since == u64::MAX {
                    self.since = seq - 1;
                } else if seq - self.since > LOG_MAX as u64 {
                    self.force_end(seq);
                }
                self.young += 1;
                // Recording goes on after a plan is left, however long its epoch runs: the plan
                // may have been a fragment of a step (temporaries that ended as an epoch before
                // the step reached its peak), and only a recording that goes on finds the step.
                // A log filled without an epoch pauses it (`pause`).
                if !self.recording {
                    return NIL;
                }
                self.count_in(addr, size);
                self.log_alloc(size, seq)
            }
            Mode::Off => NIL,
            Mode::Recording | Mode::Steering => {
                self.count_in(addr, size);
                self.log_alloc(size, seq)
            }
            Mode::Ready if self.recording => {
                // Not through `alloc_planned` (`take_at`): the recording goes on.
                self.mode = Mode::Recording;
                self.count_in(addr, size);
                self.log_alloc(size, seq)
            }
            Mode::Ready => {
                // Not through `alloc_planned` (`take_at`): this epoch's start was missed, so
                // it is neither logged nor followed.
                self.mode = Mode::Left;
                self.since = seq - 1;
                self.young = 1;
                NIL
            }
        }
    }

    /// Free of the block of allocation `seq`, `size` bytes at `addr`, logged at `k` (`on_alloc`).
    /// True when the recording found an epoch ending here: the pool reads its floor for
    /// `keep_ended`.
    #[inline(always)]
    pub(super) fn on_free(&mut self, addr: u64, size: u64, seq: u64, k: u32) -> bool {
        if self.quick {
            return false;
        }
        let young =
            matches!(self.mode, Mode::Following | Mode::Left | Mode::Waiting) && seq > self.since;
        if young {
            self.young -= 1;
            // A period's turn ends with its last allocation, its carry still live.
            if self.young == 0 && !(self.mode == Mode::Following && self.following_period()) {
                self.end_epoch();
            }
            if !self.recording {
                return false;
            }
        }
        self.count_out(addr, size);
        if !self.recording {
            return false;
        }
        let found = self.log_free(seq, k);
        // Back at a floor while recording, or ready for the next epoch: one that may be placed
        // as usual. (Following a plan, the plan places the epoch; left or waiting, the stream
        // counts only the epoch's own blocks, and the hash misses the rest.)
        if self.has_learnt_step_lived() && matches!(self.mode, Mode::Recording | Mode::Ready) {
            self.arm_step_lived();
        }
        found
    }

    #[inline(always)]
    fn count_in(&mut self, addr: u64, size: u64) {
        self.live = self.live.wrapping_add(size);
        self.count = self.count.wrapping_add(1);
        self.hash ^= mix(addr, size);
    }

    #[inline(always)]
    fn count_out(&mut self, addr: u64, size: u64) {
        // Wrapping: after `force_end` the figures are wrong until `recount`.
        self.live = self.live.wrapping_sub(size);
        self.count = self.count.wrapping_sub(1);
        self.hash ^= mix(addr, size);
    }

    /// An epoch outside recording that does not end (a floor that keeps growing) is counted as
    /// ended after `LOG_MAX` allocations, so that a wait runs out and the stream records again.
    /// Its live blocks, uncounted, become older than the next: the figures wait for `recount`.
    #[cold]
    fn force_end(&mut self, seq: u64) {
        self.quick = false;
        self.end_epoch();
        self.since = seq - 1;
        self.stale = !self.recording;
    }

    /// The range emptied: a plan over an empty floor (`quick`) ends its epoch here.
    pub(super) fn on_empty(&mut self) {
        if self.quick && self.mode != Mode::Off {
            self.end_epoch();
            self.quick = self.mode != Mode::Ready;
        }
    }

    /// The recording stops (its log emptied) until the next epoch starts after a wait;
    /// the live figures counted the epoch's own blocks, so they wait for `recount`.
    #[cold]
    fn stop_recording(&mut self) {
        self.recording = false;
        self.drop_log();
        self.stale = true;
    }

    /// The log and its starts are emptied while the stream does not record. Up to
    /// `LOG_KEPT` entries of their memory stay: a recording that starts again (each time a
    /// program's pass or a replay's starts over an empty range) then writes into memory it
    /// has used rather than growing a new log from nothing (mlp_small_train's replay: five
    /// reallocations and their copies a pass; 0.21–0.24 → 0.20 of PyTorch's time an operation
    /// on the H200, BENCHMARKS.md session 52). Beyond that, the memory of a long log goes.
    fn drop_log(&mut self) {
        self.log.clear();
        self.log.shrink_to(LOG_KEPT);
        self.starts.clear();
        self.starts.shrink_to(LOG_KEPT);
    }

    /// No epoch in a whole log: the stream stops recording for 2^misses − 1 times `LOG_MAX`
    /// allocations (counted, nothing else done per operation), then records again.
    #[cold]
    fn pause(&mut self) {
        self.stop_recording();
        self.misses += 1;
        self.wait = (1u32 << self.misses.min(10)).min(MAX_WAIT) - 1;
        self.mode = Mode::Waiting;
        self.quick = true;
        self.young = 0;
    }

    /// Whether the stream is logging.
    pub(super) fn is_recording(&self) -> bool {
        self.recording
    }

    /// The entries the log holds, and those its memory has room for.
    #[cfg(test)]
    pub(super) fn log_room(&self) -> (usize, usize) {
        (self.log.len(), self.log.capacity())
    }

    /// The allocation order before the log's first entry: a block allocated later than it has
    /// its log index.
    pub(super) fn log_from(&self) -> u64 {
        self.log_from
    }

    /// Whether the range's figures need `recount` before the next epoch starts.
    pub(super) fn stale(&self) -> bool {
        self.stale
    }

    /// The range's live blocks counted afresh (`Pool::alloc_planned`, before a stale stream
    /// chooses its next plan).
    pub(super) fn recount(&mut self, blocks: impl Iterator<Item = (u64, u64)>) {
        (self.live, self.count, self.hash) = (0, 0, 0);
        for (addr, size) in blocks {
            self.count_in(addr, size);
        }
        self.stale = false;
    }

    /// Starts recording afresh: every live block is older than the log.
    fn restart_log(&mut self, seq_before: u64) {
        self.recording = true;
        self.found = 0;
        self.log.clear();
        self.starts.clear();
        self.clock = 0;
        self.newest = -1;
        self.log_from = seq_before;
        self.peak_live = self.live;
        self.periods.restart();
        self.step_lived.restart();
    }

    #[inline]
    fn log_alloc(&mut self, size: u64, seq: u64) -> u32 {
        if self.quiet {
            return NIL;
        }
        if self.log.len() >= LOG_MAX || self.clock >= u32::MAX - 1 {
            if self.found == 0 {
                // A whole log without an epoch (no set of live blocks came back): the recording
                // pauses, longer each time.
                self.pause();
                return NIL;
            }
            // The log's memory stays bounded: it starts over from here.
            self.restart_log(seq - 1);
        }
        let k = self.log.len() as i64;
        if self.starts.last().is_none_or(|s| s.mark < self.newest) {
            self.starts.push(Start {
                mark: self.newest,
                pos: k as u32,
                clock: self.clock,
                live: self.live - size,
                peak: self.live,
                count: self.count - 1,
                oldest_freed: i64::MAX,
            });
        }
        self.clock += 1;
        self.log.push(Logged {
            size,
            start: self.clock,
            end: u32::MAX,
        });
        self.newest = k;
        self.logged_step_lived(k as u32);
        self.peak_live = self.peak_live.max(self.live);
        let top = self.starts.last_mut().expect("a start");
        top.peak = top.peak.max(self.live);
        if size >= self.periods.big {
            self.note_big(k as u32, size);
        }
        if self.periods.ready_at == Some(k as u32 + 1) {
            self.turn_logged();
        }
        k as u32
    }

    #[inline]
    fn log_free(&mut self, seq: u64, k: u32) -> bool {
        if self.quiet {
            return false;
        }
        let logged = seq > self.log_from && (k as usize) < self.log.len();
        let freed = if logged { k as i64 } else { -1 };
        if let Some(top) = self.starts.last_mut() {
            top.oldest_freed = top.oldest_freed.min(freed);
        }
        if !logged {
            return false;
        }
        self.clock += 1;
        self.log[k as usize].end = self.clock;
        freed == self.newest && self.drop_newest()
    }

    /// The newest live entry went: the pointer walks down to the next live one, and the starts
    /// above it end; the lowest of them is an epoch (true) when its floor stayed, it was large,
    /// and it made at least as many allocations as its floor has blocks (reading the floor, and
    /// looking for the plan's blocks in it, then cost at most one step an allocation).
    #[inline(never)]
    fn drop_newest(&mut self) -> bool {
        let mut v = self.newest - 1;
        while v >= 0 && self.log[v as usize].end != u32::MAX {
            v -= 1;
        }
        self.newest = v;
        let mut ended = None;
        while let Some(&s) = self.starts.last() {
            if s.mark < v {
                break;
            }
            self.starts.pop();
            if let Some(below) = self.starts.last_mut() {
                below.peak = below.peak.max(s.peak);
                below.oldest_freed = below.oldest_freed.min(s.oldest_freed);
            }
            ended = Some(s);
        }
        let Some(s) = ended else { return false };
        self.found += 1;
        let clean = s.oldest_freed >= s.pos as i64;
        let large = s.live == 0 || 2 * (s.peak - s.live) >= self.peak_live - s.live;
        let n = self.log.len() - s.pos as usize;
        let long = n as u64 >= s.count;
        if clean && large && long {
            self.learn_step_lived(s.pos as usize);
        }
        // The epoch that parted from a plan of its first size and floor is a variant of that
        // step, whatever its size: a batch of smaller images may not reach half the most live
        // bytes a larger one did, and would otherwise part from the plan every time it comes.
        let first = self.log[s.pos as usize].size;
        let parted = self.parted == Some((first, self.hash));
        if !(clean && (large || parted) && long) {
            return false;
        }
        if parted {
            self.parted = None;
        }
        // The same epoch as one kept (its first size, floor and log): its plan stays, made once
        // (a program following its steps' plan finds each step again), and it is the newest —
        // the variant the next epoch like it follows.
        let log = &self.log[s.pos as usize..];
        let known = match self.kept.iter().position(|k| k.logs(log, self.hash)) {
            Some(i) => {
                let again = self.kept.remove(i);
                self.kept.push(again);
                true
            }
            None => false,
        };
        // The next allocation may follow a plan. Outside recording a plan's epoch is under way
        // — unless the range is empty: every epoch has ended, and one that empties it holds
        // every other, so a wait (for plans of steps left) gives way to it.
        if self.mode == Mode::Recording || (s.live == 0 && self.mode == Mode::Waiting) {
            self.mode = Mode::Ready;
        }
        // Or a period's turn steering its carry, when the epoch holds the turn (`periodic.rs`).
        self.end_steering_at(s.pos);
        if !known {
            let c0 = s.clock;
            let log = self.log[s.pos as usize..]
                .iter()
                .map(|l| Logged {
                    size: l.size,
                    start: l.start - c0,
                    end: l.end - c0,
                })
                .collect();
            self.ended = Some(log);
            return true;
        }
        false
    }

    /// At an epoch's first allocation (`Ready`), of `size` bytes, allocation `seq − 1` the last
    /// before it: the plan of the kept epoch that starts with it over the same floor (planned
    /// now, the first time) becomes the one followed (true); with none, the stream records
    /// (false), going on with its log when it was recording.
    pub(super) fn choose(&mut self, size: u64, terms: Terms, seq_before: u64) -> bool {
        self.plan = None;
        self.parted = None;
        self.following = None;
        let hash = self.hash;
        // After a plan over an empty floor was left outside recording, the next epoch like it
        // is logged rather than followed: the variant that left it is learnt.
        let relearn = self.relearn == Some((size, hash));
        if relearn {
            self.relearn = None;
        }
        if let Some(i) = self
            .kept
            .iter()
            .rposition(|k| k.first_size() == size && k.hash == hash)
            .filter(|_| !relearn)
        {
            let k = self.kept[i].clone();
            let fresh = k.plan.get().is_none();
            // A variant's plan holds what they start with where the newest planned one has it.
            let base = self.kept[..i]
                .iter()
                .rev()
                .filter(|x| x.first_size() == size && x.hash == hash)
                .find_map(|x| x.plan.get().cloned().flatten());
            self.plan = k.plan(terms, base.as_deref());
            self.planned += u64::from(fresh);
            if self.plan.is_none() {
                // Refused by the planner: this epoch is logged in its place.
                self.kept.remove(i);
            } else {
                self.following = Some(k);
            }
        }
        self.next = 0;
        self.placed.clear();
        self.since = seq_before;
        self.young = 0;
        if let Some(p) = &self.plan {
            self.placed.resize(p.sizes.len(), NIL);
            self.mode = Mode::Following;
            self.quick = p.young == p.sizes.len();
            if self.quick || self.in_row >= SURE {
                // Over an empty floor the recording stops (its log emptied): an epoch
                // that empties the range holds every other one. Over a floor it goes on, so
                // that an epoch holding this one (a program's pass over several steps) is
                // still found — until plans have been followed `SURE` times in a row.
                self.recording = false;
                self.drop_log();
            } else if !self.recording {
                // A plan was left since it stopped: the epoch that left it, a variant, is
                // learnt when it comes again.
                self.restart_log(seq_before);
            }
            true
        } else {
            if !self.recording {
                self.restart_log(seq_before);
            }
            self.quick = false;
            self.mode = Mode::Recording;
            // Placed as usual: what lived through the last epoch over this floor goes low.
            if self.has_learnt_step_lived() {
                self.arm_step_lived();
            }
            false
        }
    }

    /// An epoch ended outside recording (its allocations all freed).
    fn end_epoch(&mut self) {
        self.steer_again();
        self.since = u64::MAX;
        self.young = 0;
        match self.mode {
            Mode::Following => {
                if self
                    .plan
                    .as_ref()
                    .is_some_and(|p| self.next as usize == p.young)
                {
                    self.followed_to_end();
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
            Mode::Off | Mode::Ready | Mode::Recording | Mode::Steering => {}
        }
    }

    /// The plan followed was placed to its end: the stream is ready for the next, and its
    /// kept epoch is the newest (the variant the next epoch like it follows first).
    fn followed_to_end(&mut self) {
        self.steer_again();
        self.followed += 1;
        self.misses = 0;
        self.in_row += 1;
        self.plan = None;
        let following = self.following.take();
        if let Some(i) = self.listed(following) {
            let again = self.kept.remove(i);
            self.kept.push(again);
        }
        self.mode = Mode::Ready;
    }
}
