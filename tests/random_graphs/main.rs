//! Random graphs of built-ins and host callbacks, run through the Rust API on the host backend
//! with jitter: dynamic and planned mode give bit-identical outputs, equal to a plain
//! interpretation of the same graph, and every run returns allocated memory to its baseline.
//!
//! `spec` makes the graphs and their reference, `harness` builds and runs them; the tests are in
//! `matches_reference` (random graphs, any mode and budget), `budgets` (fixed graphs at the
//! budget's edge), `recompute` (rebuilding instead of copying) and `pool_calls` (the run against
//! its dry run).

mod budgets;
mod harness;
mod matches_reference;
mod pool_calls;
mod recompute;
mod spec;
