//! What the pool reports to its callers: statistics, errors (and their conversion into the
//! crate's `Error`), and what it knows of a live block.

use std::fmt;

use crate::device::{DeviceError, StreamId};
use crate::error::Error;

/// Pool statistics; all O(1) and always on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Sum of rounded sizes of live blocks.
    pub allocated_bytes: u64,
    /// Memory held from the device: plain segments plus mapped pages.
    pub reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Sum of sizes as requested (unrounded) of live blocks.
    pub requested_bytes: u64,
    /// Successful allocations, cumulative.
    pub alloc_count: u64,
    /// Successful frees (`free` and `free_after_event`), cumulative.
    pub free_count: u64,
    /// Live segments (plain segments and reserved virtual ranges).
    pub segment_count: u64,
    /// Cumulative device segment allocations and range reservations.
    pub segment_alloc_count: u64,
    /// Cumulative device segment frees and range releases.
    pub segment_free_count: u64,
    /// Allocations that failed (out of memory or a device error), cumulative.
    pub failed_alloc_count: u64,
    /// Pages mapped into virtual ranges, cumulative.
    pub page_map_count: u64,
    /// Pages unmapped from virtual ranges, cumulative.
    pub page_unmap_count: u64,
    /// Times free pages were recycled, cumulative.
    pub recycle_count: u64,
    /// Times recycling waited for the device (`VirtualMemory::quiesce`), cumulative.
    pub device_wait_count: u64,
    /// Epochs placed by their plan to the end, and plans left before it (`epochs.rs`), over
    /// every stream, cumulative (filled by `Pool::stats`).
    pub epochs_followed: u64,
    pub epochs_left: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PoolError {
    ZeroSize,
    /// Would exceed `memory_limit`, or the device refused even after releasing cached memory.
    OutOfMemory {
        requested: u64,
        reserved: u64,
        allocated: u64,
        limit: u64,
    },
    /// Free of an address the pool did not hand out (or freed twice).
    UnknownPointer(u64),
    /// A device error (also `DeviceError::Invalid` for memory the pool cannot use).
    Device(DeviceError),
    /// `release_all` found blocks still in use (`live` allocated, `pending` waiting on an
    /// event, `bytes` their total size); every segment was released anyway.
    LiveBlocks {
        live: u64,
        pending: u64,
        bytes: u64,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::ZeroSize => write!(f, "allocation of 0 bytes"),
            PoolError::OutOfMemory {
                requested,
                reserved,
                allocated,
                limit,
            } => {
                write!(
                    f,
                    "out of device memory: requested {requested} bytes with {reserved} bytes \
                     reserved and {allocated} bytes allocated, "
                )?;
                if *limit == u64::MAX {
                    write!(f, "no memory limit (the device refused)")
                } else {
                    write!(f, "memory limit {limit} bytes")
                }
            }
            PoolError::UnknownPointer(addr) => write!(
                f,
                "free of unknown pointer {addr:#x} (not allocated by this pool, or already freed)"
            ),
            PoolError::Device(e) => write!(f, "device error in the memory pool: {e}"),
            PoolError::LiveBlocks {
                live,
                pending,
                bytes,
            } => write!(
                f,
                "memory pool released with {live} live block(s) and {pending} block(s) pending \
                 on an event, {bytes} bytes in all"
            ),
        }
    }
}

impl std::error::Error for PoolError {}

impl From<DeviceError> for PoolError {
    fn from(e: DeviceError) -> Self {
        PoolError::Device(e)
    }
}

/// A live block, as [`Pool::block_info`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// The stream it was allocated on (and is reused on).
    pub stream: StreamId,
    /// The tag given to `alloc_tagged` (0 for `alloc`).
    pub tag: u8,
    /// Rounded size.
    pub size: u64,
    /// Size as requested.
    pub requested: u64,
}

impl From<PoolError> for Error {
    fn from(e: PoolError) -> Error {
        let text = e.to_string();
        match e {
            PoolError::OutOfMemory { .. } => Error::OutOfMemory(text),
            PoolError::ZeroSize | PoolError::UnknownPointer(_) => Error::InvalidArgument(text),
            PoolError::Device(d) => Error::from(d),
            PoolError::LiveBlocks { .. } => Error::InvalidState(text),
        }
    }
}
