//! Periods: a loop that carries a block from each turn into the next (a sampler's latents from
//! one denoising step to the next, a recurrent state) never returns to the same live blocks,
//! so none of its turns is an epoch (`epochs.rs`). Yet its allocations repeat, and so can their
//! places. Placed as usual, such a loop can creep: diffusion_unet_infer's 216 MiB block goes
//! higher in the range every step, as the step's small blocks take its old place (BENCHMARKS.md,
//! session 30).
//!
//! *Finding one.* While the stream records, each allocation of the log's largest size looks back
//! at the last ones of that size (`BIG_SEEN`), for a distance `P` such that:
//! - the `P` allocations up to this one repeat the `P` before them (their rounded sizes);
//! - every block of those `P` still live — the turn's *carry* — replaces its copy of the turn
//!   before, which was freed in this turn before the new one was made. Each copy outlives its
//!   turn by less than one, so a training step's saved activations are no carry.
//! - A period too short to carry its state (a latent that lives a little longer than one step)
//!   is found at twice its length, the next distance looked at.
//!
//! *Where a turn starts.* The turn is cut before the allocation where the fewest of its bytes
//! are live: the loop's state, not a step's activations, is then its carry.
//!
//! *Keeping it.* At that allocation (`keep_period`) the live blocks are the period's floor: the
//! carry among them, each freed in the next turn when its copy was in this one. The turn is kept
//! as an epoch is. Its plan (`epoch_plan.rs`) holds the floor where it is and puts each carried
//! allocation in the slot of the block it replaces, so a turn that follows the plan ends over
//! the floor it started on, and the next turn follows the same plan.
//!
//! *Steering onto it.* The slots are chosen beside the floor's lasting blocks (`carry_slots`),
//! where the carry does not split the memory the turn's large blocks take. The carry of the
//! turn being cut, though, lies wherever the usual placement put it. So the turn after it is
//! placed as usual, except for its carried allocations, which go to the slots:
//! - the pool holds the slots from the turn's first allocation (`period_steer.rs`), when only
//!   the floor and the carry are live, and hands them to the carried allocations;
//! - the next turn then starts over the plan's floor.
//!
//! A turn right after a steering turn that must steer again found its carry off the slots: the
//! loop's carry varies from turn to turn, and steering would go on without a turn following.
//! Then no turn steers until a plan is followed to its end or an epoch ends (`steer_again`).
//!
//! A turn that follows a period's plan ends with its last allocation: its carry stays live, so
//! its count of allocations still live never reaches zero as an epoch's does. A turn that leaves
//! the plan — the loop is over — records again at once, without the wait that leaving an
//! epoch plan costs: a loop's end is no sign that its turns differed.
//! A steering turn may outlast its loop, and the step holding the loop may end within it (a
//! sampler's last denoising step): that step is an epoch that started before the turn, so its
//! end frees the carry, ends the steering and leaves the stream ready for the step's plan.
//! Before, the steering went on over the step's end, and a sampler whose loop is found anew in
//! every step (dit_sample, benches/traces_host) followed no plan at all.
//!
//! Detection costs one comparison per allocation. At an allocation of the largest size it costs
//! at most `BIG_SEEN` comparisons of up to `2P` sizes. Keeping a period reads the floor (every
//! block of the range), so a period is looked for only once the stream has logged at least as
//! many allocations since the floor was last read as the floor has blocks: reading it costs at
//! most one step an allocation, whatever the floor's size. A turn may be shorter than its floor
//! (an encoder's two layers, 44 allocations, over 211 blocks of weights: session 33); before,
//! such a period was never looked for.

use super::super::epoch_plan::carry_slots;
use std::sync::Arc;

use super::{mix, Epochs, Kept, Logged, Mode, NIL};

/// Allocations of the largest size remembered: the distances a period is looked for at. Four
/// cover a loop whose turn makes its largest block twice, found at twice its length; eight,
/// one that makes it four times.
const BIG_SEEN: usize = 8;

/// The recording's search for periods.
#[derive(Clone, Debug, Default)]
pub(super) struct Periods {
    /// Whether periods are looked for (`PoolConfig::period_plans`).
    on: bool,
    /// The largest size logged since the log started, and the log indexes of the latest
    /// allocations of it, oldest first.
    pub(super) big: u64,
    big_at: Vec<u32>,
    /// A period found, `.0` allocations long, and the log index of the allocation its next turn
    /// is cut before: the turn is kept then (`Epochs::keep_period`).
    pub(super) pending: Option<(u32, u32)>,
    /// One past the log index of a turn's last allocation: the stream is ready for a plan after
    /// it (`Epochs::turn_logged`).
    pub(super) ready_at: Option<u32>,
    /// A turn placed as usual but its carry, steered to its slots (log index, offset from the
    /// range's base, size), for the next turn to start over the steady plan's floor.
    steer: Vec<(u32, u64, u64)>,
    steered: usize,
    /// The log index of that turn's first allocation.
    steer_from: u32,
    /// The pool's blocks holding the slots (`NIL`: not held), per `steer` entry: allocated,
    /// not handed out, until their allocation comes (`Pool::hold_slots`).
    holds: Vec<u32>,
    /// The log's length when the floor was last read for a period (`keep_period`).
    floor_read: u32,
    /// Whether the last turn steered its carry and no turn has followed a plan since
    /// (`start_steering`), and whether the turn after such a turn found its carry off the
    /// slots again: then no turn steers until a plan is followed to its end or an epoch ends
    /// (`steer_again`).
    steered_turn: bool,
    steer_failed: bool,
    /// Turns that steered their carry, cumulative (the replay's figures).
    #[cfg(test)]
    turns_steered: u64,
}

impl Periods {
    pub(super) fn new(on: bool) -> Periods {
        Periods {
            // Off, the largest size is never reached: no period is looked for.
            big: if on { 0 } else { u64::MAX },
            on,
            ..Periods::default()
        }
    }

    /// Forgets the log's allocations (it starts over).
    pub(super) fn restart(&mut self) {
        self.big = if self.on { 0 } else { u64::MAX };
        self.big_at.clear();
        self.pending = None;
        self.ready_at = None;
        self.steer.clear();
        self.floor_read = 0;
    }
}

impl Epochs {
    /// Allocation `k` of the log, of `size` bytes, at least the largest so far: while recording,
    /// whether the allocations up to it form a period (then the stream is ready for its plan).
    #[inline(never)]
    pub(super) fn note_big(&mut self, k: u32, size: u64) {
        let ps = &mut self.periods;
        if size > ps.big {
            ps.big = size;
            ps.big_at.clear();
        } else if self.mode == Mode::Recording && ps.pending.is_none() {
            if let Some(p) = self.find_period(k) {
                let at = self.cut(p, k) + p;
                self.periods.pending = Some((p, at));
                self.periods.ready_at = Some(at);
                self.found += 1;
            }
        }
        let ps = &mut self.periods;
        if ps.big_at.len() == BIG_SEEN {
            ps.big_at.remove(0);
        }
        ps.big_at.push(k);
    }

    /// Where a turn of the period of `p` allocations found at allocation `k` is best cut: the
    /// allocation (of the last turn) before which the fewest bytes of the turn's blocks are
    /// live — the loop's state between its steps, not a step's activations, is then the carry the
    /// plan holds in place.
    fn cut(&self, p: u32, k: u32) -> u32 {
        let log = &self.log;
        let (p, k) = (p as usize, k as usize);
        let first = k + 1 - p;
        // crossing[c - first]: bytes of the `p` allocations before `c` live just before it, by
        // differences: allocation `i` is live before each `c` in `(i, i + p]` made before its free.
        let mut diff = vec![0i128; p + 1];
        for i in first - p..=k {
            let lo = (i + 1).max(first);
            let top = (i + p).min(k);
            if lo > top {
                continue;
            }
            let end = log[i].end;
            // The last `c` in `[lo, top]` allocated before `end` (starts increase with `c`).
            let n = log[lo..=top].partition_point(|l| l.start < end);
            if n == 0 {
                continue;
            }
            diff[lo - first] += log[i].size as i128;
            diff[lo - first + n] -= log[i].size as i128;
        }
        let (mut best, mut at, mut sum) = (i128::MAX, first, 0i128);
        for c in first..=k {
            sum += diff[c - first];
            if sum < best {
                (best, at) = (sum, c);
            }
        }
        at as u32
    }

    /// The shortest distance back to an allocation of the largest size at which the log up to
    /// allocation `k` is a period (module comment).
    fn find_period(&self, k: u32) -> Option<u32> {
        // Keeping a period reads the floor: at most one step an allocation logged since the last
        // read (module comment).
        if u64::from(k.saturating_sub(self.periods.floor_read)) < self.count {
            return None;
        }
        let log = &self.log;
        for &q in self.periods.big_at.iter().rev() {
            let p = k - q;
            if 2 * p > k + 1 {
                // Too few allocations logged to see a turn and the one before (the older
                // allocations are further back still).
                return None;
            }
            let (k, p) = (k as usize, p as usize);
            if !(0..p).all(|j| log[k - j].size == log[k - p - j].size) {
                continue;
            }
            // A block still live is carried when its copy of the turn before was freed in this
            // turn before it was made; or it goes before the next allocation when that copy
            // went before this turn's first (`keep_period` looks again then).
            let carried = |i: usize| {
                let before = log[i - p].end;
                before != u32::MAX && before < log[i].start
            };
            if (k + 1 - p..=k).all(|i| log[i].end != u32::MAX || carried(i)) {
                return Some(p as u32);
            }
        }
        None
    }

    /// Keeps the period found (`periods.pending`) at the allocation its turn is cut before:
    /// `floor` is the range's allocated blocks now (offset from the range's base `base`, size,
    /// index in the log or `NIL`). Its plan keeps the carry in slots beside the floor's lasting
    /// blocks; when the carry lies elsewhere now, the turn starting here steers it there
    /// (`start_steering`). Nothing is kept when the allocations since the period was found
    /// differ, or the floor is not what the period says (a carried block gone).
    pub(in crate::memory::pool) fn keep_period(
        &mut self,
        floor: &[(u64, u64, u32)],
        base: u64,
        align: u64,
    ) {
        let Some((p, at)) = self.periods.pending.take() else {
            return;
        };
        let (p, at) = (p as usize, at as usize);
        self.periods.floor_read = self.log.len() as u32;
        if self.log.len() != at {
            return;
        }
        let (first, k) = (at - p, at - 1);
        // The allocations logged since the period was found repeat it too.
        if !(first..at).all(|i| self.log[i].size == self.log[i - p].size) {
            return;
        }
        let c0 = self.log[first].start - 1;
        let mut carried = Vec::new();
        let mut floor_ends = Vec::with_capacity(floor.len());
        let mut blocks = Vec::with_capacity(floor.len());
        for &(off, size, i) in floor {
            let i = i as usize;
            let end = if (first..=k).contains(&i) && self.log[i].end == u32::MAX {
                let before = self.log[i - p].end;
                if before == u32::MAX || before <= c0 || before >= self.log[i].start {
                    return;
                }
                carried.push(((i - first) as u32, off));
                before - c0
            } else {
                u32::MAX
            };
            floor_ends.push(end);
            blocks.push((off, size));
        }
        // Every block of the period still live is in the floor.
        let live = (first..=k).filter(|&i| self.log[i].end == u32::MAX).count();
        if live != carried.len() || carried.is_empty() {
            return;
        }
        let log: Vec<Logged> = self.log[first..=k]
            .iter()
            .map(|l| Logged {
                size: l.size,
                start: l.start - c0,
                end: if l.end == u32::MAX {
                    u32::MAX
                } else {
                    l.end - c0
                },
            })
            .collect();
        // The carry's slots: where the plan keeps it turn after turn. The floor's carried blocks
        // move there (their hash with them); until they lie there, a turn steers its carry there.
        let stays: Vec<(u64, u64)> = blocks
            .iter()
            .zip(&floor_ends)
            .filter(|(_, &e)| e == u32::MAX)
            .map(|(&b, _)| b)
            .collect();
        let sizes: Vec<u64> = carried.iter().map(|&(j, _)| log[j as usize].size).collect();
        let mut slots = carry_slots(&stays, &sizes, align);
        // A slot must be free when the steering turn starts, where the carry is live: slots
        // under the carry (but a block's own, where it already lies) are chosen around it too.
        let now: Vec<(u64, u64)> = carried.iter().zip(&sizes).map(|(c, &z)| (c.1, z)).collect();
        let clash = slots
            .iter()
            .zip(&now)
            .any(|(&o, &(at, z))| o != at && now.iter().any(|&(b, y)| o < b + y && b < o + z));
        if clash {
            let around: Vec<(u64, u64)> = stays.iter().chain(&now).copied().collect();
            slots = carry_slots(&around, &sizes, align);
        }
        let mut hash = self.hash;
        let mut steer = Vec::new();
        for (c, &slot) in carried.iter_mut().zip(&slots) {
            let (j, now) = *c;
            let size = log[j as usize].size;
            if now != slot {
                hash ^= mix(base + now, size) ^ mix(base + slot, size);
                steer.push((at as u32 + j, slot, size));
                let f = blocks
                    .iter()
                    .position(|b| *b == (now, size))
                    .expect("a carried block");
                blocks[f].0 = slot;
            }
            c.1 = slot;
        }
        let size = log[0].size;
        let found = Kept::new(log, blocks, hash, floor_ends, carried);
        if let Some(i) = self.kept.iter().position(|x| x.same_as(&found)) {
            // The period found again as it was kept (a program's next step through the same
            // layers): the kept one stays, its plan made once, and is the newest again — where
            // the new one would have replaced it.
            let again = self.kept.remove(i);
            self.kept.push(again);
        } else {
            self.kept
                .retain(|x| x.first_size() != size || x.hash != hash);
            self.kept.push(Arc::new(found));
            self.bound_kept();
        }
        // A turn right after a steering turn that must steer again: its carry is not the one
        // the last turn steered (blocks whose lifetimes vary from turn to turn, as a training
        // loop's Python variables hold the last step's tensors into the next), so steering
        // never ends in a followed turn, and each steering turn's held slots cost memory the
        // turn then maps elsewhere (gan_train recorded on a GPU: BENCHMARKS.md, session 40).
        if std::mem::take(&mut self.periods.steered_turn) && !steer.is_empty() {
            self.periods.steer_failed = true;
        }
        if !steer.is_empty() && !self.periods.steer_failed {
            self.periods.steer = steer;
            self.periods.steered = 0;
            self.periods.steer_from = at as u32;
            self.periods.ready_at = Some((at + p) as u32);
        }
    }

    /// The last allocation of a turn was logged (`periods.ready_at`): the next allocation keeps
    /// the period found or follows its plan. A steering turn is over, whether its carry was all
    /// made or not.
    pub(super) fn turn_logged(&mut self) {
        self.periods.ready_at = None;
        self.periods.steer.clear();
        if matches!(self.mode, Mode::Recording | Mode::Steering) {
            self.mode = Mode::Ready;
        }
    }

    /// A turn followed its period's plan to its last allocation: the next allocation starts the
    /// next turn, over the floor the plan left. Outside recording the live figures missed the
    /// turn's carry (`recount` before choosing).
    pub(in crate::memory::pool) fn end_turn(&mut self) {
        self.followed_to_end();
        self.stale |= !self.recording;
    }

    /// A period's plan was left at allocation `seq_before + 1`: the loop has ended, or changed.
    /// The plan goes and the stream records again from here, with no wait (outside recording
    /// the pool counts the live figures afresh first).
    pub(in crate::memory::pool) fn leave_period(&mut self, seq_before: u64) {
        self.note_left_plan();
        if !self.recording {
            self.restart_log(seq_before);
        }
        self.quick = false;
        self.mode = Mode::Recording;
    }

    /// Whether a period was found at the last allocation: the pool reads the floor for
    /// `keep_period` at the next.
    pub(in crate::memory::pool) fn period_pending(&self) -> bool {
        self.periods.pending.is_some()
    }

    /// The period found is not kept (the stream has no range).
    pub(in crate::memory::pool) fn forget_period(&mut self) {
        self.periods.pending = None;
    }

    /// Whether the plan followed is a period's.
    pub(in crate::memory::pool) fn following_period(&self) -> bool {
        self.plan.as_ref().is_some_and(|p| p.periodic)
    }

    /// After choosing no plan at a turn's start: the slots (offset from the range's base, size)
    /// this turn steers its carry to — then the stream is `Steering` until the turn ends, and the
    /// pool holds the slots (`set_holds`) — or none.
    pub(in crate::memory::pool) fn start_steering(&mut self) -> Vec<(u64, u64)> {
        if self.periods.steer.is_empty() || self.mode != Mode::Recording {
            self.periods.steer.clear();
            return Vec::new();
        }
        self.mode = Mode::Steering;
        self.periods.steered_turn = true;
        #[cfg(test)]
        {
            self.periods.turns_steered += 1;
        }
        self.periods.steer.iter().map(|&(_, o, s)| (o, s)).collect()
    }

    /// The pool's blocks holding the slots `start_steering` gave, in its order (`NIL`: a slot not
    /// free at the turn's start).
    pub(in crate::memory::pool) fn set_holds(&mut self, holds: Vec<u32>) {
        self.periods.holds = holds;
    }

    /// The next allocation, of `size` bytes, while steering: its slot (offset from the range's
    /// base) and the block holding it (`NIL`: none), if it is a carried one of the turn. `None`
    /// too once the turn's carried allocations are all made: the steering is over
    /// (`steering`), the rest of the turn placed as usual.
    pub(in crate::memory::pool) fn steer_next(&mut self, size: u64) -> Option<(u64, u32)> {
        let k = self.log.len() as u32;
        let ps = &mut self.periods;
        while let Some(&(i, slot, s)) = ps.steer.get(ps.steered) {
            if i > k {
                return None;
            }
            ps.steered += 1;
            if i == k && s == size {
                let h = ps.holds.get(ps.steered - 1).map_or(NIL, |&h| h);
                if let Some(x) = ps.holds.get_mut(ps.steered - 1) {
                    *x = NIL;
                }
                return Some((slot, h));
            }
        }
        ps.steer.clear();
        if self.mode == Mode::Steering {
            self.mode = Mode::Recording;
        }
        None
    }

    /// An epoch that started at log index `pos` ended while a turn steers: when it started
    /// before the turn, the turn's carry is freed with it — the loop is over (a sampler's inner
    /// loop that ended within the turn, and its step with it) — so the steering ends and the
    /// stream is ready for the epoch's plan; the pool gives the slots back at the next
    /// allocation. Otherwise the turn goes on.
    pub(super) fn end_steering_at(&mut self, pos: u32) {
        if self.mode == Mode::Steering && pos <= self.periods.steer_from {
            self.periods.steer.clear();
            self.periods.ready_at = None;
            self.mode = Mode::Ready;
        }
    }

    /// A plan was followed to its end, or an epoch ended: the turns after it may steer.
    pub(super) fn steer_again(&mut self) {
        self.periods.steered_turn = false;
        self.periods.steer_failed = false;
    }

    /// Turns that steered their carry so far.
    #[cfg(test)]
    pub(in crate::memory::pool) fn turns_steered(&self) -> u64 {
        self.periods.turns_steered
    }

    /// Whether the stream steers its turn's carry.
    pub(in crate::memory::pool) fn steering(&self) -> bool {
        self.mode == Mode::Steering
    }

    /// The blocks still holding slots, taken from the stream: a turn whose steering is over, or
    /// left, gives them back (the pool frees them).
    pub(in crate::memory::pool) fn take_holds(&mut self) -> Vec<u32> {
        let mut held = std::mem::take(&mut self.periods.holds);
        held.retain(|&h| h != NIL);
        held
    }

    /// Whether block `i` holds a slot (`Pool::check`: allocated, not handed out).
    pub(in crate::memory::pool) fn holds(&self, i: u32) -> bool {
        i != NIL && self.periods.holds.contains(&i)
    }
}
