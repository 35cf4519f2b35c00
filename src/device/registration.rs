//! Registering device memory with communicators (`ncclCommRegister`): the ranges of device
//! memory that live — segments, mapped virtual-memory pages — and the communicators of the
//! device that register them. A backend reports a range after allocating it (`added`) and before
//! freeing it (`removing`); a communicator `attach`es when it is made and registers every range
//! alive then, and every range added after. So every registered range is deregistered before its
//! memory goes, for every communicator, whichever came first.
//!
//! The cost is paid per segment or page (rare: the pool hands out blocks of them), never per
//! block; with no communicator `added`/`removing` only update the map of ranges.

use super::DevPtr;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

/// What memory is registered with: a communicator. Failures are the implementor's to log —
/// registration only makes collectives on the memory faster, it is never required.
pub trait Registrable: Send + Sync {
    fn register(&self, addr: DevPtr, bytes: u64);
    /// Deregisters the range registered at `addr` (a no-op if there is none).
    fn deregister(&self, addr: DevPtr);
}

#[derive(Default)]
struct State {
    ranges: BTreeMap<DevPtr, u64>,
    comms: Vec<Weak<dyn Registrable>>,
}

/// A device's live ranges and its communicators (see the module comment).
#[derive(Default)]
pub struct Registrations {
    state: Mutex<State>,
}

impl Registrations {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `bytes` at `addr` were allocated: every communicator registers them.
    pub fn added(&self, addr: DevPtr, bytes: u64) {
        let mut st = self.lock();
        st.ranges.insert(addr, bytes);
        st.comms.retain(|c| c.strong_count() > 0);
        for c in st.comms.iter().filter_map(Weak::upgrade) {
            c.register(addr, bytes);
        }
    }

    /// The range at `addr` is about to be freed: every communicator deregisters it first.
    pub fn removing(&self, addr: DevPtr) {
        let mut st = self.lock();
        if st.ranges.remove(&addr).is_none() {
            return;
        }
        for c in st.comms.iter().filter_map(Weak::upgrade) {
            c.deregister(addr);
        }
    }

    /// A new communicator: it registers every live range now, and later ones as they come. It
    /// leaves the list when it is dropped (and deregisters its ranges itself then).
    pub fn attach(&self, comm: &Arc<dyn Registrable>) {
        let mut st = self.lock();
        for (&addr, &bytes) in &st.ranges {
            comm.register(addr, bytes);
        }
        st.comms.retain(|c| c.strong_count() > 0);
        st.comms.push(Arc::downgrade(comm));
    }
}

#[cfg(test)]
impl Registrations {
    /// Communicators attached and still alive.
    pub fn communicators(&self) -> usize {
        self.lock()
            .comms
            .iter()
            .filter(|c| c.strong_count() > 0)
            .count()
    }
}
