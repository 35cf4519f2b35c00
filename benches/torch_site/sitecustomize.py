"""Runs any PyTorch program on gkrt's pool, unchanged: put this folder on PYTHONPATH and set
GKRT_TORCH_LIB to the path of libgkrt.so. Python imports sitecustomize at start-up; this installs
gkrt's entry points as PyTorch's CUDA allocator before the program allocates anything.

    GKRT_TORCH_LIB=/path/libgkrt.so PYTHONPATH=benches/torch_site python3 train.py

gkrt's own variables apply (GKRT_MEMORY_LIMIT, GKRT_LOG_LEVEL, GKRT_POOL_VMM; see src/capi/raw.rs).
"""
import os

_lib = os.environ.get("GKRT_TORCH_LIB")
if _lib:
    import torch

    torch.cuda.memory.change_current_allocator(
        torch.cuda.memory.CUDAPluggableAllocator(
            os.path.abspath(_lib), "gkrt_torch_alloc", "gkrt_torch_free"
        )
    )
