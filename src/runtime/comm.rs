//! Communicators as the runtime hands them out: a rank's `Communicator` of the runtime's device,
//! kept with that runtime (a graph's collective nodes run on the runtime the communicator was
//! made on).

use super::{Error, Result, Runtime};
use crate::device::comm::{CommOptions, Communicator, UniqueId, UNIQUE_ID_BYTES};
use std::sync::Arc;
use std::time::Duration;

/// How long a rank waits for the others (to join, to reach a collective) when the caller gives
/// no timeout: long enough for any real step, short enough that a job does not hang for good.
pub(crate) const DEFAULT_COMM_TIMEOUT_MS: u32 = 300_000;

pub struct Comm {
    runtime: Arc<Runtime>,
    inner: Arc<dyn Communicator>,
}

impl Comm {
    /// Joins the communicator of `id` as `rank` of `nranks` on `runtime`'s device, waiting (at
    /// most `timeout_ms`, 0 = [`DEFAULT_COMM_TIMEOUT_MS`]) for every rank to join.
    pub fn init_rank(
        runtime: Arc<Runtime>,
        id: &[u8; UNIQUE_ID_BYTES],
        rank: u32,
        nranks: u32,
        timeout_ms: u32,
    ) -> Result<Arc<Comm>> {
        let options = comm_options(timeout_ms);
        let inner = runtime
            .device()
            .comm_init_rank(&UniqueId(*id), rank, nranks, options)
            .map_err(|e| Error::from(e).context(format!("joining as rank {rank} of {nranks}")))?;
        Ok(Arc::new(Comm { runtime, inner }))
    }

    /// Wraps a communicator the host program made (an `ncclComm_t` on CUDA) as `rank` of
    /// `nranks` on `runtime`'s device; it stays the caller's (never destroyed here). Waits for
    /// other ranks are bounded by `timeout_ms` as for `init_rank`.
    pub fn wrap(
        runtime: Arc<Runtime>,
        native: *mut std::ffi::c_void,
        rank: u32,
        nranks: u32,
        timeout_ms: u32,
    ) -> Result<Arc<Comm>> {
        let options = comm_options(timeout_ms);
        let inner = runtime
            .device()
            .comm_wrap(native, rank, nranks, options)
            .map_err(|e| Error::from(e).context(format!("wrapping rank {rank} of {nranks}")))?;
        Ok(Arc::new(Comm { runtime, inner }))
    }

    pub fn rank(&self) -> u32 {
        self.inner.rank()
    }

    pub fn nranks(&self) -> u32 {
        self.inner.nranks()
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    pub(crate) fn communicator(&self) -> &Arc<dyn Communicator> {
        &self.inner
    }

    /// Aborts the communicator on every rank: their waiting and later collectives fail with
    /// `PeerFailed`.
    pub fn abort(&self, why: &str) {
        self.inner.abort(why)
    }

    /// Why it was aborted, if it was.
    pub fn aborted(&self) -> Option<String> {
        self.inner.aborted()
    }
}

impl Runtime {
    /// A fresh unique id for `Comm::init_rank` on this runtime's backend.
    pub fn comm_unique_id(&self) -> Result<[u8; UNIQUE_ID_BYTES]> {
        Ok(self.device().comm_unique_id()?.0)
    }
}

/// The options of a communicator whose waits are bounded by `timeout_ms` (0:
/// [`DEFAULT_COMM_TIMEOUT_MS`]).
fn comm_options(timeout_ms: u32) -> CommOptions {
    let ms = if timeout_ms == 0 {
        DEFAULT_COMM_TIMEOUT_MS
    } else {
        timeout_ms
    };
    CommOptions {
        timeout: Duration::from_millis(ms as u64),
    }
}
