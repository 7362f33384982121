"""Run CUDA kernel source on the CPU: a stand-in for CuPy's RawModule in emulation mode.

The exact source that would go to NVRTC is compiled with g++ after ``#include "shim.h"``,
which defines the CUDA keywords away and makes ``threadIdx``/``blockIdx`` plain variables, and
one launcher per kernel (:mod:`.launch`) is appended.
``EmulatedModule(source, names).get_function(name)`` returns a callable with CuPy's
``RawKernel`` signature, ``kernel(grid, block, args)``, taking NumPy arrays where CuPy takes
device arrays.

Compiled libraries are cached as :class:`rnnc.diskcache.DiskCache` entries under
``<rnnc cache root>/cuda-emulate`` (or ``cache_dir``), keyed by everything that goes into the
build: the compiler and its version, the flags, ``shim.h``, this file and the C++ source. A
library is only ever loaded from bytes that passed the entry's checks, copied to a fresh
private file first, so a planted, truncated or swapped file is never ``dlopen``ed: it is
deleted and the library rebuilt.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from rnnc import diskcache
from rnnc.backends.cuda.launch import EmulatedKernel, launcher_source, parse_kernels
from rnnc.backends.cuda.ptx import numbered

SHIM_PATH = Path(__file__).with_name("shim.h")

# No -ffast-math: emulation must keep IEEE NaN/inf semantics so masking and overflow
# behave as in the kernels' CUDA build (which rnnc also compiles without fast math).
CXX_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-w")


@functools.cache
def compiler_identity(cxx: str) -> str:
    """The compiler's version line, part of the cache key so an upgrade rebuilds."""
    result = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.splitlines()[0] if result.stdout else cxx


def find_cxx() -> str:
    """The C++ compiler to build emulation libraries with."""
    for candidate in ("g++", "c++", "clang++"):
        path = shutil.which(candidate)
        if path:
            return path
    raise RuntimeError("CUDA emulation needs a C++ compiler (g++ or clang++) on PATH")


@functools.cache
def _file_text(path: Path) -> str:
    return path.read_text()


def library_key(cxx: str, cpp: str) -> str:
    """The cache key of the library built from ``cpp``: every input of the build."""
    parts = [cxx, compiler_identity(cxx), " ".join(CXX_FLAGS), platform.machine(),
             _file_text(SHIM_PATH), _file_text(Path(__file__)), cpp]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def load_library(cxx: str, cpp: str, cache_dir: Path | None) -> ctypes.CDLL:
    """The library built from ``cpp``: from a checked cache entry, or compiled (and stored).

    ``cache_dir`` None means ``<rnnc cache root>/cuda-emulate``; a directory that is not
    private keeps nothing on disk (with one warning)."""
    store = diskcache.DiskCache(cache_dir, "cuda-emulate-library") if cache_dir is not None \
        else diskcache.DiskCache(diskcache.default_root(), "cuda-emulate-library",
                                 "cuda-emulate")
    key = library_key(cxx, cpp)
    source = hashlib.sha256(cpp.encode()).hexdigest()
    entry = store.load(key, source)
    if entry is not None:
        try:
            return _open_copy(entry.payload, store.directory)
        except OSError:
            store.discard(key)  # checked bytes the loader still refuses: build again
    library = compile_library(cxx, cpp, store.directory)
    store.store(key, source, {}, library)
    return _open_copy(library, store.directory)


def _scratch(cache_dir: Path | None) -> tempfile.TemporaryDirectory:
    """A fresh private directory (mode 0700, unpredictable name): in the cache directory
    when it is usable (a temporary directory may be mounted noexec), else in $TMPDIR."""
    where = None if cache_dir is None else diskcache.private_directory(cache_dir)
    return tempfile.TemporaryDirectory(prefix=".build-", dir=where)


def compile_library(cxx: str, cpp: str, cache_dir: Path | None) -> bytes:
    """The bytes of the shared library g++ builds from ``cpp`` (RuntimeError on failure)."""
    with _scratch(cache_dir) as work:
        source_path = Path(work) / "kernels.cpp"
        source_path.write_text(cpp)
        output = Path(work) / "kernels.so"
        command = [
            cxx,
            *CXX_FLAGS,
            "-I",
            str(SHIM_PATH.parent),
            str(source_path),
            "-o",
            str(output),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(result.stderr)
        return output.read_bytes()


def _open_copy(library: bytes, cache_dir: Path | None) -> ctypes.CDLL:
    """``dlopen`` a private copy of checked bytes: nothing can change the file in between."""
    with _scratch(cache_dir) as work:
        path = Path(work) / "kernels.so"
        path.write_bytes(library)
        return ctypes.CDLL(str(path))  # the mapping outlives the file


class EmulatedModule:
    """CUDA kernel source compiled for the CPU; ``get_function`` mirrors ``cupy.RawModule``."""

    def __init__(self, source: str, names: list[str], cache_dir: str | Path | None = None) -> None:
        self.source = source
        names = list(dict.fromkeys(names))  # a repeated name would define its launcher twice
        kernels = parse_kernels(source)
        missing = [n for n in names if n not in kernels]
        if missing:
            raise ValueError(f"kernels {missing} not found in source; found {sorted(kernels)}")
        self.params = {n: kernels[n] for n in names}
        # #line keeps compiler messages in the kernel source's own line numbers.
        cpp = (
            f'#include "shim.h"\n#line 1 "kernels.cu"\n{source}\n'
            f'#line 1 "launchers.cpp"\n'
            + "\n".join(launcher_source(n, self.params[n]) for n in names)
        )
        cxx = find_cxx()
        try:
            self._library = load_library(cxx, cpp, None if cache_dir is None else Path(cache_dir))
        except RuntimeError as error:
            raise RuntimeError(
                f"emulated CUDA kernels failed to compile:\n{error}\n"
                f"kernel source:\n{numbered(source)}"
            ) from None
        self._kernels: dict[str, EmulatedKernel] = {}
        for name in names:
            launch = getattr(self._library, f"launch_{name}")
            launch.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
            launch.restype = None
            self._kernels[name] = EmulatedKernel(name, self.params[name], launch)

    def get_function(self, name: str) -> EmulatedKernel:
        """The kernel called name, callable as ``kernel(grid, block, args)``."""
        if name not in self._kernels:
            raise ValueError(f"no kernel {name!r} in this module; it has {sorted(self._kernels)}")
        return self._kernels[name]
