//! Tests of the arena planners: their placements against the independent checker, and cases
//! with known answers.

use super::*;
use proptest::prelude::*;

fn buf(start: u32, end: u32, size: u64) -> BufferSpec {
    BufferSpec {
        start,
        end,
        size,
        align: 1,
    }
}

fn problem(bufs: &[(u32, u32, u64)]) -> ArenaProblem {
    ArenaProblem {
        buffers: bufs.iter().map(|&(s, e, z)| buf(s, e, z)).collect(),
        groups: vec![],
    }
}

/// Random problems: up to 40 buffers over 30 steps, sizes 0..100 (some zero), alignments 1..16,
/// and up to 3 groups of distinct buffers.
fn arb_problem() -> impl Strategy<Value = ArenaProblem> {
    (1usize..40)
        .prop_flat_map(|n| {
            (
                prop::collection::vec((0u32..30, 1u32..12, 0u64..100, 0u32..5), n),
                prop::collection::vec(0..n, 0..10),
                0usize..4,
            )
        })
        .prop_map(|(bufs, picks, ngroups)| {
            let buffers: Vec<BufferSpec> = bufs
                .into_iter()
                .map(|(s, l, z, a)| BufferSpec {
                    start: s,
                    end: s + l,
                    size: z,
                    align: 1 << a,
                })
                .collect();
            let mut uniq: Vec<usize> = Vec::new();
            for p in picks {
                if !uniq.contains(&p) {
                    uniq.push(p);
                }
            }
            let groups = if ngroups == 0 || uniq.is_empty() {
                vec![]
            } else {
                let chunk = uniq.len().div_ceil(ngroups);
                uniq.chunks(chunk).map(|c| c.to_vec()).collect()
            };
            ArenaProblem { buffers, groups }
        })
}

/// Group contiguity and alignment, checked directly (as well as by `check_placement`).
fn assert_layout(p: &ArenaProblem, pl: &Placement) {
    for (i, b) in p.buffers.iter().enumerate() {
        assert_eq!(pl.offsets[i] % b.align, 0, "buffer {i} misaligned");
    }
    for g in &p.groups {
        let a = g.iter().map(|&i| p.buffers[i].align).max().unwrap();
        for w in g.windows(2) {
            let padded = p.buffers[w[0]].size.next_multiple_of(a);
            assert_eq!(
                pl.offsets[w[1]],
                pl.offsets[w[0]] + padded,
                "group {g:?} not contiguous"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn greedy_and_search_are_valid(p in arb_problem()) {
        let lb = lower_bound(&p);
        let g = plan_greedy(&p).unwrap();
        prop_assert_eq!(check_placement(&p, &g), Ok(g.size));
        assert_layout(&p, &g);
        prop_assert!(lb <= g.size);
        let s = plan_search(&p, Duration::from_millis(20), None).unwrap();
        prop_assert_eq!(check_placement(&p, &s), Ok(s.size));
        assert_layout(&p, &s);
        prop_assert!(lb <= s.size);
        prop_assert!(s.size <= g.size, "search {} worse than greedy {}", s.size, g.size);
        let e = plan_greedy_either(&p, &[]).unwrap();
        prop_assert_eq!(check_placement(&p, &e), Ok(e.size));
        assert_layout(&p, &e);
        prop_assert!(lb <= e.size && e.size <= g.size, "either {} against greedy {}", e.size, g.size);
    }

    #[test]
    fn fixed_buffers_stay_and_the_rest_go_around_them(
        p in arb_problem(),
        picks in prop::collection::vec(any::<bool>(), 40),
    ) {
        let p = ArenaProblem { groups: vec![], ..p };
        // Offsets no two live buffers share: a greedy plan's, some of them held.
        let g = plan_greedy(&p).unwrap();
        let fixed: Vec<(usize, u64)> = (0..p.buffers.len())
            .filter(|&i| picks[i])
            .map(|i| (i, g.offsets[i]))
            .collect();
        let e = plan_greedy_either(&p, &fixed).unwrap();
        prop_assert_eq!(check_placement(&p, &e), Ok(e.size));
        assert_layout(&p, &e);
        for &(i, o) in &fixed {
            prop_assert_eq!(e.offsets[i], o, "fixed buffer {} moved", i);
        }
    }

    #[test]
    fn search_with_a_target_meets_it_or_keeps_the_best(p in arb_problem()) {
        let g = plan_greedy(&p).unwrap();
        let target = g.size - g.size / 8;
        let s = plan_search(&p, Duration::from_millis(20), Some(target)).unwrap();
        prop_assert_eq!(check_placement(&p, &s), Ok(s.size));
        prop_assert!(s.size <= g.size);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Fixed buffers, some touching and some with gaps, over lifetimes that differ (a floor
    /// of weights around which the pool plans an epoch): a buffer placed around them takes the
    /// lowest gap it fits among those it meets in time — as if each fixed buffer were a range
    /// of its own (the greedy inserts touching ones of the same lifetime as one).
    #[test]
    fn a_buffer_takes_the_lowest_gap_between_fixed_ones(
        fixed in prop::collection::vec(
            (1u64..50, prop::sample::select(vec![0u64, 1, 10, 20]), 0usize..3),
            1..30,
        ),
        size in prop::sample::select(vec![1u64, 2, 5, 10, 20, 40, 60]),
        life in 0usize..3,
    ) {
        let lives = [(0u32, 10u32), (5, 10), (0, 5)];
        let mut bufs = Vec::new();
        let mut at = Vec::new();
        let mut top = 0;
        for &(z, gap, l) in &fixed {
            let o = top + gap;
            bufs.push(buf(lives[l].0, lives[l].1, z));
            at.push((bufs.len() - 1, o));
            top = o + z;
        }
        let (s, e) = [(0, 10), (0, 5), (3, 7)][life];
        bufs.push(buf(s, e, size));
        let p = ArenaProblem { buffers: bufs, groups: vec![] };
        let pl = plan_greedy_either(&p, &at).unwrap();
        prop_assert_eq!(check_placement(&p, &pl), Ok(pl.size));
        // The lowest offset, from 0 or a met buffer's end, clear of every buffer it meets.
        let met: Vec<(u64, u64)> = at
            .iter()
            .filter(|&&(i, _)| p.buffers[i].start < e && s < p.buffers[i].end)
            .map(|&(i, o)| (o, o + p.buffers[i].size))
            .collect();
        let clear = |o: u64| met.iter().all(|&(lo, hi)| o + size <= lo || hi <= o);
        let lowest = std::iter::once(0)
            .chain(met.iter().map(|&(_, hi)| hi))
            .filter(|&o| clear(o))
            .min()
            .unwrap();
        prop_assert_eq!(pl.offsets[p.buffers.len() - 1], lowest);
    }
}

#[test]
fn greedy_in_order_of_start_wins_on_a_growing_cache() {
    // Two caches grown by one unit per step, each copy freed right after the next exists
    // (concatenation), as a decoder's key/value cache: by size the largest copies take the
    // bottom and the smaller ones stack above them; in order of start each copy reuses the
    // space the previous ones left.
    let mut bufs: Vec<(u32, u32, u64)> = Vec::new();
    let mut t = 0u32;
    let mut last = [None::<usize>; 2];
    for k in 1..=12u64 {
        for slot in last.iter_mut() {
            t += 1;
            bufs.push((t, u32::MAX, k * 256));
            if let Some(j) = *slot {
                t += 1;
                bufs[j].1 = t;
            }
            *slot = Some(bufs.len() - 1);
        }
    }
    for b in &mut bufs {
        if b.1 == u32::MAX {
            b.1 = t + 1;
        }
    }
    let p = problem(&bufs);
    let g = plan_greedy(&p).unwrap();
    let e = plan_greedy_either(&p, &[]).unwrap();
    assert_eq!(check_placement(&p, &e), Ok(e.size));
    assert!(
        e.size < g.size,
        "either {} against greedy {}",
        e.size,
        g.size
    );
}

#[test]
fn a_fixed_buffer_splits_the_arena_and_others_fill_both_sides() {
    // 64 bytes held at 32 for the whole time: a 32-byte buffer fits below it, a 40-byte one
    // only above.
    let p = problem(&[(0, 10, 64), (1, 5, 40), (2, 6, 32)]);
    let e = plan_greedy_either(&p, &[(0, 32)]).unwrap();
    assert_eq!(e.offsets, vec![32, 96, 0]);
    assert_eq!(e.size, 136);
    let grouped = ArenaProblem {
        groups: vec![vec![1, 2]],
        ..p.clone()
    };
    assert!(matches!(
        plan_greedy_either(&grouped, &[(0, 32)]),
        Err(PlanError::Invalid(_))
    ));
    assert!(matches!(
        plan_greedy_either(&p, &[(3, 0)]),
        Err(PlanError::Invalid(m)) if m.contains("fixed buffer 3")
    ));
}

#[test]
fn known_optimum_greedy_misses() {
    // Greedy by size needs 16 here; 14 is the lower bound, hence optimal.
    let p = problem(&[
        (2, 6, 1),
        (1, 5, 3),
        (4, 7, 4),
        (1, 2, 3),
        (2, 5, 3),
        (2, 5, 3),
        (1, 3, 2),
    ]);
    assert_eq!(lower_bound(&p), 14);
    let g = plan_greedy(&p).unwrap();
    assert_eq!(g.size, 16);
    let s = plan_search(&p, Duration::from_secs(5), None).unwrap();
    assert_eq!(check_placement(&p, &s), Ok(14));
    assert_eq!(s.size, 14);
}

#[test]
fn minimalloc_readme_example() {
    let p = problem(&[(0, 3, 4), (3, 9, 4), (0, 9, 4), (9, 21, 4), (0, 21, 4)]);
    assert_eq!(lower_bound(&p), 12);
    let s = plan_search(&p, Duration::from_secs(1), Some(12)).unwrap();
    assert_eq!(check_placement(&p, &s), Ok(12));
}

#[test]
fn groups_are_contiguous_and_padded() {
    let mut p = problem(&[(0, 4, 10), (1, 3, 7), (2, 6, 5), (0, 8, 3)]);
    p.buffers[2].align = 8;
    p.groups = vec![vec![1, 2, 0]];
    for pl in [
        plan_greedy(&p).unwrap(),
        plan_search(&p, Duration::from_millis(50), None).unwrap(),
    ] {
        check_placement(&p, &pl).unwrap();
        assert_eq!(pl.offsets[1] % 8, 0);
        assert_eq!(pl.offsets[2], pl.offsets[1] + 8);
        assert_eq!(pl.offsets[0], pl.offsets[2] + 8);
    }
}

#[test]
fn invalid_problems_name_the_culprit() {
    let bad = |p: &ArenaProblem| match plan_greedy(p) {
        Err(PlanError::Invalid(m)) => m,
        other => panic!("expected Invalid, got {other:?}"),
    };
    assert!(bad(&problem(&[(0, 1, 1), (3, 3, 1)])).contains("buffer 1"));
    let mut p = problem(&[(0, 1, 1), (0, 2, 1)]);
    p.buffers[1].align = 3;
    assert!(bad(&p).contains("buffer 1"));
    let mut p = problem(&[(0, 1, 1), (0, 2, 1)]);
    p.groups = vec![vec![0, 5]];
    assert!(bad(&p).contains("group 0"));
    p.groups = vec![vec![0], vec![1, 0]];
    assert!(bad(&p).contains("buffer 0"));
    p.groups = vec![vec![]];
    assert!(bad(&p).contains("group 0"));
    assert!(matches!(
        plan_search(&p, Duration::ZERO, None),
        Err(PlanError::Invalid(_))
    ));
}

#[test]
fn checker_rejects_bad_placements() {
    let mut p = problem(&[(0, 4, 10), (2, 6, 10), (6, 8, 10)]);
    let ok = Placement {
        offsets: vec![0, 10, 0],
        size: 20,
    };
    assert_eq!(check_placement(&p, &ok), Ok(20));
    let overlap = Placement {
        offsets: vec![0, 5, 0],
        size: 15,
    };
    assert!(check_placement(&p, &overlap)
        .unwrap_err()
        .contains("overlap"));
    let wrong_size = Placement {
        offsets: vec![0, 10, 0],
        size: 21,
    };
    assert!(check_placement(&p, &wrong_size).is_err());
    p.buffers[2].align = 4;
    let misaligned = Placement {
        offsets: vec![0, 10, 2],
        size: 20,
    };
    assert!(check_placement(&p, &misaligned)
        .unwrap_err()
        .contains("buffer 2"));
    p.groups = vec![vec![0, 2]];
    assert!(check_placement(&p, &ok).unwrap_err().contains("group 0"));
    // Touching intervals [0, 4) and [4, ...) do not conflict.
    let p = problem(&[(0, 4, 10), (4, 8, 10)]);
    assert_eq!(
        check_placement(
            &p,
            &Placement {
                offsets: vec![0, 0],
                size: 10
            }
        ),
        Ok(10)
    );
}

#[test]
fn empty_and_zero_sized() {
    let p = ArenaProblem::default();
    assert_eq!(
        plan_greedy(&p).unwrap(),
        Placement {
            offsets: vec![],
            size: 0
        }
    );
    assert_eq!(
        plan_search(&p, Duration::from_millis(1), None)
            .unwrap()
            .size,
        0
    );
    let p = problem(&[(0, 5, 0), (0, 5, 7), (2, 3, 0)]);
    let pl = plan_search(&p, Duration::from_millis(10), None).unwrap();
    assert_eq!(check_placement(&p, &pl), Ok(7));
    assert_eq!(lower_bound(&p), 7);
}

#[test]
fn lower_bound_sweeps_half_open_intervals() {
    assert_eq!(lower_bound(&problem(&[(0, 2, 5), (2, 4, 5), (1, 3, 1)])), 6);
    assert_eq!(
        lower_bound(&problem(&[(0, 10, 5), (3, 4, 2), (3, 5, 2), (4, 6, 9)])),
        16
    );
}

#[test]
fn parse_csv_reads_and_names_bad_lines() {
    let p = parse_csv("id,lower,upper,size\nb1,0,3,4\n\nb2,3,9,4\n").unwrap();
    assert_eq!(p.buffers.len(), 2);
    assert_eq!(
        (p.buffers[1].start, p.buffers[1].end, p.buffers[1].size),
        (3, 9, 4)
    );
    // Negative steps are shifted.
    let p = parse_csv("id,lower,upper,size\n0,-1,5,4\n1,0,3,2\n").unwrap();
    assert_eq!(
        (p.buffers[0].start, p.buffers[0].end, p.buffers[1].start),
        (0, 6, 1)
    );
    let err = |t: &str| match parse_csv(t) {
        Err(PlanError::Invalid(m)) => m,
        other => panic!("expected an error for {t:?}, got {other:?}"),
    };
    assert!(err("id,lower,upper,size\n0,1,2,3\n1,x,2,3\n").contains("line 3"));
    assert!(err("id,lower,upper,size\n0,1,2\n").contains("line 2"));
    assert!(err("id,lower,upper,size\n0,1,2,3\n1,5,5,3\n").contains("line 3"));
    assert!(err("id,lower,upper,size\n0,1,2,-3\n").contains("line 2"));
    assert!(err("a,b,c\n0,1,2\n").contains("line 1"));
    assert!(err("").contains("header"));
}

#[test]
fn shipped_instances_parse_and_plan() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/plans/minimalloc");
    let Ok(text) = std::fs::read_to_string(dir.join("A.1048576.csv")) else {
        return; // The instances are not part of every checkout.
    };
    let p = parse_csv(&text).unwrap();
    assert_eq!(p.buffers.len(), 154);
    let g = plan_greedy(&p).unwrap();
    assert_eq!(check_placement(&p, &g), Ok(g.size));
}

/// 20,000 random buffers, training-graph-like: short temporaries and nested saved activations.
fn big_problem(n: usize) -> ArenaProblem {
    let mut s = 0x5eedu64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let layers = (n / 16) as u32;
    let buffers = (0..n)
        .map(|k| {
            let step = (k / 8) as u32;
            let r = rnd();
            let end = if step < layers && r % 8 < 3 {
                2 * layers - step + 1
            } else {
                step + 1 + (r >> 8) as u32 % 4
            };
            let size = 256 + (rnd() % (1 << (8 + rnd() % 19))) / 256 * 256;
            BufferSpec {
                start: step,
                end,
                size,
                align: 256,
            }
        })
        .collect();
    ArenaProblem {
        buffers,
        groups: vec![],
    }
}

/// CPU time this thread has used: unlike wall time, not inflated when other tests or other
/// builds on a small machine keep it waiting for a core.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn greedy_is_fast_on_20000_buffers() {
    let p = big_problem(20_000);
    let t = thread_cpu_time();
    let g = plan_greedy(&p).unwrap();
    let took = thread_cpu_time() - t;
    // Generous: the real figure is printed by `gkrt-plans --bench-greedy` (BENCHMARKS.md §4).
    // CPU time, not wall time: on a loaded machine the wall time is many times the CPU time.
    let bound = if cfg!(debug_assertions) {
        Duration::from_secs(10)
    } else {
        Duration::from_millis(200)
    };
    assert!(took < bound, "greedy took {took:?}");
    assert_eq!(check_placement(&p, &g), Ok(g.size));
    assert!(g.size as f64 <= 1.1 * lower_bound(&p) as f64);
}

/// `plan_greedy_either` places its two greedy orders on two threads for a large problem and
/// one after the other for a small one, and the plan is the one the two sequential placements
/// give: the smaller, by size on a tie.
#[test]
fn the_two_greedy_orders_run_side_by_side_and_plan_as_one_after_the_other() {
    let here = std::thread::current().id();
    let id = || std::thread::current().id();
    let (a, b) = both(PARALLEL_ITEMS, id, id);
    assert_ne!(a, here, "the first on a thread of its own");
    assert_eq!(b, here);
    let (a, b) = both(PARALLEL_ITEMS - 1, id, || 7);
    assert_eq!((a, b), (here, 7), "a small problem on the calling thread");
    for n in [PARALLEL_ITEMS / 2, 8 * PARALLEL_ITEMS] {
        let p = big_problem(n);
        let prep = Prepared::new(&p).unwrap();
        let by_size = greedy::place(&prep.items, prep.sections, &greedy::size_order(&prep.items));
        let mut order: Vec<u32> = (0..prep.items.len() as u32).collect();
        order.sort_by_key(|&i| (prep.items[i as usize].ss, i));
        let by_start = greedy::place(&prep.items, prep.sections, &order);
        let best = if items_size(&prep.items, &by_start) < items_size(&prep.items, &by_size) {
            by_start
        } else {
            by_size
        };
        let e = plan_greedy_either(&p, &[]).unwrap();
        assert_eq!(
            e.offsets,
            prep.expand(&p, &best).unwrap().offsets,
            "{n} buffers"
        );
        assert_eq!(check_placement(&p, &e), Ok(e.size));
    }
}
