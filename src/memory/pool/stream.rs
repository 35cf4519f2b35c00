//! Per-stream state: each stream the pool serves has one [`StreamState`] per [`Lane`] it uses
//! (its free indexes, its virtual range, its marker events), found from the stream id and lane
//! through a fast hash map and a one-entry cache of the latest allocation's.

use std::hash::{BuildHasherDefault, Hasher};

use super::cold_set::ColdSet;
use super::epochs::Epochs;
use super::tlsf::{Classes, NIL};
use super::{Pool, PoolBacking, PoolError};
use crate::device::{EventId, StreamId};

/// Multiplicative hashing for the map from stream id to stream state (and any other integer
/// keys): one 128-bit multiply, both halves folded, so keys that differ only in high bits still
/// spread. Live blocks are found by address through `addr_map.rs`, which hashes on its own.
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let m = (self.0 as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (m as u64) ^ ((m >> 64) as u64)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = self.0.rotate_left(32) ^ x;
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }
}

pub(super) type FastHash = BuildHasherDefault<AddrHasher>;

/// Which of a stream's two sets of blocks an allocation joins. Blocks that outlast the stream's
/// epochs — a graph's persistent tensors, held from one run to the next — go in the `Lasting`
/// lane: a range (and free lists) of their own, so the `Working` lane's range can empty between
/// runs and its runs follow epoch plans over an empty floor (`epochs.rs`: nothing counted per
/// operation, the whole range the plan's) rather than around blocks held for good. Both lanes order their blocks by the same device stream (their markers are recorded on
/// it), so reuse within either is the stream's own; the lasting lane makes no epochs. A stream
/// of plain segments (no virtual range, so no epochs) has one lane: its lasting blocks join the
/// working ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Lane {
    #[default]
    Working,
    Lasting,
}

/// The key of a lane's state in `Pool::stream_index`: the stream id, the lane above it.
#[inline(always)]
pub(super) fn lane_key(stream: StreamId, lane: Lane) -> u64 {
    stream.0 as u64 | (lane as u64) << 32
}

/// The state of one stream the pool serves: its free indexes, its virtual range, its marker
/// events — one per lane the stream uses. Throughout the pool `si` is a stream lane's index in
/// `Pool::streams`, and a block's `owner` is the `si` of the lane it belongs to.
#[derive(Clone, Debug)]
pub(super) struct StreamState {
    pub(super) stream: StreamId,
    pub(super) warm: [Classes; 3],
    /// Free blocks of the range with unmapped pages: (size, addr, block), in that order.
    pub(super) cold: ColdSet,
    /// Segment index of the stream's virtual range, or NIL.
    pub(super) range: u32,
    /// Reserving a range failed: use plain segments from now on.
    pub(super) range_failed: bool,
    /// Grow by virtual ranges (`config.vmm`, or `set_new_stream_growth`) rather than segments.
    pub(super) virtual_growth: bool,
    /// Marker events in flight on the stream, oldest first, with their epochs; and completed
    /// ones kept for re-recording.
    pub(super) markers: std::collections::VecDeque<(EventId, u64)>,
    pub(super) spare_markers: Vec<EventId>,
    /// Frees on this stream with a smaller epoch are known done on the device.
    pub(super) safe_epoch: u64,
    /// Frees since the last marker.
    pub(super) frees: u32,
    /// When `note_free` last recorded a marker.
    pub(super) last_marker: Option<std::time::Instant>,
    /// Spin opportunities to skip after consecutive misses (backoff), and the current streak.
    pub(super) spin_skip: u32,
    pub(super) spin_misses: u32,
    /// The range's epochs: the log being recorded, the plan being followed (`epochs.rs`).
    pub(super) epochs: Epochs,
    /// A start-up move placed pages in this stream's range (`PoolConfig::startup_moves`).
    pub(super) moved_at_start: bool,
}

/// The pool's stream states, indexed by `si`. Lookups are not bounds-checked in release builds:
/// every `si` comes from `stream_ix` (below) and states are only ever added — the type offers
/// `push` and no way to remove one — so it stays below the length (debug builds check). One or
/// two come with every operation (callgrind, session 14: with the slab's and the size classes'
/// checks, a fifth of an alloc/free pair's instructions).
#[derive(Clone, Debug, Default)]
pub(super) struct Streams(Vec<StreamState>);

impl Streams {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn push(&mut self, state: StreamState) {
        self.0.push(state);
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, StreamState> {
        self.0.iter()
    }
}

impl std::ops::Index<usize> for Streams {
    type Output = StreamState;
    #[inline(always)]
    fn index(&self, si: usize) -> &StreamState {
        debug_assert!(si < self.0.len(), "stream index {si} out of range");
        // SAFETY: `si` came from `stream_ix`, and states are never removed.
        unsafe { self.0.get_unchecked(si) }
    }
}

impl std::ops::IndexMut<usize> for Streams {
    #[inline(always)]
    fn index_mut(&mut self, si: usize) -> &mut StreamState {
        debug_assert!(si < self.0.len(), "stream index {si} out of range");
        // SAFETY: as in `index`.
        unsafe { self.0.get_unchecked_mut(si) }
    }
}

impl<'a> IntoIterator for &'a Streams {
    type Item = &'a StreamState;
    type IntoIter = std::slice::Iter<'a, StreamState>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a mut Streams {
    type Item = &'a mut StreamState;
    type IntoIter = std::slice::IterMut<'a, StreamState>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut()
    }
}

impl Pool {
    /// `alloc` in `stream`'s `lane`: `Lane::Lasting` for a block held across the stream's epochs
    /// (a graph's persistent tensor), so that the working lane's range can empty between them.
    pub fn alloc_in(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
        lane: Lane,
    ) -> Result<u64, PoolError> {
        self.lane = lane;
        let r = self.alloc_tagged(backing, bytes, stream, 0);
        self.lane = Lane::Working;
        r
    }

    /// `alloc_no_wait` in `stream`'s `lane` (`alloc_in`).
    pub fn alloc_no_wait_in(
        &mut self,
        backing: &dyn PoolBacking,
        bytes: u64,
        stream: StreamId,
        lane: Lane,
    ) -> Result<u64, PoolError> {
        self.no_device_waits = true;
        let r = self.alloc_in(backing, bytes, stream, lane);
        self.no_device_waits = false;
        r
    }

    /// How a stream the pool has not seen yet will grow: by a virtual range (where the backing
    /// has virtual memory) or by plain segments, whatever `config.vmm` says for other streams.
    /// A stream the pool already serves keeps its way (false is returned).
    #[inline]
    pub fn set_new_stream_growth(&mut self, stream: StreamId, virtual_ranges: bool) -> bool {
        if self
            .stream_index
            .contains_key(&lane_key(stream, Lane::Working))
        {
            return false;
        }
        let si = self.stream_ix(stream, Lane::Working);
        self.streams[si as usize].virtual_growth = virtual_ranges;
        true
    }

    /// The `si` of `stream`'s `lane`, its state made on first use. Forced inline: nearly every
    /// allocation repeats the latest one's stream and lane, checked here without a call.
    #[inline(always)]
    pub(super) fn stream_ix(&mut self, stream: StreamId, lane: Lane) -> u32 {
        let key = lane_key(stream, lane);
        if self.last_stream.0 == key && self.last_stream.1 != NIL {
            return self.last_stream.1;
        }
        self.stream_ix_other(stream, lane)
    }

    /// `stream_ix` for a stream or lane other than the latest allocation's.
    #[inline(never)]
    pub(super) fn stream_ix_other(&mut self, stream: StreamId, lane: Lane) -> u32 {
        let key = lane_key(stream, lane);
        if let Some(&s) = self.stream_index.get(&key) {
            self.last_stream = (key, s);
            return s;
        }
        if lane == Lane::Lasting {
            // Only a stream that grows by a virtual range has epochs to keep its range free
            // for: one of plain segments keeps its lasting blocks with the rest, where they
            // cost no segment of their own.
            let working = self.stream_ix(stream, Lane::Working);
            if !self.streams[working as usize].virtual_growth {
                self.stream_index.insert(key, working);
                self.last_stream = (key, working);
                return working;
            }
        }
        // (A lasting lane comes here only beside a working lane of virtual ranges: so it grows.)
        let virtual_growth = lane == Lane::Lasting || self.config.vmm;
        let epochs = lane == Lane::Working && self.config.epoch_plans && !self.config.page_aliases;
        let s = self.streams.len() as u32;
        self.streams.push(StreamState {
            stream,
            warm: Default::default(),
            cold: ColdSet::new(),
            range: NIL,
            range_failed: false,
            virtual_growth,
            markers: Default::default(),
            spare_markers: Vec::new(),
            safe_epoch: 1,
            frees: 0,
            last_marker: None,
            spin_skip: 0,
            spin_misses: 0,
            epochs: Epochs::new(
                epochs,
                epochs && self.config.period_plans,
                self.config.step_lived_low,
            ),
            moved_at_start: false,
        });
        self.stream_index.insert(key, s);
        self.last_stream = (key, s);
        s
    }
}
