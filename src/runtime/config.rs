//! Runtime configuration (the environment variables that override it: `env.rs`).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The GPU when a driver and a device are present, else the host backend.
    Auto = 0,
    Host = 1,
    Cuda = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryMode {
    /// The pool serves each allocation as its node runs; reference counts free.
    Dynamic = 0,
    /// Every intermediate has a fixed offset in one arena planned at finalize.
    Planned = 1,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub device: DeviceChoice,
    pub device_ordinal: u32,
    /// Cap on device memory the runtime takes; 0 = the device's total memory.
    pub memory_limit: u64,
    pub memory_mode: MemoryMode,
    /// 0 off, 1 error, 2 warn, 3 info, 4 debug, 5 trace.
    pub log_level: u32,
    /// Cap on pinned host memory for swapped tensors; 0 = no cap.
    pub host_memory_limit: u64,
    /// Grow the device pool by mapping pages into one reserved virtual range per stream
    /// (CUDA only), instead of separate segments: less fragmentation (free memory never split
    /// at segment seams), at some cost per operation. `None` (auto): streams that raw calls
    /// (`gkrt_malloc`, the PyTorch entry points) bring always do — they serve allocation
    /// patterns like PyTorch's, where segments strand memory (fragmentation on the traces:
    /// BENCHMARKS.md §3) — and the runtime's own streams do when `memory_limit` is set: such a
    /// runtime works at its limit, where seams strand memory (a swapping chain on segments needs
    /// fallback evictions: BENCHMARKS.md §2), and not otherwise, because a range costs more per
    /// operation than a graph node can afford (the 10,000-kernel chain: BENCHMARKS.md §1, run
    /// B). `Some(b)`: every stream as `b` says
    /// (`gkrt_config.pool_growth`, `GKRT_POOL_VMM=1|0`). Budgets under 512 MiB always use
    /// segments (a page is 64 MiB).
    pub pool_virtual_memory: Option<bool>,
    /// Whether the pool may wait for the device to finish queued work so that free pages can
    /// move where a large request needs them (`PoolConfig::recycle_waits`), rather than map
    /// new ones. Off by default (graph runtimes never stall their own queue for it); on for the
    /// PyTorch entry points, where they keep GPT-2's peak reserved under PyTorch's own
    /// allocator's (two waits, in its first steps; without them one run in two went over:
    /// BENCHMARKS.md §3, sessions 3 and 21). A loop whose shapes change every step keeps
    /// waiting now and then, within the move budget (lstm_train: 10 waits in 15 steps).
    /// `GKRT_POOL_RECYCLE_WAIT=1|0` overrides.
    pub pool_recycle_waits: bool,
    /// Host backend only: random delay (µs) before each queued item.
    pub host_jitter_us: u32,
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            device: DeviceChoice::Auto,
            device_ordinal: 0,
            memory_limit: 0,
            memory_mode: MemoryMode::Dynamic,
            log_level: 2,
            host_memory_limit: 0,
            pool_virtual_memory: None,
            pool_recycle_waits: false,
            host_jitter_us: 0,
            seed: 0x6b72_7447,
        }
    }
}

/// Default "device memory" of the host backend when no limit is set.
pub(crate) const HOST_DEFAULT_MEMORY: u64 = 16 << 30;
