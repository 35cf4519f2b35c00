"""gkrt from Python: runtimes, graphs and kernels over the C library (ctypes, no compiled code).

    import gkrt
    with gkrt.Runtime(device="host", memory_limit=2 << 30) as rt, rt.graph() as g:
        x = g.tensor(4096, "input", "x")
        y = g.tensor(4096, "output", "y")
        g.add(rt.builtin("relu"), [x], [y])
        g.finalize()
        g.write(x, data)            # bytes-like of the tensor's size
        rt.run(g)
        out = g.read(y)             # bytes

Every failure raises `GkrtError` with the library's status and message. Handles are released
by `close()` or at the end of a `with` block; a closed object raises `GkrtError` when used.
`gkrt.torch` switches PyTorch's CUDA allocator to gkrt's pool.
"""

import ctypes
import os
import pickle
import tempfile

from . import _lib
from ._lib import lib

__all__ = ["GkrtError", "Runtime", "Graph", "Kernel", "version", "STATUS_NAMES"]

STATUS_NAMES = {
    0: "OK", 1: "INVALID_ARGUMENT", 2: "INVALID_STATE", 3: "OUT_OF_MEMORY", 4: "NO_DEVICE",
    5: "DEVICE_ERROR", 6: "COMPILE_ERROR", 7: "CALLBACK_FAILED", 8: "UNSUPPORTED", 9: "INTERNAL",
    10: "PEER_FAILED",
}
_DEVICES = {"auto": 0, "host": 1, "cuda": 2}
_MODES = {"dynamic": 0, "planned": 1}
_KINDS = {"input": 0, "parameter": 1, "intermediate": 2, "output": 3}
_BUILTINS = {"fill": 0, "copy": 1, "add": 2, "scale": 3, "relu": 4, "relu_grad": 5, "matmul": 6}


class GkrtError(Exception):
    """A failed gkrt call: `status` (an int, `status_name` its name) and the library's message."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = STATUS_NAMES.get(status, str(status))
        super().__init__(f"{self.status_name}: {message}")


def _last_error():
    n = lib.gkrt_last_error_message(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.gkrt_last_error_message(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def _check(status):
    if status != 0:
        raise GkrtError(status, _last_error())


def version():
    """The library's version string."""
    return lib.gkrt_version().decode()


def _choice(table, value, what):
    if isinstance(value, int):
        return value
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} {value!r} is not one of {sorted(table)}") from None


class _Handle:
    """An owned C handle, released once by `close()` (or the end of a `with` block)."""

    _release = None

    def __init__(self, handle):
        self._h = handle

    @property
    def handle(self):
        if self._h is None:
            raise GkrtError(1, f"this {type(self).__name__.lower()} is closed")
        return self._h

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            _check(getattr(lib, self._release)(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Kernel(_Handle):
    """A kernel of a runtime (a built-in, PTX, or CUDA source)."""

    _release = "gkrt_kernel_release"


class Runtime(_Handle):
    """A gkrt runtime: `device` "auto" / "host" / "cuda", a `memory_limit` in bytes (0: none),
    `memory_mode` "dynamic" / "planned", and the other `gkrt_config` fields by name."""

    _release = "gkrt_runtime_release"

    def __init__(self, device="auto", memory_limit=0, memory_mode="dynamic", **config):
        cfg = _lib.Config()
        _check(lib.gkrt_config_init_sized(ctypes.byref(cfg), ctypes.sizeof(cfg)))
        cfg.device = _choice(_DEVICES, device, "device")
        cfg.memory_limit = memory_limit
        cfg.memory_mode = _choice(_MODES, memory_mode, "memory_mode")
        for name, value in config.items():
            if name not in dict(_lib.Config._fields_) or name == "struct_size":
                raise TypeError(f"gkrt_config has no field {name!r}")
            setattr(cfg, name, value)
        h = ctypes.c_void_p()
        _check(lib.gkrt_runtime_create(ctypes.byref(cfg), ctypes.byref(h)))
        super().__init__(h.value)

    @classmethod
    def _wrap(cls, handle):
        rt = cls.__new__(cls)
        _Handle.__init__(rt, handle)
        return rt

    @property
    def device(self):
        """"host" or "cuda"."""
        kind = ctypes.c_uint32()
        _check(lib.gkrt_runtime_device(self.handle, ctypes.byref(kind)))
        return {1: "host", 2: "cuda"}[kind.value]

    def stats(self):
        """The runtime's statistics (`gkrt_stats`) as a dict."""
        s = _lib.Stats()
        _check(lib.gkrt_runtime_stats_sized(self.handle, ctypes.byref(s), ctypes.sizeof(s)))
        return {name: getattr(s, name) for name in _lib.STATS_FIELDS}

    def reset_peak_stats(self):
        _check(lib.gkrt_runtime_reset_peak_stats(self.handle))

    def synchronize(self):
        _check(lib.gkrt_runtime_synchronize(self.handle))

    def release_cached(self):
        """Returns cached free memory to the device; the bytes given back."""
        n = ctypes.c_uint64()
        _check(lib.gkrt_runtime_release_cached(self.handle, ctypes.byref(n)))
        return n.value

    def record_history(self, capacity):
        """Records the pool's last `capacity` events for snapshots' `device_traces` (0: off)."""
        _check(lib.gkrt_runtime_record_history(self.handle, capacity))

    def dump_snapshot(self, path):
        """Writes a memory snapshot in PyTorch's format (the pickle of
        `torch.cuda.memory._dump_snapshot`) to `path`."""
        _check(lib.gkrt_runtime_dump_snapshot(self.handle, os.fsencode(path)))

    def snapshot(self):
        """The memory snapshot as PyTorch's `torch.cuda.memory._snapshot()` returns it."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snapshot.pickle")
            self.dump_snapshot(path)
            with open(path, "rb") as f:
                return pickle.load(f)

    def trace_begin(self):
        """Starts collecting a trace of runs (Chrome trace-event JSON)."""
        _check(lib.gkrt_runtime_trace_begin(self.handle))

    def trace_end(self, path):
        """Stops collecting and writes the trace to `path` (Perfetto opens it)."""
        _check(lib.gkrt_runtime_trace_end(self.handle, os.fsencode(path)))

    def graph(self):
        """A new, empty graph of this runtime."""
        return Graph(self)

    def builtin(self, name):
        """A built-in kernel: "fill", "copy", "add", "scale", "relu", "relu_grad", "matmul"."""
        h = ctypes.c_void_p()
        _check(lib.gkrt_kernel_builtin(self.handle, _choice(_BUILTINS, name, "built-in"),
                                       ctypes.byref(h)))
        return Kernel(h.value)

    def kernel_from_ptx(self, ptx, name):
        h = ctypes.c_void_p()
        _check(lib.gkrt_kernel_from_ptx(self.handle, ptx.encode(), name.encode(), ctypes.byref(h)))
        return Kernel(h.value)

    def kernel_from_source(self, source, name, options=()):
        opts = (ctypes.c_char_p * max(len(options), 1))(*[o.encode() for o in options])
        h = ctypes.c_void_p()
        _check(lib.gkrt_kernel_from_source(self.handle, source.encode(), name.encode(), opts,
                                           len(options), ctypes.byref(h)))
        return Kernel(h.value)

    def run(self, graph):
        """Runs a finalized graph once and waits for it."""
        _check(lib.gkrt_runtime_run(self.handle, graph.handle))

    def run_async(self, graph, stream=None):
        """Queues one run of `graph` after the work on native stream `stream` (an int handle,
        e.g. `torch.cuda.current_stream().cuda_stream`; None: gkrt's own) and returns; work
        queued on `stream` afterwards runs after it. `graph.wait()` waits for it."""
        _check(lib.gkrt_runtime_run_async(self.handle, graph.handle, stream))


class Graph(_Handle):
    """A graph of one runtime: tensors (ids) and kernel nodes, then `finalize()` and runs."""

    _release = "gkrt_graph_release"

    def __init__(self, runtime):
        h = ctypes.c_void_p()
        _check(lib.gkrt_graph_create(runtime.handle, ctypes.byref(h)))
        super().__init__(h.value)
        self._sizes = {}
        self._runtime = runtime

    def tensor(self, size, kind, name=None):
        """A tensor of `size` bytes; `kind` "input", "parameter", "intermediate" or "output".
        Returns its id."""
        out = ctypes.c_uint64()
        _check(lib.gkrt_graph_add_tensor(self.handle, size, _choice(_KINDS, kind, "tensor kind"),
                                         name.encode() if name else None, ctypes.byref(out)))
        self._sizes[out.value] = size
        return out.value

    def add(self, kernel, inputs, outputs, workspaces=(), params=None, grid=(1, 1, 1),
            block=(1, 1, 1), shared_mem_bytes=0, name=None):
        """Appends a node running `kernel` on tensor ids `inputs` / `outputs`, with workspace
        sizes and a parameter blob (`bytes`, e.g. from `struct.pack`), named `name` in messages.
        Returns its index."""
        ins = (ctypes.c_uint64 * max(len(inputs), 1))(*inputs)
        outs = (ctypes.c_uint64 * max(len(outputs), 1))(*outputs)
        ws = (ctypes.c_uint64 * max(len(workspaces), 1))(*workspaces)
        launch = None
        blob = None
        if params is not None or grid != (1, 1, 1) or block != (1, 1, 1) or shared_mem_bytes:
            blob = ctypes.create_string_buffer(bytes(params or b""), len(params or b""))
            launch = _lib.Launch((ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*block),
                                 shared_mem_bytes, ctypes.cast(blob, ctypes.c_void_p),
                                 len(params or b""))
        node = ctypes.c_uint32()
        _check(lib.gkrt_graph_add_kernel(self.handle, kernel.handle, ins, len(inputs), outs,
                                         len(outputs), ws, len(workspaces),
                                         ctypes.byref(launch) if launch else None,
                                         ctypes.byref(node)))
        if name:
            _check(lib.gkrt_graph_set_node_name(self.handle, node.value, name.encode()))
        return node.value

    def set_recomputable(self, node, recomputable=True):
        _check(lib.gkrt_graph_set_node_recomputable(self.handle, node, int(recomputable)))

    def finalize(self):
        _check(lib.gkrt_graph_finalize(self.handle))

    def info(self):
        """The graph's figures (`gkrt_graph_info`) as a dict."""
        i = _lib.GraphInfo()
        _check(lib.gkrt_graph_get_info(self.handle, ctypes.byref(i)))
        return {name: getattr(i, name) for name, _ in _lib.GraphInfo._fields_}

    def bind(self, tensor, device_ptr, size=None):
        """Runs read and write `tensor` in place at device address `device_ptr` (an int, e.g.
        a PyTorch tensor's `data_ptr()`) of `size` bytes (default: the tensor's size)."""
        n = size if size is not None else self._sizes.get(tensor, 0)
        _check(lib.gkrt_graph_bind_tensor(self.handle, tensor, device_ptr, n))

    def unbind(self, tensor):
        _check(lib.gkrt_graph_unbind_tensor(self.handle, tensor))

    def wait(self):
        """Waits for the graph's asynchronous runs; raises what failed in them."""
        _check(lib.gkrt_graph_wait(self._runtime.handle, self.handle))

    def write(self, tensor, data):
        """Copies a bytes-like object (bytes, bytearray, memoryview, array, numpy array) of the
        tensor's size into an input, parameter or output tensor."""
        view = memoryview(data).cast("B")
        buf = (ctypes.c_char * len(view)).from_buffer_copy(view)
        _check(lib.gkrt_graph_write_tensor(self.handle, tensor, buf, len(view)))

    def read(self, tensor, size=None):
        """A persistent tensor's contents as bytes (`size`: its size, known for tensors made here)."""
        n = size if size is not None else self._sizes.get(tensor)
        if n is None:
            raise GkrtError(1, f"the size of tensor {tensor:#x} is not known here; pass size=")
        buf = ctypes.create_string_buffer(n)
        _check(lib.gkrt_graph_read_tensor(self.handle, tensor, buf, n))
        return buf.raw
