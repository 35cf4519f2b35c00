//! Errors and handles shared by the CUDA backend: `CUresult` → `DeviceError`, the driver
//! handle wrappers (destroyed exactly once), and the id-indexed tables that hold them.

use std::ffi::{c_char, CStr};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::sys::{self, CUresult};

use crate::device::{DeviceError, DeviceResult};

/// The driver's name for `r` (`CUDA_ERROR_ILLEGAL_ADDRESS`), or its debug form if it has none.
pub(super) fn error_name(r: CUresult) -> String {
    let mut p: *const c_char = ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string (or fails).
    if unsafe { sys::cuGetErrorName(r, &mut p) } == CUresult::CUDA_SUCCESS && !p.is_null() {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("{r:?}")
    }
}

/// The driver's description of `r`.
pub(super) fn error_string(r: CUresult) -> String {
    let mut p: *const c_char = ptr::null();
    // SAFETY: as for error_name.
    if unsafe { sys::cuGetErrorString(r, &mut p) } == CUresult::CUDA_SUCCESS && !p.is_null() {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        "unknown CUDA error".to_owned()
    }
}

#[cold]
pub(super) fn driver_error(call: &'static str, r: CUresult) -> DeviceError {
    DeviceError::Driver {
        call,
        name: error_name(r),
        message: error_string(r),
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the `Driver` error naming `call`.
#[inline]
pub(super) fn check(call: &'static str, r: CUresult) -> DeviceResult<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_error(call, r))
    }
}

#[cold]
pub(super) fn invalid(message: String) -> DeviceError {
    DeviceError::Invalid(message)
}

pub(super) fn to_usize(bytes: u64) -> DeviceResult<usize> {
    usize::try_from(bytes).map_err(|_| invalid(format!("{bytes} bytes do not fit in usize")))
}

// Lock helpers: our critical sections never panic, so poisoning carries no meaning here.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
pub(super) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
pub(super) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

// Driver handles.
//
// SAFETY of every `unsafe impl Send/Sync` below: each type wraps one opaque driver handle that we
// never dereference. The driver API is thread-safe and a handle may be used from any thread on
// which its context is current; every method makes our context current before using one, and
// the tables/`Arc`s guarantee a handle is destroyed only once, after its last use.

pub(super) struct Ctx(pub(super) sys::CUcontext);
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

/// Generates a handle type whose Drop destroys it (errors are logged: Drop cannot return them)
/// and whose `destroy` does the same but reports the error.
macro_rules! owned_handle {
    ($name:ident, $raw:ty, $call:literal, $destroy:path) => {
        pub(super) struct $name(pub(super) $raw);
        unsafe impl Send for $name {}
        unsafe impl Sync for $name {}
        impl $name {
            #[allow(dead_code)] // not every handle type is destroyed explicitly
            pub(super) fn destroy(self) -> DeviceResult<()> {
                let raw = self.0;
                std::mem::forget(self);
                // SAFETY: the handle is live and owned by `self`, which no longer exists.
                check($call, unsafe { $destroy(raw) })
            }
        }
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: as in `destroy`; this is the handle's only destruction.
                let r = unsafe { $destroy(self.0) };
                if r != CUresult::CUDA_SUCCESS {
                    log::warn!("gkrt cuda: {} failed in drop: {}", $call, error_name(r));
                }
            }
        }
    };
}

/// A stream: one we created (destroyed exactly once), or one imported from the host program
/// (`import_stream`), which we never destroy.
pub(super) struct Stream(pub(super) sys::CUstream, pub(super) Owned);
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Owned {
    Yes,
    Borrowed,
}

impl Stream {
    pub(super) fn destroy(self) -> DeviceResult<()> {
        let (raw, owned) = (self.0, self.1);
        std::mem::forget(self);
        if owned == Owned::Borrowed {
            return Ok(());
        }
        // SAFETY: the stream is live and owned by `self`, which no longer exists.
        check("cuStreamDestroy_v2", unsafe {
            sys::cuStreamDestroy_v2(raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.1 == Owned::Borrowed {
            return;
        }
        // SAFETY: as in `destroy`; this is the stream's only destruction.
        let r = unsafe { sys::cuStreamDestroy_v2(self.0) };
        if r != CUresult::CUDA_SUCCESS {
            log::warn!(
                "gkrt cuda: cuStreamDestroy_v2 failed in drop: {}",
                error_name(r)
            );
        }
    }
}
owned_handle!(
    Event,
    sys::CUevent,
    "cuEventDestroy_v2",
    sys::cuEventDestroy_v2
);
owned_handle!(
    GraphExec,
    sys::CUgraphExec,
    "cuGraphExecDestroy",
    sys::cuGraphExecDestroy
);
owned_handle!(Module, sys::CUmodule, "cuModuleUnload", sys::cuModuleUnload);

#[derive(Clone, Copy)]
pub(super) struct Func(pub(super) sys::CUfunction);
unsafe impl Send for Func {}
unsafe impl Sync for Func {}

/// A loaded kernel and what the driver says about its parameters.
pub(super) struct FuncEntry {
    pub(super) func: Func,
    pub(super) name: Box<str>,
    /// Byte size of each parameter (`cuFuncGetParamInfo`), used to reject a launch whose
    /// buffers/params do not match the kernel's signature before the driver reads past them.
    /// `None` when the driver could not tell.
    pub(super) param_sizes: Option<Box<[usize]>>,
}

/// Id-indexed table of shared handles. Slots are never reused (see the module comment).
pub(super) struct Table<T> {
    slots: RwLock<Vec<Option<Arc<T>>>>,
    what: &'static str,
}

impl<T> Table<T> {
    pub(super) fn new(what: &'static str) -> Self {
        Table {
            slots: RwLock::new(Vec::new()),
            what,
        }
    }

    pub(super) fn insert(&self, value: T) -> DeviceResult<u32> {
        let mut slots = write(&self.slots);
        let id = u32::try_from(slots.len())
            .map_err(|_| invalid(format!("too many {}s created", self.what)))?;
        slots.push(Some(Arc::new(value)));
        Ok(id)
    }

    #[inline]
    pub(super) fn get(&self, id: u32) -> DeviceResult<Arc<T>> {
        match read(&self.slots).get(id as usize) {
            Some(Some(v)) => Ok(Arc::clone(v)),
            _ => Err(self.unknown(id)),
        }
    }

    /// The id of the first live entry for which `pred` holds.
    pub(super) fn find(&self, pred: impl Fn(&T) -> bool) -> Option<u32> {
        read(&self.slots)
            .iter()
            .position(|s| s.as_deref().is_some_and(&pred))
            .map(|i| i as u32)
    }

    pub(super) fn remove(&self, id: u32) -> DeviceResult<Arc<T>> {
        let taken = write(&self.slots)
            .get_mut(id as usize)
            .and_then(Option::take);
        taken.ok_or_else(|| self.unknown(id))
    }

    /// Empties the table; the handles are destroyed (outside the lock) as the `Arc`s drop.
    pub(super) fn clear(&self) {
        let all = std::mem::take(&mut *write(&self.slots));
        drop(all);
    }

    #[cold]
    fn unknown(&self, id: u32) -> DeviceError {
        invalid(format!("unknown or destroyed {} id {id}", self.what))
    }
}
