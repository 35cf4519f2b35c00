//! The C API: the `extern "C"` functions (`runtime.rs`, `graph.rs`, `kernel.rs`, `raw.rs`,
//! `log.rs`, `binding.rs`, `async_run.rs`, `eager.rs`, `queue.rs`, `comm.rs`, `snapshot.rs`,
//! `trace.rs`), the
//! C types cbindgen exports to `include/gkrt.h` (`types.rs`), the handle tables (`handles.rs`)
//! and the panic boundary (`boundary.rs`). Everything here validates handles and pointers,
//! runs the call inside the panic boundary, maps errors to `gkrt_status` and keeps the
//! thread's last-error text. No logic of the runtime lives here.
//!
//! The `unsafe extern "C"` functions' safety contract is the C one, stated in each function's
//! header comment: pointers are NULL or valid for the sizes given.
#![allow(clippy::missing_safety_doc)]

mod async_run;
mod binding;
mod boundary;
mod comm;
mod config_layout;
mod eager;
mod graph;
mod handles;
mod kernel;
mod log;
mod queue;
mod raw;
mod runtime;
mod sized;
mod snapshot;
mod trace;
pub mod types;

pub use async_run::*;
pub use binding::*;
pub use boundary::gkrt_last_error_message;
pub use comm::*;
pub use eager::*;
pub use graph::*;
pub use kernel::*;
pub use log::*;
pub use queue::*;
pub use raw::*;
pub use runtime::*;
pub use snapshot::*;
pub use trace::*;
pub use types::*;
