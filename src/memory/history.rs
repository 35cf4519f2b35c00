//! The bounded history of a pool's events (allocations, frees, segments and pages, out of
//! memory, swaps) for memory snapshots (`runtime/snapshot/`).
//!
//! Owns: a fixed ring of [`Event`]s, allocated once when recording is switched on, and the
//! clock they are stamped with. Recording an event is a few stores and a time-stamp counter
//! read — no allocation, no lock (the pool's owner holds the runtime's state lock), nothing at
//! all when recording is off (the pool keeps `None`). When the ring is full the oldest event is
//! overwritten, as PyTorch's `max_entries` does.
//!
//! What an event's `label` means is the runtime's business (a tensor, a workspace, a raw
//! allocation; `runtime/snapshot/labels.rs`): this layer only carries it.

use std::time::Instant;

/// What happened, named as PyTorch's memory snapshots name it (`Action::name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Action {
    Alloc,
    /// The owner freed the block; its memory is reusable once `FreeCompleted` follows (at once
    /// for a stream-ordered free, after an event for a free pending on a copy).
    FreeRequested,
    FreeCompleted,
    /// A plain segment taken from the device.
    SegmentAlloc,
    SegmentFree,
    /// Pages mapped into (unmapped from) a virtual range.
    SegmentMap,
    SegmentUnmap,
    /// An allocation the pool could not serve (`size` is the request).
    Oom,
    /// A tensor copied to its pinned host slot (`addr`: the device block it left).
    SwapOut,
    /// A tensor copied back from the host (`addr`: the device block it came to).
    SwapIn,
}

impl Action {
    /// The `action` string of PyTorch's trace entries; the two swap actions are gkrt's own
    /// (PyTorch's text tools print entries they do not know as they are).
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::SwapOut => "swap_out",
            Action::SwapIn => "swap_in",
        }
    }
}

/// One recorded event: 40 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Clock ticks (`History::nanos` converts).
    pub ticks: u64,
    pub addr: u64,
    pub size: u64,
    /// Who the memory belongs to (the runtime's label; 0: unknown).
    pub label: u32,
    /// The stream's id as the device numbers it.
    pub stream: u32,
    pub action: Action,
}

/// The ring of the last `capacity` events.
#[derive(Debug)]
pub struct History {
    ring: Vec<Event>,
    /// Where the next event goes.
    next: usize,
    /// Events recorded so far (more than the ring holds once it wrapped).
    recorded: u64,
    clock: Clock,
}

impl History {
    /// A ring of `capacity` events (at least 1), allocated now.
    pub fn new(capacity: usize) -> History {
        let capacity = capacity.max(1);
        let blank = Event {
            ticks: 0,
            addr: 0,
            size: 0,
            label: 0,
            stream: 0,
            action: Action::Alloc,
        };
        History {
            ring: vec![blank; capacity],
            next: 0,
            recorded: 0,
            clock: Clock::start(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.ring.len()
    }

    /// Events recorded since the ring was made, including those overwritten since.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    #[inline(always)]
    pub fn record(&mut self, action: Action, addr: u64, size: u64, label: u32, stream: u32) {
        let at = self.next;
        // `next` stays below the ring's length (wrapped below).
        self.ring[at] = Event {
            ticks: ticks(),
            addr,
            size,
            label,
            stream,
            action,
        };
        self.next = if at + 1 == self.ring.len() { 0 } else { at + 1 };
        self.recorded += 1;
    }

    /// The events held, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        let held = (self.recorded as usize).min(self.ring.len());
        let start = if held < self.ring.len() { 0 } else { self.next };
        (0..held).map(move |k| &self.ring[(start + k) % self.ring.len()])
    }

    /// Nanoseconds since the Unix epoch of an event's ticks (PyTorch's `time_us` is wall time).
    pub fn nanos(&self, ticks: u64) -> u64 {
        self.clock.nanos(ticks)
    }
}

/// The pool's optional history: a `Pool` is cloned for dry runs, and a clone records nothing.
#[derive(Debug, Default)]
pub struct HistorySlot(pub Option<Box<History>>);

impl Clone for HistorySlot {
    fn clone(&self) -> Self {
        HistorySlot(None)
    }
}

/// Ticks → wall-clock nanoseconds: the time-stamp counter where there is one (a few ns to
/// read, where `Instant::now` costs tens of ns under some sandboxes), calibrated against the
/// system clock between the ring's start and the moment of conversion.
#[derive(Debug)]
struct Clock {
    ticks0: u64,
    instant0: Instant,
    wall0_ns: u64,
}

impl Clock {
    fn start() -> Clock {
        let wall0_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Clock {
            ticks0: ticks(),
            instant0: Instant::now(),
            wall0_ns,
        }
    }

    fn nanos(&self, t: u64) -> u64 {
        let elapsed_ns = self.instant0.elapsed().as_nanos() as f64;
        let elapsed_ticks = ticks().wrapping_sub(self.ticks0) as f64;
        let per_tick = if elapsed_ticks > 0.0 {
            elapsed_ns / elapsed_ticks
        } else {
            1.0
        };
        let since = t.saturating_sub(self.ticks0) as f64 * per_tick;
        self.wall0_ns + since as u64
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ticks() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn ticks() -> u64 {
    static START: once_cell::sync::Lazy<Instant> = once_cell::sync::Lazy::new(Instant::now);
    START.elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_events_oldest_first() {
        let mut h = History::new(3);
        for k in 0..5u64 {
            h.record(Action::Alloc, k, 10 * k, k as u32, 0);
        }
        assert_eq!(h.recorded(), 5);
        let addrs: Vec<u64> = h.events().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![2, 3, 4]);
        let times: Vec<u64> = h.events().map(|e| h.nanos(e.ticks)).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    }

    #[test]
    fn a_ring_not_yet_full_holds_what_was_recorded() {
        let mut h = History::new(8);
        h.record(Action::Oom, 0, 64, 0, 1);
        h.record(Action::SwapOut, 512, 64, 7, 2);
        let ev: Vec<(Action, u32)> = h.events().map(|e| (e.action, e.label)).collect();
        assert_eq!(ev, vec![(Action::Oom, 0), (Action::SwapOut, 7)]);
    }

    #[test]
    fn a_cloned_slot_records_nothing() {
        let slot = HistorySlot(Some(Box::new(History::new(4))));
        assert!(slot.clone().0.is_none());
    }
}
