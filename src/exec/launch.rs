//! Queuing a node's kernel on the compute stream (built-in, device function or host callback),
//! timed in a profiled run (`profile.rs`).

use super::Executor;
use crate::device::Buffer;
use crate::error::{Error, Result};
use crate::graph::{Graph, Node};
use crate::kernels::{CallbackArgs, CallbackBuffer, HostCallback, Kernel};
use std::ffi::c_void;

impl Executor<'_> {
    /// Queues node `n`'s kernel on the compute stream (timed when the run is profiled and
    /// `timed`: a recompute is not the node's own measurement).
    pub(super) fn launch(
        &mut self,
        graph: &Graph,
        n: usize,
        node: &Node,
        timed: bool,
    ) -> Result<()> {
        let tensors = graph.tensors();
        self.buffers.clear();
        for &t in node.inputs.iter().chain(&node.outputs) {
            let ptr = self.mem[t as usize].device().ok_or_else(|| {
                Error::Internal(format!(
                    "{} is not on the device when its node runs",
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
        let stream = self.streams.compute;
        // The waits before it end their timing pair here (`compute_waits`).
        self.close_waits()?;
        // The bytes this launch starts with (its allocations made, the last node's frees done).
        self.sample_memory();
        if timed {
            self.note_host_launch(n);
        }
        let start = match self.profile.as_deref_mut() {
            Some(p) => Some(p.start_stamp(self.device, stream)?),
            None => None,
        };
        match &node.kernel {
            Kernel::Builtin(_) => {
                let op = node.builtin.expect("validated at add_kernel");
                self.device.launch_builtin(
                    op,
                    &self.buffers[..n_in],
                    &self.buffers[n_in..n_in + n_out],
                    stream,
                )?;
            }
            Kernel::Device { function, .. } => {
                self.device
                    .launch(*function, &node.dims, &self.buffers, &node.params, stream)?;
            }
            Kernel::Collective { .. } => {
                return Err(Error::Internal(format!(
                    "node {n} is a collective: it is queued by Step::Collective, never launched"
                )));
            }
            Kernel::Callback(cb) => {
                // The node keeps the user data alive while the run lasts: the work needs no
                // owner of its own.
                let cb = HostCallback {
                    owner: None,
                    ..cb.clone()
                };
                // (Cloning an empty name allocates nothing; the message is made only on failure.)
                let work = callback_work(
                    cb,
                    n as u32,
                    node.name.clone(),
                    node.params.clone(),
                    &self.buffers,
                    n_in,
                    n_out,
                );
                self.device
                    .enqueue_host_work(stream, work)
                    .map_err(|e| Error::CallbackFailed(e.to_string()))?;
            }
        }
        self.order.compute_queued();
        if let (Some(start), Some(p)) = (start, self.profile.as_deref_mut()) {
            let end = p.stamp(self.device, stream)?;
            if timed {
                p.set_node(n, start, end);
            } else {
                let rebuilt = node.outputs.first().copied().unwrap_or(u32::MAX);
                p.recomputes.push((start, end, n as u32, rebuilt));
            }
        }
        Ok(())
    }

    /// Profiled runs: the pool's bytes now, where the compute stream has got to (recorded only
    /// when they changed). Taken before each launch (its allocations made, the previous
    /// node's frees done) and at the run's end.
    pub(super) fn sample_memory(&mut self) {
        if let Some(p) = self.profile.as_deref_mut() {
            let (pool, pinned) = (self.pool.stats(), self.pinned.stats());
            let pending = self.pool.pending_free_bytes();
            let at = p.here();
            p.sample(
                at,
                pool.allocated_bytes,
                pool.reserved_bytes,
                pinned.reserved_bytes,
                pending,
            );
            p.pool_counts(
                self.node as u32,
                pool.page_map_count,
                pool.device_wait_count,
                false,
            );
        }
    }

    /// Profiled runs: the host's time as node `n`'s own launch is queued (from the executor's
    /// start) and the compute-stream syncs queued since the previous one, for the timeline's
    /// `host` rows: a node the device starts as soon as the host queues it waited for the host.
    fn note_host_launch(&mut self, n: usize) {
        let syncs = std::mem::take(&mut self.syncs_since_launch);
        if let Some(p) = self.profile.as_deref_mut() {
            let ns = self.began.elapsed().as_nanos() as u64;
            p.host_launches.push((n as u32, ns, syncs));
        }
    }

    /// Profiled runs: tensor `t` is on the device from now on (`on`), or no more.
    pub(super) fn note_residency(&mut self, t: u32, on: bool) {
        if let Some(p) = self.profile.as_deref_mut() {
            let at = p.here();
            p.residency.push((t, at, on));
        }
    }

    /// Profiled runs: the fallback evicted `t` to make room for the current node.
    pub(super) fn note_eviction(&mut self, t: u32) {
        let node = self.node as u32;
        if let Some(p) = self.profile.as_deref_mut() {
            p.evictions.push((node, t));
        }
    }
}

/// The node index an eager launch's callback sees (`args->node`): it belongs to no graph.
pub(crate) const EAGER_NODE: u32 = u32::MAX;

/// Packages a host callback (a node's, or an eager launch's: `index` then names no node of a
/// graph) as device host-work: the buffers are copied into the closure so it owns everything
/// it touches when the host backend runs it later on the stream worker.
pub(crate) fn callback_work(
    cb: HostCallback,
    index: u32,
    name: String,
    params: Vec<u8>,
    buffers: &[Buffer],
    n_in: usize,
    n_out: usize,
) -> crate::device::HostWork {
    let bufs: Vec<CallbackBuffer> = buffers
        .iter()
        .map(|b| CallbackBuffer {
            ptr: b.ptr as *mut c_void,
            size: b.bytes as usize,
        })
        .collect();
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
            node: index,
        };
        // SAFETY: the function pointer and user data were given by the host for this purpose;
        // `args` and everything it points to live until the call returns.
        let status = unsafe { crate::kernels::call_callback(&cb, &args) };
        if status == 0 {
            Ok(())
        } else {
            let node = if index == EAGER_NODE {
                format!(
                    "eager launch{}",
                    if name.is_empty() {
                        String::new()
                    } else {
                        format!(" '{name}'")
                    }
                )
            } else if name.is_empty() {
                format!("node {index}")
            } else {
                format!("node {index} '{name}'")
            };
            Err(format!("{node} (host callback) reported failure {status}"))
        }
    })
}

struct SendBuffers(Vec<CallbackBuffer>);
// SAFETY: the pointers are device addresses the callback is entitled to use on its stream.
unsafe impl Send for SendBuffers {}
