"""PyTorch on gkrt's pool, in one call, with PyTorch's own statistics names.

    import gkrt.torch
    gkrt.torch.use_gkrt_allocator()           # before the first CUDA allocation
    ...
    gkrt.torch.memory_stats()["allocated_bytes.all.peak"]

PyTorch's `torch.cuda.memory_stats()` and `max_memory_reserved()` do not work for a pluggable
allocator; `memory_stats()` here returns the keys they use, read from the runtime behind the
allocator (`gkrt_torch_runtime`), and `reset_peak_memory_stats()` resets its peaks.

Not with CUDA graphs captured by `torch.compile` (`mode="reduce-overhead"`, and so transformers'
generation with a static cache, which compiles with it): their graph trees ask the allocator
`checkPoolLiveAllocations`, which PyTorch's pluggable allocators do not provide, and the program
stops with "pluggable does not yet support checkPoolLiveAllocations" (BENCHMARKS.md, session 42).

`Tensor.record_stream` does nothing here: PyTorch gives a pluggable allocator only its allocation
and free functions, so it never hears of other streams that use a block. A block is freed in the
order of the stream it was allocated on, and that stream may reuse it at once, while another
stream may still read it. A program that hands a tensor to another stream (an input pipeline on a
side stream, say) calls `gkrt.torch.record_stream(tensor, stream)` instead, which gkrt hears;
or it makes the allocating stream wait for the using one before the tensor is dropped
(`alloc_stream.wait_stream(use_stream)`) (BENCHMARKS.md, session 54).
"""

import ctypes

from . import GkrtError, Runtime, _check
from ._lib import lib, path


def use_gkrt_allocator():
    """Switches PyTorch's CUDA caching allocator to gkrt's pool (`gkrt_torch_alloc` /
    `gkrt_torch_free` in this library). Must run before PyTorch allocates CUDA memory."""
    import torch

    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "gkrt_torch_alloc", "gkrt_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def record_stream(tensor, stream):
    """`tensor.record_stream(stream)` for a tensor on gkrt's pool (`use_gkrt_allocator`), which
    PyTorch does not pass on: when the tensor's memory is freed, the stream it was allocated on
    first waits for the work queued on `stream` by then (`gkrt_record_stream`). A tensor with no
    memory (no elements) needs nothing."""
    ptr = tensor.untyped_storage().data_ptr()
    if ptr:
        with runtime(tensor.device.index) as rt:
            _check(lib.gkrt_record_stream(rt.handle, ptr, stream.cuda_stream))


def runtime(device=None):
    """A handle to the process-wide runtime behind the allocator for `device` (default: the
    current CUDA device); close it when done (the runtime itself lives on)."""
    if device is None:
        import torch

        device = torch.cuda.current_device()
    h = ctypes.c_void_p()
    _check(lib.gkrt_torch_runtime(int(device), ctypes.byref(h)))
    return Runtime._wrap(h.value)


def memory_stats(device=None):
    """gkrt's statistics under the keys of `torch.cuda.memory_stats()` (the "all" pool)."""
    with runtime(device) as rt:
        s = rt.stats()
    return {
        "allocated_bytes.all.current": s["allocated_bytes"],
        "allocated_bytes.all.peak": s["peak_allocated_bytes"],
        "reserved_bytes.all.current": s["reserved_bytes"],
        "reserved_bytes.all.peak": s["peak_reserved_bytes"],
        "requested_bytes.all.current": s["requested_bytes"],
        "allocation.all.allocated": s["alloc_count"],
        "allocation.all.freed": s["free_count"],
        "allocation.all.current": s["alloc_count"] - s["free_count"],
        "num_ooms": s["failed_alloc_count"],
        "segment.all.current": s["segment_count"],
        "segment.all.allocated": s["segment_alloc_count"],
        "segment.all.freed": s["segment_free_count"],
    }


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def reset_peak_memory_stats(device=None):
    with runtime(device) as rt:
        rt.reset_peak_stats()


__all__ = ["use_gkrt_allocator", "runtime", "memory_stats", "max_memory_allocated",
           "max_memory_reserved", "memory_allocated", "memory_reserved",
           "reset_peak_memory_stats", "GkrtError"]


def _record_memory_history(max_entries=100_000, device=None):
    """Starts recording the pool's events (the last `max_entries`) for snapshots, as
    `torch.cuda.memory._record_memory_history` does; 0 stops."""
    with runtime(device) as rt:
        rt.record_history(max_entries)


def snapshot(device=None):
    """The pool as `torch.cuda.memory._snapshot()` reports PyTorch's own: a dict with
    "segments" and "device_traces", which `torch.cuda._memory_viz` reads."""
    with runtime(device) as rt:
        return rt.snapshot()


def _dump_snapshot(filename="dump_snapshot.pickle", device=None):
    """Writes `snapshot()` as `torch.cuda.memory._dump_snapshot` does (a pickle)."""
    with runtime(device) as rt:
        rt.dump_snapshot(filename)
