//! C API: graphs, tensors, nodes, reading and writing tensors.

use super::boundary::{c_slice, guard};
use super::handles::{self, Object};
use super::types::*;
use crate::runtime::{lock_for_call, Error, RuntimeGraph, TensorKind};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

fn lock_graph(graph: *const gkrt_graph) -> Result<Arc<Mutex<RuntimeGraph>>, Error> {
    handles::graph(graph as usize)
}

/// The graph's lock for this call (an error, not a wait, from inside a host callback).
fn locked(g: &Mutex<RuntimeGraph>) -> Result<MutexGuard<'_, RuntimeGraph>, Error> {
    lock_for_call(g, "graph")
}

/// Creates an empty graph on `runtime`. `*out` receives a handle the caller releases with
/// `gkrt_graph_release`; the graph keeps the runtime alive.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_create(
    runtime: *mut gkrt_runtime,
    out: *mut *mut gkrt_graph,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        if out.is_null() {
            return Err(Error::InvalidArgument("out (gkrt_graph **) is NULL".into()));
        }
        let g = RuntimeGraph::new(rt);
        let handle = handles::register(Object::Graph(Arc::new(Mutex::new(g))))? as *mut gkrt_graph;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { *out = handle };
        Ok(())
    })
}

/// Releases a graph and the device memory of its tensors (after its queued work finishes).
/// NULL is a no-op; releasing twice gives GKRT_STATUS_INVALID_ARGUMENT. A host callback of a
/// run of this graph may release it: the handle is dead at once (later calls with it get
/// GKRT_STATUS_INVALID_ARGUMENT), the run completes, and the graph's memory is freed when the
/// run ends.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_graph_release(graph: *mut gkrt_graph) -> gkrt_status {
    if graph.is_null() {
        return gkrt_status::GKRT_STATUS_OK;
    }
    guard(|| handles::release(graph as usize, "graph"))
}

/// Adds a tensor of `size` bytes (1 .. 2^48) and kind GKRT_TENSOR_*. `name` may be NULL; it
/// appears in error messages. `*out` receives the tensor's id.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_add_tensor(
    graph: *mut gkrt_graph,
    size: u64,
    kind: gkrt_tensor_kind,
    name: *const c_char,
    out: *mut gkrt_tensor,
) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        let kind = TensorKind::from_raw(kind).ok_or_else(|| {
            Error::InvalidArgument(format!("tensor kind {kind} is not a gkrt_tensor_kind"))
        })?;
        if out.is_null() {
            return Err(Error::InvalidArgument("out (gkrt_tensor *) is NULL".into()));
        }
        let name = if name.is_null() {
            String::new()
        } else {
            // SAFETY: the C contract: a non-NULL `name` is a NUL-terminated string.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        let id = locked(&g)?.add_tensor(size, kind, &name)?;
        // SAFETY: `out` is non-NULL (checked) and valid for a write (the C contract).
        unsafe { *out = id };
        Ok(())
    })
}

/// Appends a node running `kernel` that reads `inputs` and writes `outputs` (tensor ids of
/// this graph), with one scratch buffer per entry of `workspace_sizes` (bytes, freed right
/// after the node). `launch` may be NULL (no parameters; grid and block 1). Nodes run in the
/// order added. Checked here: ids belong to this graph; every intermediate or output read was
/// written by an earlier node; built-ins get the tensor sizes and parameters they need. On
/// success `*node_out` (may be NULL) receives the node's index.
#[must_use]
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gkrt_graph_add_kernel(
    graph: *mut gkrt_graph,
    kernel: *const gkrt_kernel,
    inputs: *const gkrt_tensor,
    num_inputs: usize,
    outputs: *const gkrt_tensor,
    num_outputs: usize,
    workspace_sizes: *const u64,
    num_workspaces: usize,
    launch: *const gkrt_launch,
    node_out: *mut u32,
) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        let k = handles::kernel(kernel as usize)?;
        // SAFETY: the C contract: each array is NULL (when its count is 0) or holds its count
        // of elements, and `launch` is NULL or points to a `gkrt_launch`.
        let (inputs, outputs, workspaces, launch) = unsafe {
            (
                c_slice(inputs, num_inputs, "inputs")?,
                c_slice(outputs, num_outputs, "outputs")?,
                c_slice(workspace_sizes, num_workspaces, "workspace_sizes")?,
                launch.as_ref(),
            )
        };
        // SAFETY: the C contract, as above.
        let (dims, params) = unsafe { super::eager::launch_of(launch)? };
        let mut g = locked(&g)?;
        if g.runtime().serial() != k.runtime.serial() {
            return Err(Error::InvalidArgument(
                "the kernel belongs to another runtime than the graph".into(),
            ));
        }
        let node = g
            .graph
            .add_node(k.kernel.clone(), inputs, outputs, workspaces, dims, params)?;
        // SAFETY: the C contract: `node_out` is NULL or valid for a write.
        if let Some(out) = unsafe { node_out.as_mut() } {
            *out = node;
        }
        Ok(())
    })
}

/// Declares node `node` (an index from `gkrt_graph_add_kernel`) recomputable (`recomputable`
/// non-zero) or not (0, the default): a pure function of its inputs, which run again on the
/// same inputs writes the same bytes to its output and has no other effect. When the graph
/// must swap, its plan may then drop that output instead of copying it to the host and back,
/// and run the node once more right before the output's next reader (only where the node's
/// inputs are still unchanged there); the first two runs' timings decide whether recomputing
/// beats copying. gkrt never runs any other node twice in a run. Qualifies: a node with exactly one
/// output that it does not also read (accepted but never rerun: a node with workspaces, and one
/// whose output is an input, parameter or output tensor). Before `gkrt_graph_finalize` only:
/// GKRT_STATUS_INVALID_STATE after it, GKRT_STATUS_INVALID_ARGUMENT for an unknown node or one
/// that does not qualify.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_graph_set_node_recomputable(
    graph: *mut gkrt_graph,
    node: u32,
    recomputable: c_int,
) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        let mut g = locked(&g)?;
        Ok(g.graph.set_recomputable(node, recomputable != 0)?)
    })
}

/// Names node `node` (an index from `gkrt_graph_add_kernel`): every message about the node (an
/// error, a warning, the log) calls it "node N 'name' (kernel)". `name` is NUL-terminated UTF-8,
/// copied; an empty name removes it. Before `gkrt_graph_finalize` only: GKRT_STATUS_INVALID_STATE
/// after it, GKRT_STATUS_INVALID_ARGUMENT for a NULL or non-UTF-8 name or an unknown node.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_set_node_name(
    graph: *mut gkrt_graph,
    node: u32,
    name: *const c_char,
) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        if name.is_null() {
            return Err(Error::InvalidArgument("name is NULL".into()));
        }
        // SAFETY: the caller gives a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| Error::InvalidArgument("the node name is not valid UTF-8".into()))?;
        let mut g = locked(&g)?;
        Ok(g.graph.set_node_name(node, name)?)
    })
}

/// Freezes the graph and derives liveness (and the plan in planned mode). After this the graph
/// can run but not change. GKRT_STATUS_INVALID_ARGUMENT for a graph without nodes or with an
/// output no node writes, GKRT_STATUS_INVALID_STATE for one finalized already;
/// after a failure the graph stays unfinalized (it cannot run, and the call can be repeated).
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_graph_finalize(graph: *mut gkrt_graph) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        let mut g = locked(&g)?;
        g.finalize()
    })
}

/// Describes the graph (sizes, and after finalize its liveness figures).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_get_info(
    graph: *const gkrt_graph,
    out: *mut gkrt_graph_info,
) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        // SAFETY: the C contract: `out` is NULL or valid for a write.
        let out = unsafe { out.as_mut() }
            .ok_or_else(|| Error::InvalidArgument("out (gkrt_graph_info *) is NULL".into()))?;
        let g = locked(&g)?;
        let mut info = gkrt_graph_info {
            num_tensors: g.graph.tensors().len() as u64,
            num_nodes: g.graph.nodes().len() as u64,
            ..Default::default()
        };
        if let Some(lv) = g.graph.liveness() {
            info.finalized = 1;
            info.peak_node = lv.peak_node;
            info.persistent_bytes = lv.persistent_bytes;
            info.peak_transient_bytes = lv.peak_transient_bytes;
            info.transient_total_bytes = lv.transient_total_bytes;
            info.min_memory_limit = g.min_memory_limit();
        }
        *out = info;
        Ok(())
    })
}

/// Copies `size` bytes from host memory `data` into an input, parameter or output tensor.
/// `size` must equal the tensor's size. The copy is complete when the call returns.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_write_tensor(
    graph: *mut gkrt_graph,
    tensor: gkrt_tensor,
    data: *const c_void,
    size: usize,
) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        if data.is_null() {
            return Err(Error::InvalidArgument("data is NULL".into()));
        }
        let mut g = locked(&g)?;
        // The size is checked before a slice of the caller's buffer exists.
        g.check_io(tensor, size as u64, "write")?;
        // SAFETY: the C contract: `data` (not NULL, checked) holds `size` readable bytes.
        g.write(tensor, unsafe {
            std::slice::from_raw_parts(data as *const u8, size)
        })
    })
}

/// Copies a persistent tensor (after it was written or produced by a run) into host memory
/// `data` of `size` bytes, which must equal the tensor's size.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_graph_read_tensor(
    graph: *const gkrt_graph,
    tensor: gkrt_tensor,
    data: *mut c_void,
    size: usize,
) -> gkrt_status {
    guard(|| {
        let g = lock_graph(graph)?;
        if data.is_null() {
            return Err(Error::InvalidArgument("data is NULL".into()));
        }
        let mut g = locked(&g)?;
        // The size is checked before a slice of the caller's buffer exists.
        g.check_io(tensor, size as u64, "read")?;
        // SAFETY: the C contract: `data` (not NULL, checked) holds `size` writable bytes.
        g.read(tensor, unsafe {
            std::slice::from_raw_parts_mut(data as *mut u8, size)
        })
    })
}
