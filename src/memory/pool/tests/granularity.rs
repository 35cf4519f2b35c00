//! Physical allocations that grow with the heap (small heaps round to a granule, large ones map
//! in few driver calls, only whole allocations are unmapped), and the time budget that makes the
//! slack rule back off under churn.

use super::*;

/// The default configuration (64 MiB largest allocation) over 2 MiB granules.
fn default_pool() -> Pool {
    Pool::new(PoolConfig {
        vmm_reserve_bytes: 4 << 30,
        ..PoolConfig::default()
    })
}

#[test]
fn a_small_heap_reserves_its_peak_rounded_to_a_granule() {
    // A decoder's growing cache: per token a few small buffers, and the cache re-allocated a
    // little larger now and then; about 18 MiB live at the end.
    let f = FakeConfig::virtual_memory().move_cost(50_000).build();
    // A token takes 10 ms on an otherwise idle device.
    f.state_mut().idle_device = true;
    let mut p = default_pool();
    let (mut live, mut peak) = (0u64, 0u64);
    let mut cache = p.alloc(&f, 256 * KIB, st(0)).unwrap();
    let mut cache_bytes = 256 * KIB;
    live += cache_bytes;
    for token in 0..64u64 {
        f.advance(10_000_000);
        let tmp: Vec<(u64, u64)> = [48 * KIB, 96 * KIB, 3 * KIB + 17]
            .iter()
            .map(|&n| (p.alloc(&f, n, st(0)).unwrap(), n))
            .collect();
        let tmp_bytes: u64 = tmp.iter().map(|t| t.1).sum();
        peak = peak.max(live + tmp_bytes);
        if token % 4 == 3 {
            let bigger = cache_bytes + 1100 * KIB;
            let c = p.alloc(&f, bigger, st(0)).unwrap();
            peak = peak.max(live + tmp_bytes + bigger);
            p.free(&f, cache).unwrap();
            (cache, cache_bytes, live) = (c, bigger, live - cache_bytes + bigger);
        }
        for (a, _) in tmp {
            p.free(&f, a).unwrap();
        }
    }
    assert!(peak > 16 * MIB && peak < 64 * MIB, "peak live {peak}");
    let reserved = p.stats().peak_reserved_bytes;
    // The goal is the peak rounded to a granule plus one granule; on this pattern the
    // small buffers placed between the caches keep one more granule touched (a 64 MiB page
    // reserved 64 MiB here).
    let goal = peak.div_ceil(PAGE) * PAGE + 2 * PAGE;
    assert!(
        reserved <= goal,
        "peak reserved {reserved} > {goal} (peak live {peak}), {:?}",
        f.allocation_sizes()
    );
    assert_eq!(p.stats().reserved_bytes, f.mapped_bytes());
    // A heap this small (a 64th of it is under a granule) maps granule by granule.
    assert!(
        f.allocation_sizes()[0] == PAGE,
        "{:?}",
        f.allocation_sizes()
    );
    p.free(&f, cache).unwrap();
    check(&p);
    p.release_all(&f).unwrap();
    assert_eq!(f.mapped_bytes(), 0);
}

#[test]
fn a_large_heap_grows_by_few_driver_calls_and_unmaps_whole_allocations() {
    let f = Fake::virtual_memory();
    // Allocations of up to 64 MiB (the default is 8 MiB: see `vmm_page_bytes`).
    let mut p = Pool::new(PoolConfig {
        vmm_page_bytes: 64 * MIB,
        ..default_pool().config().clone()
    });
    // 2 GiB in 96 MiB tensors: 1024 granules.
    let blocks: Vec<u64> = (0..21)
        .map(|_| p.alloc(&f, 96 * MIB, st(0)).unwrap())
        .collect();
    let granules = p.stats().reserved_bytes / PAGE;
    assert_eq!(granules, 21 * 48);
    let sizes = f.allocation_sizes();
    // A quarter of one per granule at most (64 per doubling of the heap until the cap), and
    // one or two driver calls per request (full chunks, then the rest).
    assert!(
        sizes.len() * 4 < granules as usize && f.map_calls() <= 2 * 21,
        "{} allocations in {} calls",
        sizes.len(),
        f.map_calls()
    );
    // A 64th of the heap as it passed 1 GiB.
    assert_eq!(sizes[0], 16 * MIB, "grows with the heap: {sizes:?}");
    assert!(*sizes.last().unwrap() <= 4 * MIB, "starts small: {sizes:?}");
    // Every other tensor freed: what can go back is the whole allocations inside the holes
    // (the fake rejects an unmap that is not one whole allocation).
    for b in blocks.iter().step_by(2) {
        p.free(&f, *b).unwrap();
    }
    let released = p.release_cached(&f).unwrap();
    assert!(released > 0 && released <= 11 * 96 * MIB, "{released}");
    assert_eq!(p.stats().reserved_bytes, f.mapped_bytes());
    check(&p);
    // What is released is mapped again (in pieces sized by the heap) when needed.
    let again: Vec<u64> = (0..11)
        .map(|_| p.alloc(&f, 96 * MIB, st(0)).unwrap())
        .collect();
    assert!(again.iter().all(|&a| f.covers(a, 96 * MIB)));
    check(&p);
    for b in again.iter().chain(blocks.iter().skip(1).step_by(2)) {
        p.free(&f, *b).unwrap();
    }
    p.release_all(&f).unwrap();
    assert_eq!((f.mapped_bytes(), f.allocation_sizes().len()), (0, 0));
}

#[test]
fn chunks_are_a_64th_of_the_heap_or_a_16th_of_a_large_request() {
    let f = Fake::virtual_memory();
    let mut p = default_pool();
    // 256 MiB live: the next 8 MiB request maps 4 MiB chunks (a 64th of 264 MiB, rounded down
    // to a power of two), so a hole it leaves keeps at most 4 MiB at either end.
    let _floor = p.alloc(&f, 256 * MIB, st(0)).unwrap();
    assert_eq!(p.chunk_pages(4), 2);
    // A 128 MiB request maps 16 chunks of a 16th of it (a 64th of the heap is 6 MiB).
    assert_eq!(p.chunk_pages(64), 4);
    let before = f.allocation_sizes().len();
    let _large = p.alloc(&f, 128 * MIB, st(0)).unwrap();
    assert_eq!(f.allocation_sizes().len() - before, 16);
    // Never more than `vmm_page_bytes` (8 MiB by default).
    assert_eq!(p.chunk_pages(1024), 4);
    check(&p);
}

/// One step of a churning workload whose large transient does not fit the hole left by the
/// previous one, so the slack rule wants to move pages every step: 64 MiB kept, 64 MiB
/// transient, a 96 MiB transient after it.
fn churn_step(p: &mut Pool, f: &Fake) {
    let a = p.alloc(f, 64 * MIB, st(0)).unwrap();
    let b = p.alloc(f, 64 * MIB, st(0)).unwrap();
    p.free(f, a).unwrap();
    let c = p.alloc(f, 96 * MIB, st(0)).unwrap();
    p.free(f, b).unwrap();
    p.free(f, c).unwrap();
}

/// Steps of `churn_step` with `between_ns` of other work after each; driver calls take 50 µs.
/// Returns the pool and the unmap counts after each step.
fn churn(between_ns: u64, steps: usize) -> (Pool, Fake, Vec<u64>) {
    // Each step empties the range: epoch plans would place the next one by a plan of the last,
    // with no move (`epochs.rs`'s tests). These test the moves themselves.
    let cfg = PoolConfig {
        epoch_plans: false,
        ..PoolConfig::default()
    };
    churn_with(cfg, between_ns, steps, false)
}

/// `churn` with `cfg` (over 2 MiB allocations and a 4 GiB range), and with `hold`, a block
/// allocated before the steps and freed after them, so that the range never empties between.
fn churn_with(
    cfg: PoolConfig,
    between_ns: u64,
    steps: usize,
    hold: bool,
) -> (Pool, Fake, Vec<u64>) {
    let f = FakeConfig::virtual_memory().move_cost(50_000).build();
    f.state_mut().idle_device = true;
    let mut p = Pool::new(PoolConfig {
        vmm_reserve_bytes: 4 << 30,
        vmm_page_bytes: PAGE,
        ..cfg
    });
    let held = hold.then(|| p.alloc(&f, MIB, st(0)).unwrap());
    let mut unmaps = Vec::new();
    for _ in 0..steps {
        f.advance(between_ns);
        churn_step(&mut p, &f);
        unmaps.push(p.stats().page_unmap_count);
        check(&p);
    }
    if let Some(h) = held {
        p.free(&f, h).unwrap();
    }
    (p, f, unmaps)
}

#[test]
fn page_moves_back_off_under_churn() {
    // Back to back (as in a replay): moving would take far more than 1% of the time.
    let (p, f, unmaps) = churn(0, 12);
    assert!(p.recycle_declined_count() > 0);
    // After the first steps nothing moves any more, and no driver call is made at all: the
    // footprint grew once and every step reuses it.
    let maps = f.map_calls();
    let (p, f2, unmaps2) = churn(0, 24);
    assert_eq!(unmaps2[11..], [unmaps[11]; 13][..], "{unmaps2:?}");
    assert_eq!(f2.map_calls(), maps, "no maps after the footprint settled");
    assert!(p.stats().reserved_bytes <= 226 * MIB);
}

#[test]
fn page_moves_continue_when_the_steps_pay_for_them() {
    // 1 s of other work per step: the moves, some 30 driver calls of 50 µs, are under 1% of it.
    let (p, _, unmaps) = churn(1_000_000_000, 12);
    // Pages an earlier move placed are moved again: the moves take under 1% of the time.
    assert_eq!(p.recycle_declined_count(), 0);
    assert!(
        unmaps.windows(2).skip(1).all(|w| w[1] > w[0]),
        "moves every step: {unmaps:?} peak {}",
        p.stats().peak_reserved_bytes >> 20
    );
    // And they keep the footprint within the slack over the high-water mark (160 MiB).
    let cap = (160 * MIB / 1000 * 1030).div_ceil(PAGE) * PAGE;
    assert!(
        p.stats().peak_reserved_bytes <= cap,
        "{}",
        p.stats().peak_reserved_bytes
    );
}

#[test]
fn pages_move_only_past_the_most_ever_mapped() {
    let f = FakeConfig::virtual_memory().move_cost(50_000).build();
    f.state_mut().idle_device = true;
    let mut p = Pool::new(PoolConfig {
        vmm_reserve_bytes: 4 << 30,
        vmm_page_bytes: PAGE,
        recycle_time_permille: 0,
        ..PoolConfig::default()
    });
    // No moves at first: the 96 MiB transient maps new pages, 224 MiB in all.
    let a = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    let b = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    p.free(&f, a).unwrap();
    let c = p.alloc(&f, 96 * MIB, st(0)).unwrap();
    p.free(&f, c).unwrap();
    assert_eq!(p.stats().reserved_bytes, 224 * MIB);
    // Moves allowed now. 100 MiB fits nowhere mapped: the top of the range has 96 MiB, so 4 MiB
    // are new, and the slack over the high-water mark (164 MiB) would have the hole at the
    // bottom give up 58 MiB. But only what passes 224 MiB raises the peak: 4 MiB move.
    p.config.recycle_time_permille = 1000;
    let d = p.alloc(&f, 100 * MIB, st(0)).unwrap();
    assert_eq!(p.stats().page_unmap_count, 2);
    assert_eq!(p.stats().reserved_bytes, 224 * MIB);
    assert_eq!(p.stats().peak_reserved_bytes, 224 * MIB);
    check(&p);
    for x in [b, d] {
        p.free(&f, x).unwrap();
    }
    p.release_all(&f).unwrap();
}

#[test]
fn a_long_start_up_pays_for_no_moves_after_the_first_step() {
    // As a PyTorch program on the pool: weights mapped first, then seconds of start-up before
    // the first step, then steps back to back. The start-up's share of moving (1% of the pool's
    // lifetime) paid for every move of these steps until session 45; now it pays only until the
    // first step ends (`MoveBudget::note_steady`): the bucket alone (10 ms) runs dry after a
    // few steps, the pool then maps the footprint once, and no later step moves a page.
    let run = |start_up_ns: u64| {
        let f = FakeConfig::virtual_memory().move_cost(50_000).build();
        f.state_mut().idle_device = true;
        // Without epoch plans: the steps would follow a plan over the weights from the second
        // on, moving nothing (`epochs.rs`); here it is the budget that is looked at.
        let mut p = Pool::new(PoolConfig {
            vmm_reserve_bytes: 4 << 30,
            vmm_page_bytes: PAGE,
            epoch_plans: false,
            ..PoolConfig::default()
        });
        let weights = p.alloc(&f, 32 * MIB, st(0)).unwrap();
        f.advance(start_up_ns);
        let mut unmaps = Vec::new();
        for _ in 0..12 {
            churn_step(&mut p, &f);
            check(&p);
            unmaps.push(p.stats().page_unmap_count);
        }
        assert!(p.moves.is_steady(), "the first step ended");
        p.free(&f, weights).unwrap();
        (
            p.recycle_declined_count(),
            p.stats().peak_reserved_bytes,
            unmaps,
        )
    };
    let short = run(0);
    let (declined, _, unmaps) = &short;
    assert!(*declined > 0, "no start-up: the bucket runs dry");
    assert_eq!(unmaps[11], unmaps[6], "no moves once it has: {unmaps:?}");
    // 5 s of start-up change nothing after the first step (they paid for 198 MiB, moving in
    // every step, before).
    assert_eq!(run(5_000_000_000), short);
}

/// `PoolConfig::startup_moves` (off by default): slack-rule moves free of the time budget until
/// a range that moved pages so empties, or until they have moved the high-water mark's bytes.
#[test]
fn start_up_moves_end_when_the_moving_range_empties_or_have_moved_the_high_water_mark() {
    let run = |startup_moves: bool, hold: bool, steps: usize| {
        let cfg = PoolConfig {
            epoch_plans: false,
            // No bucket and no lifetime share: every budgeted move is declined.
            recycle_time_permille: 0,
            startup_moves,
            ..PoolConfig::default()
        };
        let (p, _, unmaps) = churn_with(cfg, 0, steps, hold);
        (
            p.stats().peak_reserved_bytes,
            unmaps,
            p.recycle_declined_count(),
        )
    };
    // Without them the budget declines every move: the 96 MiB transient maps new pages.
    let (peak_off, unmaps_off, declined_off) = run(false, false, 1);
    assert_eq!(unmaps_off, [0]);
    assert!(declined_off > 0);
    // With them the first step moves the freed block's pages under the transient instead.
    let (peak_on, unmaps_on, _) = run(true, false, 1);
    assert!(unmaps_on[0] > 0);
    assert!(
        peak_on < peak_off,
        "{} MiB against {} MiB",
        peak_on >> 20,
        peak_off >> 20
    );
    // The range empties at the end of the step: start-up is over, and later steps move nothing
    // (the budget declines), reusing what the first one mapped.
    let (_, unmaps, declined) = run(true, false, 6);
    assert!(unmaps[1..].iter().all(|&u| u == unmaps[0]), "{unmaps:?}");
    assert!(declined > 0);
    // A range that never empties (a block held throughout) stops once the moves have moved as
    // many bytes as the high-water mark of bytes in use (161 MiB here): a step moves at most
    // 32 pages, so that is within a few steps, and then no step moves again.
    let (_, unmaps, _) = run(true, true, 16);
    let last = *unmaps.last().unwrap();
    assert!(last * PAGE <= 161 * MIB + 32 * PAGE, "{unmaps:?}");
    let settled = unmaps.iter().position(|&u| u == last).unwrap();
    assert!(settled < 12, "still moving at step {settled}: {unmaps:?}");
}

/// A request that brings the program back to its own peak moves pages without asking the time
/// budget (`peak_moves`), as one that raises it does: an encoder's layers each come back to the
/// peak the first set. One that stays under the peak asks the budget, which is spent.
#[test]
fn a_request_reaching_the_programs_peak_again_moves_pages_outside_the_budget() {
    // The pages mapped before and after a request of `last` pages, and the program's peak.
    let run = |peak_moves: bool, last: u64| {
        // Each move's driver call costs 50 ms: the bucket (1 ms at 1 per mille) is spent by
        // the first.
        let f = FakeConfig::virtual_memory().move_cost(50_000_000).build();
        f.state_mut().idle_device = true;
        let mut p = Pool::new(PoolConfig {
            vmm_reserve_bytes: 4 << 30,
            vmm_page_bytes: PAGE,
            recycle_time_permille: 1,
            peak_moves,
            // (The 12 pages below would be moved as the first step's, which set the peak,
            // not charged to the bucket: `new_step.rs`.)
            new_step_moves: false,
            ..PoolConfig::default()
        });
        // The program's peak: 18 pages, two holes of 8 apart once a1 and a2 go.
        let a1 = p.alloc(&f, 8 * PAGE, st(0)).unwrap();
        let s = p.alloc(&f, PAGE, st(0)).unwrap();
        let a2 = p.alloc(&f, 8 * PAGE, st(0)).unwrap();
        let b = p.alloc(&f, PAGE, st(0)).unwrap();
        p.free(&f, a1).unwrap();
        p.free(&f, a2).unwrap();
        // 12 pages fit neither hole: placed at the top, with free pages moved there (the
        // bucket is full), which spends it.
        let c = p.alloc(&f, 12 * PAGE, st(0)).unwrap();
        let before = p.stats().reserved_bytes / PAGE;
        p.free(&f, c).unwrap();
        // What fits no hole now needs pages past the most ever mapped.
        let d = p.alloc(&f, last * PAGE, st(0)).unwrap();
        let after = p.stats().reserved_bytes / PAGE;
        check(&p);
        for x in [s, b, d] {
            p.free(&f, x).unwrap();
        }
        p.release_all(&f).unwrap();
        (before, after, p.program_peak() / PAGE)
    };
    // The 12 pages moved (18 mapped, plus the slack rule's 3% over the high-water mark).
    let (before, after, peak) = run(true, 16);
    assert!(before <= 19, "{before} pages mapped");
    // 16 pages: back at the peak of 18. Moved, nothing new is mapped; asked of the spent
    // bucket, the pool maps more.
    assert_eq!((after, peak), (before, 18));
    let (_, asked, _) = run(false, 16);
    assert!(asked > before, "asked of the bucket: {asked} pages");
    // 15 pages stay under the peak: the bucket is asked either way, and declines.
    let (_, under, _) = run(true, 15);
    assert!(under > before, "under the peak: {under} pages");
    assert_eq!(run(false, 15).1, under);
}
