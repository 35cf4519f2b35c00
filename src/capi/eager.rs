//! C API: eager launches — one kernel on the caller's device pointers, outside any graph.

use super::boundary::{c_slice, guard};
use super::handles;
use super::types::*;
use crate::runtime::{CallbackBuffer, EagerArgs, Error, LaunchDims};
use std::ffi::c_void;

/// A node's or an eager launch's `gkrt_launch` (NULL: a 1×1×1 launch without parameters),
/// checked: non-zero dimensions, a parameter blob within the cap.
///
/// # Safety
/// `launch` is NULL-free here; its `params` holds `params_size` bytes (or is NULL when 0).
pub(super) unsafe fn launch_of(launch: Option<&gkrt_launch>) -> Result<(LaunchDims, &[u8]), Error> {
    let Some(l) = launch else {
        let dims = LaunchDims {
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
        };
        return Ok((dims, &[][..]));
    };
    if l.grid.contains(&0) || l.block.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "launch grid {:?} and block {:?} must be non-zero in every dimension",
            l.grid, l.block
        )));
    }
    if l.params_size > crate::runtime::MAX_PARAMS_BYTES {
        return Err(Error::InvalidArgument(format!(
            "launch.params_size is {} bytes; a node's parameters are at most {}",
            l.params_size,
            crate::runtime::MAX_PARAMS_BYTES
        )));
    }
    // SAFETY: the C contract: `params` holds `params_size` bytes (or is NULL when 0).
    let params = unsafe { c_slice(l.params as *const u8, l.params_size, "launch.params")? };
    let dims = LaunchDims {
        grid: l.grid,
        block: l.block,
        shared_mem_bytes: l.shared_mem_bytes,
    };
    Ok((dims, params))
}

/// Launches `kernel` once, outside any graph, on device memory the caller owns: `inputs`,
/// `outputs` (device pointers and sizes, as a callback sees them) and, for device functions,
/// `launch` (as for `gkrt_graph_add_kernel`: the kernel's parameters are one pointer per input,
/// output and workspace, then the parameter blob). Any kind of kernel: a built-in (checked as a
/// node is: arity, sizes, parameters), PTX, cubin, CUDA source, or a host callback (called as
/// for a node, with `args->node` = UINT32_MAX; on the host backend when the stream reaches it,
/// on CUDA now, with the CUstream). It is queued on `stream` (a native stream: `CUstream` on
/// CUDA; on the host backend a token from `gkrt_stream_create` or a callback's `args->stream`;
/// NULL: gkrt's compute stream, where graphs run) and this returns without waiting. Workspaces
/// of `workspace_sizes` bytes come from the runtime's pool on `stream` and go back to it in
/// stream order as soon as the launch is queued (later work on `stream` may reuse them; work on
/// another stream only after the launch has run). A failure on the device (a callback's
/// non-zero status on the host backend) surfaces at the next synchronisation of `stream`
/// (`gkrt_stream_synchronize`). GKRT_STATUS_INVALID_ARGUMENT, with the buffer or rule named, for
/// a NULL buffer, a size of 0, a built-in's wrong arity or sizes, a kernel of another runtime,
/// or an unknown stream; GKRT_STATUS_OUT_OF_MEMORY for workspaces that do not fit. Nothing is
/// queued after a failure. Thread-safe.
#[must_use]
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gkrt_launch_kernel(
    runtime: *mut gkrt_runtime,
    kernel: *const gkrt_kernel,
    stream: *mut c_void,
    inputs: *const CallbackBuffer,
    num_inputs: usize,
    outputs: *const CallbackBuffer,
    num_outputs: usize,
    workspace_sizes: *const u64,
    num_workspaces: usize,
    launch: *const gkrt_launch,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        let k = handles::kernel(kernel as usize)?;
        if k.runtime.serial() != rt.serial() {
            return Err(Error::InvalidArgument(
                "the kernel belongs to another runtime".into(),
            ));
        }
        // SAFETY: the C contract: each array is NULL (when its count is 0) or holds its count
        // of elements, and `launch` is NULL or points to a `gkrt_launch`.
        let (inputs, outputs, workspaces, launch) = unsafe {
            (
                c_slice(inputs, num_inputs, "inputs")?,
                c_slice(outputs, num_outputs, "outputs")?,
                c_slice(workspace_sizes, num_workspaces, "workspace_sizes")?,
                launch.as_ref(),
            )
        };
        // SAFETY: as above.
        let (dims, params) = unsafe { launch_of(launch)? };
        let mut buffers = Vec::with_capacity(inputs.len() + outputs.len() + workspaces.len());
        buffers.extend(
            inputs
                .iter()
                .chain(outputs)
                .map(|b| crate::runtime::DeviceBuffer {
                    ptr: b.ptr as u64,
                    bytes: b.size as u64,
                }),
        );
        rt.launch_eager(
            &k.kernel,
            stream,
            EagerArgs {
                buffers,
                num_inputs: inputs.len(),
                workspaces,
                dims,
                params,
            },
        )
    })
}
