//! The process-wide runtimes behind the PyTorch entry points (`gkrt_torch_alloc`,
//! `gkrt_torch_free`, `gkrt_torch_runtime`): one per device ordinal, created on first use from
//! the environment (`GKRT_LOG_LEVEL`, `GKRT_MEMORY_LIMIT` and the variables every runtime reads;
//! see `env.rs`).
//!
//! Such a runtime is the one process-wide singleton of gkrt besides the handle table, and it is
//! justified the same way: the allocator interface PyTorch defines is a pair of plain functions
//! with no context argument, so the state they share can only live in the process. It is made
//! once per device (a failed creation is remembered and reported on every call) and never
//! destroyed: PyTorch frees tensors until the very end of the process.

use super::config::Config;
use super::{env, logging, Runtime};
use crate::error::Error;
use std::sync::{Arc, OnceLock};

/// Most device ordinals the PyTorch entry points serve.
const MAX_DEVICES: usize = 64;

type Shared = Result<Arc<Runtime>, String>;

static PROCESS_RUNTIMES: [OnceLock<Shared>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

/// Parses `GKRT_MEMORY_LIMIT`: bytes with an optional binary suffix, or a fraction in (0, 1]
/// of `total`.
fn parse_limit(text: &str, total: u64) -> Result<u64, String> {
    let t = text.trim();
    let bad = || {
        format!("GKRT_MEMORY_LIMIT='{text}' is not a size (bytes, 512M, 20GiB) or a fraction such as 0.9")
    };
    if t.contains('.') {
        let f: f64 = t.parse().map_err(|_| bad())?;
        if !(f > 0.0 && f <= 1.0) {
            return Err(bad());
        }
        return Ok((total as f64 * f) as u64);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1 << shift).filter(|&b| b > 0).ok_or_else(bad)
}

fn create_process_runtime(ordinal: u32) -> Shared {
    let level = env::log_level()?;
    logging::init(level);
    let config = Config {
        device_ordinal: ordinal,
        log_level: level,
        // PyTorch's allocation stream is where fragmentation bites (BENCHMARKS.md §3): page
        // moves may wait for the device there, which keeps GPT-2 under PyTorch's peak.
        pool_virtual_memory: Some(true),
        pool_recycle_waits: true,
        ..Config::default()
    };
    let limit = env::memory_limit();
    let rt = Runtime::new(config.clone()).map_err(|e| e.to_string())?;
    if let Some(text) = limit {
        let total = rt.device().total_memory();
        let bytes = parse_limit(&text, total)?;
        rt.lock().pool.set_memory_limit(bytes);
    }
    log::info!(
        "gkrt: process-wide runtime for device {ordinal} on {}",
        rt.device().name()
    );
    Ok(rt)
}

/// The process-wide runtime of device `device`, created on first use.
pub fn process_runtime(device: i32) -> Result<&'static Arc<Runtime>, Error> {
    let slot = usize::try_from(device)
        .ok()
        .and_then(|d| PROCESS_RUNTIMES.get(d))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "device {device} is outside 0..{MAX_DEVICES} for the process-wide runtime"
            ))
        })?;
    slot.get_or_init(|| create_process_runtime(device as u32))
        .as_ref()
        .map_err(|why| {
            Error::NoDevice(format!(
                "the process-wide gkrt runtime for device {device} could not be created: {why}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits_parse_with_suffixes_and_fractions() {
        let g = 1u64 << 30;
        assert_eq!(parse_limit("1048576", g), Ok(1 << 20));
        assert_eq!(parse_limit("512M", g), Ok(512 << 20));
        assert_eq!(parse_limit(" 20GiB ", g), Ok(20 << 30));
        assert_eq!(parse_limit("3k", g), Ok(3 << 10));
        assert_eq!(parse_limit("0.5", g), Ok(g / 2));
        for bad in ["", "0", "12X", "1.5", "-3", "G", "0.0", "99999999999999T"] {
            let e = parse_limit(bad, g).unwrap_err();
            assert!(e.contains("GKRT_MEMORY_LIMIT"), "{bad}: {e}");
        }
    }
}
