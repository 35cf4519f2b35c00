//! Teardown: a released graph's queued work finishes, then its memory goes back to the pools.

use super::{Replay, RuntimeGraph};
use crate::exec::StoreAccess;
use std::sync::Arc;

impl Drop for RuntimeGraph {
    fn drop(&mut self) {
        let rt = Arc::clone(&self.runtime);
        // The lock first: a run of another graph in another thread owns the streams' errors
        // until it has collected them (draining outside the lock took a failing callback's
        // status from under such a run, which then reported success).
        let mut st = rt.lock();
        let st = &mut *st;
        let _ = rt.drain();
        if let Replay::Captured(exec_graph) = self.replay {
            let _ = rt.device.destroy_graph(exec_graph);
        }
        for (_, exec_graph) in self.replay_cache.drain(..) {
            let _ = rt.device.destroy_graph(exec_graph);
        }
        if let Some(events) = self.async_events.take() {
            let _ = rt.device.destroy_event(events.fork);
            let _ = rt.device.destroy_event(events.done);
        }
        for event in self.profile.events() {
            let _ = rt.device.destroy_event(event);
        }
        for event in self.collective_events.drain(..).flatten() {
            let _ = rt.device.destroy_event(event);
        }
        if self.store.label_base() != 0 {
            st.labels.unregister(self.store.label_base());
        }
        self.store.release(StoreAccess {
            device: rt.device(),
            stream: rt.compute,
            pool: &mut st.pool,
            pinned: &mut st.pinned,
        });
    }
}
