//! The library's log: one logger for the `log` facade (`log` has one per process), installed by
//! the first runtime or by `set_sink`. Every message goes to the host's sink when it set one
//! (`gkrt_set_log_callback`), else to stderr. The level is the most verbose any runtime asked for.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::ffi::{c_char, c_void, CString};
use std::sync::RwLock;

/// A host's log sink: `(level, target, message, user_data)`, level 1 (error) … 5 (trace), both
/// strings NUL-terminated and valid for the call only.
pub type SinkFn = unsafe extern "C" fn(u32, *const c_char, *const c_char, *mut c_void);

#[derive(Clone, Copy)]
struct Sink {
    func: SinkFn,
    user_data: usize,
}

/// Copied out before each call, so a sink may replace itself (or log) without a deadlock.
static SINK: RwLock<Option<Sink>> = RwLock::new(None);

struct Logger;

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            deliver(record.level(), record.target(), &record.args().to_string());
        }
    }

    fn flush(&self) {}
}

static LOGGER: Logger = Logger;

/// Installs the logger (a harmless no-op when the host program installed its own) and raises
/// the level to `level` (0 off … 5 trace) if that is more verbose.
pub fn init(level: u32) {
    let filter = match level {
        0 => LevelFilter::Off,
        1 => LevelFilter::Error,
        2 => LevelFilter::Warn,
        3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    };
    let _ = log::set_logger(&LOGGER);
    if filter > log::max_level() {
        log::set_max_level(filter);
    }
}

/// Sends every later message to `func` with `user_data` (None: back to stderr). A message that
/// another thread is delivering at that moment may still reach the previous sink.
pub fn set_sink(sink: Option<(SinkFn, *mut c_void)>) {
    let _ = log::set_logger(&LOGGER);
    let sink = sink.map(|(func, user_data)| Sink {
        func,
        user_data: user_data as usize,
    });
    *SINK.write().unwrap_or_else(|p| p.into_inner()) = sink;
}

/// One message to the sink or stderr, whatever the level filter says (callers that must be
/// heard — a failed PyTorch allocation — check the level themselves).
pub fn deliver(level: Level, target: &str, message: &str) {
    let sink = *SINK.read().unwrap_or_else(|p| p.into_inner());
    match sink {
        Some(s) => {
            let text = |t: &str| CString::new(t.replace('\0', "")).unwrap_or_default();
            let (target, message) = (text(target), text(message));
            // SAFETY: the host gave the function for this purpose; both strings live until it
            // returns.
            unsafe {
                (s.func)(
                    level as u32,
                    target.as_ptr(),
                    message.as_ptr(),
                    s.user_data as *mut c_void,
                )
            };
        }
        None => eprintln!("[gkrt {level}] {message}"),
    }
}
