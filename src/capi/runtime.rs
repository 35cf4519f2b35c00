//! C API: version, configuration, runtimes, statistics.

use super::boundary::guard;
use super::config_layout::ConfigLayout;
use super::handles::{self, Object};
use super::sized::{self, CONFIG_V1_BYTES, STATS_V1_BYTES};
use super::types::*;
use crate::runtime::{Config, DeviceChoice, Error, MemoryMode, Runtime};
use std::ffi::c_char;

/// The library's version as "MAJOR.MINOR.PATCH", a static string (never free it).
#[no_mangle]
pub extern "C" fn gkrt_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// A static, human-readable name for a status value ("GKRT_STATUS_OUT_OF_MEMORY"); unknown
/// values give "GKRT_STATUS_UNKNOWN".
#[no_mangle]
pub extern "C" fn gkrt_status_name(status: i32) -> *const c_char {
    let name: &'static str = match status {
        0 => "GKRT_STATUS_OK\0",
        1 => "GKRT_STATUS_INVALID_ARGUMENT\0",
        2 => "GKRT_STATUS_INVALID_STATE\0",
        3 => "GKRT_STATUS_OUT_OF_MEMORY\0",
        4 => "GKRT_STATUS_NO_DEVICE\0",
        5 => "GKRT_STATUS_DEVICE_ERROR\0",
        6 => "GKRT_STATUS_COMPILE_ERROR\0",
        7 => "GKRT_STATUS_CALLBACK_FAILED\0",
        8 => "GKRT_STATUS_UNSUPPORTED\0",
        9 => "GKRT_STATUS_INTERNAL\0",
        10 => "GKRT_STATUS_PEER_FAILED\0",
        _ => "GKRT_STATUS_UNKNOWN\0",
    };
    name.as_ptr() as *const c_char
}

/// Fills `config` with the defaults (see `gkrt_config`), as the first version of the struct
/// (56 bytes: `struct_size` .. `host_memory_limit`, which is `sizeof(gkrt_config)` in this
/// header), and sets `struct_size`. NULL is an error. Programs that use fields added later call
/// `gkrt_config_init_sized(config, sizeof *config)`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_config_init(config: *mut gkrt_config) -> gkrt_status {
    // SAFETY: forwarded: the C contract of this function.
    guard(|| unsafe { config_init(config, CONFIG_V1_BYTES) })
}

/// Fills the caller's `size` bytes at `config` (`sizeof` of its `gkrt_config`) with the
/// defaults and sets `struct_size` to the bytes filled: a struct from an older header gets
/// only its fields, one from a newer header gets this library's fields and zeros after them
/// (the default of every field added later). `size` below 56 (the first version) or above
/// 65536 is GKRT_STATUS_INVALID_ARGUMENT; NULL is an error.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_config_init_sized(
    config: *mut gkrt_config,
    size: usize,
) -> gkrt_status {
    // SAFETY: forwarded: the C contract of this function.
    guard(|| unsafe { config_init(config, size) })
}

/// # Safety
/// `config` is NULL or valid for writes of `size` bytes.
unsafe fn config_init(config: *mut gkrt_config, size: usize) -> Result<(), Error> {
    if config.is_null() {
        return Err(Error::InvalidArgument("config is NULL".into()));
    }
    let value = ConfigLayout::new(default_config());
    // SAFETY: forwarded to the caller.
    unsafe {
        sized::write_sized(
            &value,
            config as *mut u8,
            size,
            CONFIG_V1_BYTES,
            "gkrt_config",
        )
    }?;
    Ok(())
}

fn default_config() -> gkrt_config {
    let d = Config::default();
    gkrt_config {
        struct_size: std::mem::size_of::<ConfigLayout>() as u64,
        device: d.device as u32,
        device_ordinal: d.device_ordinal,
        memory_limit: d.memory_limit,
        memory_mode: d.memory_mode as u32,
        log_level: d.log_level,
        host_jitter_us: d.host_jitter_us,
        pool_growth: GKRT_POOL_GROWTH_AUTO,
        seed: d.seed,
        host_memory_limit: d.host_memory_limit,
    }
}

fn config_from_c(c: &gkrt_config) -> Result<Config, Error> {
    let device = match c.device {
        GKRT_DEVICE_AUTO => DeviceChoice::Auto,
        GKRT_DEVICE_HOST => DeviceChoice::Host,
        GKRT_DEVICE_CUDA => DeviceChoice::Cuda,
        other => {
            return Err(Error::InvalidArgument(format!(
                "config.device = {other} is not a gkrt_device_kind"
            )))
        }
    };
    let memory_mode = match c.memory_mode {
        GKRT_MEMORY_DYNAMIC => MemoryMode::Dynamic,
        GKRT_MEMORY_PLANNED => MemoryMode::Planned,
        other => {
            return Err(Error::InvalidArgument(format!(
                "config.memory_mode = {other} is not a gkrt_memory_mode"
            )))
        }
    };
    if c.log_level > 5 {
        return Err(Error::InvalidArgument(format!(
            "config.log_level = {} (must be 0..5)",
            c.log_level
        )));
    }
    let pool_virtual_memory = match c.pool_growth {
        GKRT_POOL_GROWTH_AUTO => None,
        GKRT_POOL_GROWTH_SEGMENTS => Some(false),
        GKRT_POOL_GROWTH_VIRTUAL => Some(true),
        other => {
            return Err(Error::InvalidArgument(format!(
                "config.pool_growth = {other} is not a gkrt_pool_growth"
            )))
        }
    };
    Ok(Config {
        device,
        device_ordinal: c.device_ordinal,
        memory_limit: c.memory_limit,
        memory_mode,
        log_level: c.log_level,
        host_jitter_us: c.host_jitter_us,
        seed: c.seed,
        host_memory_limit: c.host_memory_limit,
        pool_virtual_memory,
        ..Config::default()
    })
}

/// Creates a runtime. `config` may be NULL for the defaults. On success `*out` receives a
/// handle the caller owns and releases with `gkrt_runtime_release`; on failure `*out` is left
/// untouched. Fails with GKRT_STATUS_NO_DEVICE when GKRT_DEVICE_CUDA is asked for and no
/// driver or device is present.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_runtime_create(
    config: *const gkrt_config,
    out: *mut *mut gkrt_runtime,
) -> gkrt_status {
    guard(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument(
                "out (gkrt_runtime **) is NULL".into(),
            ));
        }
        let config = if config.is_null() {
            Config::default()
        } else {
            // SAFETY: the C contract: `config` points to a `gkrt_config` of `struct_size` bytes
            // (its first field, present in every version).
            let size = unsafe { std::ptr::read_unaligned(config as *const u64) };
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            let c = unsafe {
                sized::read_sized(
                    config as *const u8,
                    size,
                    CONFIG_V1_BYTES,
                    ConfigLayout::new(default_config()),
                    "gkrt_config",
                )
            }?;
            config_from_c(&c.effective())?
        };
        crate::runtime::init_logging(config.log_level);
        let rt = Runtime::new(config)?;
        let handle = handles::register(Object::Runtime(rt))? as *mut gkrt_runtime;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { *out = handle };
        Ok(())
    })
}

/// Releases the caller's handle. Graphs and kernels made from the runtime keep it alive until
/// they are released too, so any release order is safe. NULL is a no-op; a handle already
/// released gives GKRT_STATUS_INVALID_ARGUMENT. Thread-safe: a `gkrt_malloc` / `gkrt_free` on the
/// handle in another thread either completes before the release or fails with
/// GKRT_STATUS_INVALID_ARGUMENT; memory it took stays the caller's to free through another handle
/// of the runtime, or goes with the runtime. The release waits for a graph run in progress on
/// the runtime in another thread (the handle `gkrt_runtime_create` gave shares the runtime's
/// state lock); from a host callback of such a run it fails with GKRT_STATUS_INVALID_STATE.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_runtime_release(runtime: *mut gkrt_runtime) -> gkrt_status {
    if runtime.is_null() {
        return gkrt_status::GKRT_STATUS_OK;
    }
    guard(|| handles::release(runtime as usize, "runtime"))
}

/// The backend the runtime runs on: GKRT_DEVICE_HOST or GKRT_DEVICE_CUDA.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_runtime_device(
    runtime: *const gkrt_runtime,
    out: *mut gkrt_device_kind,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        // SAFETY: the C contract: `out` is NULL or valid for a write.
        let out =
            unsafe { out.as_mut() }.ok_or_else(|| Error::InvalidArgument("out is NULL".into()))?;
        *out = match rt.device_kind() {
            crate::runtime::DeviceKind::Host => GKRT_DEVICE_HOST,
            crate::runtime::DeviceKind::Cuda => GKRT_DEVICE_CUDA,
        };
        Ok(())
    })
}

/// Copies the runtime's statistics into `*out` as the first version of `gkrt_stats` (224
/// bytes: `struct_size` .. `tensors_recomputed`), `struct_size` set to 224; the fields added
/// after it are not written. Programs that read them call
/// `gkrt_runtime_stats_sized(runtime, out, sizeof *out)`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_runtime_stats(
    runtime: *const gkrt_runtime,
    out: *mut gkrt_stats,
) -> gkrt_status {
    // SAFETY: forwarded: the C contract of this function.
    guard(|| unsafe { runtime_stats(runtime, out, STATS_V1_BYTES) })
}

/// Copies the runtime's statistics into the caller's `size` bytes at `out` (`sizeof` of its
/// `gkrt_stats`) and sets `out->struct_size` to the bytes filled: a struct from an older header
/// gets only its fields; one from a newer header gets this library's and zeros after them
/// (check `struct_size` before trusting a newer field). `size` below 224 (the first version) or
/// above 65536 is GKRT_STATUS_INVALID_ARGUMENT.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_runtime_stats_sized(
    runtime: *const gkrt_runtime,
    out: *mut gkrt_stats,
    size: usize,
) -> gkrt_status {
    // SAFETY: forwarded: the C contract of this function.
    guard(|| unsafe { runtime_stats(runtime, out, size) })
}

/// # Safety
/// `out` is NULL or valid for writes of `size` bytes.
unsafe fn runtime_stats(
    runtime: *const gkrt_runtime,
    out: *mut gkrt_stats,
    size: usize,
) -> Result<(), Error> {
    let rt = handles::runtime(runtime as usize)?;
    if out.is_null() {
        return Err(Error::InvalidArgument("out (gkrt_stats *) is NULL".into()));
    }
    let s = rt.stats()?;
    let value = gkrt_stats {
        struct_size: 0,
        allocated_bytes: s.pool.allocated_bytes,
        reserved_bytes: s.pool.reserved_bytes,
        peak_allocated_bytes: s.pool.peak_allocated_bytes,
        peak_reserved_bytes: s.pool.peak_reserved_bytes,
        requested_bytes: s.pool.requested_bytes,
        alloc_count: s.pool.alloc_count,
        free_count: s.pool.free_count,
        failed_alloc_count: s.pool.failed_alloc_count,
        segment_count: s.pool.segment_count,
        segment_alloc_count: s.pool.segment_alloc_count,
        segment_free_count: s.pool.segment_free_count,
        memory_limit: s.memory_limit,
        runs: s.counters.runs,
        nodes_launched: s.counters.nodes_launched,
        last_run_pool_allocs: s.counters.last_run_pool_allocs,
        swap_out_bytes: s.counters.swap_out_bytes,
        swap_in_bytes: s.counters.swap_in_bytes,
        tensors_swapped_out: s.counters.tensors_swapped_out,
        tensors_swapped_in: s.counters.tensors_swapped_in,
        evictions: s.counters.evictions,
        copy_wait_ns: s.counters.copy_wait_ns,
        pinned_reserved_bytes: s.pinned.reserved_bytes,
        pinned_peak_reserved_bytes: s.pinned.peak_reserved_bytes,
        page_map_count: s.pool.page_map_count,
        page_unmap_count: s.pool.page_unmap_count,
        pool_device_waits: s.pool.device_wait_count,
        tensors_recomputed: s.counters.tensors_recomputed,
        pool_epochs_followed: s.pool.epochs_followed,
        pool_epochs_left: s.pool.epochs_left,
    };
    // SAFETY: forwarded to the caller.
    unsafe { sized::write_sized(&value, out as *mut u8, size, STATS_V1_BYTES, "gkrt_stats") }?;
    Ok(())
}

/// Sets the peak statistics to the current values.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_runtime_reset_peak_stats(runtime: *mut gkrt_runtime) -> gkrt_status {
    guard(|| handles::runtime(runtime as usize)?.reset_peak_stats())
}

/// Waits until all work the runtime queued has finished; reports asynchronous failures.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_runtime_synchronize(runtime: *mut gkrt_runtime) -> gkrt_status {
    guard(|| handles::runtime(runtime as usize)?.synchronize())
}

/// Runs a finalized graph of this runtime once, start to end, and waits for it. On failure
/// (out of memory, a callback that failed, a device error) no node is run twice, every
/// intermediate's memory is back in the pool, and the runtime and graph stay usable; outputs
/// that nodes before the failure produced keep what those nodes wrote. A graph not finalized,
/// or whose input or parameter that a node reads was never written, gives
/// GKRT_STATUS_INVALID_STATE before anything runs; a graph of another runtime,
/// GKRT_STATUS_INVALID_ARGUMENT. When a call has several faults, any one of them is reported.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_runtime_run(
    runtime: *mut gkrt_runtime,
    graph: *mut gkrt_graph,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        let g = handles::graph(graph as usize)?;
        let mut g = crate::runtime::lock_for_call(&g, "graph")?;
        if g.runtime().serial() != rt.serial() {
            return Err(Error::InvalidArgument(
                "the graph belongs to another runtime".into(),
            ));
        }
        g.run()
    })
}
