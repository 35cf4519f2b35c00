//! Teardown: a released graph's queued work finishes, then its memory goes back to the pools.

use super::{Replay, RuntimeGraph};
use crate::device::DevPtr;
use crate::memory::{DeviceBacking, PinnedBacking};
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
        let arena = self.arena.as_mut().and_then(|(_, base)| base.take());
        for event in self.profile.events() {
            let _ = rt.device.destroy_event(event);
        }
        let mut blocks: Vec<DevPtr> = arena.into_iter().collect();
        for m in &mut self.mem {
            for event in m.take_events() {
                let _ = rt.device.destroy_event(event);
            }
            let (device, host) = m.discard();
            blocks.extend(device);
            if let Some(slot) = host {
                if let Err(e) = st.pinned.free(&PinnedBacking(rt.device()), slot) {
                    log::error!("releasing a graph's host slot: {e}");
                }
            }
        }
        for ptr in blocks {
            if let Err(e) = st.pool.free(&DeviceBacking(rt.device()), ptr) {
                log::error!("releasing a graph's tensor: {e}");
            }
        }
        // Blocks freed pending on this graph's (now destroyed, completed) events are free.
        for event in st.pool.pending_events() {
            st.pool.assume_complete(event);
        }
        for event in st.pinned.pending_events() {
            st.pinned.assume_complete(event);
        }
    }
}
