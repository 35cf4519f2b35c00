//! The pool's memory history (`crate::memory::history`): the owner label allocations carry, and
//! the events recorded when the history is on — one branch per operation when it is off.

use super::Pool;
use crate::memory::history::{Action, History, HistorySlot};

impl Pool {
    /// The label that allocations carry from now on (until changed): who they belong to, for
    /// snapshots and the history. The pool does not interpret it; 0 means unknown.
    #[inline]
    pub fn set_owner(&mut self, label: u32) {
        self.owner = label;
    }

    /// Switches the history on with room for `capacity` events (a new, empty ring), or off
    /// with 0.
    pub fn record_history(&mut self, capacity: usize) {
        self.history = HistorySlot((capacity > 0).then(|| Box::new(History::new(capacity))));
    }

    pub fn history(&self) -> Option<&History> {
        self.history.0.as_deref()
    }

    /// Records an event in the history, if it is on (one branch when it is off).
    #[inline(always)]
    pub fn note(&mut self, action: Action, addr: u64, size: u64, stream: u32) {
        if let Some(h) = self.history.0.as_deref_mut() {
            h.record(action, addr, size, self.owner, stream);
        }
    }

    /// Records an event about block `idx` (its address, size, label and stream).
    #[inline(always)]
    pub(super) fn note_block(&mut self, action: Action, idx: u32) {
        if let Some(h) = self.history.0.as_deref_mut() {
            let b = &self.blocks[idx];
            let stream = self.streams[b.owner as usize].stream.0;
            h.record(action, b.addr, b.size, b.fnext, stream);
        }
    }

    /// Records an event about the live block at `addr` (the caller's swap, say), if it is on.
    pub fn note_live(&mut self, action: Action, addr: u64) {
        if self.history.0.is_some() {
            if let Some(i) = self.live.get(addr) {
                self.note_block(action, i);
            }
        }
    }
}
