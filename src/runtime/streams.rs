//! Streams the host names: made by gkrt for a host that has none of its own (the host backend,
//! or a CUDA program that wants a stream gkrt made), and waited for.

use super::{Error, Result, Runtime};
use crate::device::DeviceError;
use std::ffi::c_void;

impl Runtime {
    /// A new stream of the runtime's device, as its native handle (`CUstream` on CUDA; a token
    /// on the host backend). It lives as long as the runtime.
    pub fn create_stream(&self) -> Result<*mut c_void> {
        let id = self.device.create_stream()?;
        Ok(self.device.native_stream(id)?)
    }

    /// Blocks until everything queued on the native stream `stream` (NULL: the compute
    /// stream) has run; returns the first failure raised there since the last wait.
    pub fn synchronize_stream(&self, stream: *mut c_void) -> Result<()> {
        let id = if stream.is_null() {
            self.compute
        } else {
            self.device
                .import_stream(stream)
                .map_err(|e| Error::InvalidArgument(format!("stream {stream:p}: {e}")))?
        };
        self.device.stream_synchronize(id).map_err(|e| match e {
            DeviceError::Async(m) => Error::CallbackFailed(m),
            other => Error::from(other),
        })
    }
}
