//! Tests of the caching pool, by concern — plain segments (`plain.rs`), virtual ranges
//! (`virtual_ranges.rs`), physical allocations that grow with the heap and the time budget of
//! page moves (`granularity.rs`), random sequences against a model (`random.rs`), the trace replay
//! (`replay.rs`, its traces read by `trace_file.rs`) and what each rule does on the traces that
//! asked for it (`replay_rules.rs`) — all over one configurable fake backing (`fake.rs`).

mod aliases;
mod dry_run_pending;
mod empty_range_moves;
mod epoch_fragments;
mod epochs;
mod fake;
mod granularity;
mod hold_markers;
mod lanes;
mod layout_dump;
mod majority_moves;
mod own_stream_moves;
mod pending_fit;
mod periods;
mod placement;
mod plain;
mod random;
pub(crate) mod replay;
mod replay_host;
mod replay_rules;
mod short_lived;
mod step_lived;
mod tail_first;
mod tight_peaks;
mod trace_file;
mod virtual_ranges;

use super::*;
use fake::{Fake, FakeConfig, PAGE};

const KIB: u64 = 1 << 10;

fn st(n: u32) -> StreamId {
    StreamId(n)
}

fn pool() -> Pool {
    Pool::new(PoolConfig::default())
}

fn limited(limit: u64) -> Pool {
    Pool::new(PoolConfig {
        memory_limit: limit,
        ..PoolConfig::default()
    })
}

fn check(p: &Pool) {
    if let Err(e) = p.validate() {
        panic!("pool invariant broken: {e}");
    }
}

fn vpool(limit: u64) -> Pool {
    Pool::new(PoolConfig {
        memory_limit: limit,
        vmm_reserve_bytes: 4 << 30,
        vmm_page_bytes: PAGE,
        // The slack rule unthrottled (the fake's clock stands still); `move_budget` tests set it.
        recycle_time_permille: 1000,
        ..PoolConfig::default()
    })
}

/// Frees a 64 MiB block `x` below a live one of 64 MiB, its pages maybe still in use on the
/// device, then asks for 96 MiB: that does not fit x's hole, and mapping 96 new MiB would put 64
/// MiB more behind the high-water mark than the slack allows (from an empty pool: 224 MiB for a
/// mark of 160), so x's pages move if the pool may wait for the device. Returns the 96 MiB block.
fn larger_than_a_busy_hole(f: &Fake, p: &mut Pool) -> u64 {
    let x = p.alloc(f, 64 * MIB, st(0)).unwrap();
    let _y = p.alloc(f, 64 * MIB, st(0)).unwrap();
    p.free(f, x).unwrap();
    f.note_freed(x, 64 * MIB, 0);
    let z = p.alloc(f, 96 * MIB, st(0)).unwrap();
    assert!(f.covers(z, 96 * MIB));
    z
}

#[test]
fn a_block_record_is_one_cache_line() {
    assert_eq!(std::mem::size_of::<Block>(), 64);
    assert_eq!(std::mem::align_of::<Block>(), 64);
}
