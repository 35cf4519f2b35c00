//! C API: where the library's log messages go.

use super::boundary::guard;
use super::types::gkrt_status;
use std::ffi::{c_char, c_void};

/// A host's log callback: called with the message's level (1 error, 2 warning, 3 info, 4 debug,
/// 5 trace), its target (the part of gkrt that wrote it, e.g. "gkrt::runtime") and the message,
/// both NUL-terminated and valid only during the call, and the `user_data` given to
/// `gkrt_set_log_callback`. It may be called from any thread, gkrt's own worker threads
/// included, and from several at once. It may run while gkrt holds a runtime's lock, so it must
/// not call gkrt functions (they could wait for that lock forever): record the message and
/// return.
#[allow(non_camel_case_types)]
pub type gkrt_log_fn = Option<
    unsafe extern "C" fn(
        level: u32,
        target: *const c_char,
        message: *const c_char,
        user_data: *mut c_void,
    ),
>;

/// Sends every message the library logs from now on to `callback` (with `user_data`) instead
/// of stderr; NULL sends them to stderr again (the default). Which messages are written is set
/// by `gkrt_config.log_level` (or `GKRT_LOG_LEVEL` for the PyTorch entry points): the most
/// verbose level any runtime asked for. A failed PyTorch allocation is reported whatever the
/// level. Process-wide; thread-safe. A message another thread is delivering while the callback
/// changes may still reach the previous callback, so keep `user_data` valid until then.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_set_log_callback(
    callback: gkrt_log_fn,
    user_data: *mut c_void,
) -> gkrt_status {
    guard(|| {
        crate::runtime::set_log_sink(callback.map(|f| (f as crate::runtime::LogSinkFn, user_data)));
        Ok(())
    })
}
