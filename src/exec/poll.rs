//! Blocks pending on copy-outs given back as the device finishes the copies, polled by the
//! executor oldest first (`GKRT_EXEC_POLL_IN_ORDER`, on by default) in swapping runs without a
//! release schedule.
//!
//! The pool left to itself polls every pending block's event before every allocation (it holds
//! no order among them): on the GPT-2 shape that is a dozen event queries a node, thousands a
//! step, each a driver call. The copy-outs run in order on their stream, so the executor asks
//! only from the oldest copy not yet seen done and stops at the first still running: every
//! newer one is running too, and every older one is done without asking. The pool then holds
//! its events (`Pool::hold_events`) and the blocks come back at the same allocations as before;
//! events the executor did not record (a collective's) are polled one by one as the pool did.

use super::Executor;
use crate::device::EventId;

impl Executor<'_> {
    /// Before an allocation: every block pending on a copy the device has finished goes back.
    pub(super) fn poll_copies(&mut self) {
        if !self.poll_in_order || self.pool.pending_free_blocks() == 0 {
            return;
        }
        let mut events: Vec<EventId> = self.pool.pending_events();
        // Oldest first per copy stream; events of no copy stream after them.
        events.sort_by_key(|&e| match self.order.copy_record(e) {
            Some((s, k)) => (0, s as u8, k),
            None => (1, 0, 0),
        });
        let mut running = [false; 2];
        for e in events {
            let done = match self.order.copy_record(e) {
                Some((s, _)) if running[s as usize] => continue,
                Some((s, _)) => {
                    let done = self.order.known_done(e) || self.event_done(e);
                    running[s as usize] = !done;
                    if done {
                        self.order.saw_done(e);
                    }
                    done
                }
                None => self.event_done(e),
            };
            if done {
                self.pool.assume_complete(e);
            }
        }
    }

    /// Whether `event` has completed (an event the device no longer knows guards nothing).
    fn event_done(&mut self, event: EventId) -> bool {
        self.counters.events_polled += 1;
        self.device.event_query(event).unwrap_or(true)
    }
}
