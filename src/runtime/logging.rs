//! A minimal stderr logger for the `log` facade, installed by the first runtime. The level is
//! the most verbose any runtime asked for (`log` has one logger per process).

use log::{LevelFilter, Log, Metadata, Record};

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!("[gkrt {}] {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

pub fn init(level: u32) {
    let filter = match level {
        0 => LevelFilter::Off,
        1 => LevelFilter::Error,
        2 => LevelFilter::Warn,
        3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    };
    // Fails harmlessly when the host program installed its own logger.
    let _ = log::set_logger(&LOGGER);
    if filter > log::max_level() {
        log::set_max_level(filter);
    }
}
