//! Binding: persistent tensors read and written in place in device memory the host owns.
//!
//! A bound tensor is never swapped, moved or freed by gkrt and holds no pool memory, so it is
//! outside the memory limit. Binding needs a finalized graph (the arena and the swap decision
//! are made first, counting every persistent tensor: conservative) and a graph that does not
//! swap (its plan moves persistent tensors between device and host). A planned graph replayed
//! as a captured CUDA graph keeps one capture per set of bound addresses (up to
//! `MAX_CAPTURES`): a new set is captured at the next run, a set seen before replays its own.

use super::{Replay, RuntimeGraph};
use crate::exec::StoreAccess;
use crate::runtime::{Error, Result};
use std::sync::Arc;

/// Captures kept for other sets of bound addresses (beyond it, the oldest is destroyed).
const MAX_CAPTURES: usize = 16;

impl RuntimeGraph {
    /// The index of tensor `id` for a bind or unbind (`verb`), after the checks every such call
    /// shares.
    pub(super) fn binding_index(&self, id: u64, verb: &str) -> Result<u32> {
        let t = self.graph.tensor_index(id)?;
        let tensor = &self.graph.tensors()[t as usize];
        if !tensor.kind.persists() {
            return Err(Error::InvalidArgument(format!(
                "cannot {verb} {}: only inputs, parameters and outputs can be bound; \
                 intermediates live inside a run",
                tensor.describe(t)
            )));
        }
        if !self.graph.is_finalized() {
            return Err(Error::InvalidState(format!(
                "cannot {verb} {}: finalize the graph first",
                tensor.describe(t)
            )));
        }
        if self.swap.is_some() {
            return Err(Error::InvalidState(format!(
                "cannot {verb} {}: the graph swaps (its working set exceeds the memory limit), \
                 and its swap plan moves persistent tensors; bound tensors need a graph that fits",
                tensor.describe(t)
            )));
        }
        Ok(t)
    }

    /// Binds persistent tensor `id` to `bytes` bytes of device memory at `ptr` (at least the
    /// tensor's size). Its contents are the memory's from now on: an input counts as written.
    pub fn bind(&mut self, id: u64, ptr: u64, bytes: u64) -> Result<()> {
        let t = self.binding_index(id, "bind")?;
        let tensor = &self.graph.tensors()[t as usize];
        if ptr == 0 {
            return Err(Error::InvalidArgument(format!(
                "cannot bind {} to a NULL pointer",
                tensor.describe(t)
            )));
        }
        if bytes < tensor.size {
            return Err(Error::InvalidArgument(format!(
                "cannot bind {} to {bytes} bytes: it needs {} bytes",
                tensor.describe(t),
                tensor.size
            )));
        }
        self.bind_index(t, ptr)
    }

    /// Binds tensor `t` to `ptr` (checked by the caller), keeping the captures right.
    pub(super) fn bind_index(&mut self, t: u32, ptr: u64) -> Result<()> {
        let before = self.bound_addresses();
        let rt = Arc::clone(&self.runtime);
        {
            let mut st = rt.lock_for_call()?;
            let st = &mut *st;
            self.store.bind(
                t,
                ptr,
                StoreAccess {
                    device: rt.device(),
                    stream: rt.compute,
                    pool: &mut st.pool,
                    pinned: &mut st.pinned,
                },
            )?;
        }
        self.has_contents[t as usize] = true;
        self.addresses_changed(before);
        Ok(())
    }

    /// Unbinds persistent tensor `id` (a no-op for one not bound): gkrt forgets the host's
    /// memory, and the tensor has no contents until written or produced again.
    pub fn unbind(&mut self, id: u64) -> Result<()> {
        let t = self.binding_index(id, "unbind")?;
        if !self.store.get(t).is_bound() {
            return Ok(());
        }
        // The host may reuse the memory once this returns: nothing gkrt queued may still use it.
        {
            let _st = self.runtime.lock_for_call()?;
            self.runtime.drain()?;
        }
        let before = self.bound_addresses();
        self.store.unbind(t);
        self.has_contents[t as usize] = false;
        self.addresses_changed(before);
        Ok(())
    }

    /// Every tensor's bound address (0: not bound), in tensor order: the key of a capture.
    pub(super) fn bound_addresses(&self) -> Vec<u64> {
        self.store
            .iter()
            .map(|m| {
                if m.is_bound() {
                    m.device().unwrap_or(0)
                } else {
                    0
                }
            })
            .collect()
    }

    /// Bound addresses may have changed from `before`: a captured replay has them baked in, so
    /// it is kept aside under `before` and the capture for the new addresses, if one was made
    /// before, is taken back (else the next run captures again). Rebinding among a few sets of
    /// buffers (double buffering, a queue's slots) thus captures once per set.
    pub(super) fn addresses_changed(&mut self, before: Vec<u64>) {
        if self.replay == Replay::Off {
            return;
        }
        let now = self.bound_addresses();
        if now == before {
            return;
        }
        let was_captured = matches!(self.replay, Replay::Captured(_));
        if let Replay::Captured(exec_graph) = self.replay {
            self.replay_cache.push((before, exec_graph));
            if self.replay_cache.len() > MAX_CAPTURES {
                let (_, oldest) = self.replay_cache.remove(0);
                if let Err(e) = self.runtime.device.destroy_graph(oldest) {
                    log::warn!("destroying a replaced capture: {e}");
                }
            }
        }
        self.replay = match self.replay_cache.iter().position(|(k, _)| *k == now) {
            Some(i) => Replay::Captured(self.replay_cache.remove(i).1),
            None => {
                if was_captured {
                    log::debug!("bound addresses changed: the planned graph is captured again at its next run");
                    self.captures_dropped += 1;
                }
                Replay::NotYet
            }
        };
    }

    /// Whether persistent tensor `t` is bound to the host's memory.
    pub fn is_bound(&self, t: u32) -> bool {
        self.store.get(t).is_bound()
    }

    /// How many times a change of bound addresses set a captured replay aside and found none
    /// for the new addresses (each costs a capture at the next run).
    pub fn captures_dropped(&self) -> u64 {
        self.captures_dropped
    }
}

#[cfg(test)]
mod gpu_tests {
    use crate::device::LaunchDims;
    use crate::graph::TensorKind;
    use crate::kernels::{BuiltinKind, Kernel};
    use crate::runtime::{Config, DeviceChoice, MemoryMode, Runtime, RuntimeGraph};

    /// On CUDA, a planned graph rebound between two inputs keeps one capture per address: the
    /// first switch to a new address drops the replay (one recapture), switching back and forth
    /// afterwards replays the kept captures, and every run computes on the bound input.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_rebinding_keeps_one_capture_per_address() {
        let rt = Runtime::new(Config {
            device: DeviceChoice::Cuda,
            memory_mode: MemoryMode::Planned,
            ..Config::default()
        })
        .unwrap();
        const N: usize = 1024;
        let bytes = (N * 4) as u64;
        let mut g = RuntimeGraph::new(rt.clone());
        let x = g.add_tensor(bytes, TensorKind::Input, "x").unwrap();
        let y = g.add_tensor(bytes, TensorKind::Output, "y").unwrap();
        let dims = LaunchDims {
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
        };
        g.graph
            .add_node(
                Kernel::Builtin(BuiltinKind::Scale),
                &[x],
                &[y],
                &[],
                dims,
                &3.0f32.to_ne_bytes(),
            )
            .unwrap();
        g.finalize().unwrap();
        let a = rt.raw_alloc(bytes, std::ptr::null_mut()).unwrap();
        let b = rt.raw_alloc(bytes, std::ptr::null_mut()).unwrap();
        let as_bytes = |v: f32| v.to_ne_bytes().repeat(N);
        let run_and_read = |g: &mut RuntimeGraph| {
            g.run().unwrap();
            let mut out = vec![0u8; N * 4];
            g.read(y, &mut out).unwrap();
            f32::from_ne_bytes(out[..4].try_into().unwrap())
        };
        g.bind(x, b, bytes).unwrap();
        g.write(x, &as_bytes(2.0)).unwrap();
        g.bind(x, a, bytes).unwrap();
        g.write(x, &as_bytes(1.0)).unwrap();
        for _ in 0..3 {
            assert_eq!(run_and_read(&mut g), 3.0); // the second run captures
        }
        assert_eq!(g.captures_dropped(), 0);
        g.bind(x, b, bytes).unwrap();
        assert_eq!(g.captures_dropped(), 1);
        assert_eq!(run_and_read(&mut g), 6.0); // captures for b
        for round in 0..4 {
            let (ptr, want) = if round % 2 == 0 { (a, 3.0) } else { (b, 6.0) };
            g.bind(x, ptr, bytes).unwrap();
            assert_eq!(run_and_read(&mut g), want);
        }
        assert_eq!(
            g.captures_dropped(),
            1,
            "switching between known addresses replays"
        );
        drop(g);
        rt.raw_free(a, std::ptr::null_mut(), None).unwrap();
        rt.raw_free(b, std::ptr::null_mut(), None).unwrap();
    }
}
