//! gkrt — a GPU kernel runtime behind a C ABI.
//!
//! Layers, each importing only the ones below it (see ARCHITECTURE.md):
//! `capi` → `runtime` → `exec` → `plan` → `graph` → `memory` → `device` → `kernels` → `error`.
//!
//! `error` (the crate's `Error`/`Result`, re-exported as `runtime::{Error, Result}`) imports
//! nothing and every layer may use it; so does `arena`, the offline arena planner (buffers with
//! lifetimes given offsets), which `plan` uses for planned mode and `memory` for the pool's
//! epoch plans. `kernels` describes what a node runs (built-in ops,
//! launch dimensions, function ids, the callback ABI, the built-ins' CPU arithmetic);
//! `device` implements it, and `device::open` is the one place a backend is chosen. A layer
//! may skip layers downward (`exec` names `device` streams), never import upward.
//!
//! What Rust code outside the crate may use, deliberately:
//! - [`capi`]: the C API (the `extern "C"` functions and C types of `include/gkrt.h`);
//! - [`runtime`]: the Rust facade over the layers below — runtimes, graphs, kernels and the
//!   vocabulary they take and give (used by `tests/random_graphs/`);
//! - [`planner`]: the offline arena planner (used by `src/bin/gkrt-plans.rs`).
//!
//! Every other layer is `pub(crate)`: an implementation detail, free to change.
#![deny(unsafe_op_in_unsafe_fn)]

pub(crate) mod arena;
pub mod capi;
pub(crate) mod device;
pub(crate) mod error;
pub(crate) mod exec;
pub(crate) mod graph;
pub(crate) mod kernels;
pub(crate) mod memory;
pub(crate) mod plan;
pub mod runtime;

/// The arena planner on its own: placement problems (buffers with lifetimes and sizes) read
/// from CSV, solved greedily or by a time-limited search, checked, and bounded from below.
/// The runtime uses it at finalize in planned mode; `gkrt-plans` runs it on instance files.
pub mod planner {
    pub use crate::arena::{
        check_placement, lower_bound, parse_csv, plan_greedy, plan_search, ArenaProblem, BufferSpec,
    };
}
