//! What the collective integration tests share: a jittery host runtime, f32 <-> bytes, and the
//! pool calls of a run less those of persistent tensors (which get their blocks at the host's
//! write or the first run, so the dry run, which starts with none, cannot match them).
#![allow(dead_code)] // each test binary uses its own part

pub mod chains;

use gkrt::runtime::{
    Buf, Config, DeviceChoice, LaunchDims, MemoryMode, PoolCall, Runtime, RuntimeGraph,
};
use std::sync::Arc;

pub const DIMS: LaunchDims = LaunchDims {
    grid: [1; 3],
    block: [1; 3],
    shared_mem_bytes: 0,
};

/// A host-backend runtime with 30 µs of stream jitter.
pub fn runtime(memory_mode: MemoryMode) -> Arc<Runtime> {
    Runtime::new(Config {
        device: DeviceChoice::Host,
        host_jitter_us: 30,
        memory_mode,
        ..Config::default()
    })
    .unwrap()
}

pub fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// `calls` less those of `g`'s persistent tensors, in order.
pub fn transient_calls(g: &RuntimeGraph, calls: &[PoolCall]) -> Vec<PoolCall> {
    calls
        .iter()
        .copied()
        .filter(|c| {
            let (PoolCall::Alloc { buf, .. } | PoolCall::Free { buf }) = *c;
            !matches!(buf, Buf::Tensor(t) if g.graph.tensors()[t as usize].kind.persists())
        })
        .collect()
}
