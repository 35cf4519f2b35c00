//! The crate's error, the bottom layer: one variant per status the C API reports.
//!
//! It imports nothing from the crate, so every layer may use it. Each layer's own error converts
//! into it with a `From` impl that lives beside that error (`device::DeviceError`,
//! `memory::pool::PoolError`, `graph::GraphError`); `capi` maps it to `gkrt_status` and the
//! thread's last-error text, and `runtime` re-exports it as `runtime::{Error, Result}`.

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
    /// Another rank of a communicator failed (or disagreed, or timed out); the communicator is
    /// aborted.
    PeerFailed(String),
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
            | Error::Internal(m)
            | Error::PeerFailed(m) => m,
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
            Error::PeerFailed(m) => Error::PeerFailed(wrap(m)),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
