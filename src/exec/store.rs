//! A graph's tensor memory, owned in one place: where each tensor is (`TensorMemory`), the
//! planned arena, and every pool call for them outside the step program — the host's writes and
//! reads between runs, the arena taken at the first planned run, and the release of it all when
//! the graph goes. Inside a run the executor works on the same store.

use crate::device::{DevPtr, Device, StreamId};
use crate::error::{Error, Result};
use crate::memory::pool::{Lane, Pool, PoolError};
use crate::memory::residency::{Residency, TensorMemory};
use crate::memory::{DeviceBacking, PinnedBacking};

/// A pinned pool's failure, said as what it is: pinned host memory, under the host memory limit
/// (the pool's own message speaks of device memory).
pub(super) fn pinned_error(e: PoolError) -> Error {
    match e {
        PoolError::OutOfMemory {
            requested,
            reserved,
            allocated,
            limit,
        } => Error::OutOfMemory(if limit == u64::MAX {
            format!(
                "out of pinned host memory: requested {requested} bytes with {reserved} bytes pinned \
                 and {allocated} in use; no host memory limit is set (the system refused)"
            )
        } else {
            format!(
                "out of pinned host memory: requested {requested} bytes with {reserved} bytes pinned \
                 and {allocated} in use, and the host memory limit (gkrt_config.host_memory_limit) \
                 is {limit} bytes"
            )
        }),
        other => Error::from(other),
    }
}

#[derive(Default)]
pub struct TensorStore {
    mem: Vec<TensorMemory>,
    /// Planned mode: the arena, once the first run took it from the pool.
    arena: Option<DevPtr>,
    /// The runtime's label of tensor 0 (tensor `t` is `labels + t`; 0: none registered), set
    /// on the pool before each allocation so snapshots can name the owner.
    labels: u32,
}

/// What the store's pool calls need: the device, the stream host copies run on, and the pools.
pub struct StoreAccess<'a> {
    pub device: &'a dyn Device,
    pub stream: StreamId,
    pub pool: &'a mut Pool,
    pub pinned: &'a mut Pool,
}

impl TensorStore {
    /// Room for one more tensor (nothing allocated).
    pub fn add_tensor(&mut self) {
        self.mem.push(TensorMemory::default());
    }

    pub fn get(&self, t: u32) -> &TensorMemory {
        &self.mem[t as usize]
    }

    pub fn iter(&self) -> impl Iterator<Item = &TensorMemory> {
        self.mem.iter()
    }

    pub(super) fn mem_mut(&mut self) -> &mut [TensorMemory] {
        &mut self.mem
    }

    pub fn arena(&self) -> Option<DevPtr> {
        self.arena
    }

    /// Labels for the graph's blocks from here on: tensor `t` is `base + t`, the workspaces of
    /// node `n` are `base + tensors + n`, the arena `base + tensors + nodes`.
    pub fn set_label_base(&mut self, base: u32) {
        self.labels = base;
    }

    pub fn label_base(&self) -> u32 {
        self.labels
    }

    /// The label of tensor `t` (0 when none are registered).
    fn label_of(&self, t: u32) -> u32 {
        if self.labels == 0 {
            0
        } else {
            self.labels.wrapping_add(t)
        }
    }

    /// Every queued copy has finished: in-flight states land.
    pub fn land_all(&mut self) {
        for m in &mut self.mem {
            m.land();
        }
    }

    /// Takes the planned arena of `size` bytes from the pool, once.
    pub fn take_arena(&mut self, size: u64, nodes: u32, a: StoreAccess<'_>) -> Result<()> {
        if self.arena.is_none() && size > 0 {
            a.pool
                .set_owner(self.label_of(self.mem.len() as u32 + nodes));
            // Held while the graph lives: in the lasting lane, with the persistent tensors.
            let base = a
                .pool
                .alloc_in(&DeviceBacking(a.device), size, a.stream, Lane::Lasting)
                .map_err(|e| {
                    Error::from(e).context(format!("allocating the planned arena of {size} bytes"))
                })?;
            self.arena = Some(base);
        }
        Ok(())
    }

    /// Waits (on the host) until no copy of `t` is in flight, so its host slot and device
    /// block can be touched directly.
    fn settle(&mut self, t: u32, device: &dyn Device) -> Result<()> {
        let m = &mut self.mem[t as usize];
        for event in [m.event(false), m.event(true)].into_iter().flatten() {
            device.event_synchronize(event)?;
        }
        m.land();
        Ok(())
    }

    /// Binds persistent tensor `t` to the host's memory at `ptr`: a block of its own goes back
    /// to the pool (in stream order: work queued on the stream may still read it), and from now
    /// on the tensor is read and written at `ptr`, in place. Rebinding just moves the pointer.
    pub fn bind(&mut self, t: u32, ptr: DevPtr, a: StoreAccess<'_>) -> Result<()> {
        self.settle(t, a.device)?;
        let m = &mut self.mem[t as usize];
        if !m.is_bound() {
            let (block, slot) = m.discard();
            if let Some(block) = block {
                a.pool.free(&DeviceBacking(a.device), block)?;
            }
            if let Some(slot) = slot {
                a.pinned.free(&PinnedBacking(a.device), slot)?;
            }
        }
        self.mem[t as usize].bind(ptr);
        Ok(())
    }

    /// The host takes `t`'s memory back: it has no memory or contents until written or
    /// produced again (then in a block of the pool, as if never bound).
    pub fn unbind(&mut self, t: u32) {
        if self.mem[t as usize].is_bound() {
            self.mem[t as usize].unbind();
        }
    }

    /// Copies `data` into persistent tensor `t`. One on the device is written there; one on the
    /// host — or, with `to_host_when_new` (a swapping graph), one never written — into its
    /// pinned slot. The copy is complete when this returns.
    pub fn write(
        &mut self,
        t: u32,
        data: &[u8],
        to_host_when_new: bool,
        a: StoreAccess<'_>,
    ) -> Result<()> {
        self.settle(t, a.device)?;
        let bytes = data.len() as u64;
        let to_host = match self.mem[t as usize].state() {
            Residency::OnHost => true,
            Residency::Unallocated => to_host_when_new,
            _ => false,
        };
        let label = self.label_of(t);
        let m = &mut self.mem[t as usize];
        if to_host {
            let slot = match m.host() {
                Some(slot) => slot,
                None => {
                    let slot = a
                        .pinned
                        .alloc(&PinnedBacking(a.device), bytes, StreamId(0))
                        .map_err(pinned_error)?;
                    m.set_host_slot(slot);
                    slot
                }
            };
            // SAFETY: the slot holds `bytes` bytes and no copy uses it (settled above).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), slot as *mut u8, data.len()) };
            m.written_on_host();
        } else {
            let ptr = match m.device() {
                Some(p) => p,
                None => {
                    // Held across runs: in the lasting lane (`Executor::lane_of`); a
                    // swapping graph's never-written tensors went to the host above.
                    a.pool.set_owner(label);
                    a.pool
                        .alloc_in(&DeviceBacking(a.device), bytes, a.stream, Lane::Lasting)?
                }
            };
            m.placed(ptr);
            m.overwritten();
            // SAFETY: `data` outlives the copy: the stream is synchronised before we return.
            unsafe {
                a.device
                    .copy_h2d_async(ptr, data.as_ptr(), bytes, a.stream)?
            };
            a.device.stream_synchronize(a.stream)?;
        }
        Ok(())
    }

    /// Copies persistent tensor `t`'s contents into `out`, from wherever they are. `describe`
    /// names the tensor in an error.
    pub fn read(
        &mut self,
        t: u32,
        out: &mut [u8],
        device: &dyn Device,
        stream: StreamId,
        describe: impl FnOnce() -> String,
    ) -> Result<()> {
        self.settle(t, device)?;
        let m = &self.mem[t as usize];
        match (m.state(), m.device(), m.host()) {
            (Residency::OnDevice, Some(ptr), _) => {
                // SAFETY: `out` outlives the copy: the stream is synchronised before we return.
                unsafe { device.copy_d2h_async(out.as_mut_ptr(), ptr, out.len() as u64, stream)? };
                device.stream_synchronize(stream)?;
            }
            (Residency::OnHost, _, Some(slot)) if m.host_valid() => {
                // SAFETY: the slot holds the tensor's bytes and no copy uses it (settled above).
                unsafe {
                    std::ptr::copy_nonoverlapping(slot as *const u8, out.as_mut_ptr(), out.len())
                };
            }
            (state, _, _) => {
                return Err(Error::Internal(format!(
                    "{} is marked as holding contents but is {state:?}",
                    describe()
                )))
            }
        }
        Ok(())
    }

    /// Gives everything back: the tensors' device blocks, host slots and events, and the arena.
    /// The caller has drained the device.
    pub fn release(&mut self, a: StoreAccess<'_>) {
        let mut blocks: Vec<DevPtr> = self.arena.take().into_iter().collect();
        for m in &mut self.mem {
            for event in m.take_events() {
                let _ = a.device.destroy_event(event);
            }
            let (device, host) = m.discard();
            blocks.extend(device);
            if let Some(slot) = host {
                if let Err(e) = a.pinned.free(&PinnedBacking(a.device), slot) {
                    log::error!("releasing a graph's host slot: {e}");
                }
            }
        }
        for ptr in blocks {
            if let Err(e) = a.pool.free(&DeviceBacking(a.device), ptr) {
                log::error!("releasing a graph's tensor: {e}");
            }
        }
        // Blocks freed pending on this graph's (now destroyed, completed) events are free.
        for event in a.pool.pending_events() {
            a.pool.assume_complete(event);
        }
        for event in a.pinned.pending_events() {
            a.pinned.assume_complete(event);
        }
    }
}
