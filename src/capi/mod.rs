//! The C API: `extern "C"` functions only. Everything here validates handles and pointers,
//! runs the call inside the panic boundary, maps errors to `gkrt_status` and keeps the
//! thread's last-error text. No logic of the runtime lives here.

mod boundary;
mod graph;
mod handles;
mod kernel;
mod logging;
mod runtime;
pub mod types;

pub use boundary::gkrt_last_error_message;
pub use graph::*;
pub use kernel::*;
pub use runtime::*;
pub use types::*;
