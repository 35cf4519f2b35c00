//! Step-lived blocks: what a step makes early and keeps to its end (an encoder's attention
//! masks and the output of its embeddings, live while every layer runs) splits the memory the
//! step's large blocks take when the usual placement puts it in the middle of the range — best
//! fit takes the hole that a block of the same size left one allocation before. A step whose
//! shapes differ from every earlier one follows no plan (`epochs.rs`), so nothing else keeps
//! such a block out of the way (session 33: roberta_infer_varlen's largest batch put its
//! 36 MiB one at 476 MiB, and the two-layer period's plan above it needed 158 pages more).
//!
//! *Learning.* When the recording finds an epoch, the positions (from its first allocation) of
//! the allocations still live when its last allocation was made are kept for the epoch's
//! floor (the hash of the range's live blocks then), the latest `FLOORS` floors, with how many
//! allocations the allocation at each position lived (`Epochs::life_at_position`: the
//! short-lived rule, `tail_first.rs`, asks it of the epoch under way).
//!
//! *Predicting.* Whenever the range's live blocks come back to a floor so learnt while the
//! stream records, the next allocation is position 0 of a new epoch over it: the allocations at
//! the positions learnt are predicted to live through it, and the pool places them at the
//! lowest free place of the range (`step_lived.rs` in the pool). A step with other shapes makes
//! the same calls in the same order, so the positions hold where the sizes do not; a step that
//! differs only misplaces a few blocks, low instead of best fit.
//!
//! Cost: a comparison per allocation (`wants_lowest`), a look at at most `FLOORS` hashes per
//! free while recording, and at an epoch found a pass over its log and a binary search per
//! allocation in it (the lifetimes); four bytes a position kept.

use std::sync::Arc;

use super::{Epochs, Logged};

/// Floors whose step-lived positions are kept: a program alternating a few phases, each over
/// blocks of its own, keeps each phase's.
const FLOORS: usize = 4;

/// The step-lived positions learnt, and the epoch under way's prediction.
#[derive(Clone, Debug)]
pub(super) struct StepLived {
    /// Whether blocks are predicted at all (`PoolConfig::step_lived_low`).
    on: bool,
    /// Per floor, oldest first: what the last epoch over it showed.
    learnt: Vec<Learnt>,
    /// Per floor hash, as `learnt`: for each position pages were gathered at, the largest
    /// request they were gathered for (`gathers`).
    gathered: Vec<(u64, Vec<(u32, u64)>)>,
    /// The epoch under way over a learnt floor.
    cursor: Option<Cursor>,
    /// The log index of the next allocation predicted step-lived (`u32::MAX`: none).
    next: u32,
}

impl StepLived {
    pub(super) fn new(on: bool) -> StepLived {
        StepLived {
            on,
            learnt: Vec::new(),
            gathered: Vec::new(),
            cursor: None,
            next: u32::MAX,
        }
    }

    /// The log starts over: its indexes do too.
    pub(super) fn restart(&mut self) {
        self.cursor = None;
        self.next = u32::MAX;
    }

    /// A copy for a dry run's clone, which logs nothing: it learns and predicts nothing.
    pub(super) fn for_clone(&self) -> StepLived {
        StepLived::new(false)
    }
}

/// What the last epoch over one floor showed.
#[derive(Clone, Debug)]
struct Learnt {
    /// The floor's hash.
    floor: u64,
    /// The positions of the allocations live when the epoch made its last one.
    positions: Arc<[u32]>,
    /// Per position, how many allocations were made while that allocation lived
    /// (`u32::MAX`: it outlived the epoch).
    lives: Arc<[u32]>,
}

/// The prediction for the epoch under way over a learnt floor, and its walks for low places
/// (`Pool::take_lowest`).
#[derive(Clone, Debug)]
struct Cursor {
    /// What the last epoch over the floor showed, and the index in its positions of the next
    /// one due.
    learnt: Learnt,
    due: usize,
    /// The log index of the epoch's first allocation.
    start: u32,
    /// The floor's blocks.
    floor_blocks: u64,
    /// Blocks the walks have visited, and the address of the allocated block right below the
    /// lowest free one found (0: none yet), where the next walk starts.
    walked: u64,
    walk_from: u64,
}

impl Default for StepLived {
    fn default() -> StepLived {
        StepLived::new(false)
    }
}

/// The positions in `epoch` (an epoch's log, every allocation freed) of the allocations still
/// live when its last allocation was made.
fn live_at_last(epoch: &[Logged]) -> Arc<[u32]> {
    let last = epoch.last().map_or(0, |l| l.start);
    epoch
        .iter()
        .enumerate()
        .filter(|(_, l)| l.end > last && l.end != u32::MAX)
        .map(|(j, _)| j as u32)
        .collect()
}

/// For each position in `epoch` (an epoch's log), how many allocations were made while the
/// allocation there lived: those logged after it and before its free (`u32::MAX`: never freed).
fn lives(epoch: &[Logged]) -> Arc<[u32]> {
    epoch
        .iter()
        .enumerate()
        .map(|(j, l)| match l.end {
            u32::MAX => u32::MAX,
            end => (epoch.partition_point(|m| m.start < end) - j - 1) as u32,
        })
        .collect()
}

impl Epochs {
    /// Whether the next allocation is predicted to live through its epoch: the pool places it
    /// at the lowest free place of the range.
    #[inline(always)]
    pub(in crate::memory::pool) fn wants_lowest(&self) -> bool {
        self.step_lived.next == self.log.len() as u32
    }

    /// Allocation `k` of the log was made: past the prediction's next position, on to the one
    /// after.
    #[inline(always)]
    pub(super) fn logged_step_lived(&mut self, k: u32) {
        if k == self.step_lived.next {
            self.next_step_lived();
        }
    }

    fn next_step_lived(&mut self) {
        let sl = &mut self.step_lived;
        sl.next = u32::MAX;
        if let Some(c) = &mut sl.cursor {
            c.due += 1;
            if let Some(&p) = c.learnt.positions.get(c.due) {
                sl.next = c.start + p;
            }
        }
    }

    /// An epoch found from log index `from` to the log's end, over the live blocks now: its
    /// step-lived positions replace those learnt for this floor.
    pub(super) fn learn_step_lived(&mut self, from: usize) {
        if !self.step_lived.on {
            return;
        }
        let epoch = &self.log[from..];
        let learnt = Learnt {
            floor: self.hash,
            positions: live_at_last(epoch),
            lives: lives(epoch),
        };
        let sl = &mut self.step_lived;
        sl.learnt.retain(|x| x.floor != learnt.floor);
        if sl.learnt.len() == FLOORS {
            let old = sl.learnt.remove(0).floor;
            sl.gathered.retain(|x| x.0 != old);
        }
        sl.learnt.push(learnt);
    }

    /// Whether the step-lived allocation now due, of `rounded` bytes, may have pages gathered
    /// under its low place: only when it is larger than every one they were gathered for at its
    /// position over this floor. A larger step sets a footprint the later ones reuse, as moves
    /// at the program's peak do (`move_budget.rs`); a step no larger, gathering again, would
    /// move the pages back and forth that recycling moved away between steps (host replay,
    /// gpt2's live trace: 1690 ns per operation of modelled driver time in its one pass when
    /// every step gathered, 1583 with this rule, 1504 without step-lived blocks). Noted as
    /// gathered when true.
    pub(in crate::memory::pool) fn gathers(&mut self, rounded: u64) -> bool {
        let sl = &mut self.step_lived;
        let Some((pos, hash)) = sl
            .cursor
            .as_ref()
            .and_then(|c| Some((*c.learnt.positions.get(c.due)?, c.learnt.floor)))
        else {
            return false;
        };
        let at = match sl.gathered.iter().position(|x| x.0 == hash) {
            Some(at) => at,
            None => {
                sl.gathered.push((hash, Vec::new()));
                sl.gathered.len() - 1
            }
        };
        let sizes = &mut sl.gathered[at].1;
        match sizes.binary_search_by_key(&pos, |x| x.0) {
            Ok(k) if sizes[k].1 >= rounded => false,
            Ok(k) => {
                sizes[k].1 = rounded;
                true
            }
            Err(k) => {
                sizes.insert(k, (pos, rounded));
                true
            }
        }
    }

    /// After a free while recording: when the range's live blocks are a learnt floor, the next
    /// allocation starts an epoch over it, and its step-lived positions are predicted.
    #[inline]
    pub(super) fn arm_step_lived(&mut self) {
        let hash = self.hash;
        let sl = &mut self.step_lived;
        if let Some(l) = sl.learnt.iter().rev().find(|x| x.floor == hash) {
            let start = self.log.len() as u32;
            sl.next = l.positions.first().map_or(u32::MAX, |&p| start + p);
            sl.cursor = Some(Cursor {
                learnt: l.clone(),
                due: 0,
                start,
                floor_blocks: self.count,
                walked: 0,
                walk_from: 0,
            });
        }
    }

    /// How many allocations the allocation now due lived at its position in the last epoch
    /// over the floor the epoch under way started from (`None`: no such epoch under way, it has
    /// gone past that epoch's length, or the stream is not recording, so its log does not count
    /// positions).
    pub(in crate::memory::pool) fn life_at_position(&self) -> Option<u32> {
        if !self.recording {
            return None;
        }
        let c = self.step_lived.cursor.as_ref()?;
        let pos = (self.log.len() as u32).checked_sub(c.start)?;
        c.learnt.lives.get(pos as usize).copied()
    }

    /// The walk the step-lived allocation now due may take: how many blocks it may visit, and
    /// the address of the allocated block to start after (0: the range's first block). The walks
    /// of an epoch visit at most twice the blocks the range has had allocated in it — the floor's
    /// and the epoch's so far, with a free block between any two — plus one: at most one pass
    /// over the range an epoch, a step per allocation when the epoch is as long as its floor
    /// (epochs found are: `drop_newest`).
    pub(in crate::memory::pool) fn lowest_walk(&self) -> (u64, u64) {
        let sl = &self.step_lived;
        let Some(c) = &sl.cursor else {
            return (0, 0);
        };
        let made = u64::from((self.log.len() as u32).saturating_sub(c.start));
        let budget = 2 * (c.floor_blocks + made) + 1;
        (budget.saturating_sub(c.walked), c.walk_from)
    }

    /// Blocks the walks of the epoch under way have visited.
    #[cfg(test)]
    pub(in crate::memory::pool) fn lowest_walked(&self) -> u64 {
        self.step_lived.cursor.as_ref().map_or(0, |c| c.walked)
    }

    /// A walk of `visited` blocks was taken; `from`: where the next starts.
    pub(in crate::memory::pool) fn walked_lowest(&mut self, visited: u64, from: u64) {
        if let Some(c) = &mut self.step_lived.cursor {
            c.walked += visited;
            c.walk_from = from;
        }
    }

    /// Whether any floor's step-lived positions are learnt (a free while recording looks for
    /// its floor only then).
    #[inline(always)]
    pub(super) fn has_learnt_step_lived(&self) -> bool {
        !self.step_lived.learnt.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logged(start: u32, end: u32) -> Logged {
        Logged {
            size: 1,
            start,
            end,
        }
    }

    #[test]
    fn the_blocks_live_when_an_epochs_last_allocation_is_made_are_its_step_lived_ones() {
        // 1, 3 and 4 are freed before the last allocation (5) is made; 0 and 2 after it, and the
        // last allocation is live when it is made.
        let epoch = [
            logged(1, 12),
            logged(2, 3),
            logged(4, 10),
            logged(5, 6),
            logged(7, 8),
            logged(9, 11),
        ];
        assert_eq!(&*live_at_last(&epoch), &[0, 2, 5]);
    }

    #[test]
    fn a_positions_life_counts_the_allocations_made_before_its_free() {
        // 0 is freed after 1, 2 and 3 are made; 1 at once; 2 after 3; 3 never.
        let epoch = [
            logged(1, 8),
            logged(2, 3),
            logged(4, 6),
            logged(5, u32::MAX),
        ];
        assert_eq!(&*lives(&epoch), &[3, 0, 1, u32::MAX]);
    }
}
