//! Lanes (`stream.rs`): a stream's lasting blocks in a range of their own, so that its working
//! range empties between epochs and follows their plans.

use super::epochs::{epoch, idle_pool, SIZES};
use super::*;

/// A graph's persistent tensors held across its runs: in the lasting lane they leave the working
/// range empty at each run's end, and the runs follow the plan of the run before — which one
/// such block in the working range stops (`a_range_that_never_empties_plans_nothing`).
#[test]
fn lasting_blocks_leave_the_working_range_to_its_epochs() {
    let (mut p, f) = idle_pool();
    let weights = p.alloc_in(&f, 4 * MIB, st(0), Lane::Lasting).unwrap();
    let first = epoch(&mut p, &f, &SIZES);
    let second = epoch(&mut p, &f, &SIZES);
    let third = epoch(&mut p, &f, &SIZES);
    assert_eq!(p.epoch_counts(), (2, 0));
    assert_eq!(second, third);
    assert_ne!(first, second, "the first epoch was placed online");
    // The weights are the stream's, in a range apart from every working block.
    let info = p.block_info(weights).unwrap();
    assert_eq!((info.stream, info.size), (st(0), 4 * MIB));
    for (&a, &s) in third.iter().zip(&SIZES) {
        assert!(
            a + s <= weights || a >= weights + 4 * MIB,
            "{a:#x} overlaps"
        );
    }
    let ranges = p.segs.iter().filter(|s| s.pages.is_some()).count();
    assert_eq!(ranges, 2, "one range per lane");
    // Freed with the stream's own id, as any of its blocks.
    assert!(p.free_if_owned(&f, weights, 0, st(0), Some(4 * MIB)));
    check(&p);
}

/// The lasting lane makes no epochs (its blocks outlast them); a stream of plain segments
/// (`set_new_stream_growth`), which has no epochs either, keeps one lane.
#[test]
fn only_a_stream_of_virtual_memory_has_a_lasting_lane() {
    let f = Fake::virtual_memory();
    let mut p = vpool(1 << 30);
    assert!(p.set_new_stream_growth(st(3), false));
    let a = p.alloc_in(&f, MIB, st(3), Lane::Lasting).unwrap();
    let b = p.alloc_in(&f, MIB, st(4), Lane::Lasting).unwrap();
    let ix = |p: &Pool, s: u32, lane| p.stream_index[&stream::lane_key(st(s), lane)];
    assert_eq!(ix(&p, 3, Lane::Lasting), ix(&p, 3, Lane::Working));
    assert_ne!(ix(&p, 4, Lane::Lasting), ix(&p, 4, Lane::Working));
    assert_eq!(p.segs.iter().filter(|s| s.pages.is_some()).count(), 1);
    let lasting = ix(&p, 4, Lane::Lasting);
    assert_eq!(
        p.streams[lasting as usize].epochs.mode,
        crate::memory::pool::epochs::Mode::Off
    );
    let working = ix(&p, 4, Lane::Working);
    assert_ne!(
        p.streams[working as usize].epochs.mode,
        crate::memory::pool::epochs::Mode::Off
    );
    for x in [a, b] {
        p.free(&f, x).unwrap();
    }
    check(&p);
    // A pool of plain segments whose stream was made to grow by a virtual range (as the
    // runtime does for raw calls): its lasting lane has a range too.
    let mut p = Pool::new(PoolConfig {
        vmm: false,
        ..PoolConfig::default()
    });
    assert!(p.set_new_stream_growth(st(5), true));
    let c = p.alloc_in(&f, MIB, st(5), Lane::Lasting).unwrap();
    let d = p.alloc(&f, MIB, st(5)).unwrap();
    assert_eq!(p.segs.iter().filter(|s| s.pages.is_some()).count(), 2);
    for x in [c, d] {
        p.free(&f, x).unwrap();
    }
    check(&p);
}

/// Under the memory limit, pages a freed lasting block held serve the working lane: recycling
/// moves free pages between every range, lanes included.
#[test]
fn a_freed_lasting_block_makes_room_for_working_ones() {
    let f = Fake::virtual_memory();
    f.state_mut().idle_device = true;
    let mut p = vpool(64 * MIB);
    let weights = p.alloc_in(&f, 48 * MIB, st(0), Lane::Lasting).unwrap();
    assert!(p.alloc(&f, 32 * MIB, st(0)).is_err(), "over the limit");
    p.free(&f, weights).unwrap();
    let x = p.alloc(&f, 48 * MIB, st(0)).unwrap();
    assert!(f.covers(x, 48 * MIB));
    assert!(p.stats().reserved_bytes <= 64 * MIB);
    p.free(&f, x).unwrap();
    check(&p);
}

/// A block pending on an event goes only to a request of its own lane: a lasting request
/// given a working-lane block would hold it in the working range for good (session 28's
/// leftover: the executor's out-of-memory path asked for one in either lane).
#[test]
fn a_pending_block_goes_only_to_a_request_of_its_own_lane() {
    let (mut p, f) = idle_pool();
    let w = p.alloc(&f, 4 * MIB, st(0)).unwrap();
    let l = p.alloc_in(&f, 4 * MIB, st(0), Lane::Lasting).unwrap();
    p.free_after_event(&f, w, EventId(1)).unwrap();
    assert_eq!(p.take_pending_in(4 * MIB, st(0), Lane::Lasting), None);
    p.free_after_event(&f, l, EventId(2)).unwrap();
    assert_eq!(
        p.take_pending_in(4 * MIB, st(0), Lane::Lasting),
        Some((l, EventId(2)))
    );
    assert_eq!(p.take_pending(4 * MIB, st(0)), Some((w, EventId(1))));
    for x in [w, l] {
        p.free(&f, x).unwrap();
    }
    check(&p);
}
