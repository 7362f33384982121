"""Run CUDA kernels that use shared memory and barriers on the CPU (emulation mode).

:class:`.emulate.EmulatedModule` runs every thread of a launch to completion one after another,
which is right only for independent threads. :class:`CooperativeModule` compiles the same kind
of source with ``shim_sync.h`` as well, which runs every CUDA thread as a fiber so that threads
can wait for each other:

- ``__syncthreads()`` and ``cooperative_groups::this_thread_block().sync()``: block barrier;
- ``cooperative_groups::this_grid().sync()``: grid barrier, in a cooperative launch only;
- ``__shared__ T x[N];`` inside a kernel: static shared memory, one copy per block;
- ``rnnc_shared<T>()``: the block's dynamic shared memory of ``shared_mem`` bytes (emulation
  cannot compile ``extern __shared__``; :data:`CUDA_PRELUDE` defines the function for nvcc).

The API mirrors CuPy: ``CooperativeModule(source, names, enable_cooperative_groups=...)``
stands for ``cupy.RawModule(code=source, enable_cooperative_groups=...)``, and
``get_function(name)`` returns a kernel called as ``kernel(grid, block, args, shared_mem=0)``.
As in CuPy, every launch of a module created with ``enable_cooperative_groups=True`` is
cooperative: all blocks are resident at once, so a grid may not exceed
:data:`MAX_COOPERATIVE_BLOCKS` blocks nor :data:`MAX_COOPERATIVE_THREADS` threads (a GPU allows
what fits on its multiprocessors at once, which a GPU path must check with the occupancy API).
In a normal launch blocks run one after another and ``this_grid().sync()`` is an error.

A barrier that not every thread reaches (a thread returned, or waits at the other kind of
barrier) stops the launch with :class:`EmulationFault` naming the kernel, the block and the
threads; a GPU would hang or compute garbage. Barriers are told apart by kind, not by call site.

The source is the exact text nvcc or NVRTC compiles; ``#include <cooperative_groups.h>`` lines
are blanked for emulation, where ``shim_sync.h`` provides that namespace (``sync()`` only).
The text of ``shim_sync.h`` and a digest of this file go into the C++ source, so the cache key
of :func:`.emulate.load_library` covers them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
from collections.abc import Callable
from pathlib import Path

from rnnc.backends.cuda import emulate
from rnnc.backends.cuda.launch import EmulatedKernel, Parameter, parse_kernels
from rnnc.backends.cuda.ptx import numbered
from rnnc.errors import RnncRuntimeError, RnncTypeError, RnncValueError

SYNC_SHIM_PATH = Path(__file__).with_name("shim_sync.h")

# Put first in a kernel source that uses rnnc_shared<T>() or cooperative groups: on the GPU
# it declares the dynamic shared buffer; in emulation __CUDACC__ is undefined and shim_sync.h
# provides both.
CUDA_PRELUDE = r"""#ifdef __CUDACC__
#include <cooperative_groups.h>
extern __shared__ __align__(16) unsigned char rnnc_dynamic_shared[];
template <typename T>
__device__ __forceinline__ T* rnnc_shared() { return reinterpret_cast<T*>(rnnc_dynamic_shared); }
#endif
"""

# CUDA's dynamic shared memory without opting in; a kernel's max_dynamic_shared_size_bytes
# raises it up to the largest any target has (sm_90: 227 KiB per block).
DEFAULT_DYNAMIC_SHARED_BYTES = 48 * 1024
MAX_DYNAMIC_SHARED_BYTES = 227 * 1024
# A cooperative launch needs every block resident at once. A GPU's limit depends on the
# kernel's registers and shared memory (an H100 holds at most 132 x 2048 threads); emulation
# needs a stack per thread, so it takes a fixed, smaller bound.
MAX_COOPERATIVE_BLOCKS = 1024
MAX_COOPERATIVE_THREADS = 65536

ERROR_BYTES = 1024
COOPERATIVE_GROUPS_INCLUDE = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*<cooperative_groups\.h>[ \t]*$", re.MULTILINE
)


class EmulationFault(RnncRuntimeError):
    """An emulated kernel did what a GPU cannot run as written: a barrier that not every
    thread reaches, a grid barrier outside a cooperative launch, a thread's stack overflowed."""


@functools.cache
def _own_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def emulated_source(source: str) -> str:
    """source with each ``#include <cooperative_groups.h>`` blanked (line numbers kept)."""
    return COOPERATIVE_GROUPS_INCLUDE.sub("", source)


def launcher_source(name: str, params: list[Parameter]) -> str:
    """C++ for ``launch_<name>``: unpack the arguments and hand the kernel to the scheduler."""
    unpacked = []
    for i, p in enumerate(params):
        if p.pointer:
            # args[i] points at the device pointer itself, as in cuLaunchKernel.
            unpacked.append(f"static_cast<{p.base}*>(*static_cast<void**>(rnnc_args[{i}]))")
        else:
            unpacked.append(f"*static_cast<{p.base}*>(rnnc_args[{i}])")
    return (
        f"static void rnnc_body_{name}(void** rnnc_args) {{\n"
        f"    (void)rnnc_args;\n"
        f"    ::{name}({', '.join(unpacked)});\n"
        f"}}\n"
        f'extern "C" int launch_{name}(unsigned rnnc_grid_x, unsigned rnnc_block_x, '
        f"unsigned long long rnnc_shared_bytes, int rnnc_cooperative, void** rnnc_args, "
        f"char* rnnc_error, unsigned long long rnnc_error_size) {{\n"
        f"    return rnnc_sync::run(rnnc_body_{name}, rnnc_grid_x, rnnc_block_x, "
        f"rnnc_shared_bytes, rnnc_cooperative, rnnc_args, rnnc_error, rnnc_error_size);\n"
        f"}}\n"
    )


def library_source(source: str, params: dict[str, list[Parameter]]) -> str:
    """The C++ compiled for source: shim.h, shim_sync.h's text, the kernels, their launchers."""
    return (
        f'#include "shim.h"\n// cooperative.py {_own_digest()}\n'
        f'#line 1 "shim_sync.h"\n{SYNC_SHIM_PATH.read_text()}\n'
        f'#line 1 "kernels.cu"\n{emulated_source(source)}\n'
        f'#line 1 "launchers.cpp"\n'
        + "\n".join(launcher_source(n, p) for n, p in params.items())
    )


class CooperativeKernel:
    """One kernel of a CooperativeModule, called like ``cupy.RawKernel``."""

    def __init__(self, name: str, params: list[Parameter], launch: Callable[..., int],
                 cooperative: bool) -> None:
        self.name = name
        self.params = params
        self.cooperative = cooperative
        self._launch = launch
        self._max_shared = DEFAULT_DYNAMIC_SHARED_BYTES

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        """The most dynamic shared memory a launch may ask for (CuPy's attribute of that name)."""
        return self._max_shared

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self._max_shared = self._byte_count("max_dynamic_shared_size_bytes", value,
                                            MAX_DYNAMIC_SHARED_BYTES)

    def __call__(
        self,
        grid: tuple[int, ...] | int,
        block: tuple[int, ...] | int,
        args: tuple,
        *,
        shared_mem: int = 0,
    ) -> None:
        """Run the kernel over grid x block threads with args and shared_mem bytes of dynamic
        shared memory per block; arguments are checked as strictly as EmulatedKernel does."""
        shared = self._byte_count("shared_mem", shared_mem, self._max_shared)
        checked = EmulatedKernel(self.name, self.params,
                                 functools.partial(self._run, shared))
        checked(grid, block, args)

    def _byte_count(self, what: str, value: object, limit: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RnncTypeError(
                f"kernel {self.name!r}: {what} must be an int number of bytes, "
                f"got {type(value).__name__}")
        if not 0 <= value <= limit:
            hint = (" (set the kernel's max_dynamic_shared_size_bytes to allow more)"
                    if what == "shared_mem" and value > limit else "")
            raise RnncValueError(
                f"kernel {self.name!r}: {what} must be in 0..{limit}, got {value}{hint}")
        return value

    def _run(self, shared: int, grid: int, block: int, pointers: ctypes.Array) -> None:
        """Launch with checked arguments; raise what the scheduler reports."""
        if self.cooperative and (grid > MAX_COOPERATIVE_BLOCKS
                                 or grid * block > MAX_COOPERATIVE_THREADS):
            raise RnncValueError(
                f"kernel {self.name!r}: a cooperative launch has every block resident at once, "
                f"at most {MAX_COOPERATIVE_BLOCKS} blocks and {MAX_COOPERATIVE_THREADS} threads "
                f"in emulation; got {grid} blocks of {block} threads")
        error = ctypes.create_string_buffer(ERROR_BYTES)
        status = self._launch(grid, block, shared, int(self.cooperative), pointers, error,
                              ERROR_BYTES)
        message = f"kernel {self.name!r}: {error.value.decode(errors='replace')}"
        if status == 2:
            raise MemoryError(message)
        if status != 0:
            raise EmulationFault(message)


class CooperativeModule:
    """CUDA source with barriers and shared memory compiled for the CPU; mirrors
    ``cupy.RawModule(code=source, enable_cooperative_groups=...)``."""

    def __init__(self, source: str, names: list[str], cache_dir: str | Path | None = None, *,
                 enable_cooperative_groups: bool = False) -> None:
        self.source = source
        self.enable_cooperative_groups = bool(enable_cooperative_groups)
        names = list(dict.fromkeys(names))  # a repeated name would define its launcher twice
        kernels = parse_kernels(source)
        missing = [n for n in names if n not in kernels]
        if missing:
            raise RnncValueError(f"kernels {missing} not found in source; found {sorted(kernels)}")
        self.params = {n: kernels[n] for n in names}
        try:
            self._library = emulate.load_library(
                emulate.find_cxx(), library_source(source, self.params),
                None if cache_dir is None else Path(cache_dir))
        except RuntimeError as error:
            raise RuntimeError(
                f"emulated CUDA kernels failed to compile:\n{error}\n"
                f"kernel source:\n{numbered(source)}"
            ) from None
        self._kernels = {n: self._kernel(n) for n in names}

    def _kernel(self, name: str) -> CooperativeKernel:
        launch = getattr(self._library, f"launch_{name}")
        launch.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_int,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_ulonglong]
        launch.restype = ctypes.c_int
        return CooperativeKernel(name, self.params[name], launch, self.enable_cooperative_groups)

    def get_function(self, name: str) -> CooperativeKernel:
        """The kernel called name, callable as ``kernel(grid, block, args, shared_mem=0)``."""
        if name not in self._kernels:
            raise RnncValueError(
                f"no kernel {name!r} in this module; it has {sorted(self._kernels)}")
        return self._kernels[name]
