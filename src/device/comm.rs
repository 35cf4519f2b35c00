//! Communicators at the device layer: the trait a backend's communicator implements, and the
//! unique id ranks share to find each other.
//!
//! A communicator joins `nranks` ranks (in one process or many) that were handed the same
//! 128-byte [`UniqueId`]. Calls are queued on a stream of the rank's own device, in stream
//! order, like NCCL's: every rank must queue the same collectives in the same order. The host
//! backend's model (`host/comm.rs`) checks that each collective matches across ranks and fails
//! with an error instead of hanging; every wait of it is bounded by the communicator's timeout.

use super::{Device, DeviceResult, StreamId};
pub use crate::kernels::collective::{Collective, CollectiveKind};
#[cfg(test)]
pub use crate::kernels::collective::{DType, ReduceOp};
use std::time::Duration;

/// NCCL_UNIQUE_ID_BYTES.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

/// The bytes ranks share (by their own means) to join one communicator.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(")?;
        for b in &self.0[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// How a communicator is made.
#[derive(Clone, Copy, Debug)]
pub struct CommOptions {
    /// Bound on every wait for other ranks (joining, each collective): past it the
    /// communicator is aborted and the call fails with `DeviceError::PeerFailed`.
    pub timeout: Duration,
}

/// One rank's communicator. Dropping it leaves the communicator: ranks that still wait for this
/// one fail with `PeerFailed` rather than hang.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> u32;
    fn nranks(&self) -> u32;
    /// Queues `calls` on `stream` of `device` (this rank's device) as one group, like calls
    /// between `ncclGroupStart` and `ncclGroupEnd`: sends are posted before the group's other
    /// calls wait, so a send/receive exchange in one group cannot deadlock. Errors found when
    /// the group runs (a mismatch, a peer that failed) are asynchronous errors of `stream`.
    fn enqueue(
        &self,
        device: &dyn Device,
        calls: &[Collective],
        stream: StreamId,
    ) -> DeviceResult<()>;
    /// A captured graph holding this communicator's calls was just launched on `stream` (of
    /// `device`): watch it as one outstanding group, as `enqueue` watches what it queues — its
    /// timeout clock starts now (or when the group before it completes) and covers the whole
    /// replay, since its collectives cannot be told apart from the rest of the graph; past the
    /// timeout, or on an asynchronous error, the communicator is aborted and `stream` fails
    /// with `PeerFailed`. Backends without capture have nothing to watch.
    fn watch_replay(&self, _device: &dyn Device, _stream: StreamId) -> DeviceResult<()> {
        Ok(())
    }
    /// Aborts the communicator for every rank (`ncclCommAbort`): calls waiting or queued on any
    /// rank fail with `PeerFailed` naming `why`; it cannot be used again.
    fn abort(&self, why: &str);
    /// Why the communicator was aborted, if it was.
    fn aborted(&self) -> Option<String>;
}
