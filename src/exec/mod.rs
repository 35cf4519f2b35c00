//! The executor: interprets a finalized graph's step program on one stream.
//!
//! Dynamic mode: before a node runs, the intermediates it first writes and its workspaces come
//! from the pool (stream-ordered on the compute stream); right after it is queued, its
//! workspaces and the intermediates whose last use it was go back. Because all of this work
//! runs in order on one stream, a block freed here may be handed to the next node at once —
//! the device runs the reader before the next writer. Nothing here analyses the graph: the
//! per-node alloc and free lists were computed at finalize.
//!
//! Planned mode: the same walk with every transient buffer at a fixed arena offset and no pool
//! call at all.

use crate::device::{Buffer, DevPtr, Device, StreamId};
use crate::graph::{Graph, Node, TensorKind};
use crate::kernels::{CallbackArgs, CallbackBuffer, HostCallback, Kernel};
use crate::memory::pool::{Pool, PoolBacking};
use crate::runtime::error::{Error, Result};
use std::ffi::c_void;

/// Fixed places of every transient buffer (planned mode): `tensor_offsets[t]` for
/// intermediates, `workspace_offsets[node][i]` for workspaces, both relative to `base`.
pub struct FixedLayout<'a> {
    pub base: DevPtr,
    pub tensor_offsets: &'a [u64],
    pub workspace_offsets: &'a [Vec<u64>],
}

/// Counters of one run.
#[derive(Default, Debug, Clone, Copy)]
pub struct RunCounters {
    pub nodes: u64,
    pub pool_allocs: u64,
}

pub struct Executor<'a> {
    pub device: &'a dyn Device,
    pub stream: StreamId,
    pub pool: &'a mut Pool,
    pub backing: &'a dyn PoolBacking,
    /// Planned mode when set: transient buffers live at fixed offsets, not in the pool.
    pub layout: Option<FixedLayout<'a>>,
    /// Device pointer of every tensor of the graph; persistent ones are kept across runs.
    pub storage: &'a mut [Option<DevPtr>],
    pub counters: RunCounters,
    workspaces: Vec<DevPtr>,
    buffers: Vec<Buffer>,
}

impl<'a> Executor<'a> {
    pub fn new(
        device: &'a dyn Device,
        stream: StreamId,
        pool: &'a mut Pool,
        backing: &'a dyn PoolBacking,
        layout: Option<FixedLayout<'a>>,
        storage: &'a mut [Option<DevPtr>],
    ) -> Self {
        Executor {
            device,
            stream,
            pool,
            backing,
            layout,
            storage,
            counters: RunCounters::default(),
            workspaces: Vec::new(),
            buffers: Vec::new(),
        }
    }

    /// Queues every node of `graph` (finalized) on the stream. On error, every transient
    /// buffer this run holds is returned and the error names the node at fault. The caller
    /// synchronises the stream afterwards (asynchronous failures surface there).
    pub fn run(&mut self, graph: &Graph) -> Result<()> {
        let result = (0..graph.nodes().len()).try_for_each(|n| self.run_node(graph, n));
        if result.is_err() {
            self.release_transients(graph);
        }
        result
    }

    fn run_node(&mut self, graph: &Graph, n: usize) -> Result<()> {
        let lv = graph.liveness().expect("executor runs finalized graphs");
        let node = &graph.nodes()[n];
        let tensors = graph.tensors();
        let at = |e: Error| e.context(format!("node {n} ({})", node.kernel.describe()));

        for &t in &lv.allocs[n] {
            let ptr = self
                .take(tensors[t as usize].size, Slot::Tensor(t))
                .map_err(|e| {
                    at(e.context(format!(
                        "allocating its output {}",
                        tensors[t as usize].describe(t)
                    )))
                })?;
            self.storage[t as usize] = Some(ptr);
        }
        // Persistent tensors first written by a node (outputs; parameters initialised on the
        // device) get memory once and keep it.
        for &t in &node.outputs {
            if self.storage[t as usize].is_none() && tensors[t as usize].kind.persists() {
                let ptr = self
                    .take_persistent(tensors[t as usize].size)
                    .map_err(|e| {
                        at(e.context(format!(
                            "allocating its output {}",
                            tensors[t as usize].describe(t)
                        )))
                    })?;
                self.storage[t as usize] = Some(ptr);
            }
        }
        self.workspaces.clear();
        for (i, &w) in node.workspaces.iter().enumerate() {
            match self.take(w, Slot::Workspace(n, i)) {
                Ok(ptr) => self.workspaces.push(ptr),
                Err(e) => {
                    self.give_workspaces();
                    return Err(at(
                        e.context(format!("allocating workspace {i} of {w} bytes"))
                    ));
                }
            }
        }

        let launched = self.launch(graph, n, node).map_err(at);
        self.give_workspaces();
        launched?;
        self.counters.nodes += 1;

        for &t in &lv.frees[n] {
            if let Some(ptr) = self.storage[t as usize].take() {
                self.give(ptr);
            }
        }
        Ok(())
    }

    fn launch(&mut self, graph: &Graph, n: usize, node: &Node) -> Result<()> {
        let tensors = graph.tensors();
        self.buffers.clear();
        for &t in node.inputs.iter().chain(&node.outputs) {
            let ptr = self.storage[t as usize].ok_or_else(|| {
                Error::InvalidState(format!(
                    "{} has no memory (never written)",
                    tensors[t as usize].describe(t)
                ))
            })?;
            self.buffers.push(Buffer {
                ptr,
                bytes: tensors[t as usize].size,
            });
        }
        for (&ptr, &bytes) in self.workspaces.iter().zip(&node.workspaces) {
            self.buffers.push(Buffer { ptr, bytes });
        }
        let n_in = node.inputs.len();
        let n_out = node.outputs.len();
        match &node.kernel {
            Kernel::Builtin(_) => {
                let op = node.builtin.expect("validated at add_kernel");
                self.device.launch_builtin(
                    op,
                    &self.buffers[..n_in],
                    &self.buffers[n_in..n_in + n_out],
                    self.stream,
                )?;
            }
            Kernel::Device { function, .. } => {
                self.device.launch(
                    *function,
                    &node.dims,
                    &self.buffers,
                    &node.params,
                    self.stream,
                )?;
            }
            Kernel::Callback(cb) => {
                let work = callback_work(*cb, n as u32, &self.buffers, n_in, n_out, &node.params);
                self.device
                    .enqueue_host_work(self.stream, work)
                    .map_err(|e| Error::CallbackFailed(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Memory for a transient buffer: its fixed place in planned mode, else the pool.
    fn take(&mut self, bytes: u64, slot: Slot) -> Result<DevPtr> {
        match &self.layout {
            Some(layout) => Ok(layout.base
                + match slot {
                    Slot::Tensor(t) => layout.tensor_offsets[t as usize],
                    Slot::Workspace(n, i) => layout.workspace_offsets[n][i],
                }),
            None => self.take_persistent(bytes),
        }
    }

    /// Memory from the pool (persistent tensors in both modes, transients in dynamic mode).
    fn take_persistent(&mut self, bytes: u64) -> Result<DevPtr> {
        self.counters.pool_allocs += 1;
        Ok(self.pool.alloc(self.backing, bytes, self.stream)?)
    }

    fn give(&mut self, ptr: DevPtr) {
        if self.layout.is_none() {
            // The pointer came from this pool a moment ago; failure would be a bug in the
            // step program, and leaking is the safe outcome.
            if let Err(e) = self.pool.free(self.backing, ptr) {
                log::error!("returning a transient buffer to the pool: {e}");
            }
        }
    }

    fn give_workspaces(&mut self) {
        let workspaces = std::mem::take(&mut self.workspaces);
        for &ptr in &workspaces {
            self.give(ptr);
        }
        self.workspaces = workspaces;
        self.workspaces.clear();
    }

    /// After a failed run: every intermediate still holding memory gives it back.
    fn release_transients(&mut self, graph: &Graph) {
        for (t, tensor) in graph.tensors().iter().enumerate() {
            if tensor.kind == TensorKind::Intermediate {
                if let Some(ptr) = self.storage[t].take() {
                    self.give(ptr);
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Tensor(u32),
    Workspace(usize, usize),
}

/// Packages a host-callback node as device host-work: the buffers are copied into the closure
/// so it owns everything it touches when the host backend runs it later on the stream worker.
fn callback_work(
    cb: HostCallback,
    node: u32,
    buffers: &[Buffer],
    n_in: usize,
    n_out: usize,
    params: &[u8],
) -> crate::device::HostWork {
    let bufs: Vec<CallbackBuffer> = buffers
        .iter()
        .map(|b| CallbackBuffer {
            ptr: b.ptr as *mut c_void,
            size: b.bytes as usize,
        })
        .collect();
    let params = params.to_vec();
    let bufs = SendBuffers(bufs);
    Box::new(move |stream| {
        let bufs = bufs;
        let b = &bufs.0;
        let args = CallbackArgs {
            inputs: b.as_ptr(),
            num_inputs: n_in,
            outputs: b[n_in..].as_ptr(),
            num_outputs: n_out,
            workspaces: b[n_in + n_out..].as_ptr(),
            num_workspaces: b.len() - n_in - n_out,
            params: if params.is_empty() {
                std::ptr::null()
            } else {
                params.as_ptr() as *const c_void
            },
            params_size: params.len(),
            stream,
            node,
        };
        // SAFETY: the function pointer and user data were given by the host for this purpose;
        // `args` and everything it points to live until the call returns.
        let status = unsafe { (cb.func)(&args, cb.user_data as *mut c_void) };
        if status == 0 {
            Ok(())
        } else {
            Err(format!(
                "node {node} (host callback) reported failure {status}"
            ))
        }
    })
}

struct SendBuffers(Vec<CallbackBuffer>);
// SAFETY: the pointers are device addresses the callback is entitled to use on its stream.
unsafe impl Send for SendBuffers {}
