//! What the tests share: building graphs of `K`-byte tensors on the host backend through gkrt's
//! C API, and tracing their runs. Each test file uses only some of it.
#![allow(dead_code)]

use gkrt::capi::*;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

/// Every tensor's size.
pub const K: u64 = 256 << 10;

pub fn ok(s: gkrt_status) {
    assert_eq!(s, gkrt_status::GKRT_STATUS_OK, "a gkrt call failed");
}

/// A host runtime under `limit` bytes (0: none).
pub unsafe fn runtime(limit: u64) -> *mut gkrt_runtime {
    let mut cfg = std::mem::zeroed::<gkrt_config>();
    ok(gkrt_config_init(&mut cfg));
    cfg.device = GKRT_DEVICE_HOST;
    cfg.memory_limit = limit;
    cfg.log_level = 1;
    let mut rt = null_mut();
    ok(gkrt_runtime_create(&cfg, &mut rt));
    rt
}

pub unsafe fn tensor(g: *mut gkrt_graph, name: &str, kind: gkrt_tensor_kind) -> u64 {
    let mut t = 0;
    let name = CString::new(name).unwrap();
    ok(gkrt_graph_add_tensor(g, K, kind, name.as_ptr(), &mut t));
    t
}

/// A node of kernel `k` without launch parameters; returns its index.
pub unsafe fn node(g: *mut gkrt_graph, k: *mut gkrt_kernel, ins: &[u64], outs: &[u64]) -> u32 {
    launched(g, k, ins, outs, std::ptr::null())
}

/// A node of kernel `k` launched with `launch`; returns its index.
pub unsafe fn launched(
    g: *mut gkrt_graph,
    k: *mut gkrt_kernel,
    ins: &[u64],
    outs: &[u64],
    launch: *const gkrt_launch,
) -> u32 {
    let mut n = 0;
    ok(gkrt_graph_add_kernel(
        g,
        k,
        ins.as_ptr(),
        ins.len(),
        outs.as_ptr(),
        outs.len(),
        std::ptr::null(),
        0,
        launch,
        &mut n,
    ));
    n
}

/// Writes `K` bytes of `data` to tensor `t`.
pub unsafe fn write(g: *mut gkrt_graph, t: u64, data: &[u8]) {
    assert_eq!(data.len() as u64, K);
    ok(gkrt_graph_write_tensor(
        g,
        t,
        data.as_ptr() as *const c_void,
        data.len(),
    ));
}

/// `runs` traced runs of `g` (after one untraced), the trace's JSON.
pub unsafe fn trace_runs(
    rt: *mut gkrt_runtime,
    g: *mut gkrt_graph,
    runs: usize,
    tag: &str,
) -> String {
    ok(gkrt_runtime_run(rt, g));
    let path = std::env::temp_dir().join(format!("gkrt-viz-{tag}-{}.json", std::process::id()));
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    ok(gkrt_runtime_trace_begin(rt));
    for _ in 0..runs {
        ok(gkrt_runtime_run(rt, g));
    }
    ok(gkrt_runtime_trace_end(rt, c_path.as_ptr()));
    let json = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    json
}
