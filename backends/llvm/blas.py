"""The installed BLAS libraries: found, loaded, and their GEMM called by address.

Three documented interfaces are probed, each only when its package is installed:

- ``scipy_openblas32`` (the default): ``get_lib_dir()``/``get_library()`` name the
  shared library, whose CBLAS symbols carry a ``scipy_`` prefix
  (``scipy_cblas_sgemm``, ``scipy_cblas_dgemm``, ``scipy_openblas_set_num_threads``).
- SciPy's ``scipy.linalg.cython_blas``: ``__pyx_capi__`` holds one ``PyCapsule`` per
  routine with the Fortran calling convention (every argument by pointer,
  column-major).
- Intel MKL's ``mkl`` wheel: ``libmkl_rt.so`` with ``cblas_sgemm``/``cblas_dgemm`` and
  ``MKL_Set_Num_Threads``; the LP64 (32-bit integer) interface is selected first.

All three use 32-bit integers. Callers think in row-major
``C = alpha * op(A) @ op(B) + beta * C``; for the Fortran convention the operands are
swapped, which computes the same product as the column-major ``C^T = op(B)^T op(A)^T``.
Generated code calls a library by its address (:mod:`rnnc.backends.llvm.gemm`); Python calls
it through ctypes (:func:`call_gemm_ctypes`), and :mod:`rnnc.backends.llvm.autotune` picks one
per GEMM shape.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rnnc import process

__all__ = [
    "Blas",
    "available",
    "call_gemm_ctypes",
    "gemm_arguments",
    "get",
    "same_convention",
    "set_threads",
]

Convention = Literal["cblas", "fortran"]

# CBLAS enum values from cblas.h.
CBLAS_ROW_MAJOR = 101
CBLAS_NO_TRANS = 111
CBLAS_TRANS = 112

# Order in which get(None) picks a library.
PREFERENCE = ("openblas", "mkl", "scipy")


@dataclass(frozen=True)
class Blas:
    """One bound BLAS library: GEMM addresses, calling convention, thread control."""

    name: str
    sgemm_addr: int
    dgemm_addr: int
    convention: Convention
    set_threads: Callable[[int], None] | None = None
    # Address of the C function ``void set_num_threads(int)`` when there is one: generated
    # code calls it to give each GEMM call site its own thread count.
    threads_addr: int | None = None
    # Keeps the shared library (or capsule owner) loaded while the addresses are used.
    handle: object = field(default=None, repr=False, compare=False)

    def gemm_addr(self, dtype: np.dtype | type) -> int:
        """Return the GEMM address for float32 or float64."""
        dtype = np.dtype(dtype)
        if dtype == np.float32:
            return self.sgemm_addr
        if dtype == np.float64:
            return self.dgemm_addr
        raise TypeError(f"BLAS GEMM needs float32 or float64, got {dtype}")


def _address(function: ctypes._CFuncPtr) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def _load_openblas() -> Blas | None:
    with _short_thread_timeout():
        try:
            scipy_openblas32 = importlib.import_module("scipy_openblas32")  # loads the library
        except ImportError:
            return None
        path = os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(True))
        library = ctypes.CDLL(path)
    return _bind_cblas("openblas", library, "scipy_", "scipy_openblas_set_num_threads")


# OpenBLAS's worker threads spin this many cycles (log2; 4 is its least) after a call before
# they sleep. Its default, 2**28 cycles (about 0.1 s), leaves a core spinning long after each
# threaded call, which a thread team of rnnc's own then has to share (docs/threads.md).
THREAD_TIMEOUT = 4


def _short_thread_timeout() -> AbstractContextManager[None]:
    """``OPENBLAS_THREAD_TIMEOUT`` = :data:`THREAD_TIMEOUT` while rnnc's own OpenBLAS loads
    (it reads the variable once, then), unless the caller set it."""
    return process.default_while(process.OPENBLAS_THREAD_TIMEOUT, str(THREAD_TIMEOUT))


def _bind_cblas(name: str, library: ctypes.CDLL, prefix: str, set_num_threads_symbol: str
                ) -> Blas:
    """A loaded CBLAS library: ``<prefix>cblas_sgemm``/``dgemm`` and its thread setter."""
    set_num_threads = getattr(library, set_num_threads_symbol)
    set_num_threads.argtypes = [ctypes.c_int]
    set_num_threads.restype = None
    return Blas(
        name=name,
        sgemm_addr=_address(getattr(library, f"{prefix}cblas_sgemm")),
        dgemm_addr=_address(getattr(library, f"{prefix}cblas_dgemm")),
        convention="cblas",
        set_threads=set_num_threads,
        threads_addr=_address(set_num_threads),
        handle=library,
    )


def _capsule_address(capsule: object) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


def _load_scipy() -> Blas | None:
    try:
        cython_blas = importlib.import_module("scipy.linalg.cython_blas")
    except ImportError:
        return None
    capsules = cython_blas.__pyx_capi__
    return Blas(
        name="scipy",
        sgemm_addr=_capsule_address(capsules["sgemm"]),
        dgemm_addr=_capsule_address(capsules["dgemm"]),
        convention="fortran",
        set_threads=_threadpoolctl_setter(),
        handle=cython_blas,
    )


def _threadpoolctl_setter() -> Callable[[int], None] | None:
    """Thread control for the BLAS bundled in SciPy's wheel, through threadpoolctl."""
    try:
        threadpoolctl = importlib.import_module("threadpoolctl")
    except ImportError:
        return None
    # SciPy wheels ship their OpenBLAS in scipy.libs/; matching that directory
    # leaves other loaded BLAS libraries (scipy-openblas32, NumPy's) alone.
    controllers = [
        lib
        for lib in threadpoolctl.ThreadpoolController().lib_controllers
        if lib.user_api == "blas" and "scipy.libs" in Path(lib.filepath).parts
    ]
    if not controllers:
        return None

    def set_num_threads(n: int) -> None:
        for lib in controllers:
            lib.set_num_threads(n)

    return set_num_threads


def _mkl_library_paths() -> list[Path]:
    """Paths of libmkl_rt from the installed ``mkl`` distribution's file list."""
    try:
        files = importlib.metadata.distribution("mkl").files or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names = [f for f in files if Path(str(f)).name.startswith("libmkl_rt.so")]
    # The versioned name (libmkl_rt.so.2) is the real file; the bare .so may be absent.
    names.sort(key=lambda f: len(str(f)), reverse=True)
    return [Path(f.locate()) for f in names]


def _load_mkl() -> Blas | None:
    if not sys.platform.startswith("linux"):
        return None
    for path in _mkl_library_paths():
        if not path.exists():
            continue
        try:
            library = ctypes.CDLL(str(path))
        except OSError:
            continue
        # mkl_rt picks LP64 or ILP64 at its first call; pin LP64 (0) so that the
        # 32-bit integers emitted for every library mean the same thing here.
        set_layer = getattr(library, "MKL_Set_Interface_Layer", None)
        if set_layer is not None:
            set_layer.argtypes = [ctypes.c_int]
            set_layer.restype = ctypes.c_int
            if set_layer(0) != 0:
                continue
        return _bind_cblas("mkl", library, "", "MKL_Set_Num_Threads")
    return None


@cache
def _load(name: str) -> Blas | None:
    # Loading a library starts its thread pool, so nothing is loaded before it is asked for.
    loader = {"openblas": _load_openblas, "mkl": _load_mkl, "scipy": _load_scipy}.get(name)
    return loader() if loader is not None else None


def available() -> dict[str, Blas]:
    """Return every BLAS that is installed and loads, by name, in preference order."""
    found = {name: _load(name) for name in PREFERENCE}
    return {name: blas for name, blas in found.items() if blas is not None}


def get(name: str | None = None) -> Blas:
    """Return the named BLAS, or the preferred installed one when name is None."""
    if name is None:
        for candidate in PREFERENCE:
            if _load(candidate) is not None:
                return _load(candidate)
        raise ValueError(
            "no BLAS library found; install scipy-openblas32 (pip install scipy-openblas32)"
        )
    blas = _load(name)
    if blas is None:
        raise ValueError(
            f"unknown or unavailable BLAS {name!r}; available: {sorted(available()) or 'none'}"
        )
    return blas


def same_convention(blas: Blas) -> list[Blas]:
    """The installed libraries callable like ``blas`` (the per-shape choice is among these).

    SciPy's Fortran-convention BLAS joins only when it is the one asked for: loading it
    starts another thread pool.
    """
    names = [n for n in PREFERENCE if n != "scipy"] if blas.convention == "cblas" else ["scipy"]
    found = [_load(n) for n in names]
    return [b for b in found if b is not None and b.convention == blas.convention]


def set_threads(n: int, blas: Blas | str | None = None) -> None:
    """Set the number of threads of one BLAS (the default one when blas is None)."""
    if n < 1:
        raise ValueError(f"thread count must be at least 1, got {n}")
    library = blas if isinstance(blas, Blas) else get(blas)
    if library.set_threads is not None:
        library.set_threads(n)


def gemm_arguments(convention: Convention, transa: bool, transb: bool, m: Any, n: Any, k: Any,
                   alpha: Any, a: Any, lda: Any, b: Any, ldb: Any, beta: Any, c: Any, ldc: Any
                   ) -> list[tuple[str, Any]]:
    """The arguments, in order, of the GEMM routine of ``convention`` that computes row-major
    ``C = alpha * op(A) @ op(B) + beta * C``, each as ``(kind, value)``.

    A kind is ``i`` (a 32-bit integer), ``c`` (a character code), ``s`` (a scalar of the
    dtype) or ``m`` (a matrix pointer); the values are the caller's, or constants. The Fortran
    routine is column-major: A and B, and m and n, swap places, so that it computes
    ``C^T = op(B)^T op(A)^T``, the same memory as the row-major product.
    """
    if convention == "cblas":
        trans = [CBLAS_TRANS if t else CBLAS_NO_TRANS for t in (transa, transb)]
        return [("i", CBLAS_ROW_MAJOR), ("i", trans[0]), ("i", trans[1]), ("i", m), ("i", n),
                ("i", k), ("s", alpha), ("m", a), ("i", lda), ("m", b), ("i", ldb), ("s", beta),
                ("m", c), ("i", ldc)]
    if convention == "fortran":
        return [("c", ord("T" if transb else "N")), ("c", ord("T" if transa else "N")),
                ("i", n), ("i", m), ("i", k), ("s", alpha), ("m", b), ("i", ldb), ("m", a),
                ("i", lda), ("s", beta), ("m", c), ("i", ldc)]
    raise ValueError(f"convention must be 'cblas' or 'fortran', got {convention!r}")


def call_gemm_ctypes(blas: Blas, transa: bool, transb: bool, m: int, n: int, k: int,
                     alpha: float, a: np.ndarray, lda: int, b: np.ndarray, ldb: int,
                     beta: float, c: np.ndarray, ldc: int) -> None:
    """Compute row-major ``C = alpha * op(A) @ op(B) + beta * C`` in place through ctypes.

    The arrays must be C-contiguous and share C's dtype; ``lda``/``ldb``/``ldc`` are
    row strides in elements, as in CBLAS row-major. Callers validate shapes.
    """
    scalar = ctypes.c_float if c.dtype == np.float32 else ctypes.c_double
    types = {"i": ctypes.c_int, "c": ctypes.c_char, "s": scalar, "m": ctypes.c_void_p}
    arguments = gemm_arguments(blas.convention, transa, transb, m, n, k, alpha, a.ctypes.data,
                               lda, b.ctypes.data, ldb, beta, c.ctypes.data, ldc)
    values = [types[kind](value) for kind, value in arguments]
    if blas.convention == "fortran":  # every argument but the matrices by address
        values = [v if kind == "m" else ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                  for (kind, _), v in zip(arguments, values, strict=True)]
    function = ctypes.CFUNCTYPE(None, *[type(v) for v in values])(blas.gemm_addr(c.dtype))
    function(*values)
