//! Kernels: what a node runs, and the rules a node must satisfy to run it — the lowest layer
//! above `error`, importing nothing else from the crate.
//!
//! A kernel is a built-in (implemented by every backend with the same arithmetic), a device
//! function (PTX, cubin or CUDA source, loaded by the device), or a host callback (a C function
//! pointer with user data). This module owns their descriptions: `BuiltinKind` (the C API's
//! numbering) and `BuiltinOp` (what a backend runs), `LaunchDims`, `FunctionId` (an opaque id
//! a device hands out), `Buffer`, the callback ABI (`HostCallback`, `CallbackArgs`,
//! `CallbackBuffer`), and in `host.rs` the built-ins' CPU arithmetic. The device layer
//! implements these; the graph layer validates each node against its kernel here, at build
//! time, so the executor never meets a malformed node.

pub mod collective;
pub mod host;

use std::ffi::c_void;

/// A function a device has loaded: an opaque handle into the loading backend's table, handed
/// out by `Device::load_function` and accepted by `Device::launch` of the same device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionId(pub u32);

/// Grid, block and dynamic shared memory of a device-function launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
}

/// A device buffer as a kernel sees it: its device address (a `device::DevPtr`) and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub ptr: u64,
    pub bytes: u64,
}

/// The built-in kernels. All operate on f32 elements; element counts come from buffer sizes,
/// which the graph layer has already validated (see `validate_builtin`). Every backend
/// implements each one with the arithmetic of `host::run`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BuiltinOp {
    /// out[i] = value
    Fill { value: f32 },
    /// out = in
    Copy,
    /// out[i] = a[i] + b[i]
    Add,
    /// out[i] = alpha * in[i]
    Scale { alpha: f32 },
    /// out[i] = max(in[i], 0)
    Relu,
    /// out[i] = x[i] > 0 ? grad[i] : 0   (inputs: grad, x)
    ReluGrad,
    /// out[m×n] = a[m×k] · b[k×n], row-major f32
    Matmul { m: u32, n: u32, k: u32 },
}

/// The built-in kernels' numbering in the C API (never renumbered).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BuiltinKind {
    Fill = 0,
    Copy = 1,
    Add = 2,
    Scale = 3,
    Relu = 4,
    ReluGrad = 5,
    Matmul = 6,
}

impl BuiltinKind {
    pub fn from_raw(raw: u32) -> Option<BuiltinKind> {
        use BuiltinKind::*;
        [Fill, Copy, Add, Scale, Relu, ReluGrad, Matmul]
            .into_iter()
            .find(|k| *k as u32 == raw)
    }

    pub fn name(self) -> &'static str {
        match self {
            BuiltinKind::Fill => "fill",
            BuiltinKind::Copy => "copy",
            BuiltinKind::Add => "add",
            BuiltinKind::Scale => "scale",
            BuiltinKind::Relu => "relu",
            BuiltinKind::ReluGrad => "relu_grad",
            BuiltinKind::Matmul => "matmul",
        }
    }
}

/// A host callback as the C API receives it. The signature is mirrored by
/// `gkrt_callback_fn` in the header; it lives here so the executor can call it.
#[derive(Clone, Debug)]
pub struct HostCallback {
    pub func: unsafe extern "C" fn(*const CallbackArgs, *mut c_void) -> i32,
    pub user_data: usize,
    /// Frees `user_data` when the last kernel and node holding this callback are gone (None:
    /// the host keeps the user data itself).
    pub owner: Option<std::sync::Arc<UserDataOwner>>,
}

/// The host's function that frees a callback's user data, called once, on drop — once armed
/// (a kernel that never came to exist leaves the data to the host).
pub struct UserDataOwner {
    free: unsafe extern "C" fn(*mut c_void),
    user_data: usize,
    armed: std::sync::atomic::AtomicBool,
}

impl UserDataOwner {
    /// An owner of `user_data`, not yet armed.
    pub fn new(free: unsafe extern "C" fn(*mut c_void), user_data: usize) -> UserDataOwner {
        UserDataOwner {
            free,
            user_data,
            armed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on the drop frees the user data.
    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for UserDataOwner {
    fn drop(&mut self) {
        if self.armed.load(std::sync::atomic::Ordering::Acquire) {
            // SAFETY: the host gave the function and the pointer for exactly this call.
            unsafe { (self.free)(self.user_data as *mut c_void) }
        }
    }
}

impl std::fmt::Debug for UserDataOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserDataOwner({:#x})", self.user_data)
    }
}

thread_local! {
    static IN_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Calls a host callback with the current thread marked as inside one (see `inside_callback`).
///
/// # Safety
/// As for calling `cb.func` with `args`: both come from the host for this purpose.
pub unsafe fn call_callback(cb: &HostCallback, args: &CallbackArgs) -> i32 {
    IN_CALLBACK.with(|c| c.set(true));
    // SAFETY: forwarded to the caller.
    let status = unsafe { (cb.func)(args, cb.user_data as *mut c_void) };
    IN_CALLBACK.with(|c| c.set(false));
    status
}

/// True while this thread runs a host callback: the C API then refuses calls that would need
/// the busy runtime.
pub fn inside_callback() -> bool {
    IN_CALLBACK.with(|c| c.get())
}

/// What a callback is called with: the node's buffers and the stream. Mirrors
/// `gkrt_callback_args` in the C API (`capi` re-exports it under that name).
#[repr(C)]
pub struct CallbackArgs {
    /// The node's inputs, in the order they were added.
    pub inputs: *const CallbackBuffer,
    /// Entries at `inputs`.
    pub num_inputs: usize,
    /// The node's outputs, in the order they were added.
    pub outputs: *const CallbackBuffer,
    /// Entries at `outputs`.
    pub num_outputs: usize,
    /// The node's workspaces, in the order their sizes were given at add time.
    pub workspaces: *const CallbackBuffer,
    /// Entries at `workspaces`.
    pub num_workspaces: usize,
    /// The node's parameter blob (as given to add_kernel), or NULL when empty.
    pub params: *const c_void,
    /// Bytes at `params`.
    pub params_size: usize,
    /// `CUstream` on the CUDA backend; an opaque token on the host backend. On both it is the
    /// runtime's compute stream, which `gkrt_malloc` / `gkrt_free` of the same runtime accept
    /// (after the run: during it the runtime is busy, see `gkrt_callback_fn`).
    pub stream: *mut c_void,
    /// The node's index in its graph.
    pub node: u32,
}

/// A buffer handed to a callback: a device pointer and its size in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallbackBuffer {
    /// Device address on CUDA, host address on the host backend.
    pub ptr: *mut c_void,
    /// Size in bytes.
    pub size: usize,
}

#[derive(Clone, Debug)]
pub enum Kernel {
    Builtin(BuiltinKind),
    Device {
        function: FunctionId,
        name: String,
    },
    Callback(HostCallback),
    /// A collective over a communicator (`graph::collective`): not launched as a kernel but
    /// queued on the communication stream.
    Collective {
        kind: collective::CollectiveKind,
        dtype: collective::DType,
    },
}

impl Kernel {
    pub fn describe(&self) -> String {
        match self {
            Kernel::Collective { kind, dtype } => {
                format!("collective {} of {}", kind.name(), dtype.name())
            }
            Kernel::Builtin(b) => format!("built-in {}", b.name()),
            Kernel::Device { name, .. } => format!("device function '{name}'"),
            Kernel::Callback(_) => "host callback".to_string(),
        }
    }
}

/// Checks a built-in node's shape and parameter blob; returns the op the device runs.
/// Errors name the rule that failed and the sizes involved.
pub fn validate_builtin(
    kind: BuiltinKind,
    inputs: &[u64],
    outputs: &[u64],
    params: &[u8],
) -> Result<BuiltinOp, String> {
    let name = kind.name();
    let arity = |n_in: usize, n_out: usize| -> Result<(), String> {
        if inputs.len() != n_in || outputs.len() != n_out {
            return Err(format!(
                "built-in {name} takes {n_in} input(s) and {n_out} output(s), got {} and {}",
                inputs.len(),
                outputs.len()
            ));
        }
        Ok(())
    };
    let f32_sized = |what: &str, bytes: u64| -> Result<(), String> {
        if !bytes.is_multiple_of(4) {
            return Err(format!(
                "built-in {name}: {what} has {bytes} bytes, not a whole number of f32 elements"
            ));
        }
        Ok(())
    };
    let same_size = |sizes: &[u64]| -> Result<(), String> {
        if sizes.windows(2).any(|w| w[0] != w[1]) {
            return Err(format!(
                "built-in {name}: all tensors must have the same size, got {sizes:?} bytes"
            ));
        }
        Ok(())
    };
    let scalar = || -> Result<f32, String> {
        let bytes: [u8; 4] = params.try_into().map_err(|_| {
            format!(
                "built-in {name} needs a 4-byte f32 parameter, got {} bytes",
                params.len()
            )
        })?;
        Ok(f32::from_ne_bytes(bytes))
    };
    let no_params = || -> Result<(), String> {
        if !params.is_empty() {
            return Err(format!(
                "built-in {name} takes no parameters, got {} bytes",
                params.len()
            ));
        }
        Ok(())
    };
    match kind {
        BuiltinKind::Fill => {
            arity(0, 1)?;
            f32_sized("the output", outputs[0])?;
            Ok(BuiltinOp::Fill { value: scalar()? })
        }
        BuiltinKind::Copy => {
            arity(1, 1)?;
            no_params()?;
            same_size(&[inputs[0], outputs[0]])?;
            Ok(BuiltinOp::Copy)
        }
        BuiltinKind::Add | BuiltinKind::ReluGrad => {
            arity(2, 1)?;
            no_params()?;
            same_size(&[inputs[0], inputs[1], outputs[0]])?;
            f32_sized("the output", outputs[0])?;
            Ok(if kind == BuiltinKind::Add {
                BuiltinOp::Add
            } else {
                BuiltinOp::ReluGrad
            })
        }
        BuiltinKind::Scale => {
            arity(1, 1)?;
            same_size(&[inputs[0], outputs[0]])?;
            f32_sized("the output", outputs[0])?;
            Ok(BuiltinOp::Scale { alpha: scalar()? })
        }
        BuiltinKind::Relu => {
            arity(1, 1)?;
            no_params()?;
            same_size(&[inputs[0], outputs[0]])?;
            f32_sized("the output", outputs[0])?;
            Ok(BuiltinOp::Relu)
        }
        BuiltinKind::Matmul => {
            arity(2, 1)?;
            if params.len() != 12 {
                return Err(format!(
                    "built-in matmul needs parameters {{uint32 m, n, k}} (12 bytes), got {} bytes",
                    params.len()
                ));
            }
            let dim = |i: usize| u32::from_ne_bytes(params[i * 4..i * 4 + 4].try_into().unwrap());
            let (m, n, k) = (dim(0), dim(1), dim(2));
            if m == 0 || n == 0 || k == 0 {
                return Err(format!(
                    "built-in matmul: dimensions must be non-zero, got m={m} n={n} k={k}"
                ));
            }
            // r·c·4 can exceed 64 bits (m = k = 3,037,000,500 wraps to a small number): a size
            // that does not fit is never equal to a tensor's.
            let want = |r: u32, c: u32| (r as u64).checked_mul(c as u64)?.checked_mul(4);
            let checks = [
                ("input a (m×k)", inputs[0], want(m, k)),
                ("input b (k×n)", inputs[1], want(k, n)),
                ("output (m×n)", outputs[0], want(m, n)),
            ];
            for (what, got, expected) in checks {
                let Some(expected) = expected else {
                    return Err(format!(
                        "built-in matmul m={m} n={n} k={k}: {what} would need more than 2^64 bytes, has {got}"
                    ));
                };
                if got != expected {
                    return Err(format!(
                        "built-in matmul m={m} n={n} k={k}: {what} must have {expected} bytes, has {got}"
                    ));
                }
            }
            Ok(BuiltinOp::Matmul { m, n, k })
        }
    }
}
