//! Eager launches: one kernel of any kind on the caller's device pointers, outside any graph,
//! on a stream the caller names. Its workspaces come from the runtime's pool on that stream and
//! go back to it in stream order right after the launch is queued (reused at once by later
//! work on the same stream, on another only after an event: the pool's rule), so the launch
//! waits for nothing.

use super::{Error, Result, Runtime};
use crate::device::{Buffer, DevPtr, LaunchDims};
use crate::exec::{launch_eager, EagerKernel};
use crate::graph::{MAX_BUFFER_BYTES, MAX_NODE_BUFFERS, MAX_PARAMS_BYTES};
use crate::kernels::{validate_builtin, BuiltinOp, Kernel};
use crate::memory::DeviceBacking;
use std::ffi::c_void;

/// The caller's side of an eager launch.
pub struct EagerArgs<'a> {
    /// The inputs, then the outputs (one allocation per launch: this is a hot path; room for
    /// the workspaces is welcome).
    pub buffers: Vec<Buffer>,
    pub num_inputs: usize,
    pub workspaces: &'a [u64],
    pub dims: LaunchDims,
    pub params: &'a [u8],
}

impl Runtime {
    /// Queues `kernel` once on the native stream `stream` (NULL: the compute stream) and
    /// returns. Bad arguments are refused before anything is queued, naming the buffer.
    pub fn launch_eager(
        &self,
        kernel: &Kernel,
        stream: *mut c_void,
        mut a: EagerArgs<'_>,
    ) -> Result<()> {
        let what = || format!("eager launch of {}", kernel.describe());
        let builtin =
            check(kernel, &a).map_err(|e| Error::InvalidArgument(format!("{}: {e}", what())))?;
        let native = if stream.is_null() {
            self.device.native_stream(self.compute)?
        } else {
            stream
        };
        let (num_inputs, num_outputs) = (a.num_inputs, a.buffers.len() - a.num_inputs);
        let mut buffers = std::mem::take(&mut a.buffers);
        let launch = |buffers: &[Buffer], s| {
            let k = EagerKernel {
                kernel,
                builtin,
                dims: &a.dims,
                params: a.params,
                buffers,
                num_inputs,
                num_outputs,
            };
            launch_eager(self.device(), &k, s).map_err(|e| e.context(what()))
        };
        if a.workspaces.is_empty() {
            // No pool call: no state lock either.
            let s = self
                .device
                .import_stream(native)
                .map_err(|e| Error::InvalidArgument(format!("stream {native:p}: {e}")))?;
            return launch(&buffers, s);
        }
        let mut st = self.lock_for_call()?;
        let st = &mut *st;
        let s = self.raw_stream(st, native)?;
        let backing = DeviceBacking(self.device());
        let mut taken: Vec<DevPtr> = Vec::with_capacity(a.workspaces.len());
        let mut result = Ok(());
        for (i, &bytes) in a.workspaces.iter().enumerate() {
            match st.pool.alloc(&backing, bytes, s) {
                Ok(p) => {
                    taken.push(p);
                    buffers.push(Buffer { ptr: p, bytes });
                }
                Err(e) => {
                    result = Err(Error::from(e)
                        .context(format!("{}: workspace {i} of {bytes} bytes", what())));
                    break;
                }
            }
        }
        if result.is_ok() {
            result = launch(&buffers, s);
        }
        // In stream order: behind the launch (or nothing, when it was not queued).
        for p in taken {
            if let Err(e) = st.pool.free(&backing, p) {
                log::error!("returning an eager launch's workspace to the pool: {e}");
            }
        }
        result
    }
}

/// The checks a graph makes when a node is added, on the caller's buffers; the built-in's op.
fn check(kernel: &Kernel, a: &EagerArgs<'_>) -> std::result::Result<Option<BuiltinOp>, String> {
    let n_in = a.num_inputs.min(a.buffers.len());
    let (inputs, outputs) = a.buffers.split_at(n_in);
    if a.params.len() > MAX_PARAMS_BYTES {
        return Err(format!(
            "a parameter blob of {} bytes; at most {MAX_PARAMS_BYTES}",
            a.params.len()
        ));
    }
    for (role, count) in [
        ("inputs", inputs.len()),
        ("outputs", outputs.len()),
        ("workspaces", a.workspaces.len()),
    ] {
        if count > MAX_NODE_BUFFERS {
            return Err(format!("{count} {role}; at most {MAX_NODE_BUFFERS}"));
        }
    }
    for (role, bufs) in [("input", inputs), ("output", outputs)] {
        for (i, b) in bufs.iter().enumerate() {
            if b.ptr == 0 {
                return Err(format!("{role} {i} is NULL"));
            }
            if b.bytes == 0 || b.bytes > MAX_BUFFER_BYTES {
                return Err(format!(
                    "{role} {i}: size {} bytes (must be between 1 and {MAX_BUFFER_BYTES})",
                    b.bytes
                ));
            }
        }
    }
    for (i, &w) in a.workspaces.iter().enumerate() {
        if w == 0 || w > MAX_BUFFER_BYTES {
            return Err(format!(
                "workspace {i}: size {w} bytes (must be between 1 and {MAX_BUFFER_BYTES})"
            ));
        }
    }
    if outputs.is_empty() && !matches!(kernel, Kernel::Callback(_)) {
        return Err("no outputs".into());
    }
    match kernel {
        Kernel::Builtin(kind) => {
            let sizes = |b: &[Buffer]| b.iter().map(|b| b.bytes).collect::<Vec<_>>();
            let op = validate_builtin(*kind, &sizes(inputs), &sizes(outputs), a.params)?;
            if matches!(op, BuiltinOp::Matmul { .. })
                && inputs
                    .iter()
                    .any(|i| outputs.iter().any(|o| o.ptr == i.ptr))
            {
                return Err("matmul cannot write one of its own inputs".into());
            }
            Ok(Some(op))
        }
        _ => Ok(None),
    }
}
