//! Teardown: a released graph's queued work finishes, then its memory goes back to the pools.

use super::{Replay, RuntimeGraph};
use crate::exec::StoreAccess;
use std::sync::Arc;

impl Drop for RuntimeGraph {
    fn drop(&mut self) {
        let rt = Arc::clone(&self.runtime);
        let _ = rt.drain();
        if let Replay::Captured(exec_graph) = self.replay {
            let _ = rt.device.destroy_graph(exec_graph);
        }
        let mut st = rt.lock();
        let st = &mut *st;
        for event in self.profile.events() {
            let _ = rt.device.destroy_event(event);
        }
        self.store.release(StoreAccess {
            device: rt.device(),
            stream: rt.compute,
            pool: &mut st.pool,
            pinned: &mut st.pinned,
        });
    }
}
