//! The runtime's error: one variant per status the C API reports. Lower layers' errors convert
//! into it with `From`; `capi` maps it to `gkrt_status` and the thread's last-error text.

use crate::device::DeviceError;
use crate::graph::GraphError;
use crate::memory::pool::PoolError;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    InvalidArgument(String),
    InvalidState(String),
    OutOfMemory(String),
    NoDevice(String),
    Device(String),
    Compile(String),
    CallbackFailed(String),
    Unsupported(String),
    Internal(String),
}

impl Error {
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::InvalidState(m)
            | Error::OutOfMemory(m)
            | Error::NoDevice(m)
            | Error::Device(m)
            | Error::Compile(m)
            | Error::CallbackFailed(m)
            | Error::Unsupported(m)
            | Error::Internal(m) => m,
        }
    }

    /// The same error with `context` in front of its message ("node 3 (built-in add): ...").
    pub fn context(self, context: impl std::fmt::Display) -> Error {
        let wrap = |m: String| format!("{context}: {m}");
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(wrap(m)),
            Error::InvalidState(m) => Error::InvalidState(wrap(m)),
            Error::OutOfMemory(m) => Error::OutOfMemory(wrap(m)),
            Error::NoDevice(m) => Error::NoDevice(wrap(m)),
            Error::Device(m) => Error::Device(wrap(m)),
            Error::Compile(m) => Error::Compile(wrap(m)),
            Error::CallbackFailed(m) => Error::CallbackFailed(wrap(m)),
            Error::Unsupported(m) => Error::Unsupported(wrap(m)),
            Error::Internal(m) => Error::Internal(wrap(m)),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl From<GraphError> for Error {
    fn from(e: GraphError) -> Error {
        match e {
            GraphError::Invalid(m) => Error::InvalidArgument(m),
            GraphError::State(m) => Error::InvalidState(m),
        }
    }
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Error {
        let text = e.to_string();
        match e {
            DeviceError::OutOfMemory { .. } => Error::OutOfMemory(text),
            DeviceError::NoDevice(_) => Error::NoDevice(text),
            DeviceError::Driver { .. } | DeviceError::Async(_) => Error::Device(text),
            DeviceError::Compile(_) => Error::Compile(text),
            DeviceError::Unsupported(_) => Error::Unsupported(text),
            // The device refuses what it was handed (e.g. a parameter blob the kernel's
            // signature does not take): the caller's input, as far as the device can tell.
            DeviceError::Invalid(_) => Error::InvalidArgument(text),
        }
    }
}

impl From<PoolError> for Error {
    fn from(e: PoolError) -> Error {
        let text = e.to_string();
        match e {
            PoolError::OutOfMemory { .. } => Error::OutOfMemory(text),
            PoolError::ZeroSize | PoolError::UnknownPointer(_) => Error::InvalidArgument(text),
            PoolError::Device(d) => Error::from(d),
            PoolError::LiveBlocks { .. } => Error::InvalidState(text),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
