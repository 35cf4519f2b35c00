//! Page aliases (`alias.rs`): a moved chunk's old address kept mapped as its shadow, so moving
//! it back is bookkeeping. On the recording fake, whose memory holds what is written through
//! any address of it, which asserts that every physical allocation is freed once and that no
//! address is unmapped while queued work may use it.

use super::*;

/// (With the slack at every request, `tight_peaks` off, and an empty range's pages moved only
/// by it, `empty_range_moves` off: the cases below count the slack's cap.)
fn alias_pool() -> Pool {
    Pool::new(PoolConfig {
        page_aliases: true,
        tight_peaks: false,
        empty_range_moves: false,
        ..vpool(u64::MAX).config().clone()
    })
}

/// x (64 MiB) freed on stream 0; then z (96 MiB) on stream 1, which would map more than the
/// slack allows (cap: 50 pages, 1.03 of the 96 MiB high-water mark): 30 of x's 32 pages (from
/// its high end) move to z's low end as aliases, their old addresses kept as shadows. Returns
/// the pool and x, z.
fn moved_case(f: &Fake) -> (Pool, u64, u64) {
    let mut p = alias_pool();
    let x = p.alloc(f, 64 * MIB, st(0)).unwrap();
    p.free(f, x).unwrap();
    f.note_freed(x, 64 * MIB, 0);
    let (maps, unmaps) = (f.map_calls(), f.unmap_calls());
    let z = p.alloc(f, 96 * MIB, st(1)).unwrap();
    // 30 aliases and one call for the 18 new pages; nothing unmapped.
    assert_eq!(p.alias_counts(), (0, 30));
    assert_eq!((f.map_calls() - maps, f.unmap_calls() - unmaps), (31, 0));
    assert_eq!(p.shadow_count(), 30);
    // Memory is counted once: 2 (x) + 48 (z) pages, while 80 addresses are mapped.
    assert_eq!(p.stats().reserved_bytes, 50 * PAGE);
    assert_eq!(f.mapped_bytes(), 50 * PAGE);
    assert_eq!(f.mapped_addresses(), 80);
    check(&p);
    (p, x, z)
}

/// `alias_again_until_undone`: moving again ends at the first placement that must unmap a
/// shadow whose chunk is live elsewhere (the move undone at a cost), whatever the time, and
/// starts afresh after `release_cached`; without it, moving again goes on.
#[test]
fn moving_again_ends_when_a_move_is_undone() {
    for until_undone in [true, false] {
        let f = Fake::virtual_memory();
        f.state_mut().idle_device = true;
        let (mut p, x, z) = moved_case(&f);
        p.config.alias_moves_again = true;
        p.config.alias_again_until_undone = until_undone;
        assert!(p.moves_again_allowed());
        // 64 MiB on stream 0 while z holds the moved chunks: x's shadows are dropped and new
        // memory is mapped there.
        let unmaps = f.unmap_calls();
        let w = p.alloc(&f, 64 * MIB, st(0)).unwrap();
        assert_eq!(w, x);
        assert_eq!(p.alias_conflicts(), 30);
        assert_eq!(f.unmap_calls() - unmaps, 30);
        assert_eq!(p.moves_again_allowed(), !until_undone);
        check(&p);
        for (a, s) in [(w, 0), (z, 1)] {
            let size = p.block_size(a).unwrap();
            p.free(&f, a).unwrap();
            f.note_freed(a, size, s);
        }
        p.release_cached(&f).unwrap();
        assert!(p.moves_again_allowed());
        assert_eq!(p.release_all(&f), Ok(()));
    }
}

#[test]
fn a_chunk_moved_back_to_its_shadow_costs_no_driver_call_and_keeps_its_bytes() {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let (mut p, x, z) = moved_case(&f);
    // Written through z's first 30 pages: the memory that was x's pages 2..32.
    for k in 0..30 {
        assert!(f.write(z + k * PAGE, 1000 + k));
    }
    // Through the shadow the same memory shows (one physical allocation, two addresses).
    assert_eq!(f.read(x + 5 * PAGE), Some(1003));
    p.free(&f, z).unwrap();
    f.note_freed(z, 96 * MIB, 1);
    // 64 MiB on stream 0 again: x's pages are shadows of chunks now free (and idle on the
    // device) in stream 1's range, so they switch back: no driver call, no wait.
    let (maps, unmaps, syncs) = (f.map_calls(), f.unmap_calls(), f.syncs());
    let w = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    assert_eq!(w, x);
    assert_eq!(
        (
            f.map_calls() - maps,
            f.unmap_calls() - unmaps,
            f.syncs() - syncs
        ),
        (0, 0, 0)
    );
    assert_eq!(p.alias_counts(), (30, 30));
    // The next user of that memory at its first address sees what was written through z.
    for k in 0..30 {
        assert_eq!(f.read(w + (k + 2) * PAGE), Some(1000 + k), "page {k}");
    }
    // z's old pages are the shadows now; reserved is unchanged, and never counted twice.
    assert_eq!(p.shadow_count(), 30);
    assert_eq!(p.stats().reserved_bytes, 50 * PAGE);
    assert_eq!(f.mapped_bytes(), 50 * PAGE);
    check(&p);
    // Releasing the cache unmaps every address and frees each allocation once (the fake
    // asserts a second free); w keeps its 32 pages, each mapped at one address.
    p.release_cached(&f).unwrap();
    assert_eq!(p.shadow_count(), 0);
    assert_eq!(f.mapped_addresses(), 32);
    assert_eq!(f.mapped_bytes(), 32 * PAGE);
    assert_eq!(p.stats().reserved_bytes, 32 * PAGE);
    for k in 0..30 {
        assert_eq!(f.read(w + (k + 2) * PAGE), Some(1000 + k), "page {k}");
    }
    p.free(&f, w).unwrap();
    p.release_cached(&f).unwrap();
    assert_eq!((f.mapped_bytes(), f.mapped_addresses()), (0, 0));
    assert!(f.allocation_sizes().is_empty());
    assert_eq!(p.release_all(&f), Ok(()));
}

/// A shadow whose chunk is live elsewhere is never handed out: a block placed over it gets
/// memory of its own (the shadow is unmapped first), and writing it leaves the live block's
/// bytes alone.
#[test]
fn a_block_over_a_shadow_of_a_live_chunk_gets_its_own_memory() {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let (mut p, x, z) = moved_case(&f);
    for k in 0..48 {
        assert!(f.write(z + k * PAGE, 2000 + k));
    }
    let (maps, unmaps) = (f.map_calls(), f.unmap_calls());
    let w = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    assert_eq!(w, x);
    // z holds the chunks: nothing switches; the 30 shadows are unmapped and 30 pages mapped.
    assert_eq!(p.alias_counts(), (0, 30));
    assert_eq!(p.shadow_count(), 0);
    assert_eq!(f.unmap_calls() - unmaps, 30);
    assert!(f.map_calls() > maps);
    for k in 0..32 {
        assert!(f.write(w + k * PAGE, 3000 + k));
    }
    for k in 0..48 {
        assert_eq!(f.read(z + k * PAGE), Some(2000 + k), "z's page {k}");
    }
    assert_eq!(p.stats().reserved_bytes, 80 * PAGE);
    assert_eq!((f.mapped_bytes(), f.mapped_addresses()), (80 * PAGE, 80));
    check(&p);
    p.free(&f, w).unwrap();
    p.free(&f, z).unwrap();
    // Teardown with nothing released before: every allocation freed once, no address left.
    f.quiesce().unwrap();
    assert_eq!(p.release_all(&f), Ok(()));
    assert_eq!((f.mapped_bytes(), f.mapped_addresses()), (0, 0));
}

/// Switching which address of a chunk is live follows the rule of any reuse across streams:
/// z's block was freed on stream 1 and the device has not passed that free, so stream 0 may not
/// take its memory — no switch, no wait; the request maps pages of its own and the shadows
/// under it (which nothing queued uses) are unmapped.
#[test]
fn a_chunk_the_device_may_still_use_is_not_switched() {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let (mut p, x, z) = moved_case(&f);
    assert!(f.write(z, 7));
    p.free(&f, z).unwrap();
    f.note_freed(z, 96 * MIB, 1);
    f.state_mut().idle_device = false;
    let (maps, unmaps, syncs) = (f.map_calls(), f.unmap_calls(), f.syncs());
    let w = p.alloc(&f, 64 * MIB, st(0)).unwrap();
    assert_eq!(w, x);
    assert_eq!(p.alias_counts(), (0, 30));
    assert_eq!(f.syncs() - syncs, 0);
    assert_eq!(f.unmap_calls() - unmaps, 30);
    assert!(f.map_calls() > maps);
    // Fresh memory under w's moved part: not what z's user wrote.
    assert_eq!(f.read(w + 2 * PAGE), None);
    assert_eq!(f.read(z), Some(7));
    assert_eq!(p.stats().reserved_bytes, f.mapped_bytes());
    check(&p);
    p.free(&f, w).unwrap();
    f.quiesce().unwrap();
    p.release_cached(&f).unwrap();
    assert_eq!((f.mapped_bytes(), f.mapped_addresses()), (0, 0));
    assert_eq!(p.release_all(&f), Ok(()));
}

/// A recorded training step replayed three times on the recording fake with aliases on and
/// moves unlimited (chunks move in every pass, as aliases): a word is written at the start,
/// the end and every page edge of each block, and read back before it is freed — a block handed
/// memory that is live elsewhere, or a switch from under a live block, changes another block's
/// words. The pool stays valid after every pass; at the end every address is unmapped and every
/// allocation freed once.
#[test]
fn a_training_trace_with_aliases_keeps_every_blocks_bytes() {
    use super::replay::{load_trace, Ev};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/traces/bert_train.trace.gz"
    );
    let (evs, unfreed) = load_trace(path);
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = Pool::new(PoolConfig {
        page_aliases: true,
        alias_moves_again: true,
        recycle_time_permille: 1000,
        // The fake's clock stands still: markers by count alone, so freed blocks become known
        // idle (the idle device passes them) and chunks may switch back.
        marker_min_interval_ns: 0,
        ..PoolConfig::default()
    });
    let points = |addr: u64, size: u64| {
        let mut v = vec![addr];
        v.extend((addr / PAGE + 1..(addr + size).div_ceil(PAGE)).map(|k| k * PAGE));
        v.push(addr + size - 8);
        v
    };
    let mut addr = vec![0u64; evs.len()];
    let mut checked = 0u64;
    for pass in 0..3u64 {
        let stamp = |i: u32, k: usize| (pass << 56) ^ ((i as u64) << 16) ^ k as u64;
        for e in &evs {
            match *e {
                Ev::A(i, bytes, s) => {
                    let a = p.alloc(&f, bytes, st(s)).unwrap();
                    addr[i as usize] = a;
                    for (k, x) in points(a, p.block_size(a).unwrap()).into_iter().enumerate() {
                        assert!(f.write(x, stamp(i, k)), "block {i} unmapped at {x:#x}");
                    }
                }
                Ev::F(i) => {
                    let a = addr[i as usize];
                    for (k, x) in points(a, p.block_size(a).unwrap()).into_iter().enumerate() {
                        assert_eq!(f.read(x), Some(stamp(i, k)), "pass {pass}: block {i}");
                        checked += 1;
                    }
                    p.free(&f, a).unwrap();
                }
            }
        }
        for &i in &unfreed {
            p.free(&f, addr[i as usize]).unwrap();
        }
        check(&p);
        assert_eq!(p.stats().reserved_bytes, f.mapped_bytes());
    }
    // (Chunks are aliased every pass; on this fake, whose markers complete only as they are
    // polled, none is seen idle in time to switch back — the switch with its bytes is tested
    // above.)
    assert!(p.alias_counts().1 > 100, "{:?}", p.alias_counts());
    assert!(checked > 10_000);
    p.release_cached(&f).unwrap();
    assert_eq!((f.mapped_bytes(), f.mapped_addresses()), (0, 0));
    assert_eq!(p.release_all(&f), Ok(()));
}
