//! The time budget of the slack rule's page moves: recycling pages to keep the footprint near
//! the high-water mark pays for itself only while moving is cheap next to the work between
//! moves. The pool measures what its moves cost (the wall time of each slack-rule remap:
//! picking victims, waiting on markers, unmapping and mapping) against the wall time that
//! passes, and moves pages under the slack rule only while the moves have taken at most
//! `recycle_time_permille` of it (a token bucket). Under churn — the same pages moved back and
//! forth between steps in quick succession — the bucket runs dry and the pool maps new pages
//! instead, once, after which the steps reuse them with no driver call; when the steps are long
//! next to a move (a real training step), every move is paid for and the footprint stays near
//! the high-water mark. No constant here depends on a workload: the rate is the share of time
//! the pool may spend saving memory, and the bucket holds one second's worth of it — full at
//! first, so the one-off moves of a program's first steps are not held back.
//! The long-run rule is the pool's lifetime share: all moves so far have taken at most
//! `recycle_time_permille` of the time since the pool first mapped memory (`note_start`;
//! `release_cached` restarts it, as it restarts the most ever mapped).
//! Pages that a slack-rule move placed move again only under it (`allows_repeat`, no bucket;
//! after the first step, counted from there):
//! the full bucket pays for moving memory once to where a program's steps need it, not for
//! moving it back and forth (which, in a replay with no work between calls, it did for the whole
//! of the bucket: 1.06 of PyTorch's time per operation on resnet_infer_sizes, pool_replay run 4).
//! Any move may also draw on it when the bucket is empty. Measured from the first move instead,
//! with only the bucket for first moves, the outcome depended on when a program's first steps
//! ran: GPT-2 in PyTorch on the pool reserved 8.227 GB in the lockstep pairs whose gkrt process
//! ran its first two steps back to back and 7.927 GB in those where the other process's steps
//! ran between them (PyTorch: 8.082; session 10, workloads run) — the seconds of start-up before
//! the first step counted for nothing. The lifetime share is the rule's own goal (moves take at
//! most that share of the program's time), so it adds no constant; a replay with no work
//! between calls earns almost nothing from it (the host replay of every trace is unchanged).
//! That allowance is the start-up's: once a step of the program has ended (`note_steady`: a
//! stream's range emptied, an epoch found over blocks kept for good, or the next step rose
//! past the first one's half-way mark, `new_step.rs`), an empty bucket declines, whatever the
//! lifetime share says; pages a move placed move again only within the share of the time
//! since then; and a move the bucket pays for no longer waits for the device
//! (`PoolConfig::recycle_waits`). A share of the whole life passed bursts of
//! moves that cost a quarter of a step, in 7–11 of 20 steps of llama_train in PyTorch (1.11–1.27
//! of PyTorch's step there, 0.94–1.01 in the others); with the bucket alone after the first step
//! those bursts are fewer and smaller (BENCHMARKS.md, session 28).
//! A request that brings the program to its own peak (the most bytes it has had allocated at
//! once, ever), raising it or reaching it again, is not asked: its moves set the footprint the
//! later steps reuse. They may take pages an earlier move placed and leave the pages they place
//! free to move again; in all they move at most the bytes of that peak (`allows_at_peak`), so a
//! program that grows for ever, or comes back to its peak in every step, moves its footprint at
//! most once over: a one-off cost, not churn. That allowance is their bound, so the bucket is
//! not charged for them: charged, they ran it into debt, and the next move that was not at the
//! peak waited for the debt to be paid, which made what they saved depend on what a move costs
//! (host replay of roberta_infer_varlen at 5–200 µs per physical allocation: 1.10–1.25 of its
//! peak live; uncharged, 1.156 at every cost; session 31). Asked of the bucket, they were what it
//! declined on bert, gnn, gpt2_run and lstm_train, whose first passes need 11–16 ms of moves
//! against its 10 (host replay; BENCHMARKS.md, session 29); a live program's lifetime share
//! pays for the same moves out of its start-up. Reaching the peak counts as well (session 31):
//! an encoder's layers each come back to the peak their first layer set, and each, placed
//! without moves, mapped pages of its own (roberta_infer_varlen 1.1726 → 1.1560).
//! The budget rule (`memory_limit`) never consults it.
//! It also remembers whether a placement has had to unmap what mapping new memory would not
//! (`note_undone`): a count, not a time, by which `alias_again_until_undone` ends moving again.

/// Wall time whose share of moving the bucket saves up. A burst after an idle spell may go
/// beyond it only in the program's first step, while all moves stay within the pool's lifetime
/// share.
const BUCKET_WINDOW_NS: u64 = 1_000_000_000;

#[derive(Clone, Debug, Default)]
pub(super) struct MoveBudget {
    /// Moving time still allowed, in ns (negative: moves have overspent and must be repaid).
    credit_ns: i64,
    /// When the credit was last brought up to date (the backing's clock).
    at_ns: u64,
    /// Whether `allows` has run (the bucket starts full).
    started: bool,
    /// Slack-rule moves declined for lack of credit.
    pub(super) declined: u64,
    /// Moving time spent in all, and when the first move was asked for (the lifetime share's
    /// start when `note_start` never ran).
    spent_ns: u64,
    first_ns: u64,
    /// When the pool first mapped memory (`note_start`; None before): the start of the
    /// lifetime share.
    born_ns: Option<u64>,
    /// Whether placing a block has cost an unmap that mapping new memory would not have
    /// (`note_undone`): with `alias_again_until_undone`, pages moved once move again only
    /// before that.
    undone: bool,
    /// Bytes moved by start-up moves (`PoolConfig::startup_moves`), and whether they are over.
    pub(super) startup_moved: u64,
    pub(super) startup_over: bool,
    /// A step of the program has ended (`note_steady`): the lifetime share no longer pays for
    /// a move when the bucket is empty.
    steady: bool,
    /// When the bucket was first asked after that, and the moving time spent by then: where
    /// the share that pays for moving pages again starts afresh (`allows_repeat`).
    steady_from: Option<(u64, u64)>,
    /// Bytes moved by moves at the program's peak (`allows_at_peak`).
    peak_moved: u64,
}

impl MoveBudget {
    /// Whether a slack-rule move may start at `now` with `permille` of wall time for moving
    /// (at least 1000: always; 0: never): while the bucket has credit, or moves so far are
    /// within the pool's lifetime share.
    pub(super) fn allows(&mut self, now: u64, permille: u64) -> bool {
        if permille >= 1000 {
            return true;
        }
        let cap = (BUCKET_WINDOW_NS / 1000 * permille) as i64;
        if !self.started {
            (self.started, self.credit_ns, self.at_ns, self.first_ns) = (true, cap, now, now);
        }
        let earned = now.saturating_sub(self.at_ns) as u128 * permille as u128 / 1000;
        self.credit_ns = (self.credit_ns as i128 + earned as i128).min(cap as i128) as i64;
        self.at_ns = now;
        if self.steady && self.steady_from.is_none() {
            self.steady_from = Some((now, self.spent_ns));
        }
        let ok = permille > 0
            && (self.credit_ns > 0 || (!self.steady && self.within_lifetime_share(now, permille)));
        if !ok {
            self.declined += 1;
        }
        ok
    }

    /// A step of the program ended (a range emptied, or an epoch was found): the lifetime
    /// share has paid for the first step's one-off moves out of the start-up's time, and from
    /// here on a move waits for the bucket. Any range that empties counts, even one that held
    /// a warm-up allocation only (`GkrtRaw`'s, trace_replay's): the replays earn almost nothing
    /// from the share, and GPT-2 in PyTorch, whose first steps need it, reserves what it did
    /// (7.927 GB; BENCHMARKS.md, session 28).
    pub(super) fn note_steady(&mut self) {
        self.steady = true;
    }

    pub(super) fn is_steady(&self) -> bool {
        self.steady
    }

    /// Starts the accounting afresh (the pool released its cache: as the most ever mapped, the
    /// lifetime share restarts); the count of declined moves stays.
    pub(super) fn restart(&mut self) {
        *self = MoveBudget {
            declined: self.declined,
            ..MoveBudget::default()
        };
    }

    /// Placing a block cost an unmap beyond what mapping new memory costs: a shadow dropped
    /// because its chunk was live elsewhere, or a chunk a move took and could not place.
    pub(super) fn note_undone(&mut self) {
        self.undone = true;
    }

    /// Whether moves again may go on under `alias_again_until_undone`: no move has been undone
    /// at a cost since the start (or `restart`). A count, not a time: the same decisions at any
    /// pace.
    pub(super) fn none_undone(&self) -> bool {
        !self.undone
    }

    /// Whether the lifetime share has started (`note_start`).
    pub(super) fn started_lifetime(&self) -> bool {
        self.born_ns.is_some()
    }

    /// The pool mapped memory at `now`; the first call starts the lifetime share.
    pub(super) fn note_start(&mut self, now: u64) {
        self.born_ns.get_or_insert(now);
    }

    /// Whether the pool's page moves so far have taken less than `permille` of the time since
    /// it first mapped memory.
    fn within_lifetime_share(&self, now: u64, permille: u64) -> bool {
        self.born_ns.is_some_and(|born| {
            (self.spent_ns as u128) * 1000 < now.saturating_sub(born) as u128 * permille as u128
        })
    }

    /// Whether a slack-rule move may take pages that an earlier one moved (call after `allows`
    /// said yes): only while moving has taken at most `permille` of the wall time since the
    /// pool first mapped memory (since the first move when nothing was mapped through
    /// `note_start`), with no bucket. Moving the same memory back and forth between steps
    /// then costs at most that share of the program's time, and none in a replay with no work
    /// between the calls; moved once and kept, pages need no such credit. Once a step has
    /// ended (`note_steady`), the share counts from the first move asked for after it: the
    /// start-up's seconds paid for moving the same pages in every step of wgan_gp_train in
    /// PyTorch until the bucket ran dry, 17 of its first 60 steps (BENCHMARKS.md, session 45).
    pub(super) fn allows_repeat(&self, now: u64, permille: u64) -> bool {
        // `allows` set `steady_from` if a step has ended.
        let (since, spent_before) = self
            .steady_from
            .unwrap_or((self.born_ns.unwrap_or(self.first_ns), 0));
        permille >= 1000
            || (self.spent_ns - spent_before) as u128 * 1000
                <= now.saturating_sub(since) as u128 * permille as u128
    }

    /// Whether a move for a request that brings the program to its peak of `peak` bytes may go
    /// ahead without the bucket: while such moves have moved less than `peak` bytes in all
    /// (counted afresh after `restart`, as the rest of the accounting).
    pub(super) fn allows_at_peak(&self, peak: u64) -> bool {
        self.peak_moved < peak
    }

    /// A move at the program's peak moved `bytes`.
    pub(super) fn note_peak_move(&mut self, bytes: u64) {
        self.peak_moved = self.peak_moved.saturating_add(bytes);
    }

    /// A move took `ns`.
    pub(super) fn charge(&mut self, ns: u64) {
        self.spent_ns = self.spent_ns.saturating_add(ns);
        self.credit_ns = self
            .credit_ns
            .saturating_sub(ns.min(i64::MAX as u64) as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_are_allowed_while_they_take_at_most_their_share_of_time() {
        let mut b = MoveBudget::default();
        // The bucket starts full: 1% of a second, 10 ms of moving.
        assert!(b.allows(5_000_000, 10));
        b.charge(10_150_000);
        // 1 ms later: 10 µs more, still 140 µs in debt.
        assert!(!b.allows(6_000_000, 10));
        // 15 ms after that the debt is repaid.
        assert!(b.allows(21_000_000, 10));
        assert_eq!(b.declined, 1);
        // An idle hour saves up at most one second's share.
        assert!(b.allows(3_600_000_000_000, 10));
        b.charge(10_000_011);
        assert!(!b.allows(3_600_000_000_001, 10));
        // The two ends of the knob.
        let mut never = MoveBudget::default();
        assert!(!never.allows(1 << 40, 0));
        let mut always = MoveBudget::default();
        always.charge(u64::MAX);
        assert!(always.allows(0, 1000));
        assert!(always.allows_repeat(0, 1000));
    }

    #[test]
    fn an_empty_bucket_still_moves_within_the_pools_lifetime_share() {
        let mut b = MoveBudget::default();
        // The pool mapped memory at 0; its first move comes 5 s later and takes the whole
        // bucket (10 ms).
        b.note_start(0);
        b.note_start(4_000_000_000); // later maps do not move the start
        assert!(b.allows(5_000_000_000, 10));
        b.charge(12_000_000);
        // 1 ms later the bucket is in debt, but 12 ms is under 1% of the 5 s lived.
        assert!(b.allows(5_001_000_000, 10));
        b.charge(40_000_000);
        // 52 ms spent: over 1% of 5.002 s, and the bucket is in debt: declined.
        assert!(!b.allows(5_002_000_000, 10));
        assert_eq!(b.declined, 1);
        // Without a start (no memory mapped yet) only the bucket counts.
        let mut fresh = MoveBudget::default();
        assert!(fresh.allows(5_000_000_000, 10));
        fresh.charge(12_000_000);
        assert!(!fresh.allows(5_001_000_000, 10));
        // After a restart (the pool released its cache) the lifetime counts from the next
        // start: the 52 ms spent no longer count, nor do the 5 s before.
        b.restart();
        assert_eq!(b.declined, 1);
        b.note_start(6_000_000_000);
        assert!(b.allows(6_001_000_000, 10));
        b.charge(12_000_000);
        assert!(!b.allows(6_002_000_000, 10));
        assert!(!b.allows_repeat(6_002_000_000, 10));
        // Permille 0 never moves, whatever the lifetime.
        let mut never = MoveBudget::default();
        never.note_start(0);
        assert!(!never.allows(1 << 40, 0));
    }

    #[test]
    fn after_a_step_an_empty_bucket_waits_whatever_the_lifetime_share() {
        let mut b = MoveBudget::default();
        b.note_start(0);
        // 5 s of start-up, then a move that takes the whole bucket and more.
        assert!(b.allows(5_000_000_000, 10));
        b.charge(12_000_000);
        // Before the first step ends the lifetime share (1% of 5 s) pays for the next one...
        assert!(b.allows(5_001_000_000, 10));
        b.note_steady();
        // ...after it, the bucket in debt declines it, though 12 ms is still under 1% of 5 s.
        assert!(!b.allows(5_002_000_000, 10));
        assert_eq!(b.declined, 1);
        // The bucket earns it back: its 2 ms of debt take 0.2 s at 1%.
        assert!(!b.allows(5_100_000_000, 10));
        assert!(b.allows(5_300_000_000, 10));
        // A restart (the pool released its cache) starts over with the start-up's allowance.
        b.restart();
        b.note_start(7_000_000_000);
        assert!(b.allows(9_000_000_000, 10));
        b.charge(12_000_000);
        assert!(b.allows(9_001_000_000, 10));
    }

    #[test]
    fn after_a_step_the_share_for_moving_pages_again_counts_from_there() {
        let mut b = MoveBudget::default();
        b.note_start(0);
        // 5 s of start-up, then 12 ms of moves: within 1% of the lifetime, so pages a move
        // placed may move again.
        assert!(b.allows(5_000_000_000, 10));
        b.charge(12_000_000);
        assert!(b.allows_repeat(5_000_000_000, 10));
        b.note_steady();
        // A step ended. 2 s later the bucket has credit again; the share for moving pages
        // again starts at this move: nothing spent since, allowed.
        assert!(b.allows(7_000_000_000, 10));
        assert!(b.allows_repeat(7_000_000_000, 10));
        b.charge(6_000_000);
        // 6 ms moved since take 0.6 s to earn, though all 18 ms are far under 1% of 7 s.
        assert!(b.allows(7_010_000_000, 10));
        assert!(!b.allows_repeat(7_010_000_000, 10));
        assert!(!b.allows_repeat(7_599_999_999, 10));
        assert!(b.allows_repeat(7_600_000_000, 10));
    }

    #[test]
    fn moves_at_new_peaks_move_at_most_the_peaks_bytes_in_all() {
        let mut b = MoveBudget::default();
        assert!(b.allows_at_peak(100 << 20));
        b.note_peak_move(60 << 20);
        assert!(b.allows_at_peak(100 << 20));
        b.note_peak_move(40 << 20);
        // 100 MiB moved for a peak of 100 MiB: a higher peak earns what it adds.
        assert!(!b.allows_at_peak(100 << 20));
        assert!(b.allows_at_peak(101 << 20));
        // They are charged as any move: the bucket (full at first) may be in debt after them.
        assert!(b.allows(0, 10));
        b.charge(20_000_000);
        assert!(!b.allows(1_000_000, 10));
    }

    #[test]
    fn a_move_undone_is_remembered_until_a_restart() {
        let mut b = MoveBudget::default();
        assert!(b.none_undone());
        b.note_undone();
        assert!(!b.none_undone());
        // Time passing does not forget it: a count, not a share of time.
        assert!(b.allows(1 << 40, 10));
        assert!(!b.none_undone());
        b.restart();
        assert!(b.none_undone());
    }

    #[test]
    fn moving_pages_again_needs_the_long_run_share_without_start_up_credit() {
        let mut b = MoveBudget::default();
        assert!(b.allows(1_000_000, 10));
        // Nothing spent yet: allowed.
        assert!(b.allows_repeat(1_000_000, 10));
        b.charge(200_000);
        // The bucket still has credit, but 200 µs is 1% of 20 ms, not yet passed.
        assert!(b.allows(2_000_000, 10));
        assert!(!b.allows_repeat(20_999_999, 10));
        assert!(b.allows_repeat(21_000_000, 10));
    }
}
