//! Queuing a node's kernel on the compute stream (built-in, device function or host callback),
//! and the timing events of a profiled run.

use super::Executor;
use crate::device::{Buffer, Device, EventId};
use crate::error::{Error, Result};
use crate::graph::{Graph, Node};
use crate::kernels::{CallbackArgs, CallbackBuffer, HostCallback, Kernel};
use std::ffi::c_void;

/// Timing events of one profiled run (the first run of a swapping graph, or any run while the
/// runtime traces): a pair around each node's kernel on the compute stream, around each swap
/// copy on its stream and around each recompute; and, for traces, the pool's bytes after each
/// node was queued and the fallback's evictions. Events are created on first use and reused by
/// later profiled runs.
#[derive(Default, Debug)]
pub struct RunProfile {
    pub nodes: Vec<(EventId, EventId)>,
    /// (start, end, bytes, host to device, tensor)
    pub copies: Vec<(EventId, EventId, u64, bool, u32)>,
    /// (start, end, node run again, tensor rebuilt)
    pub recomputes: Vec<(EventId, EventId, u32, u32)>,
    /// After node `n` was queued: (n, allocated, reserved, pinned reserved) bytes.
    pub memory: Vec<(u32, u64, u64, u64)>,
    /// (node being made room for, tensor evicted by the fallback)
    pub evictions: Vec<(u32, u32)>,
    spare_copy_events: Vec<(EventId, EventId)>,
}

impl RunProfile {
    /// Every event it holds, for destruction.
    pub fn events(&self) -> impl Iterator<Item = EventId> + '_ {
        self.nodes
            .iter()
            .copied()
            .chain(self.copies.iter().map(|&(a, b, ..)| (a, b)))
            .chain(self.recomputes.iter().map(|&(a, b, ..)| (a, b)))
            .chain(self.spare_copy_events.iter().copied())
            .flat_map(|(a, b)| [a, b])
    }

    pub(super) fn reset(&mut self) {
        let used = self.copies.drain(..).map(|(a, b, ..)| (a, b));
        self.spare_copy_events.extend(used);
        let used = self.recomputes.drain(..).map(|(a, b, ..)| (a, b));
        self.spare_copy_events.extend(used);
        self.memory.clear();
        self.evictions.clear();
    }

    pub(super) fn node_pair(
        &mut self,
        device: &dyn Device,
        n: usize,
    ) -> Result<(EventId, EventId)> {
        while self.nodes.len() <= n {
            self.nodes
                .push((device.create_event()?, device.create_event()?));
        }
        Ok(self.nodes[n])
    }

    pub(super) fn copy_pair(&mut self, device: &dyn Device) -> Result<(EventId, EventId)> {
        match self.spare_copy_events.pop() {
            Some(pair) => Ok(pair),
            None => Ok((device.create_event()?, device.create_event()?)),
        }
    }
}

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
        let timing = match self.profile.as_deref_mut() {
            Some(p) if timed => Some(p.node_pair(self.device, n)?),
            Some(p) => Some(p.copy_pair(self.device)?),
            None => None,
        };
        if let Some((start, _)) = timing {
            self.device.record_event(start, stream)?;
        }
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
        if let Some((start, end)) = timing {
            self.device.record_event(end, stream)?;
            if !timed {
                let rebuilt = node.outputs.first().copied().unwrap_or(u32::MAX);
                if let Some(p) = self.profile.as_deref_mut() {
                    p.recomputes.push((start, end, n as u32, rebuilt));
                }
            }
        }
        if timed {
            self.sample_memory(n as u32);
        }
        Ok(())
    }

    /// Profiled runs: the pool's bytes now (after node `n` was queued), for traces.
    fn sample_memory(&mut self, n: u32) {
        if let Some(p) = self.profile.as_deref_mut() {
            let (pool, pinned) = (self.pool.stats(), self.pinned.stats());
            p.memory.push((
                n,
                pool.allocated_bytes,
                pool.reserved_bytes,
                pinned.reserved_bytes,
            ));
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
