"""The shared library and its C declarations (ctypes), mirroring include/gkrt.h.

Where the library comes from, first found wins: the GKRT_LIBRARY environment variable (a path),
the system's search (ctypes.util.find_library("gkrt"), i.e. ldconfig), then the checkout this
package sits in (target/release/libgkrt.so).
"""

import ctypes
import ctypes.util
import os

c_u32, c_u64, c_size, c_void_p, c_char_p = (
    ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p)


class Config(ctypes.Structure):
    # struct_size first (include/gkrt.h): set by gkrt_config_init_sized to ctypes.sizeof(Config).
    _fields_ = [("struct_size", c_u64), ("device", c_u32), ("device_ordinal", c_u32), ("memory_limit", c_u64),
                ("memory_mode", c_u32), ("log_level", c_u32), ("host_jitter_us", c_u32),
                ("pool_growth", c_u32), ("seed", c_u64), ("host_memory_limit", c_u64)]


STATS_FIELDS = [
    "allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
    "requested_bytes", "alloc_count", "free_count", "failed_alloc_count", "segment_count",
    "segment_alloc_count", "segment_free_count", "memory_limit", "runs", "nodes_launched",
    "last_run_pool_allocs", "swap_out_bytes", "swap_in_bytes", "tensors_swapped_out",
    "tensors_swapped_in", "evictions", "copy_wait_ns", "pinned_reserved_bytes",
    "pinned_peak_reserved_bytes", "page_map_count", "page_unmap_count", "pool_device_waits",
    "tensors_recomputed",
    "pool_epochs_followed",
    "pool_epochs_left",
]


class Stats(ctypes.Structure):
    # struct_size first: the bytes the library filled (gkrt_runtime_stats_sized).
    _fields_ = [("struct_size", c_u64)] + [(name, c_u64) for name in STATS_FIELDS]


class GraphInfo(ctypes.Structure):
    _fields_ = [("num_tensors", c_u64), ("num_nodes", c_u64), ("finalized", c_u32),
                ("peak_node", c_u32), ("persistent_bytes", c_u64),
                ("peak_transient_bytes", c_u64), ("transient_total_bytes", c_u64),
                ("min_memory_limit", c_u64)]


class Launch(ctypes.Structure):
    _fields_ = [("grid", c_u32 * 3), ("block", c_u32 * 3), ("shared_mem_bytes", c_u32),
                ("params", c_void_p), ("params_size", c_size)]


def _candidates():
    env = os.environ.get("GKRT_LIBRARY")
    if env:
        yield env
    found = ctypes.util.find_library("gkrt")
    if found:
        yield found
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "target", "release", "libgkrt.so")


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise OSError("libgkrt not found; set GKRT_LIBRARY to its path. Tried: " + "; ".join(tried))


lib, path = _load()

_P = ctypes.POINTER
_signatures = {
    "gkrt_version": (c_char_p, []),
    "gkrt_status_name": (c_char_p, [ctypes.c_int]),
    "gkrt_last_error_message": (c_size, [ctypes.c_char_p, c_size]),
    "gkrt_config_init": (ctypes.c_int, [_P(Config)]),
    "gkrt_config_init_sized": (ctypes.c_int, [_P(Config), c_size]),
    "gkrt_runtime_stats_sized": (ctypes.c_int, [c_void_p, _P(Stats), c_size]),
    "gkrt_runtime_create": (ctypes.c_int, [_P(Config), _P(c_void_p)]),
    "gkrt_runtime_release": (ctypes.c_int, [c_void_p]),
    "gkrt_runtime_device": (ctypes.c_int, [c_void_p, _P(c_u32)]),
    "gkrt_runtime_stats": (ctypes.c_int, [c_void_p, _P(Stats)]),
    "gkrt_runtime_reset_peak_stats": (ctypes.c_int, [c_void_p]),
    "gkrt_runtime_synchronize": (ctypes.c_int, [c_void_p]),
    "gkrt_runtime_run": (ctypes.c_int, [c_void_p, c_void_p]),
    "gkrt_runtime_release_cached": (ctypes.c_int, [c_void_p, _P(c_u64)]),
    "gkrt_malloc": (ctypes.c_int, [c_void_p, c_size, c_void_p, _P(c_void_p)]),
    "gkrt_free": (ctypes.c_int, [c_void_p, c_void_p, c_void_p]),
    "gkrt_record_stream": (ctypes.c_int, [c_void_p, c_void_p, c_void_p]),
    "gkrt_runtime_record_history": (ctypes.c_int, [c_void_p, c_u64]),
    "gkrt_runtime_dump_snapshot": (ctypes.c_int, [c_void_p, c_char_p]),
    "gkrt_runtime_trace_begin": (ctypes.c_int, [c_void_p]),
    "gkrt_runtime_trace_end": (ctypes.c_int, [c_void_p, c_char_p]),
    "gkrt_torch_runtime": (ctypes.c_int, [ctypes.c_int, _P(c_void_p)]),
    "gkrt_graph_create": (ctypes.c_int, [c_void_p, _P(c_void_p)]),
    "gkrt_graph_release": (ctypes.c_int, [c_void_p]),
    "gkrt_graph_add_tensor": (ctypes.c_int, [c_void_p, c_u64, c_u32, c_char_p, _P(c_u64)]),
    "gkrt_graph_add_kernel": (ctypes.c_int, [c_void_p, c_void_p, _P(c_u64), c_size, _P(c_u64),
                                             c_size, _P(c_u64), c_size, _P(Launch), _P(c_u32)]),
    "gkrt_graph_set_node_recomputable": (ctypes.c_int, [c_void_p, c_u32, ctypes.c_int]),
    "gkrt_graph_set_node_name": (ctypes.c_int, [c_void_p, c_u32, c_char_p]),
    "gkrt_graph_finalize": (ctypes.c_int, [c_void_p]),
    "gkrt_graph_get_info": (ctypes.c_int, [c_void_p, _P(GraphInfo)]),
    "gkrt_graph_write_tensor": (ctypes.c_int, [c_void_p, c_u64, c_void_p, c_size]),
    "gkrt_graph_read_tensor": (ctypes.c_int, [c_void_p, c_u64, c_void_p, c_size]),
    "gkrt_kernel_builtin": (ctypes.c_int, [c_void_p, c_u32, _P(c_void_p)]),
    "gkrt_kernel_from_ptx": (ctypes.c_int, [c_void_p, c_char_p, c_char_p, _P(c_void_p)]),
    "gkrt_kernel_from_source": (ctypes.c_int, [c_void_p, c_char_p, c_char_p, _P(c_char_p), c_size,
                                               _P(c_void_p)]),
    "gkrt_kernel_release": (ctypes.c_int, [c_void_p]),
    "gkrt_graph_bind_tensor": (ctypes.c_int, [c_void_p, c_u64, c_void_p, c_size]),
    "gkrt_graph_unbind_tensor": (ctypes.c_int, [c_void_p, c_u64]),
    "gkrt_runtime_run_async": (ctypes.c_int, [c_void_p, c_void_p, c_void_p]),
    "gkrt_graph_wait": (ctypes.c_int, [c_void_p, c_void_p]),
    "gkrt_malloc": (ctypes.c_int, [c_void_p, c_size, c_void_p, _P(c_void_p)]),
    "gkrt_free": (ctypes.c_int, [c_void_p, c_void_p, c_void_p]),
}
for _name, (_res, _args) in _signatures.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args
