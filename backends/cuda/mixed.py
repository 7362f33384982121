"""One emulated library for a module whose kernels partly wait at barriers (emulation mode).

A program's module holds one-thread-per-element kernels and, with fused steps, kernels that use
shared memory and ``__syncthreads()``. The first kind runs correctly, and about fifty times
faster, with :mod:`.emulate`'s plain loop over threads; the second needs :mod:`.cooperative`'s
fibers. Both need the same source compiled once (the source is what a GPU compiles, and
``shim_sync.h`` must be present for the barrier kernels to compile at all), so
:class:`MixedModule` builds one library from :func:`.cooperative.library_source` with a fiber
launcher for each barrier kernel and a plain launcher (:func:`.launch.launcher_source`) for each
other kernel, cached like every emulation library (:func:`.emulate.load_library`).
``get_function(name)`` returns a :class:`~.cooperative.CooperativeKernel` (normal launch: blocks
one after another) or an :class:`~.launch.EmulatedKernel`, both called like ``cupy.RawKernel``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

from rnnc.backends.cuda import emulate
from rnnc.backends.cuda.cooperative import CooperativeKernel, library_source
from rnnc.backends.cuda.launch import EmulatedKernel, launcher_source, parse_kernels
from rnnc.backends.cuda.ptx import numbered
from rnnc.errors import RnncValueError

_COOPERATIVE_ARGS = [ctypes.c_uint, ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_int,
                     ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_ulonglong]
_PLAIN_ARGS = [ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]


class MixedModule:
    """CUDA source compiled for the CPU with fibers for the kernels in ``barriers`` only;
    mirrors ``cupy.RawModule(code=source)``."""

    def __init__(self, source: str, names: list[str], barriers: Iterable[str]) -> None:
        self.source = source
        names = list(dict.fromkeys(names))
        waiting = set(barriers)
        kernels = parse_kernels(source)
        missing = [n for n in names if n not in kernels]
        if missing:
            raise RnncValueError(f"kernels {missing} not found in source; found {sorted(kernels)}")
        params = {n: kernels[n] for n in names}
        cpp = library_source(source, {n: p for n, p in params.items() if n in waiting})
        cpp += "\n" + "\n".join(launcher_source(n, p) for n, p in params.items()
                                  if n not in waiting)
        try:
            library = emulate.load_library(emulate.find_cxx(), cpp, None)
        except RuntimeError as error:
            raise RuntimeError(f"emulated CUDA kernels failed to compile:\n{error}\n"
                               f"kernel source:\n{numbered(source)}") from None
        self._kernels: dict[str, CooperativeKernel | EmulatedKernel] = {}
        for name in names:
            launch = getattr(library, f"launch_{name}")
            if name in waiting:
                launch.argtypes, launch.restype = _COOPERATIVE_ARGS, ctypes.c_int
                self._kernels[name] = CooperativeKernel(name, params[name], launch, False)
            else:
                launch.argtypes, launch.restype = _PLAIN_ARGS, None
                self._kernels[name] = EmulatedKernel(name, params[name], launch)

    def get_function(self, name: str) -> CooperativeKernel | EmulatedKernel:
        """The kernel called name, callable as ``kernel(grid, block, args)``."""
        if name not in self._kernels:
            raise RnncValueError(
                f"no kernel {name!r} in this module; it has {sorted(self._kernels)}")
        return self._kernels[name]
