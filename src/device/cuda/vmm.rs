//! Virtual memory on CUDA (the driver's VMM API): reserved address ranges, with physical memory
//! mapped into them one allocation (`cuMemCreate` handle) per page, so each page can later be
//! unmapped on its own (`cuMemUnmap` cannot unmap part of a mapping); access is granted once per
//! run of pages mapped together.
//!
//! Unmapped allocations are kept as spares, keyed by size, and the next `map` of that size
//! reuses one instead of creating a new allocation: the pool moves memory by unmapping pages of
//! free blocks and mapping them where a block needs them, and reusing the handle halves the
//! driver calls of such a move. `trim` releases the spares; the pool calls it at the end of
//! every operation, so spares never outlive a pool call. `CudaDevice::disable_virtual_memory`
//! (the runtime's `GKRT_VMM=0`) turns the facility off for a device (the pool then uses plain
//! `cuMemAlloc` segments), for comparisons.
//!
//! An allocation may also be mapped at further addresses (`map_alias`: the pool keeps a moved
//! chunk's old address as an alias, so moving it back is bookkeeping). Each address is its own
//! `cuMemMap` + `cuMemSetAccess`; the handle is counted once, and goes to the spares (or is
//! released at teardown) only when its last address is unmapped.

use std::collections::HashMap;

use cudarc::driver::sys::{self, CUresult};

use super::handles::{check, driver_error, error_name, error_string, lock, to_usize};
use super::CudaDevice;
use crate::device::{DevPtr, DeviceError, DeviceResult, VirtualMemory};

/// Physical allocations behind virtual memory.
#[derive(Default)]
pub(super) struct Handles {
    /// Mapped: address → (handle, size).
    mapped: HashMap<DevPtr, (sys::CUmemGenericAllocationHandle, u64)>,
    /// Unmapped, not yet released: (handle, size).
    spare: Vec<(sys::CUmemGenericAllocationHandle, u64)>,
    /// Handles mapped at more than one address: how many addresses beyond the first.
    extra: HashMap<sys::CUmemGenericAllocationHandle, u32>,
}

impl Handles {
    /// One address of `handle` was unmapped: true when it was its last (release it or keep it
    /// as a spare), false when it is still mapped elsewhere.
    fn last_address_gone(&mut self, handle: sys::CUmemGenericAllocationHandle) -> bool {
        match self.extra.get_mut(&handle) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.extra.remove(&handle);
                false
            }
            None => true,
        }
    }
}

impl CudaDevice {
    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; all-zero is a valid (then filled) value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal as i32;
        prop
    }

    /// The granularity when the device supports VMM and `disable_virtual_memory` did not turn it off.
    pub(super) fn vmm_page(&self) -> Option<u64> {
        *self.vmm_page.get_or_init(|| {
            let attr =
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
            match super::attribute(self.dev, attr) {
                Ok(1) => {}
                other => {
                    log::info!("gkrt cuda: no virtual memory management ({other:?})");
                    return None;
                }
            }
            self.bind().ok()?;
            let prop = self.allocation_prop();
            let mut g: usize = 0;
            let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
            // SAFETY: valid out-pointer and property struct.
            let r = unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, flag) };
            if r != CUresult::CUDA_SUCCESS || !g.is_power_of_two() {
                log::info!("gkrt cuda: no usable allocation granularity ({r:?}, {g})");
                return None;
            }
            Some(g as u64)
        })
    }

    /// (Addresses mapped, spare allocations, allocations mapped at more than one address.)
    #[cfg(test)]
    pub(super) fn vmm_handle_counts(&self) -> (usize, usize, usize) {
        let h = lock(&self.vmm_handles);
        (h.mapped.len(), h.spare.len(), h.extra.len())
    }

    /// Releases every physical allocation (device teardown; the pool has unmapped its pages).
    pub(super) fn release_vmm_handles(&self) {
        let mut h = lock(&self.vmm_handles);
        for (addr, (handle, size)) in std::mem::take(&mut h.mapped) {
            // SAFETY: mapped by `map` or `map_alias`; nothing runs on the device any more. A
            // handle at several addresses is released with its last one, once.
            unsafe { sys::cuMemUnmap(addr, size as usize) };
            if h.last_address_gone(handle) {
                // SAFETY: its last address was unmapped just above.
                unsafe { sys::cuMemRelease(handle) };
            }
        }
        for (handle, _) in std::mem::take(&mut h.spare) {
            // SAFETY: an unmapped handle of ours, released once.
            unsafe { sys::cuMemRelease(handle) };
        }
    }
}

impl VirtualMemory for CudaDevice {
    fn granularity(&self) -> u64 {
        self.vmm_page().unwrap_or(0)
    }

    fn reserve(&self, bytes: u64) -> DeviceResult<DevPtr> {
        let align = self.granularity();
        let size = to_usize(bytes)?;
        self.bind()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address; flags 0.
        match unsafe { sys::cuMemAddressReserve(&mut p, size, align as usize, 0, 0) } {
            CUresult::CUDA_SUCCESS => Ok(p),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory {
                requested: bytes,
                message: "cuMemAddressReserve: no address space left".into(),
            }),
            r => Err(driver_error("cuMemAddressReserve", r)),
        }
    }

    fn unreserve(&self, base: DevPtr, bytes: u64) -> DeviceResult<()> {
        let size = to_usize(bytes)?;
        self.bind()?;
        // SAFETY: the driver validates that [base, base+size) is one reservation.
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(base, size)
        })
    }

    fn map(&self, addr: DevPtr, page: u64, count: u64) -> DeviceResult<()> {
        let size = to_usize(page)?;
        let total = to_usize(page.checked_mul(count).ok_or_else(|| {
            DeviceError::Invalid(format!("map of {count} pages of {page} bytes overflows"))
        })?)?;
        self.bind()?;
        let mut h = lock(&self.vmm_handles);
        let mut done = 0;
        let mut failed = None;
        while done < count {
            let at = addr + done * page;
            let handle = match h.spare.iter().position(|&(_, n)| n == page) {
                Some(k) => h.spare.swap_remove(k).0,
                None => {
                    let prop = self.allocation_prop();
                    let mut handle: sys::CUmemGenericAllocationHandle = 0;
                    // SAFETY: valid out-pointer and property struct; a granularity multiple.
                    match unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) } {
                        CUresult::CUDA_SUCCESS => handle,
                        CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                            failed = Some(DeviceError::OutOfMemory {
                                requested: page * (count - done),
                                message: format!(
                                    "cuMemCreate: {}",
                                    error_string(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
                                ),
                            });
                            break;
                        }
                        r => {
                            failed = Some(driver_error("cuMemCreate", r));
                            break;
                        }
                    }
                }
            };
            // SAFETY: handle holds `size` bytes; the page lies unmapped inside a reservation.
            let r = unsafe { sys::cuMemMap(at, size, 0, handle, 0) };
            if r != CUresult::CUDA_SUCCESS {
                h.spare.push((handle, page));
                failed = Some(driver_error("cuMemMap", r));
                break;
            }
            h.mapped.insert(at, (handle, page));
            done += 1;
        }
        if failed.is_none() {
            let desc = sys::CUmemAccessDesc {
                location: self.allocation_prop().location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the whole run was mapped just above; one descriptor.
            let r = unsafe { sys::cuMemSetAccess(addr, total, &desc, 1) };
            if r == CUresult::CUDA_SUCCESS {
                drop(h);
                for k in 0..count {
                    self.registrations.added(addr + k * page, page);
                }
                return Ok(());
            }
            failed = Some(driver_error("cuMemSetAccess", r));
        }
        // All or nothing: undo the pages of this call.
        for k in 0..done {
            let at = addr + k * page;
            if let Some((handle, n)) = h.mapped.remove(&at) {
                // SAFETY: mapped above by this call, never used.
                unsafe { sys::cuMemUnmap(at, size) };
                h.spare.push((handle, n));
            }
        }
        Err(failed.expect("set on every failing path"))
    }

    fn unmap(&self, addr: DevPtr, page: u64, count: u64) -> DeviceResult<()> {
        self.bind()?;
        let mut h = lock(&self.vmm_handles);
        for k in 0..count {
            let at = addr + k * page;
            let Some(&(handle, size)) = h.mapped.get(&at) else {
                return Err(DeviceError::Invalid(format!(
                    "unmap of {at:#x}: nothing mapped there"
                )));
            };
            if size != page {
                return Err(DeviceError::Invalid(format!(
                    "unmap of {page} bytes at {at:#x}, but {size} were mapped"
                )));
            }
            // Communicators let go of the page before its memory goes.
            self.registrations.removing(at);
            // SAFETY: exactly the range one cuMemMap mapped; the caller quiesced the device.
            check("cuMemUnmap", unsafe { sys::cuMemUnmap(at, size as usize) })?;
            h.mapped.remove(&at);
            if h.last_address_gone(handle) {
                h.spare.push((handle, size));
            }
        }
        Ok(())
    }

    fn supports_aliases(&self) -> bool {
        true
    }

    fn map_alias(&self, addr: DevPtr, from: DevPtr, page: u64) -> DeviceResult<()> {
        let size = to_usize(page)?;
        self.bind()?;
        let mut h = lock(&self.vmm_handles);
        let Some(&(handle, n)) = h.mapped.get(&from) else {
            return Err(DeviceError::Invalid(format!(
                "alias of {from:#x}: nothing mapped there"
            )));
        };
        if n != page {
            return Err(DeviceError::Invalid(format!(
                "alias of {page} bytes of {from:#x}, but {n} are mapped there"
            )));
        }
        if h.mapped.contains_key(&addr) {
            return Err(DeviceError::Invalid(format!(
                "alias at {addr:#x}: already mapped"
            )));
        }
        // SAFETY: handle holds `size` bytes (mapped at `from`); `addr` lies unmapped inside a
        // reservation (the pool's bookkeeping, checked by the driver).
        check("cuMemMap", unsafe {
            sys::cuMemMap(addr, size, 0, handle, 0)
        })?;
        let desc = sys::CUmemAccessDesc {
            location: self.allocation_prop().location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: mapped just above; one descriptor.
        let r = unsafe { sys::cuMemSetAccess(addr, size, &desc, 1) };
        if r != CUresult::CUDA_SUCCESS {
            // SAFETY: mapped above by this call, never used.
            unsafe { sys::cuMemUnmap(addr, size) };
            return Err(driver_error("cuMemSetAccess", r));
        }
        h.mapped.insert(addr, (handle, page));
        *h.extra.entry(handle).or_insert(0) += 1;
        drop(h);
        self.registrations.added(addr, page);
        Ok(())
    }

    fn quiesce(&self) -> DeviceResult<()> {
        self.bind()?;
        // Stream-ordered frees: work queued before them may still touch the memory.
        // SAFETY: plain driver call on the current context.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn trim(&self) -> DeviceResult<()> {
        let spare = std::mem::take(&mut lock(&self.vmm_handles).spare);
        let mut first = Ok(());
        for (handle, _) in spare {
            // SAFETY: an unmapped handle of ours, released once.
            let r = unsafe { sys::cuMemRelease(handle) };
            if r != CUresult::CUDA_SUCCESS && first.is_ok() {
                log::warn!("gkrt cuda: cuMemRelease failed: {}", error_name(r));
                first = Err(driver_error("cuMemRelease", r));
            }
        }
        first
    }
}
