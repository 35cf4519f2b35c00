//! Whether the program is in a *new step*: one that raised its peak of allocated bytes. Such a
//! step has shapes the program never had at that size, so no earlier step's layout fits it, and
//! the page moves that keep its footprint down are made once, as those of a request at the
//! peak are (`move_budget.rs`, `allows_at_peak`): the later steps of the same shapes reuse what
//! they placed. A training step whose input grows (a longer audio clip, a larger batch) raises
//! the peak in its forward pass and needs its biggest moves in its backward pass, below the
//! peak, where the time bucket — paid for by the steps before it, never by this one — declined
//! them (wav2vec2_train, host replay: 1.1935 of its peak live; BENCHMARKS.md, session 38).
//!
//! The step lasts until the program comes down below half the way from where the step started
//! to the peak, and then goes up past that mark again: the next step has begun. Half is the
//! epochs' own test of a step against a temporary inside one (`epochs.rs`). Coming down past
//! the mark does not end it: the step's last requests (a backward pass's late gradients, the
//! optimizer's) still follow (ended there, wav2vec2_train at 100 µs a physical allocation
//! stayed at 1.1584). Where the step started is the lowest allocated level seen since the last
//! new step ended (0 at first: the program's first step builds its weights too).
//! Counted from allocated bytes only, so the same calls give the same answer at any pace, and
//! the swap planner's dry runs (clones of the pool) see what the pool will.
//! A program that keeps more than half its first step's peak between steps never comes down
//! past that mark: its first step stays new for good, and every later step's moves are a new
//! step's, bounded by the peak's allowance and waiting for the device when they must
//! (mean_teacher_side_train in PyTorch: in 9 of 20 steps). Not waiting after the first step
//! cost hypernet_train's recording 220 MiB (`replay_rules.rs`; BENCHMARKS.md, session 56).

#[derive(Clone, Debug, Default)]
pub(super) struct NewStep {
    /// In a step that raised the peak.
    on: bool,
    /// Allocated bytes where that step started.
    from: u64,
    /// That step has come down below its half-way mark.
    descended: bool,
    /// The lowest allocated bytes since the last new step ended.
    low: u64,
}

impl NewStep {
    /// Whether the program is in a step that raised its peak.
    pub(super) fn is_new(&self) -> bool {
        self.on
    }

    /// Half the way from where the step started to `peak`.
    fn mark(&self, peak: u64) -> u64 {
        self.from + peak.saturating_sub(self.from) / 2
    }

    /// An allocation brought the allocated bytes to `now`; `peak` is the program's peak before
    /// it. True when it began the step after a new one: a step of the program has ended.
    pub(super) fn on_alloc(&mut self, now: u64, peak: u64) -> bool {
        if now > peak {
            if !self.on {
                self.from = self.low;
            }
            self.on = true;
            self.descended = false;
        } else if self.on && self.descended && now > self.mark(peak) {
            // Up past the mark after coming down: the next step.
            self.on = false;
            self.descended = false;
            self.low = now;
            return true;
        }
        false
    }

    /// A free brought the allocated bytes to `now`; `peak` is the program's peak.
    pub(super) fn on_free(&mut self, now: u64, peak: u64) {
        self.low = self.low.min(now);
        if self.on && now <= self.mark(peak) {
            self.descended = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program's allocated level and peak as the pool keeps them.
    #[derive(Default)]
    struct Walk {
        s: NewStep,
        at: u64,
        peak: u64,
        /// Allocations that began the step after a new one (`on_alloc` said a step ended).
        ended: u32,
    }

    impl Walk {
        /// Goes through `levels` (a rise is an allocation, a fall a free); whether each is in a
        /// new step.
        fn to(&mut self, levels: &[u64]) -> Vec<bool> {
            levels
                .iter()
                .map(|&l| {
                    if l > self.at {
                        if self.s.on_alloc(l, self.peak) {
                            self.ended += 1;
                        }
                        self.peak = self.peak.max(l);
                    } else {
                        self.s.on_free(l, self.peak);
                    }
                    self.at = l;
                    self.s.is_new()
                })
                .collect()
        }
    }

    #[test]
    fn a_step_that_raises_the_peak_is_new_until_the_next_step_starts() {
        let mut w = Walk::default();
        let (t, f) = (true, false);
        // The first step builds weights (40) and rises to 100: new from its first allocation.
        assert_eq!(w.to(&[40, 100]), [t, t]);
        // Its backward frees and allocates, down past its mark (50) at the end — the same step.
        assert_eq!(w.to(&[60, 80, 55, 75, 40]), [t; 5]);
        // The next step goes up past the mark: not new; as high as the peak is not new either.
        assert_eq!(w.to(&[60, 80, 100, 40]), [f; 4]);
        // That rise past the mark ended the first step, once.
        assert_eq!(w.ended, 1);
        // A step that goes higher is new from where it passes the peak (starting at 40: mark
        // 80), through its backward down past the mark...
        assert_eq!(
            w.to(&[90, 110, 120, 90, 100, 60, 40]),
            [f, t, t, t, t, t, t]
        );
        // ...to the next step's rise past it.
        assert_eq!(w.to(&[70, 90]), [t, f]);
        assert_eq!(w.ended, 2);
    }

    #[test]
    fn a_step_over_weights_that_stay_ends_where_the_next_rises_past_its_mark() {
        let mut w = Walk::default();
        let (t, f) = (true, false);
        // Weights of 100 stay; the first step starts from nothing and rises to 180 (mark 90,
        // below the weights: it stays new).
        assert_eq!(w.to(&[100, 180, 100, 170]), [t; 4]);
        // Never down past its mark (the weights stay above it): no step has ended.
        assert_eq!(w.ended, 0);
        // A higher step (mark 110 from 0) comes down to the weights, past its mark, and the
        // next rise past it ends the new step.
        assert_eq!(w.to(&[220, 100, 150]), [t, t, f]);
        assert_eq!(w.ended, 1);
        // From there a step starts at the lowest level since: the weights (mark 170 for 240).
        assert_eq!(w.to(&[100, 240, 160, 110, 200]), [f, t, t, t, f]);
    }
}
