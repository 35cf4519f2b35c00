//! Random sequences of operations, on plain segments and on virtual memory, checked after
//! every step against a model of what the pool must guarantee.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

// --- property test against a model ---

#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc(u64, u32),
    Free(usize),
    /// Free after an event; `true`: reuse the newest still-incomplete event.
    FreeAfterEvent(usize, bool),
    Complete(usize),
    BadFree(usize),
    ReleaseCached,
    ResetPeaks,
    /// Every live block freed and every event completed: the ranges empty, and the next
    /// operations start a new epoch (`epochs.rs`). Only in the virtual-memory sequences.
    FreeAll,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1u64..=4096,
        3 => 4097u64..=MIB,
        2 => MIB + 1..=12 * MIB,
        1 => 12 * MIB + 1..=40 * MIB,
    ];
    prop_oneof![
        // Stream 3 and 4: streams 0 and 1's lasting lanes (in the virtual-memory sequences).
        8 => (size, 0u32..5).prop_map(|(n, s)| Op::Alloc(n, s)),
        5 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, r)| Op::FreeAfterEvent(i, r)),
        2 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::BadFree),
        1 => Just(Op::ReleaseCached),
        1 => Just(Op::ResetPeaks),
    ]
}

struct LiveBlock {
    addr: u64,
    size: u64,
    requested: u64,
    stream: u32,
}

/// Memory a freed block occupied, with the stream it belonged to and the event its reuse
/// waits for.
struct Retired {
    addr: u64,
    size: u64,
    stream: u32,
    event: Option<EventId>,
}

#[derive(Default)]
struct Model {
    live: Vec<LiveBlock>,
    retired: Vec<Retired>,
    incomplete: Vec<EventId>,
    freed_addrs: Vec<u64>,
    next_event: u32,
    unpolled_completion: bool,
    allocated: u64,
    requested: u64,
    peak_allocated: u64,
    allocs: u64,
    frees: u64,
    failed: u64,
}

fn overlaps(a: u64, an: u64, b: u64, bn: u64) -> bool {
    a < b + bn && b < a + an
}

impl Model {
    fn blocked(&self, f: &Fake, r: &Retired) -> bool {
        r.event.is_some_and(|e| !f.event_complete(e))
    }
}

fn check_state(p: &Pool, f: &Fake, m: &mut Model) -> Result<(), TestCaseError> {
    if let Err(e) = p.validate() {
        return Err(TestCaseError::fail(format!("invariant: {e}")));
    }
    let expected = {
        let s = f.state();
        PoolStats {
            allocated_bytes: m.allocated,
            reserved_bytes: s.reserved,
            peak_allocated_bytes: m.peak_allocated,
            peak_reserved_bytes: s.peak,
            requested_bytes: m.requested,
            alloc_count: m.allocs,
            free_count: m.frees,
            segment_count: s.segments.len() as u64,
            segment_alloc_count: s.allocs,
            segment_free_count: s.frees,
            failed_alloc_count: m.failed,
            ..PoolStats::default()
        }
    };
    prop_assert_eq!(p.stats(), expected);
    let align = p.config().alignment;
    let mut sorted: Vec<&LiveBlock> = m.live.iter().collect();
    sorted.sort_by_key(|b| b.addr);
    for w in sorted.windows(2) {
        prop_assert!(w[0].addr + w[0].size <= w[1].addr, "live blocks overlap");
    }
    let s = f.state();
    for b in &m.live {
        prop_assert_eq!(b.addr % align, 0);
        prop_assert_eq!(p.block_size(b.addr), Some(b.size));
        let seg = s.segments.range(..=b.addr).next_back();
        prop_assert!(
            seg.is_some_and(|(&base, &n)| b.addr + b.size <= base + n),
            "block {:#x}+{} outside every live segment",
            b.addr,
            b.size
        );
    }
    // Segments freed since the last check held nothing in use.
    let freed: Vec<(u64, u64)> = s.freed_log.clone();
    drop(s);
    f.state_mut().freed_log.clear();
    for (base, n) in freed {
        for b in &m.live {
            prop_assert!(
                !overlaps(b.addr, b.size, base, n),
                "segment freed under a live block"
            );
        }
        for r in &m.retired {
            prop_assert!(
                !(overlaps(r.addr, r.size, base, n) && m.blocked(f, r)),
                "segment freed under a block pending on an incomplete event"
            );
        }
        m.retired.retain(|r| !overlaps(r.addr, r.size, base, n));
    }
    Ok(())
}

fn run_ops(cfg: PoolConfig, nstreams: u32, capacity: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let limit = cfg.memory_limit;
    let f = FakeConfig::plain().capacity(capacity).build();
    let mut p = Pool::new(cfg);
    let align = p.config().alignment;
    let mut m = Model::default();
    for op in ops {
        match *op {
            Op::Alloc(n, s) => {
                let s = s % 3 % nstreams;
                let r = n.div_ceil(align) * align;
                // Nothing in use once completed events are polled: the request must succeed
                // whenever it fits the budget and the device on its own.
                let quiet = m.live.is_empty() && !m.retired.iter().any(|x| m.blocked(&f, x));
                let dry = (capacity == u64::MAX && !m.unpolled_completion).then(|| {
                    p.dry_run(&[DryRunStep::Alloc {
                        bytes: n,
                        stream: st(s),
                    }])
                });
                let res = p.alloc(&f, n, st(s));
                m.unpolled_completion = false;
                match res {
                    Ok(addr) => {
                        for x in &m.retired {
                            if overlaps(x.addr, x.size, addr, r) {
                                prop_assert_eq!(x.stream, s, "block of another stream reused");
                                prop_assert!(!m.blocked(&f, x), "reused before its event");
                            }
                        }
                        prop_assert!(f.reserved() <= limit);
                        m.live.push(LiveBlock {
                            addr,
                            size: r,
                            requested: n,
                            stream: s,
                        });
                        m.allocated += r;
                        m.requested += n;
                        m.peak_allocated = m.peak_allocated.max(m.allocated);
                        m.allocs += 1;
                        if let Some(d) = dry {
                            prop_assert_eq!(d, Ok(p.stats()), "dry run disagrees");
                        }
                    }
                    Err(PoolError::OutOfMemory {
                        requested,
                        reserved,
                        allocated,
                        limit: l,
                    }) => {
                        m.failed += 1;
                        prop_assert_eq!(
                            (requested, reserved, allocated, l),
                            (n, f.reserved(), m.allocated, limit)
                        );
                        prop_assert!(p.idle.is_empty(), "failed without releasing the cache");
                        prop_assert!(
                            reserved.saturating_add(r) > limit
                                || reserved.saturating_add(r) > capacity,
                            "failed although an exact segment fit"
                        );
                        prop_assert!(!(quiet && r <= limit && r <= capacity), "quiet pool failed");
                        if let Some(d) = dry {
                            prop_assert!(
                                matches!(d, Err((0, PoolError::OutOfMemory { .. }))),
                                "dry run: {:?}",
                                d
                            );
                        }
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("alloc error {e}"))),
                }
            }
            Op::Free(i) | Op::FreeAfterEvent(i, _) if !m.live.is_empty() => {
                let b = m.live.swap_remove(i % m.live.len());
                let event = match *op {
                    Op::FreeAfterEvent(_, reuse) => {
                        let e = match m.incomplete.last() {
                            Some(&e) if reuse => e,
                            _ => {
                                m.next_event += 1;
                                m.incomplete.push(EventId(m.next_event));
                                EventId(m.next_event)
                            }
                        };
                        p.free_after_event(&f, b.addr, e)
                            .map_err(|e| TestCaseError::fail(format!("free_after_event: {e}")))?;
                        Some(e)
                    }
                    _ => {
                        p.free(&f, b.addr)
                            .map_err(|e| TestCaseError::fail(format!("free: {e}")))?;
                        None
                    }
                };
                m.allocated -= b.size;
                m.requested -= b.requested;
                m.frees += 1;
                m.freed_addrs.push(b.addr);
                m.retired.push(Retired {
                    addr: b.addr,
                    size: b.size,
                    stream: b.stream,
                    event,
                });
            }
            Op::Free(_) | Op::FreeAfterEvent(..) => {}
            Op::Complete(i) => {
                if !m.incomplete.is_empty() {
                    let e = m.incomplete.remove(i % m.incomplete.len());
                    f.complete(e);
                    m.unpolled_completion = true;
                }
            }
            Op::BadFree(i) => {
                if !m.freed_addrs.is_empty() {
                    let a = m.freed_addrs[i % m.freed_addrs.len()];
                    if !m.live.iter().any(|b| b.addr == a) {
                        prop_assert_eq!(p.free(&f, a), Err(PoolError::UnknownPointer(a)));
                    }
                }
                if let Some(b) = m.live.first() {
                    let a = b.addr + 1;
                    prop_assert_eq!(
                        p.free_after_event(&f, a, EventId(0)),
                        Err(PoolError::UnknownPointer(a))
                    );
                }
            }
            Op::ReleaseCached => {
                let before = f.reserved();
                let released = p.release_cached(&f);
                m.unpolled_completion = false;
                prop_assert_eq!(released, Ok(before - f.reserved()));
                // Every segment left holds something in use.
                let s = f.state();
                for (&base, &n) in &s.segments {
                    let used = m.live.iter().any(|b| overlaps(b.addr, b.size, base, n))
                        || m.retired
                            .iter()
                            .any(|x| overlaps(x.addr, x.size, base, n) && m.blocked(&f, x));
                    prop_assert!(used, "release_cached kept an unused segment {:#x}", base);
                }
            }
            Op::ResetPeaks => {
                p.reset_peaks();
                m.peak_allocated = m.allocated;
                let mut s = f.state_mut();
                s.peak = s.reserved;
            }
            Op::FreeAll => unreachable!("not generated for plain segments"),
        }
        check_state(&p, &f, &mut m)?;
    }
    // Free everything, complete every event: the cache drains to nothing.
    for b in std::mem::take(&mut m.live) {
        prop_assert_eq!(p.free(&f, b.addr), Ok(()));
        m.allocated -= b.size;
        m.requested -= b.requested;
        m.frees += 1;
    }
    for e in std::mem::take(&mut m.incomplete) {
        f.complete(e);
    }
    p.release_cached(&f)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    check_state(&p, &f, &mut m)?;
    prop_assert_eq!(p.stats().reserved_bytes, 0);
    prop_assert_eq!(p.stats().allocated_bytes, 0);
    prop_assert_eq!(f.live_segments(), 0);
    prop_assert_eq!(p.release_all(&f), Ok(()));
    Ok(())
}

fn tiny_config() -> PoolConfig {
    PoolConfig {
        small_request_max: 4 * KIB,
        small_segment_bytes: 16 * KIB,
        medium_request_max: 64 * KIB,
        medium_segment_bytes: 256 * KIB,
        large_segment_rounding: 64 * KIB,
        ..PoolConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_alloc_free_sequences_match_the_model(
        tiny in any::<bool>(),
        nstreams in 1u32..=3,
        limit in prop_oneof![Just(u64::MAX), MIB..=64 * MIB],
        capacity in prop_oneof![3 => Just(u64::MAX), 1 => MIB..=96 * MIB],
        ops in proptest::collection::vec(op_strategy(), 1..200),
    ) {
        let base = if tiny { tiny_config() } else { PoolConfig::default() };
        run_ops(PoolConfig { memory_limit: limit, ..base }, nstreams, capacity, &ops)?;
    }
}

/// Random operations on a pool with virtual memory: blocks never overlap, every page under a
/// block in use is mapped, pages are unmapped only under free memory, other streams' blocks are
/// reused only after their event, reserved bytes match the device's physical memory and stay
/// within the budget, and the words written into each block (through the fake's memory) read
/// back unchanged until it is freed — with page aliases (`aliases`), which a block handed out
/// over a shadow, or a chunk switched from under a live block, would break; every physical
/// allocation is freed once (the fake asserts) and none is left at the end.
fn run_virtual_ops(
    limit: u64,
    capacity: u64,
    nstreams: u32,
    (waits, aliases, idle): (bool, bool, bool),
    chunk: u64,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let f = FakeConfig::virtual_memory().capacity(capacity).build();
    // An idle device passes markers as they are polled: moves need no wait, and chunks switch
    // back to their shadows.
    f.state_mut().idle_device = idle;
    let mut p = Pool::new(PoolConfig {
        memory_limit: limit,
        vmm_reserve_bytes: 256 * MIB,
        vmm_page_bytes: chunk,
        recycle_time_permille: 1000,
        recycle_min_bytes: 4 * MIB,
        recycle_waits: waits,
        page_aliases: aliases,
        ..PoolConfig::default()
    });
    // Each live block's words: its first and last, and one at every page edge inside it.
    let points = |addr: u64, size: u64| {
        let mut v = vec![addr];
        v.extend(
            (addr.div_ceil(PAGE) * PAGE..addr + size)
                .step_by(PAGE as usize)
                .skip_while(|&x| x == addr),
        );
        v.push(addr + size - 8);
        v
    };
    let mut stamps: HashMap<u64, u64> = HashMap::new();
    let mut next_stamp = 0u64;
    let mut live: Vec<LiveBlock> = Vec::new();
    let mut retired: Vec<Retired> = Vec::new();
    let mut incomplete: Vec<EventId> = Vec::new();
    let mut next_event = 0;
    for op in ops {
        match *op {
            Op::Alloc(n, s) => {
                let lane = if s >= 3 { Lane::Lasting } else { Lane::Working };
                let s = s % 3 % nstreams;
                match p.alloc_in(&f, n, st(s), lane) {
                    Ok(addr) => {
                        let r = n.div_ceil(256) * 256;
                        for b in &live {
                            prop_assert!(!overlaps(b.addr, b.size, addr, r), "live blocks overlap");
                        }
                        for x in &retired {
                            if overlaps(x.addr, x.size, addr, r) {
                                prop_assert_eq!(x.stream, s, "block of another stream reused");
                                prop_assert!(
                                    x.event.is_none_or(|e| f.event_complete(e)),
                                    "reused before its event"
                                );
                            }
                        }
                        live.push(LiveBlock {
                            addr,
                            size: r,
                            requested: n,
                            stream: s,
                        });
                        next_stamp += 1;
                        stamps.insert(addr, next_stamp);
                        for x in points(addr, r) {
                            // (Blocks of the plain-segment fallback are outside its memory.)
                            prop_assert!(f.write(x, next_stamp ^ x) || f.reserved() > 0);
                        }
                    }
                    Err(PoolError::OutOfMemory { .. }) => {
                        // Memory in use (live, or pending on an incomplete event), each block
                        // rounded out to whole pages at both ends, plus the request: more than
                        // the budget or the device.
                        let blocked = |x: &Retired| x.event.is_some_and(|e| !f.event_complete(e));
                        let held = live.iter().map(|b| b.size + 2 * PAGE).sum::<u64>()
                            + retired
                                .iter()
                                .filter(|x| blocked(x))
                                .map(|x| x.size + 2 * PAGE)
                                .sum::<u64>();
                        prop_assert!(
                            held + n + 2 * PAGE > limit.min(capacity),
                            "out of memory with {held} bytes held"
                        );
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("alloc: {e}"))),
                }
            }
            Op::Free(i) | Op::FreeAfterEvent(i, _) if !live.is_empty() => {
                let b = live.swap_remove(i % live.len());
                stamps.remove(&b.addr);
                let event = if let Op::FreeAfterEvent(_, reuse) = *op {
                    let e = match incomplete.last() {
                        Some(&e) if reuse => e,
                        _ => {
                            next_event += 1;
                            incomplete.push(EventId(next_event));
                            EventId(next_event)
                        }
                    };
                    prop_assert_eq!(p.free_after_event(&f, b.addr, e), Ok(()));
                    Some(e)
                } else {
                    prop_assert_eq!(p.free(&f, b.addr), Ok(()));
                    f.note_freed(b.addr, b.size, b.stream);
                    None
                };
                retired.push(Retired {
                    addr: b.addr,
                    size: b.size,
                    stream: b.stream,
                    event,
                });
            }
            Op::Free(_) | Op::FreeAfterEvent(..) => {}
            Op::Complete(i) => {
                if !incomplete.is_empty() {
                    f.complete(incomplete.remove(i % incomplete.len()));
                }
                f.complete_marker();
            }
            Op::BadFree(i) => {
                let a = 0x1000 + (i as u64 % 1000) * 256;
                prop_assert_eq!(p.free(&f, a), Err(PoolError::UnknownPointer(a)));
            }
            Op::ReleaseCached => {
                let before = p.stats().reserved_bytes;
                let released = p.release_cached(&f);
                prop_assert_eq!(released, Ok(before - p.stats().reserved_bytes));
            }
            Op::ResetPeaks => p.reset_peaks(),
            Op::FreeAll => {
                for b in live.drain(..) {
                    stamps.remove(&b.addr);
                    prop_assert_eq!(p.free(&f, b.addr), Ok(()));
                    f.note_freed(b.addr, b.size, b.stream);
                }
                for e in incomplete.drain(..) {
                    f.complete(e);
                }
                f.complete_marker();
                retired.clear();
            }
        }
        if let Err(e) = p.validate() {
            return Err(TestCaseError::fail(format!("invariant: {e}")));
        }
        let s = p.stats();
        prop_assert_eq!(s.reserved_bytes, f.mapped_bytes() + f.reserved());
        prop_assert!(s.reserved_bytes <= limit, "over the budget");
        for b in &live {
            prop_assert!(
                f.covers(b.addr, b.size) || f.reserved() > 0,
                "live block unmapped"
            );
        }
        let blocked = |x: &Retired| x.event.is_some_and(|e| !f.event_complete(e));
        for x in retired.iter().filter(|x| blocked(x)) {
            prop_assert!(
                f.covers(x.addr, x.size) || f.reserved() > 0,
                "pages unmapped under a block pending on an event"
            );
        }
        // Every live block still holds what was written into it (blocks in plain segments,
        // the fallback, are not in the fake's memory and read `None`).
        for b in &live {
            let stamp = stamps[&b.addr];
            for x in points(b.addr, b.size) {
                let got = f.read(x);
                prop_assert!(
                    got == Some(stamp ^ x) || (got.is_none() && f.reserved() > 0),
                    "block {:#x}: word {x:#x} reads {got:?}, not its own",
                    b.addr
                );
            }
        }
    }
    for b in std::mem::take(&mut live) {
        prop_assert_eq!(p.free(&f, b.addr), Ok(()));
    }
    for e in incomplete {
        f.complete(e);
    }
    p.release_cached(&f)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(p.stats().reserved_bytes, 0);
    prop_assert_eq!(f.mapped_bytes(), 0);
    prop_assert_eq!(f.mapped_addresses(), 0, "an alias left mapped");
    prop_assert_eq!(p.release_all(&f), Ok(()));
    prop_assert!(f.state().ranges.is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sequences_on_virtual_memory_keep_every_invariant(
        nstreams in 1u32..=3,
        limit in prop_oneof![Just(u64::MAX), 16 * MIB..=128 * MIB],
        capacity in prop_oneof![3 => Just(u64::MAX), 1 => 16 * MIB..=160 * MIB],
        waits in any::<bool>(),
        aliases in any::<bool>(),
        idle in any::<bool>(),
        // The sequence run 1–3 times in a row, as training steps repeat (moves then repeat,
        // and chunks go back to their shadows); with `empty`, everything is freed after each
        // run, so the later runs follow the plan of the one before (`epochs.rs`).
        repeats in 1usize..=3,
        empty in any::<bool>(),
        // Physical allocations of one page, or growing with the heap up to 16 pages.
        chunk in prop_oneof![Just(PAGE), Just(16 * PAGE)],
        ops in proptest::collection::vec(op_strategy(), 1..200),
    ) {
        let mut ops = ops;
        if empty {
            ops.push(Op::FreeAll);
        }
        run_virtual_ops(limit, capacity, nstreams, (waits, aliases, idle), chunk, &ops.repeat(repeats))?;
    }
}

/// Found by the property test above (CI, session 22; its minimal case less a `ReleaseCached`,
/// which the failure does not need): after the first run emptied the range,
/// the second run's first request of one byte was refused with nothing held. The first run's
/// plan needs 61 MiB, more than the device's 60 (the online placement had fitted; the pool held
/// 52 MiB, cached): gathering its footprint ran the device out of memory, and that error reached
/// the caller. Now the plan is not followed and the byte is placed as usual.
#[test]
fn a_followed_epoch_on_a_small_device_still_finds_memory() {
    let mut ops = vec![
        Op::Alloc(1, 0),
        Op::Alloc(1, 0),
        Op::Alloc(1, 0),
        Op::Alloc(7948289, 0),
        Op::Free(175384476876014972),
        Op::Alloc(3841, 0),
        Op::Free(0),
        Op::Free(17096114642653471),
        Op::Free(3366886441952709175),
        Op::Alloc(1, 0),
        Op::Alloc(8773633, 0),
        Op::Free(3457503771510669346),
        Op::Alloc(20018689, 0),
        Op::Free(1275981285793436165),
        Op::Alloc(1, 0),
        Op::FreeAfterEvent(2990806084120561658, false),
        Op::Alloc(5993985, 0),
        Op::Alloc(1, 0),
        Op::Alloc(11422721, 0),
        Op::Alloc(1, 0),
        Op::Alloc(2666, 2),
        Op::Alloc(165834, 2),
        Op::Alloc(2567, 1),
        Op::Free(5069671550103834521),
        Op::FreeAfterEvent(7419432618091082785, true),
        Op::Free(7073057689693395580),
        Op::Complete(15515221870152366069),
        Op::Alloc(28792494, 1),
        Op::Alloc(3697, 1),
        Op::Alloc(9473927, 0),
        Op::Alloc(2622, 2),
        Op::Free(677235134189969042),
        Op::Alloc(2364, 1),
        Op::FreeAfterEvent(9105304249561570304, true),
        Op::Alloc(3043, 2),
        Op::Alloc(3391, 1),
        Op::FreeAfterEvent(16761690202455100987, true),
        Op::Alloc(577008, 2),
        Op::Alloc(4013, 0),
        Op::Alloc(270455, 2),
        Op::Free(6371855611595630249),
        Op::Alloc(832497, 0),
        Op::Free(10222823187650185182),
        Op::Complete(10750730067407751582),
        Op::Alloc(589954, 0),
        Op::Free(11583872224356630771),
        Op::Alloc(19700122, 1),
        Op::Alloc(672955, 2),
    ];
    ops.push(Op::FreeAll);
    run_virtual_ops(
        u64::MAX,
        60 * MIB,
        1,
        (false, false, true),
        PAGE,
        &ops.repeat(2),
    )
    .unwrap();
}
