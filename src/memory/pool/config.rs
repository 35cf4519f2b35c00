//! The pool's configuration: the knobs, their defaults, normalisation, and the benchmark
//! overrides read from the environment.

use super::round_up;

pub(super) const MIB: u64 = 1 << 20;

/// Pool configuration. [`Pool::new`] normalises it (see [`Pool::config`]): `alignment` becomes a
/// power of two (0 means the default), segment sizes become multiples of the alignment and at
/// least as large as the requests they serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Every block address and rounded size is a multiple of this (default 256).
    pub alignment: u64,
    /// Cap on reserved bytes (plain segments plus mapped pages); `u64::MAX` = none.
    pub memory_limit: u64,
    /// Requests up to this many bytes use the small pool (default 1 MiB).
    pub small_request_max: u64,
    /// Size of a small-pool segment (default 2 MiB).
    pub small_segment_bytes: u64,
    /// Large-pool requests up to this many bytes share medium segments (default 10 MiB).
    pub medium_request_max: u64,
    /// Size of a shared large-pool segment (default 20 MiB).
    pub medium_segment_bytes: u64,
    /// Larger requests get their own segment, rounded up to a multiple of this (default 2 MiB).
    pub large_segment_rounding: u64,
    /// Use the backing's virtual memory when it has some (default true).
    pub vmm: bool,
    /// Address space reserved per stream in virtual mode; 0 (default) = twice the memory limit,
    /// at least 1 GiB and at most 1 TiB.
    pub vmm_reserve_bytes: u64,
    /// Largest physical allocation in virtual mode (default 8 MiB). Pages are the device's
    /// granularity (2 MiB on NVIDIA GPUs); one allocation covers several consecutive pages, as
    /// many as a 64th of the mapped memory or a 16th of the request (a power of two, at most
    /// this, and under a memory limit at most a 32nd of it). Allocations are unmapped whole, so
    /// recycling can take back only those lying wholly inside a hole: larger ones mean fewer
    /// driver calls, smaller ones more of the holes reclaimable (on the recorded traces 64 MiB
    /// left gnn_train at 1.14 of its peak, 4 and 8 MiB at 1.03: BENCHMARKS.md §3).
    pub vmm_page_bytes: u64,
    /// Mapped memory may exceed the high-water mark of allocated bytes by this many thousandths
    /// before large requests recycle free pages instead of mapping new ones (default 30).
    pub recycle_slack_permille: u64,
    /// Only a request needing at least this many bytes of new pages — or more than the slack
    /// itself — recycles under the slack rule (default 2 MiB, one granule: every growth; the
    /// time budget `recycle_time_permille` bounds what that costs); the budget always recycles.
    pub recycle_min_bytes: u64,
    /// Whether the slack rule may wait for the device (`quiesce`) to reuse pages that queued
    /// work may still touch. Default false: it moves only pages the device is known to be done
    /// with (markers) and otherwise maps new ones, so it never stalls the device (waiting costs
    /// step time for little memory: BENCHMARKS.md §3). Even when true, a move the time bucket
    /// pays for does not wait once the program's first step has ended
    /// (`MoveBudget::note_steady`): a wait drains the device's queue, which costs a program
    /// more than the pool's clock sees (in PyTorch, wgan_gp_train's steady moves took 0.4 ms of
    /// its 16 ms step on that clock and 1.5 ms of the step; BENCHMARKS.md, session 44). Moves
    /// at the program's peak, in a new step and gathering a plan's pages, which set the
    /// footprint once, still may. The budget may always wait.
    pub recycle_waits: bool,
    /// Whether `take_pending_if_closer` may take a block pending on an event (the caller's
    /// stream then waits for it) when it fits a request more closely than every free block,
    /// as the pool's dry run places it (`pending_fit.rs`). Default false: an experiment knob
    /// until the H200 measures whether the copies waited for cost less than the page moves
    /// saved.
    pub pending_best_fit: bool,
    /// Which requests of at most a page, whose best fit is a warm free block at least twice
    /// their size, take the mapped start of the range's last block instead when that start
    /// spans at most `vmm_page_bytes` (`tail_first.rs`), keeping the warm hole whole for the
    /// large block that left it: none, every one, or those whose size the pool has seen live
    /// shorter than the mean (`lifetimes.rs`; the default since session 31:
    /// `GKRT_POOL_SHORT_LIVED_TAIL=0` turns it off, `GKRT_POOL_TAIL_PREFIX_FIRST=1` sends every
    /// one).
    pub tail_first: TailFirst,
    /// Whether a slack-rule move that cannot bring mapping under the cap, when the growth over
    /// the cap is more than one physical allocation, goes ahead only when the pages it can move
    /// are at least half of the pages over the cap — it saves at least as much as the peak
    /// still grows (`recycle.rs`, `majority_short`). A smaller move lowers the peak by a few
    /// pages while the rest of the growth is mapped anyway, and leaves holes unmapped that
    /// later steps need again: bert_train's later passes then set higher peaks at the same
    /// event (ARCHITECTURE.md, "The pool's fragmentation"; H200 run 6: 1.1268 with such moves,
    /// 1.0727 without, and 0.267 of PyTorch's time per operation against 0.190). Default true
    /// (session 12: in the host replay on the model clock it changes three of 22 traces at four
    /// speeds — bert 1.074–1.133 to 1.0727, gpt2_run_train 1.0743 to 1.0694–1.0754 — and GPT-2
    /// in PyTorch on the pool reserves the same 7.927 GB with it); `GKRT_POOL_MAJORITY_MOVES=0`
    /// makes every such move as before.
    pub recycle_majority_moves: bool,
    /// Whether a page move keeps the moved chunk's old address mapped to the same memory as an
    /// alias (its "shadow", which no block may use while the chunk is live elsewhere), so that
    /// moving it back there later — training steps that move the same chunks back and forth —
    /// needs no driver call and no device wait, and costs the move budget nothing; a first move
    /// maps once instead of unmapping and mapping (`alias.rs`; ARCHITECTURE.md, "Alias
    /// mappings"). Needs a device that can map one allocation at two addresses (CUDA can);
    /// reserved bytes still count each physical allocation once. Default false (session 13:
    /// in the host replay with the H200's costs it changes no training trace's peak, and
    /// kv_growth's from 1.081 to 1.101); `GKRT_POOL_ALIASES=1` turns it on.
    pub page_aliases: bool,
    /// With `page_aliases`: pages an earlier slack-rule move placed may move again whenever a
    /// move is allowed (the time budget), not only within the pool's lifetime share
    /// (`MoveBudget::allows_repeat`) — the period-two moves of training steps then switch back
    /// for free. Default false (session 13, host replay with the H200's costs: bert_train
    /// 1.073 → 1.030, gpt2_run_train 1.075 → 1.030, lstm 1.062 → 1.051, llama 1.060 → 1.057,
    /// but gnn_train 1.148 → 1.157, and 76–85 ns per operation of steady page moves on
    /// resnet_infer_sizes and vit_infer_batches; session 14: bert's 1.030 holds only at that
    /// pace — the bucket decides whether its second pass moves pages again, 1.091 without work
    /// between calls, as on the H200); `GKRT_POOL_ALIASES=2` turns both on.
    pub alias_moves_again: bool,
    /// With `alias_moves_again`: pages move again only until placing a block first costs an
    /// unmap that mapping new memory would not have — a shadow dropped because its chunk was
    /// live elsewhere when its address was needed, or a chunk a move took but could not place
    /// (`MoveBudget::note_undone`; `release_cached` starts afresh). With aliases a move that
    /// holds costs no more driver calls than mapping new memory (an alias map for a map, a
    /// switch for nothing); the first unmap says moves are being undone, and the later passes
    /// of a repeating program would pay for it again. A count the pool keeps, not the time
    /// budget, so the result does not depend on the machine's pace. Default false
    /// (`GKRT_POOL_ALIASES=3` turns it and the two above on).
    pub alias_again_until_undone: bool,
    /// Before the slack rule picks pages to move, it records a marker after the latest frees
    /// and polls it for up to this long (default 200 µs; at least four polls, however long the
    /// scheduler held the thread): an idle or nearly idle device passes it, and the pages freed
    /// before it can move without a stall; a busy one does not, and new pages are mapped (after
    /// a miss, spins back off exponentially).
    pub recycle_spin_ns: u64,
    /// Thousandths of wall time the slack rule's page moves may take (default 10: 1%), measured
    /// by the pool (`move_budget.rs`): under churn, when moves come faster than they are paid
    /// for, it maps new pages instead. 0: the slack rule never moves pages; 1000 or more: no
    /// limit. The budget (`memory_limit`) is not subject to it.
    pub recycle_time_permille: u64,
    /// Stream-ordered frees between two marker events on a stream with a virtual range
    /// (default 256): more frequent markers tell recycling sooner which free pages the device
    /// is done with, at one event query and one record each.
    pub marker_every: u32,
    /// Least time between two of those markers (default 1 ms). A marker costs two driver calls
    /// (a record, a query), which a burst of fast frees would pay often, while the device's
    /// progress matters to recycling only on the scale of kernels and steps, where real programs
    /// keep their markers (figures: BENCHMARKS.md §3).
    pub marker_min_interval_ns: u64,
    /// Whether a stream's range that returns to the same live blocks (empty, or a program's
    /// weights) and fills again the same way is placed by an
    /// offline plan of the last time (`epochs.rs`; ARCHITECTURE.md, "Epoch plans"). Default
    /// true; not with `page_aliases` (gathering the pages under the plan moves them plainly).
    pub epoch_plans: bool,
    /// Start-up moves (experiment, default false): slack-rule page moves free of the time
    /// budget, pages moved before allowed to move again, until they have moved as many bytes as
    /// the high-water mark of bytes in use or a range that moved pages so first empties.
    pub startup_moves: bool,
    /// Whether a slack-rule move for a request that brings the program to its own peak (the
    /// most bytes it has had allocated at once), raising it or reaching it again, goes ahead
    /// without asking the time budget, up to moving that peak's bytes in all (`move_budget.rs`;
    /// with `recycle_time_permille` 0 no slack-rule move is made, these neither). Default true
    /// (session 29, host replay: bert, gnn, gpt2_run and lstm_train's first-pass peaks
    /// 1.06–1.15 → 1.03 of the peak live; diffusion_unet_infer 1.0965 → 1.1083; session 31,
    /// reaching it too, and not charged to the budget: roberta_infer_varlen 1.1726 → 1.1560);
    /// `GKRT_POOL_PEAK_MOVES=0` turns it off.
    pub peak_moves: bool,
    /// Whether a loop that carries a block from turn to turn (a sampler's latents, a recurrent
    /// state) is found as a period and its turns follow a plan that keeps the carry in place
    /// (`epochs/periodic.rs`; with `epoch_plans` only). Default true (session 30, host replay:
    /// diffusion_unet_infer 1.1083 → 1.0905; no other trace has such a loop);
    /// `GKRT_POOL_PERIOD_PLANS=0` turns it off. A runtime made with a memory limit turns it off:
    /// its graphs may swap, and the swap planner predicts the pool by dry runs on clones, which
    /// log nothing — a period found in the middle of a run would place and hold blocks where the
    /// dry run did not (GPT-2 medium's emulated steady runs mapped 70 pages a run).
    pub period_plans: bool,
    /// Whether an epoch that follows no plan places at the lowest free place of its range the
    /// allocations that, at the same positions in the last epoch over the same floor, lived
    /// through it (`epochs/step_lived.rs`, `step_lived.rs`; with `epoch_plans` only). Default
    /// true (session 33, host replay: roberta_infer_varlen 1.1560 → 1.0678 with `period_plans`'
    /// periods over large floors); `GKRT_POOL_STEP_LIVED=0` turns it off. Off under a memory
    /// limit, as `period_plans` is: the swap planner's dry runs log nothing, so they could not
    /// foresee it.
    pub step_lived_low: bool,
    /// Whether a request that raises the high-water mark of bytes in use gets no slack: when
    /// free mapped pages can be moved, it maps new pages only beyond that mark (and one page),
    /// not up to `recycle_slack_permille` over it. What such a request maps becomes the
    /// program's footprint, which its later steps keep when they follow its plan; below the
    /// mark the slack still lets a step that places differently map a little more instead of
    /// moving pages. Its moves are those of `peak_moves` (not asked of the time budget, up to
    /// the peak's bytes), so without `peak_moves` it is within the budget like any slack move.
    /// Default true (session 35, host replay, all 35 traces: moe_train 1.0536 → 1.0475, bert
    /// 1.0299 → 1.0059, 19 others lower, 4 higher, none over its goal; BENCHMARKS.md, session
    /// 35); `GKRT_POOL_TIGHT_PEAKS=0` turns it off. Off under a memory limit: the swap
    /// planner's plans and figures were measured without it.
    pub tight_peaks: bool,
    /// Whether the page moves of a step that raised the program's peak of allocated bytes
    /// (until the next step starts: `new_step.rs`) are those of `peak_moves` — not asked of the
    /// time budget, up to the peak's bytes in all — as the moves of its request at the peak
    /// are: the step has shapes no earlier step had, and its later repeats reuse what it
    /// places. With `peak_moves` only. Default true (session 38, host replay of 60 traces:
    /// wav2vec2_train 1.1935 → 1.0301, dit_sample 1.1097 → 1.0662, none higher;
    /// BENCHMARKS.md, session 38); `GKRT_POOL_NEW_STEP_MOVES=0` turns it off. Off under a
    /// memory limit, as `tight_peaks`: measured without a limit only.
    pub new_step_moves: bool,
    /// Thousandths over the high-water mark of bytes in use up to which an epoch plan's
    /// gathering (and a period's or a step-lived block's, which gather the same way) may map new
    /// pages, where the slack rule's cap is lower (default 50). A followed plan places every
    /// later step of its epoch without moving a page, where the usual placement past the cap
    /// moves pages, or maps them when the time budget declines the moves; the planner's
    /// footprints are within 1.05 of their epochs' peaks on the recorded traces, and a plan
    /// whose pages do not fit is not followed. 0: the slack rule's cap alone, as before
    /// session 39 (host replay of 60 traces: vae_train 1.0525 → 1.0425 with 50, none over its
    /// goal; 40 leaves vae_train's plan unfollowed, 70 lets gpt2_run_train gather for the plans
    /// it left before, and its first pass then reaches 1.0574 against 1.0301; BENCHMARKS.md,
    /// session 39); `GKRT_POOL_PLAN_ROOM_PERMILLE` sets it. 0 under a
    /// memory limit, as `tight_peaks`: measured without a limit only.
    pub plan_room_permille: u64,
    /// Whether, once the program's first step has ended (`MoveBudget::note_steady`), a
    /// slack-rule move and a plan's gathering take pages only from their own stream's ranges
    /// and from empty ones (streams at rest), never from another stream's range that holds
    /// live blocks. Both streams of such a pair run in every step: what one takes, the other
    /// takes back in its next step, a move each way every step. prefetch_stream_train (an
    /// input pipeline on a side stream) did so in PyTorch on the pool, 1.053 of PyTorch's step
    /// on an H100 with no memory saved (0.988 with no slack moves at all, 0.470 GB against
    /// 0.468); host replay of its GPU recording 1.1156 → 1.0678, its steady pass with the
    /// trace's weights kept 14 / 15 → 1 / 2 allocations moved, no other trace changed
    /// (BENCHMARKS.md, session 55). Default true; `GKRT_POOL_OWN_STREAM_MOVES=0` turns it off.
    /// Off under a memory limit, as `tight_peaks`: measured without a limit only.
    pub own_stream_moves: bool,
    /// Whether a request that would raise the most pages ever mapped, within the slack rule's
    /// cap, takes the free pages another stream left mapped in its empty range (a warm-up
    /// allocation's, a stream done with its work) before mapping new ones, and no other
    /// range's (over the cap the slack rule moves pages as before). Moving a page costs what
    /// mapping a new one does (about 40 µs against 35 on the H200, BENCHMARKS.md session 25),
    /// so the footprint does not grow by pages nothing uses; the stream whose range it was
    /// maps anew if it comes back, as it would have anyway. Without it such pages sat within
    /// the slack rule's page of rounding over the high-water mark: trace_replay's warm-up page
    /// was that page on every trace (host replay: decoder_tiny_generate 1.0784 → 1.0335,
    /// memory_bank_train's GPU recording 1.0465 → 1.0192, four more lower, none higher;
    /// BENCHMARKS.md, session 60). Default true; `GKRT_POOL_EMPTY_RANGE_MOVES=0` turns it off.
    /// Off under a memory limit, as `tight_peaks`: measured without a limit only.
    pub empty_range_moves: bool,
}

/// `PoolConfig::tail_first`: which small requests take the range's short mapped tail before
/// cutting a warm hole twice their size. One field, so that the hot path tests one byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailFirst {
    /// None: the best fit is cut.
    Off,
    /// Every such request (`GKRT_POOL_TAIL_PREFIX_FIRST=1`; host replay: bert, gnn and
    /// mlp_small training 0.013–0.023 lower reserved / live, moe training 0.009 higher).
    Always,
    /// Those whose size the pool has seen live fewer allocations than there are live blocks:
    /// shorter than the mean, by Little's law (`lifetimes.rs`). The default since session 31
    /// (`GKRT_POOL_SHORT_LIVED_TAIL=0` turns it off). Host replay: mlp_small_train 1.067 → 1.044
    /// of its peak live; in session 15 kv_growth went 1.084 → 1.130 at the replay's fast pace,
    /// and with epoch plans and periods (session 31) no trace goes over its goal with it, at
    /// either pace, with or without a held block (ARCHITECTURE.md, "Placement by lifetime").
    ShortLived,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            alignment: 256,
            memory_limit: u64::MAX,
            small_request_max: MIB,
            small_segment_bytes: 2 * MIB,
            medium_request_max: 10 * MIB,
            medium_segment_bytes: 20 * MIB,
            large_segment_rounding: 2 * MIB,
            vmm: true,
            vmm_reserve_bytes: 0,
            vmm_page_bytes: 8 * MIB,
            recycle_slack_permille: 30,
            recycle_min_bytes: 2 * MIB,
            recycle_waits: false,
            pending_best_fit: false,
            tail_first: TailFirst::ShortLived,
            recycle_majority_moves: true,
            page_aliases: false,
            alias_moves_again: false,
            alias_again_until_undone: false,
            recycle_spin_ns: 200_000,
            recycle_time_permille: 10,
            marker_every: 256,
            marker_min_interval_ns: 1_000_000,
            epoch_plans: true,
            startup_moves: false,
            peak_moves: true,
            period_plans: true,
            step_lived_low: true,
            tight_peaks: true,
            new_step_moves: true,
            plan_room_permille: 50,
            own_stream_moves: true,
            empty_range_moves: true,
        }
    }
}

impl PoolConfig {
    /// This configuration as a runtime with a memory limit uses it: its graphs may swap, and
    /// the swap planner predicts the pool by dry runs on clones, which log nothing, so no
    /// period or step-lived block can be foreseen (`period_plans` and `step_lived_low` off;
    /// GPT-2 medium's emulated steady runs mapped 70 pages a run with periods, session 30); and
    /// the planner's choices and figures were fitted
    /// with small requests cut from their best fit (`tail_first` off; short-lived requests at
    /// the tail were measured on allocators without a limit only, session 31; `tight_peaks`,
    /// `new_step_moves`, `plan_room_permille`, `own_stream_moves` and `empty_range_moves` off,
    /// measured without a limit only too, sessions 35, 38, 39, 55 and 60).
    pub fn for_swapping(self) -> PoolConfig {
        PoolConfig {
            period_plans: false,
            step_lived_low: false,
            tight_peaks: false,
            new_step_moves: false,
            plan_room_permille: 0,
            own_stream_moves: false,
            empty_range_moves: false,
            tail_first: TailFirst::Off,
            ..self
        }
    }

    pub(super) fn normalized(mut self) -> PoolConfig {
        let a = match self.alignment {
            0 => 256,
            a => a.checked_next_power_of_two().unwrap_or(1 << 63),
        };
        self.alignment = a;
        let up = |x: u64| round_up(x.max(1), a).unwrap_or(u64::MAX - (u64::MAX % a));
        self.small_request_max = up(self.small_request_max);
        self.medium_request_max = up(self.medium_request_max.max(self.small_request_max));
        self.small_segment_bytes = up(self.small_segment_bytes.max(self.small_request_max));
        self.medium_segment_bytes = up(self.medium_segment_bytes.max(self.medium_request_max));
        self.large_segment_rounding = up(self.large_segment_rounding);
        self
    }

    /// Address space to reserve per stream for pages of `page` bytes.
    pub(super) fn reserve_bytes(&self, page: u64) -> u64 {
        const GIB: u64 = 1 << 30;
        let want = match self.vmm_reserve_bytes {
            0 => self.memory_limit.saturating_mul(2).clamp(GIB, 1 << 40),
            n => n,
        };
        round_up(want.max(page), page).unwrap_or(want - want % page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a memory limit the rules measured without one are off, and nothing else changes:
    /// the swap planner's dry runs and figures assume the pool they were fitted on.
    #[test]
    fn for_swapping_turns_off_the_rules_measured_without_a_limit() {
        let d = PoolConfig::default();
        assert!(d.period_plans && d.step_lived_low && d.tight_peaks && d.new_step_moves);
        assert!(d.own_stream_moves && d.empty_range_moves);
        assert_eq!(d.tail_first, TailFirst::ShortLived);
        assert!(d.plan_room_permille > d.recycle_slack_permille);
        let s = d.clone().for_swapping();
        assert!(!s.period_plans && !s.step_lived_low && !s.tight_peaks && !s.new_step_moves);
        assert!(!s.own_stream_moves && !s.empty_range_moves);
        assert_eq!(s.tail_first, TailFirst::Off);
        assert_eq!(s.plan_room_permille, 0);
        let back = PoolConfig {
            period_plans: true,
            step_lived_low: true,
            tight_peaks: true,
            new_step_moves: true,
            plan_room_permille: d.plan_room_permille,
            own_stream_moves: true,
            empty_range_moves: true,
            tail_first: TailFirst::ShortLived,
            ..s
        };
        assert_eq!(format!("{back:?}"), format!("{d:?}"));
    }
}
