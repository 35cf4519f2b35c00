//! One kernel queued outside any graph (an eager launch) on a given stream: the same device
//! calls a node's launch makes, on buffers the caller supplies.

use super::launch::{callback_work, EAGER_NODE};
use crate::device::{Buffer, Device, LaunchDims, StreamId};
use crate::error::{Error, Result};
use crate::kernels::{BuiltinOp, Kernel};

/// What one eager launch runs: the kernel (with its validated op for a built-in), its launch
/// dimensions and parameter blob, and its buffers (inputs, then outputs, then workspaces).
pub struct EagerKernel<'a> {
    pub kernel: &'a Kernel,
    pub builtin: Option<BuiltinOp>,
    pub dims: &'a LaunchDims,
    pub params: &'a [u8],
    pub buffers: &'a [Buffer],
    pub num_inputs: usize,
    pub num_outputs: usize,
}

/// Queues `k` on `stream`.
pub fn launch_eager(device: &dyn Device, k: &EagerKernel<'_>, stream: StreamId) -> Result<()> {
    let (n_in, n_out) = (k.num_inputs, k.num_outputs);
    match k.kernel {
        Kernel::Builtin(_) => {
            let op = k.builtin.expect("validated by the caller");
            device.launch_builtin(
                op,
                &k.buffers[..n_in],
                &k.buffers[n_in..n_in + n_out],
                stream,
            )?;
        }
        Kernel::Device { function, .. } => {
            device.launch(*function, k.dims, k.buffers, k.params, stream)?;
        }
        Kernel::Callback(cb) => {
            // The work keeps the user data alive (its owner cloned): the kernel may be released
            // before the stream reaches it.
            let work = callback_work(
                cb.clone(),
                EAGER_NODE,
                String::new(),
                k.params.to_vec(),
                k.buffers,
                n_in,
                n_out,
            );
            device
                .enqueue_host_work(stream, work)
                .map_err(|e| Error::CallbackFailed(e.to_string()))?;
        }
        // Collectives are graph nodes with a communicator, never a kernel handle.
        Kernel::Collective { .. } => {
            return Err(Error::InvalidArgument(
                "a collective runs only as a graph node (gkrt_graph_add_collective)".into(),
            ))
        }
    }
    Ok(())
}
