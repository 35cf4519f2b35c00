#!/usr/bin/env python3
"""Regenerates the NVRTC-compiled fixtures of src/device/cuda/testdata/ that the host tests of
src/device/cuda/params.rs parse (no GPU needed: NVRTC compiles without one).

Needs an NVRTC library, e.g. from PyPI:
    python3 -m pip install --target /tmp/nvrtc "nvidia-cuda-nvrtc==13.0.*"
    LD_LIBRARY_PATH=/tmp/nvrtc/nvidia/cu13/lib python3 scripts/gen_cuda_param_fixtures.py

Writes, from testdata/params_kernels.cu and the built-ins' source in builtins.rs:
    params_kernels.sm_90.cubin, params_kernels.compute_90.ptx, builtins.sm_90.cubin
"""
import ctypes
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "src/device/cuda/testdata"


def compile_nvrtc(lib, source: bytes, arch: str, options) -> bytes:
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"gkrt.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=" + arch.encode()] + [o.encode() for o in options]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if r != 0:
        sys.exit(f"nvrtcCompileProgram failed ({r}):\n{log.value.decode()}")
    if arch.startswith("sm_"):
        get_size, get = lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN
    else:
        get_size, get = lib.nvrtcGetPTXSize, lib.nvrtcGetPTX
    if get_size(prog, ctypes.byref(n)) != 0:
        sys.exit("size query failed")
    buf = ctypes.create_string_buffer(n.value)
    if get(prog, buf) != 0:
        sys.exit("image query failed")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.raw[: n.value]


def main():
    lib = ctypes.CDLL("libnvrtc.so.13")
    version = (ctypes.c_int(), ctypes.c_int())
    lib.nvrtcVersion(ctypes.byref(version[0]), ctypes.byref(version[1]))
    print(f"NVRTC {version[0].value}.{version[1].value}")
    kernels = (DATA / "params_kernels.cu").read_bytes()
    builtins_rs = (ROOT / "src/device/cuda/builtins.rs").read_text()
    builtins = re.search(r'pub\(super\) const SOURCE: &str = r#"(.*?)"#;', builtins_rs, re.S).group(1)
    out = {
        "params_kernels.sm_90.cubin": compile_nvrtc(lib, kernels, "sm_90", []),
        # PTX keeps NVRTC's terminating NUL, as the backend gets it.
        "params_kernels.compute_90.ptx": compile_nvrtc(lib, kernels, "compute_90", []),
        "builtins.sm_90.cubin": compile_nvrtc(lib, builtins.encode(), "sm_90", ["--fmad=false"]),
    }
    for name, data in out.items():
        (DATA / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
