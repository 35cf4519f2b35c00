//! gkrt — a GPU kernel runtime behind a C ABI.
//!
//! Layers, each using only the ones below it (see ARCHITECTURE.md):
//! `capi` → `runtime` → `exec` → `plan` → `graph` → `memory` → `device` (+ `kernels`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod capi;
pub mod device;
pub mod exec;
pub mod graph;
pub mod kernels;
pub mod memory;
pub mod plan;
pub mod runtime;
