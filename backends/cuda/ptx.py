"""Compile rnnc's CUDA kernel source to PTX with nvcc or NVRTC, without needing a GPU.

Tests use this to check that generated kernels are valid CUDA for the architectures rnnc
targets (sm_80, sm_90) on machines that have a CUDA compiler but no device. The source
is the raw kernel text that CuPy would compile; ``shim.h`` belongs to emulation only.
nvcc is used when on PATH, else NVRTC from the ``nvidia-cuda-nvrtc`` wheel through ctypes.
No fast-math flag is passed: rnnc's kernels keep IEEE semantics unless they ask for the
approximate intrinsics (``__expf``) by name.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ARCH_PATTERN = re.compile(r"sm_[0-9]{2,3}")

NO_COMPILER = (
    "no CUDA compiler: install nvcc (the CUDA toolkit) or "
    "pip install nvidia-cuda-nvrtc-cu12 to compile kernels to PTX"
)

# Where the NVRTC wheels put the library: CUDA 12 wheels under nvidia/cuda_nvrtc/lib,
# CUDA 13 wheels under nvidia/cu13/lib.
NVRTC_WHEEL_DIRS = ("nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib")


def numbered(source: str) -> str:
    """Source with 1-based line numbers, matching the compiler's messages."""
    return "\n".join(f"{i:4d} | {line}" for i, line in enumerate(source.splitlines(), 1))


def nvrtc_library_path() -> str | None:
    """The path of libnvrtc from an installed wheel, else one the dynamic loader finds."""
    for entry in sys.path:
        for wheel_dir in NVRTC_WHEEL_DIRS:
            matches = sorted(glob.glob(os.path.join(entry or ".", wheel_dir, "libnvrtc.so*")))
            if matches:
                return matches[0]
    return ctypes.util.find_library("nvrtc")


@functools.lru_cache(maxsize=1)
def load_nvrtc() -> ctypes.CDLL | None:
    """libnvrtc loaded with its function signatures declared, or None when absent."""
    path = nvrtc_library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    program = ctypes.c_void_p
    strings = ctypes.POINTER(ctypes.c_char_p)
    size = ctypes.POINTER(ctypes.c_size_t)
    signatures = {
        "nvrtcCreateProgram": [
            ctypes.POINTER(program),
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int,
            strings,
            strings,
        ],
        "nvrtcCompileProgram": [program, ctypes.c_int, strings],
        "nvrtcGetPTXSize": [program, size],
        "nvrtcGetPTX": [program, ctypes.c_char_p],
        "nvrtcGetProgramLogSize": [program, size],
        "nvrtcGetProgramLog": [program, ctypes.c_char_p],
        "nvrtcDestroyProgram": [ctypes.POINTER(program)],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def available_compiler() -> str | None:
    """``"nvcc"`` or ``"nvrtc"``, whichever compile_ptx would use, or None if neither exists."""
    if shutil.which("nvcc"):
        return "nvcc"
    if load_nvrtc() is not None:
        return "nvrtc"
    return None


def compile_ptx(source: str, arch: str, compiler: str | None = None) -> str:
    """Compile CUDA C source to PTX text for arch (``"sm_80"``, ``"sm_90"``)."""
    if not ARCH_PATTERN.fullmatch(arch):
        raise ValueError(f"arch must look like 'sm_80' or 'sm_90', got {arch!r}")
    compiler = compiler or available_compiler()
    if compiler == "nvcc":
        return compile_with_nvcc(source, arch)
    if compiler == "nvrtc":
        return compile_with_nvrtc(source, arch)
    if compiler is None:
        raise RuntimeError(NO_COMPILER)
    raise ValueError(f"compiler must be 'nvcc' or 'nvrtc', got {compiler!r}")


def compile_with_nvcc(source: str, arch: str) -> str:
    """PTX from ``nvcc -ptx``."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError(NO_COMPILER)
    with tempfile.TemporaryDirectory(prefix="rnnc-ptx-") as work:
        source_path = Path(work) / "kernels.cu"
        source_path.write_text(source)
        output = Path(work) / "kernels.ptx"
        command = [nvcc, "-ptx", f"-arch={arch}", "-std=c++17", str(source_path), "-o", str(output)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"nvcc failed for {arch}:\n{result.stderr}\nkernel source:\n{numbered(source)}"
            )
        return output.read_text()


def compile_with_nvrtc(source: str, arch: str) -> str:
    """PTX from NVRTC, called through ctypes."""
    lib = load_nvrtc()
    if lib is None:
        raise RuntimeError(NO_COMPILER)

    def check(status: int, what: str) -> None:
        if status != 0:
            message = lib.nvrtcGetErrorString(status).decode()
            raise RuntimeError(f"NVRTC {what} failed for {arch}: {message}")

    program = ctypes.c_void_p()
    check(
        lib.nvrtcCreateProgram(
            ctypes.byref(program), source.encode(), b"kernels.cu", 0, None, None
        ),
        "nvrtcCreateProgram",
    )
    try:
        # compute_XX, not sm_XX: given a real architecture NVRTC emits a cubin and no PTX.
        options = [f"--gpu-architecture=compute_{arch[3:]}".encode(), b"--std=c++17"]
        option_array = (ctypes.c_char_p * len(options))(*options)
        status = lib.nvrtcCompileProgram(program, len(options), option_array)
        if status != 0:
            log_size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(program, ctypes.byref(log_size))
            log = ctypes.create_string_buffer(log_size.value)
            lib.nvrtcGetProgramLog(program, log)
            raise RuntimeError(
                f"NVRTC failed for {arch}:\n{log.value.decode(errors='replace')}\n"
                f"kernel source:\n{numbered(source)}"
            )
        ptx_size = ctypes.c_size_t()
        check(lib.nvrtcGetPTXSize(program, ctypes.byref(ptx_size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(ptx_size.value)
        check(lib.nvrtcGetPTX(program, ptx), "nvrtcGetPTX")
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
