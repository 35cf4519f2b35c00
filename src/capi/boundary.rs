//! The panic boundary, status mapping and the thread-local last error.

use super::types::gkrt_status;
use crate::runtime::Error;
use std::cell::RefCell;
use std::ffi::{c_char, CStr};

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub fn status_of(e: &Error) -> gkrt_status {
    match e {
        Error::InvalidArgument(_) => gkrt_status::GKRT_STATUS_INVALID_ARGUMENT,
        Error::InvalidState(_) => gkrt_status::GKRT_STATUS_INVALID_STATE,
        Error::OutOfMemory(_) => gkrt_status::GKRT_STATUS_OUT_OF_MEMORY,
        Error::NoDevice(_) => gkrt_status::GKRT_STATUS_NO_DEVICE,
        Error::Device(_) => gkrt_status::GKRT_STATUS_DEVICE_ERROR,
        Error::Compile(_) => gkrt_status::GKRT_STATUS_COMPILE_ERROR,
        Error::CallbackFailed(_) => gkrt_status::GKRT_STATUS_CALLBACK_FAILED,
        Error::Unsupported(_) => gkrt_status::GKRT_STATUS_UNSUPPORTED,
        Error::Internal(_) => gkrt_status::GKRT_STATUS_INTERNAL,
        Error::PeerFailed(_) => gkrt_status::GKRT_STATUS_PEER_FAILED,
    }
}

pub fn set_last_error(e: &Error) {
    log::debug!("gkrt error: {e}");
    LAST_ERROR.with(|l| *l.borrow_mut() = e.message().to_string());
}

/// Runs `body` with panics caught; an `Err` or a panic becomes a status and the last error.
pub fn guard(body: impl FnOnce() -> Result<(), Error>) -> gkrt_status {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => gkrt_status::GKRT_STATUS_OK,
        Ok(Err(e)) => {
            set_last_error(&e);
            status_of(&e)
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let e = Error::Internal(format!("internal error (a bug in gkrt): {what}"));
            set_last_error(&e);
            gkrt_status::GKRT_STATUS_INTERNAL
        }
    }
}

/// Copies the calling thread's last error message into `buf` (NUL-terminated, truncated to
/// `len - 1` bytes) and returns the message's full length in bytes, without the NUL.
/// `buf` may be NULL (or `len` 0) to ask for the length only. The text stays valid until the
/// next failing call on this thread; it names the tensor, node or size at fault.
/// Thread-safe: each thread has its own last error.
#[no_mangle]
pub unsafe extern "C" fn gkrt_last_error_message(buf: *mut c_char, len: usize) -> usize {
    let msg = LAST_ERROR.with(|l| l.borrow().clone());
    if !buf.is_null() && len > 0 {
        let n = msg.len().min(len - 1);
        // SAFETY: the caller gives `len` writable bytes at `buf`, and `n < len`.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
    }
    msg.len()
}

/// A slice from a C pointer and count; NULL is allowed only for an empty array, and a count no
/// C array can have (past `isize::MAX` bytes) is refused before the slice exists.
///
/// # Safety
/// A non-NULL `ptr` must point to `len` readable elements.
pub(super) unsafe fn c_slice<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::InvalidArgument(format!(
            "{what} is NULL but its count is {len}"
        )));
    }
    // A slice may span at most isize::MAX bytes; a larger count is no array a caller has.
    if len
        .checked_mul(std::mem::size_of::<T>())
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(Error::InvalidArgument(format!(
            "{what}: a count of {len} elements of {} bytes is larger than any array",
            std::mem::size_of::<T>()
        )));
    }
    // SAFETY: `ptr` is not NULL and points to `len` readable elements (the caller's contract),
    // which span at most isize::MAX bytes (checked above).
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The UTF-8 text of a C string; NULL and invalid UTF-8 are errors naming `what`.
///
/// # Safety
/// A non-NULL `p` points to a NUL-terminated string that outlives `'a`.
pub(super) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // SAFETY: forwarded to the caller; `p` is not NULL.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Error::InvalidArgument(format!("{what} is not valid UTF-8")))
}
