//! The runtime: one device, its pool and streams, and the graphs and kernels made on it.
//!
//! A `Runtime` is shared (`Arc`) by every graph and kernel made from it, so release order
//! cannot leave a dangling device. Its mutable state sits behind one lock (`state_lock.rs`,
//! whose flag lives in the runtime's home, `home.rs`): runs, tensor writes and reads, and pool
//! calls are serialised per runtime.
//!
//! Files: `config.rs` the configuration, `env.rs` every `GKRT_*` variable, `process.rs` the
//! PyTorch entry points' runtimes, `raw.rs` raw pool use (`gkrt_malloc`), `graph/` a graph
//! bound to its runtime, `logging.rs` the stderr logger.

mod comm;
pub mod config;
mod eager;
mod env;
mod graph;
pub(crate) mod home;
mod logging;
mod process;
mod queue;
mod raw;
pub mod snapshot;
mod state_lock;
mod streams;
pub mod trace;

use crate::device;
use crate::device::host::HostOptions;
use crate::device::{Device, EventId, StreamId};
pub use crate::error::{Error, Result};
use crate::exec::{RunCounters, Streams};
pub use crate::kernels::collective::{CollectiveKind, DType, ReduceOp};
use crate::memory::pool::{Pool, PoolConfig};
use crate::memory::{DeviceBacking, PinnedBacking};
pub use comm::Comm;
pub use config::{Config, DeviceChoice, MemoryMode};
pub use eager::EagerArgs;
pub use graph::RuntimeGraph;
pub use logging::{init as init_logging, set_sink as set_log_sink, SinkFn as LogSinkFn};
pub use queue::{DeviceQueue, QueueStats};

/// A message to the host's log sink (or stderr) whatever the level: for failures the host must
/// hear about even with logging off.
pub fn log_always(level: log::Level, message: &str) {
    logging::deliver(level, module_path!(), message);
}
pub use process::process_runtime;
pub(crate) use state_lock::{FlagLock, StateGuard};

// The vocabulary of the layers below that the C API converts to and from, and that a runtime's
// and graph's methods take and give, re-exported so that `capi` (and Rust users: the lower
// layers are crate-private) name the runtime only (ARCHITECTURE.md: each layer uses the one
// below it).
pub use crate::device::{DeviceKind, LaunchDims, ModuleSource};
pub use crate::graph::TensorKind;
pub(crate) use crate::graph::MAX_PARAMS_BYTES;
#[cfg(test)]
pub(crate) use crate::kernels::call_callback;
pub(crate) use crate::kernels::inside_callback;
pub use crate::kernels::{
    Buffer as DeviceBuffer, BuiltinKind, CallbackArgs, CallbackBuffer, HostCallback, Kernel,
    UserDataOwner,
};
pub use crate::memory::pool::PoolStats;
pub use crate::plan::program::{Buf, PoolCall};
pub use crate::plan::swap::{Policy as SwapPolicy, SwapPlan};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

static NEXT_RUNTIME_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Granule of every allocation; statistics and liveness are in multiples of it.
pub(crate) const ALIGNMENT: u64 = 256;

/// Counters the runtime keeps beside the pool's.
#[derive(Clone, Copy, Debug, Default)]
pub struct RuntimeCounters {
    pub runs: u64,
    pub nodes_launched: u64,
    /// Pool allocations made by the last run (0 in planned mode once the arena exists).
    pub last_run_pool_allocs: u64,
    /// Swapping, cumulative: bytes and tensors copied each way, fallback evictions, and the time
    /// the compute stream spent waiting for copies.
    pub swap_out_bytes: u64,
    pub swap_in_bytes: u64,
    pub tensors_swapped_out: u64,
    pub tensors_swapped_in: u64,
    pub evictions: u64,
    pub copy_wait_ns: u64,
    /// Tensors rebuilt by running their (recomputable) producer again instead of swapping.
    pub tensors_recomputed: u64,
    /// Swapping runs' allocations that took the range the plan's dry run placed them in, and
    /// those that found it taken (`plan::swap_placements`), cumulative.
    pub placed_allocs: u64,
    pub misplaced_allocs: u64,
}

impl RuntimeCounters {
    fn add_run(&mut self, run: &RunCounters, copy_wait_ns: u64) {
        self.runs += 1;
        self.nodes_launched += run.nodes;
        self.last_run_pool_allocs = run.pool_allocs;
        self.swap_out_bytes += run.bytes_out;
        self.swap_in_bytes += run.bytes_in;
        self.tensors_swapped_out += run.tensors_out;
        self.tensors_swapped_in += run.tensors_in;
        self.evictions += run.evictions;
        self.copy_wait_ns += copy_wait_ns;
        self.tensors_recomputed += run.recomputes;
        self.placed_allocs += run.placed;
        self.misplaced_allocs += run.misplaced;
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub pool: PoolStats,
    pub pinned: PoolStats,
    pub counters: RuntimeCounters,
    pub memory_limit: u64,
}

pub struct State {
    pub pool: Pool,
    /// Pinned host memory for swapped tensors: pinned once, reused, grown only when needed.
    pub pinned: Pool,
    pub counters: RuntimeCounters,
    /// Timing events reused around compute-stream waits on copies.
    pub stall_pairs: Vec<(EventId, EventId)>,
    /// The native stream of the latest raw allocation or free and its id: raw calls nearly
    /// always repeat it, and this skips the device's stream table.
    pub last_raw_stream: Option<(usize, StreamId)>,
    /// Streams first met through raw calls grow by virtual ranges (`Config::pool_virtual_memory`).
    pub raw_virtual: bool,
    /// Raw blocks used on streams other than their own (`raw_record_stream`), and those
    /// streams: their free waits for each (`raw.rs`).
    pub stream_uses: std::collections::HashMap<crate::device::DevPtr, Vec<StreamId>>,
    /// The owners of pool blocks by label, for snapshots (`snapshot/labels.rs`).
    pub labels: snapshot::Labels,
    /// The trace being collected (`trace_begin` .. `trace_end`).
    pub trace: Option<trace::Trace>,
}

pub struct Runtime {
    serial: u64,
    config: Config,
    device: Arc<dyn Device>,
    compute: StreamId,
    streams: Streams,
    /// Index of the runtime's home (`home.rs`), whose flag is the state's lock.
    home: usize,
    state: FlagLock<State>,
}

impl Runtime {
    pub fn new(config: Config) -> Result<Arc<Runtime>> {
        let config = env::config_overrides(config)?;
        let device = open_device(&config)?;
        let limit = match config.memory_limit {
            0 => device.total_memory(),
            l => l,
        };
        let compute = device.create_stream()?;
        let streams = Streams {
            compute,
            copy_in: device.create_stream()?,
            copy_out: device.create_stream()?,
            // Only ever waited for: without timing unless GKRT_EXEC_ELIDE=0.
            marker: if env::exec_elide() {
                device.create_sync_event()?
            } else {
                device.create_event()?
            },
            comm: device.create_stream()?,
        };
        // Virtual ranges only under a budget of at least 512 MiB (eight of the 64 MiB pages the
        // pool once had; kept when pages became granules so small budgets behave as before).
        let big_enough = limit >= 512 << 20;
        let vmm = config
            .pool_virtual_memory
            .unwrap_or(config.memory_limit != 0)
            && big_enough;
        let raw_virtual = config.pool_virtual_memory.unwrap_or(true) && big_enough;
        let mut pool_config = PoolConfig {
            alignment: ALIGNMENT,
            memory_limit: limit,
            vmm,
            recycle_waits: config.pool_recycle_waits,
            ..PoolConfig::default()
        };
        if config.memory_limit != 0 {
            // Graphs may swap (`PoolConfig::for_swapping`).
            pool_config = pool_config.for_swapping();
        }
        let pool = Pool::new(env::pool_overrides(pool_config));
        let host_limit = if config.host_memory_limit == 0 {
            u64::MAX
        } else {
            config.host_memory_limit
        };
        let pinned = Pool::new(env::pool_overrides(PoolConfig {
            alignment: ALIGNMENT,
            memory_limit: host_limit,
            ..PoolConfig::default()
        }));
        log::info!(
            "gkrt runtime on {} ({:?}), memory limit {} bytes, {:?} mode",
            device.name(),
            device.kind(),
            limit,
            config.memory_mode
        );
        // Last, so that no failure above leaves a home taken.
        let (home, home_record) =
            home::acquire().ok_or_else(|| Error::OutOfMemory(home::exhausted_message()))?;
        Ok(Arc::new(Runtime {
            serial: NEXT_RUNTIME_SERIAL.fetch_add(1, Ordering::Relaxed),
            config,
            device,
            compute,
            streams,
            home,
            state: FlagLock::new(
                home_record.flag(),
                State {
                    pool,
                    pinned,
                    counters: RuntimeCounters::default(),
                    stall_pairs: Vec::new(),
                    last_raw_stream: None,
                    raw_virtual,
                    stream_uses: Default::default(),
                    labels: snapshot::Labels::default(),
                    trace: None,
                },
            ),
        }))
    }

    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// Index of the runtime's home (`home.rs`).
    pub(crate) fn home(&self) -> usize {
        self.home
    }

    /// The state, for a caller that holds its lock through a pinned handle of the runtime's
    /// home (`capi/handles.rs`).
    ///
    /// # Safety
    /// The caller holds the flag of home `self.home()` for as long as it uses the pointer.
    #[inline]
    pub(crate) unsafe fn state_locked(&self) -> *mut State {
        // SAFETY: forwarded to the caller.
        unsafe { self.state.locked() }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn device(&self) -> &dyn Device {
        &*self.device
    }

    pub fn device_kind(&self) -> DeviceKind {
        self.device.kind()
    }

    /// The state lock. A panic while it was held (caught at the C boundary) released it and
    /// must not make the runtime unusable.
    pub fn lock(&self) -> StateGuard<'_, State> {
        self.state.lock()
    }

    /// The state lock if it is free now (callers that must not wait, then `lock_for_call`).
    #[inline]
    pub fn try_lock_for_call(&self) -> Option<StateGuard<'_, State>> {
        self.state.try_lock()
    }

    /// The state lock for a call from outside (see `lock_for_call`): the free lock is taken at
    /// once; a busy one is an error inside a host callback and a wait elsewhere.
    pub fn lock_for_call(&self) -> Result<StateGuard<'_, State>> {
        state_lock_for_call(&self.state, "runtime")
    }

    pub fn stats(&self) -> Result<Stats> {
        let st = self.lock_for_call()?;
        Ok(Stats {
            pool: st.pool.stats(),
            pinned: st.pinned.stats(),
            counters: st.counters,
            memory_limit: st.pool.memory_limit(),
        })
    }

    pub fn reset_peak_stats(&self) -> Result<()> {
        self.lock_for_call()?.pool.reset_peaks();
        Ok(())
    }

    /// Starts collecting a trace of runs (a new one: one already collecting is dropped). Runs
    /// are timed with events from now on, until `trace_end`.
    pub fn trace_begin(&self) -> Result<()> {
        self.lock_for_call()?.trace = Some(trace::Trace::default());
        Ok(())
    }

    /// Stops collecting and writes the trace's JSON to `path`. Not collecting is an error; a
    /// trace that cannot be written is dropped (the error names the file).
    pub fn trace_end(&self, path: &std::path::Path) -> Result<()> {
        let trace = self.lock_for_call()?.trace.take().ok_or_else(|| {
            Error::InvalidState(
                "no trace is being collected (gkrt_runtime_trace_begin first)".into(),
            )
        })?;
        std::fs::write(path, trace.to_json()).map_err(|e| {
            Error::InvalidArgument(format!("writing the trace to '{}': {e}", path.display()))
        })
    }

    /// Waits for all queued work (compute and copies); reports the first asynchronous failure.
    pub fn synchronize(&self) -> Result<()> {
        let _busy = self.lock_for_call()?;
        self.drain()
    }

    /// Waits for every stream of the runtime (callers hold the state lock or own the runtime).
    fn drain(&self) -> Result<()> {
        let mut first = Ok(());
        for s in [
            self.streams.compute,
            self.streams.copy_in,
            self.streams.copy_out,
            self.streams.comm,
        ] {
            if let (Err(e), Ok(())) = (self.device.stream_synchronize(s), &first) {
                first = Err(Error::from(e));
            }
        }
        first
    }

    /// Makes a kernel object from a built-in, device code, or a host callback.
    pub fn load_kernel(&self, source: ModuleSource<'_>, function: &str) -> Result<Kernel> {
        let id = self.device.load_function(source, function)?;
        Ok(Kernel::Device {
            function: id,
            name: function.to_string(),
        })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.drain();
        let st = self.state.get_mut();
        if let Err(e) = st.pool.release_all(&DeviceBacking(&*self.device)) {
            log::warn!("releasing the runtime's pool: {e}");
        }
        if let Err(e) = st.pinned.release_all(&PinnedBacking(&*self.device)) {
            log::warn!("releasing the runtime's pinned pool: {e}");
        }
        for (a, b) in st.stall_pairs.drain(..) {
            let _ = self.device.destroy_event(a);
            let _ = self.device.destroy_event(b);
        }
        let _ = self.device.destroy_event(self.streams.marker);
        for s in [
            self.streams.compute,
            self.streams.copy_in,
            self.streams.copy_out,
            self.streams.comm,
        ] {
            let _ = self.device.destroy_stream(s);
        }
        home::vacate(self.home);
    }
}

/// Locks `m` for a call that comes from the C API. A host callback runs while its runtime is busy
/// with the run (the run holds the runtime's and the graph's locks; on the host backend it also
/// waits for the callback's thread), so from inside a callback a busy lock is an error, not a
/// wait that could never end.
///
/// The free lock is taken before the thread-local "inside a callback" flag is read: the pool's
/// raw calls come through here on every operation, and with the CUDA driver loaded a
/// thread-local read from this library is slow enough to matter there (BENCHMARKS.md §3,
/// "What each change did").
pub fn lock_for_call<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
    match m.try_lock() {
        Ok(g) => return Ok(g),
        Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => {}
    }
    if crate::kernels::inside_callback() {
        return Err(busy_inside_callback(what));
    }
    Ok(m.lock().unwrap_or_else(|p| p.into_inner()))
}

/// `lock_for_call` for the state's `FlagLock`: the free lock at once; a busy one an error inside
/// a host callback (its holder may be waiting for the device, which waits for the callback) and
/// a wait elsewhere.
pub fn state_lock_for_call<'a, T>(l: &'a FlagLock<T>, what: &str) -> Result<StateGuard<'a, T>> {
    if let Some(g) = l.try_lock() {
        return Ok(g);
    }
    if crate::kernels::inside_callback() {
        return Err(busy_inside_callback(what));
    }
    Ok(l.lock())
}

pub(crate) fn busy_inside_callback(what: &str) -> Error {
    Error::InvalidState(format!(
        "the {what} is busy (running the graph whose host callback made this call, or another); \
         a host callback cannot call into a runtime or graph that is running"
    ))
}

fn open_device(config: &Config) -> Result<Arc<dyn Device>> {
    let backend = match config.device {
        DeviceChoice::Auto => device::Backend::Auto,
        DeviceChoice::Host => device::Backend::Host,
        DeviceChoice::Cuda => device::Backend::Cuda,
    };
    let host = HostOptions {
        jitter_us: config.host_jitter_us,
        seed: config.seed,
        total_memory: if config.memory_limit > 0 {
            config.memory_limit
        } else {
            config::HOST_DEFAULT_MEMORY
        },
    };
    Ok(device::open(
        backend,
        config.device_ordinal,
        host,
        env::device_virtual_memory(),
    )?)
}
