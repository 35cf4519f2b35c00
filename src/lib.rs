//! gkrt — a GPU kernel runtime behind a C ABI.
//!
//! Layers, each importing only the ones below it (see ARCHITECTURE.md):
//! `capi` → `runtime` → `exec` → `plan` → `graph` → `memory` → `device` → `kernels` → `error`.
//!
//! `error` (the crate's `Error`/`Result`, re-exported as `runtime::{Error, Result}`) imports
//! nothing and every layer may use it. `kernels` describes what a node runs (built-in ops,
//! launch dimensions, function ids, the callback ABI, the built-ins' CPU arithmetic);
//! `device` implements it, and `device::open` is the one place a backend is chosen. A layer
//! may skip layers downward (`exec` names `device` streams), never import upward.

pub mod capi;
pub mod device;
pub mod error;
pub mod exec;
pub mod graph;
pub mod kernels;
pub mod memory;
pub mod plan;
pub mod runtime;
