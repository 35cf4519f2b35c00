//! The runtime: one device, its pool and streams, and the graphs and kernels made on it.
//!
//! A `Runtime` is shared (`Arc`) by every graph and kernel made from it, so release order
//! cannot leave a dangling device. Its mutable state sits behind one mutex: runs, tensor
//! writes and reads, and pool calls are serialised per runtime.

pub mod config;
pub mod error;

use crate::device::cuda;
use crate::device::host::{HostDevice, HostOptions};
use crate::device::{DevPtr, Device, DeviceKind, GraphExecId, ModuleSource, StreamId};
use crate::exec::{Executor, FixedLayout, RunCounters};
use crate::plan::{plan_graph_arena, ArenaLayout};
use crate::graph::{Graph, TensorKind};
use crate::kernels::Kernel;
use crate::memory::pool::{Pool, PoolConfig, PoolStats};
use crate::memory::DeviceBacking;
pub use config::{Config, DeviceChoice, MemoryMode};
pub use error::{Error, Result};
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
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub pool: PoolStats,
    pub counters: RuntimeCounters,
    pub memory_limit: u64,
}

pub struct State {
    pub pool: Pool,
    pub counters: RuntimeCounters,
}

pub struct Runtime {
    serial: u64,
    config: Config,
    device: Arc<dyn Device>,
    compute: StreamId,
    state: Mutex<State>,
}

impl Runtime {
    pub fn new(config: Config) -> Result<Arc<Runtime>> {
        let config = config.with_env_overrides()?;
        let device = open_device(&config)?;
        let limit = match config.memory_limit {
            0 => device.total_memory(),
            l => l,
        };
        let compute = device.create_stream()?;
        let pool = Pool::new(PoolConfig {
            alignment: ALIGNMENT,
            memory_limit: limit,
            ..PoolConfig::default()
        });
        log::info!(
            "gkrt runtime on {} ({:?}), memory limit {} bytes, {:?} mode",
            device.name(),
            device.kind(),
            limit,
            config.memory_mode
        );
        Ok(Arc::new(Runtime {
            serial: NEXT_RUNTIME_SERIAL.fetch_add(1, Ordering::Relaxed),
            config,
            device,
            compute,
            state: Mutex::new(State {
                pool,
                counters: RuntimeCounters::default(),
            }),
        }))
    }

    pub fn serial(&self) -> u64 {
        self.serial
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

    /// The state lock. A panic while it was held (caught at the C boundary) must not make the
    /// runtime unusable, so a poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            pool: st.pool.stats(),
            counters: st.counters,
            memory_limit: st.pool.memory_limit(),
        }
    }

    pub fn reset_peak_stats(&self) {
        self.lock().pool.reset_peaks();
    }

    /// Waits for all queued work; reports asynchronous failures.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.device.stream_synchronize(self.compute)?)
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
        let _ = self.device.stream_synchronize(self.compute);
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = st.pool.release_all(&DeviceBacking(&*self.device)) {
            log::warn!("releasing the runtime's pool: {e}");
        }
        let _ = self.device.destroy_stream(self.compute);
    }
}

fn open_device(config: &Config) -> Result<Arc<dyn Device>> {
    let host = || -> Arc<dyn Device> {
        Arc::new(HostDevice::new(HostOptions {
            jitter_us: config.host_jitter_us,
            seed: config.seed,
            total_memory: if config.memory_limit > 0 {
                config.memory_limit
            } else {
                config::HOST_DEFAULT_MEMORY
            },
        }))
    };
    match config.device {
        DeviceChoice::Host => Ok(host()),
        DeviceChoice::Cuda => {
            cuda::probe(config.device_ordinal)
                .map_err(|why| Error::NoDevice(format!("CUDA device requested: {why}")))?;
            Ok(Arc::new(cuda::CudaDevice::open(config.device_ordinal)?))
        }
        DeviceChoice::Auto => match cuda::probe(config.device_ordinal) {
            Ok(()) => {
                log::info!(
                    "device auto: CUDA driver and device {} found",
                    config.device_ordinal
                );
                Ok(Arc::new(cuda::CudaDevice::open(config.device_ordinal)?))
            }
            Err(why) => {
                log::info!("device auto: using the host backend ({why})");
                Ok(host())
            }
        },
    }
}

/// A graph bound to the runtime it runs on, with the device memory of its persistent tensors.
pub struct RuntimeGraph {
    runtime: Arc<Runtime>,
    pub graph: Graph,
    /// Device pointer per tensor: persistent tensors keep theirs until the graph is released.
    storage: Vec<Option<DevPtr>>,
    /// Per tensor: holds meaningful contents (written by the host, or produced by a run).
    has_contents: Vec<bool>,
    /// Planned mode: the layout chosen at finalize, and the arena once the first run took it.
    arena: Option<(ArenaLayout, Option<DevPtr>)>,
    replay: Replay,
    successful_runs: u64,
}

/// Whole-step replay of a planned graph (CUDA graphs): captured at the second run, once every
/// address is fixed, and replayed from then on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Replay {
    NotYet,
    Captured(GraphExecId),
    /// Not captured; the reason was logged once.
    Off,
}

/// How long finalize may search for a smaller arena than the greedy one.
const ARENA_SEARCH_TIME: std::time::Duration = std::time::Duration::from_millis(50);

impl RuntimeGraph {
    pub fn new(runtime: Arc<Runtime>) -> RuntimeGraph {
        RuntimeGraph {
            runtime,
            graph: Graph::new(),
            storage: Vec::new(),
            has_contents: Vec::new(),
            arena: None,
            replay: Replay::NotYet,
            successful_runs: 0,
        }
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    pub fn add_tensor(&mut self, size: u64, kind: TensorKind, name: &str) -> Result<u64> {
        let id = self.graph.add_tensor(size, kind, name)?;
        self.storage.push(None);
        self.has_contents.push(false);
        Ok(id)
    }

    pub fn finalize(&mut self) -> Result<()> {
        let limit = self.runtime.lock().pool.memory_limit();
        let lv = self.graph.finalize(ALIGNMENT)?;
        let (persistent, peak) = (lv.persistent_bytes, lv.peak_transient_bytes);
        if persistent + peak > limit {
            // Nothing makes this fit until swapping exists; say so now, not only mid-run.
            log::warn!(
                "graph needs {} bytes at its peak (persistent {persistent} + transient {peak}) but the memory limit is {limit}; runs will fail with out-of-memory",
                persistent + peak
            );
        }
        if self.runtime.config().memory_mode == MemoryMode::Planned {
            let layout = plan_graph_arena(&self.graph, ALIGNMENT, ARENA_SEARCH_TIME).map_err(Error::Internal)?;
            if persistent + layout.size > limit {
                log::warn!(
                    "planned mode: arena of {} bytes plus {persistent} persistent bytes exceeds the memory limit {limit}; this graph runs in dynamic mode",
                    layout.size
                );
            } else {
                log::info!(
                    "planned mode: arena of {} bytes for a transient peak of {} bytes ({:.4}x)",
                    layout.size,
                    layout.lower_bound,
                    layout.size as f64 / layout.lower_bound.max(1) as f64
                );
                self.arena = Some((layout, None));
            }
        }
        if !self.is_planned() || !self.runtime.device.supports_capture() {
            self.replay = Replay::Off;
        } else if self.graph.nodes().iter().any(|n| matches!(n.kernel, crate::kernels::Kernel::Callback(_))) {
            log::info!(
                "planned graph not captured for replay: host callbacks run on the host when a node is queued, so a replayed capture would skip them"
            );
            self.replay = Replay::Off;
        }
        Ok(())
    }

    /// True when the graph runs from a planned arena (planned mode and the plan fits).
    pub fn is_planned(&self) -> bool {
        self.arena.is_some()
    }

    fn persistent_index(&self, id: u64, verb: &str) -> Result<u32> {
        let t = self.graph.tensor_index(id)?;
        let tensor = &self.graph.tensors()[t as usize];
        if !tensor.kind.persists() {
            return Err(Error::InvalidArgument(format!(
                "cannot {verb} {}: intermediates live only inside a run; make it an output to read it",
                tensor.describe(t)
            )));
        }
        Ok(t)
    }

    fn check_size(&self, t: u32, size: u64, verb: &str) -> Result<()> {
        let tensor = &self.graph.tensors()[t as usize];
        if size != tensor.size {
            return Err(Error::InvalidArgument(format!(
                "{verb} of {size} bytes does not match {}",
                tensor.describe(t)
            )));
        }
        Ok(())
    }

    /// Copies `data` into a persistent tensor, allocating its memory on first write.
    pub fn write(&mut self, id: u64, data: &[u8]) -> Result<()> {
        let t = self.persistent_index(id, "write")?;
        self.check_size(t, data.len() as u64, "write")?;
        let rt = Arc::clone(&self.runtime);
        let mut st = rt.lock();
        let ptr = match self.storage[t as usize] {
            Some(p) => p,
            None => {
                let p =
                    st.pool
                        .alloc(&DeviceBacking(rt.device()), data.len() as u64, rt.compute)?;
                self.storage[t as usize] = Some(p);
                p
            }
        };
        // SAFETY: `data` outlives the copy: the stream is synchronised before we return.
        unsafe { rt.device.copy_h2d_async(ptr, data.as_ptr(), data.len() as u64, rt.compute)? };
        rt.device.stream_synchronize(rt.compute)?;
        self.has_contents[t as usize] = true;
        Ok(())
    }

    pub fn read(&self, id: u64, out: &mut [u8]) -> Result<()> {
        let t = self.persistent_index(id, "read")?;
        self.check_size(t, out.len() as u64, "read")?;
        let tensor = &self.graph.tensors()[t as usize];
        let ptr = match (self.storage[t as usize], self.has_contents[t as usize]) {
            (Some(p), true) => p,
            _ => {
                return Err(Error::InvalidState(format!(
                    "{} has no contents yet: write it or run the graph first",
                    tensor.describe(t)
                )))
            }
        };
        let rt = &self.runtime;
        let _st = rt.lock();
        // SAFETY: `out` outlives the copy: the stream is synchronised before we return.
        unsafe { rt.device.copy_d2h_async(out.as_mut_ptr(), ptr, out.len() as u64, rt.compute)? };
        rt.device.stream_synchronize(rt.compute)?;
        Ok(())
    }

    /// Runs the graph once. On failure no node is re-run, every transient buffer is back in the
    /// pool, and the runtime and graph stay usable.
    pub fn run(&mut self) -> Result<()> {
        if !self.graph.is_finalized() {
            return Err(Error::InvalidState(
                "the graph must be finalized before it runs".into(),
            ));
        }
        let lv = self.graph.liveness().expect("finalized");
        for (t, tensor) in self.graph.tensors().iter().enumerate() {
            let read_first = lv.first_use[t]
                .is_some_and(|n| self.graph.nodes()[n as usize].inputs.contains(&(t as u32)));
            if tensor.kind.host_written() && read_first && !self.has_contents[t] {
                return Err(Error::InvalidState(format!(
                    "{} is read by node {} but was never written",
                    tensor.describe(t as u32),
                    lv.first_use[t].unwrap()
                )));
            }
        }
        let rt = Arc::clone(&self.runtime);
        let mut st = rt.lock();
        let backing = DeviceBacking(rt.device());
        // Planned mode takes its arena from the pool once, at the first run, and keeps it.
        if let Some((layout, base @ None)) = &mut self.arena {
            if layout.size > 0 {
                *base = Some(st.pool.alloc(&backing, layout.size, rt.compute).map_err(|e| {
                    Error::from(e).context(format!("allocating the planned arena of {} bytes", layout.size))
                })?);
            }
        }
        let mut counters = RunCounters::default();
        let queued = match self.replay {
            Replay::Captured(exec_graph) => {
                counters.nodes = self.graph.nodes().len() as u64;
                rt.device.launch_graph(exec_graph, rt.compute).map_err(Error::from)
            }
            _ => {
                let capture = self.replay == Replay::NotYet && self.successful_runs > 0;
                if capture && !begin_capture(&rt) {
                    self.replay = Replay::Off;
                }
                let capture = capture && self.replay == Replay::NotYet;
                let fixed = fixed_layout(&self.arena);
                let mut exec =
                    Executor::new(rt.device(), rt.compute, &mut st.pool, &backing, fixed, &mut self.storage);
                let mut r = exec.run(&self.graph);
                counters = exec.counters;
                if capture {
                    match (rt.device.end_capture(rt.compute), &r) {
                        (Ok(exec_graph), Ok(())) => {
                            self.replay = Replay::Captured(exec_graph);
                            r = rt.device.launch_graph(exec_graph, rt.compute).map_err(Error::from);
                        }
                        (Ok(exec_graph), Err(_)) => {
                            let _ = rt.device.destroy_graph(exec_graph);
                        }
                        (Err(e), _) => {
                            // The work was recorded, not run: run it the ordinary way.
                            log::warn!("planned graph not captured for replay: {e}");
                            self.replay = Replay::Off;
                            let mut exec = Executor::new(
                                rt.device(),
                                rt.compute,
                                &mut st.pool,
                                &backing,
                                fixed_layout(&self.arena),
                                &mut self.storage,
                            );
                            r = exec.run(&self.graph);
                            counters = exec.counters;
                        }
                    }
                }
                r
            }
        };
        // Wait even after a queueing error: buffers given back above may still be in use by
        // work already queued, and asynchronous failures must be collected now, not later.
        let finished = rt
            .device
            .stream_synchronize(rt.compute)
            .map_err(|e| match e {
                crate::device::DeviceError::Async(m) => Error::CallbackFailed(m),
                other => Error::from(other),
            });
        st.counters.runs += 1;
        st.counters.nodes_launched += counters.nodes;
        st.counters.last_run_pool_allocs = counters.pool_allocs;
        queued?;
        finished?;
        self.successful_runs += 1;
        for (t, tensor) in self.graph.tensors().iter().enumerate() {
            if tensor.kind.persists() && self.storage[t].is_some() {
                self.has_contents[t] = true;
            }
        }
        Ok(())
    }
}

fn fixed_layout(arena: &Option<(ArenaLayout, Option<DevPtr>)>) -> Option<FixedLayout<'_>> {
    arena.as_ref().map(|(layout, base)| FixedLayout {
        base: base.unwrap_or(0),
        tensor_offsets: &layout.tensor_offsets,
        workspace_offsets: &layout.workspace_offsets,
    })
}

/// Starts capturing the compute stream; on failure logs why and returns false.
fn begin_capture(rt: &Runtime) -> bool {
    match rt.device.begin_capture(rt.compute) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("planned graph not captured for replay: {e}");
            false
        }
    }
}

impl Drop for RuntimeGraph {
    fn drop(&mut self) {
        let rt = Arc::clone(&self.runtime);
        let _ = rt.device.stream_synchronize(rt.compute);
        if let Replay::Captured(exec_graph) = self.replay {
            let _ = rt.device.destroy_graph(exec_graph);
        }
        let mut st = rt.lock();
        let backing = DeviceBacking(rt.device());
        let arena = self.arena.as_mut().and_then(|(_, base)| base.take());
        for ptr in self.storage.iter_mut().filter_map(|p| p.take()).chain(arena) {
            if let Err(e) = st.pool.free(&backing, ptr) {
                log::error!("releasing a graph's tensor: {e}");
            }
        }
    }
}
