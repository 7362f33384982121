"""BLAS GEMM bound by function pointer, so generated LLVM code can call it directly.

Three documented interfaces are probed, each only when its package is installed:

- ``scipy_openblas32`` (the default): ``get_lib_dir()``/``get_library()`` name the
  shared library, whose CBLAS symbols carry a ``scipy_`` prefix
  (``scipy_cblas_sgemm``, ``scipy_cblas_dgemm``, ``scipy_openblas_set_num_threads``).
- SciPy's ``scipy.linalg.cython_blas``: ``__pyx_capi__`` holds one ``PyCapsule`` per
  routine with the Fortran calling convention (every argument by pointer,
  column-major).
- Intel MKL's ``mkl`` wheel: ``libmkl_rt.so`` with ``cblas_sgemm``/``cblas_dgemm`` and
  ``MKL_Set_Num_Threads``; the LP64 (32-bit integer) interface is selected first.

All three use 32-bit integers. Generated code calls a library through
:func:`emit_gemm_call`, which turns the address into a function pointer with
``inttoptr``, so the JIT resolves no symbols. Callers think in row-major
``C = alpha * op(A) @ op(B) + beta * C``; for the Fortran convention the operands are
swapped, which computes the same product as the column-major ``C^T = op(B)^T op(A)^T``.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np
from llvmlite import ir

from rnnc import diskcache

__all__ = [
    "Blas",
    "available",
    "call_gemm_ctypes",
    "choose",
    "emit_gemm_call",
    "gemm_function_type",
    "get",
    "same_convention",
    "set_threads",
    "split_candidate",
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
    try:
        scipy_openblas32 = importlib.import_module("scipy_openblas32")
    except ImportError:
        return None
    path = os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(True))
    library = ctypes.CDLL(path)
    set_num_threads = library.scipy_openblas_set_num_threads
    set_num_threads.argtypes = [ctypes.c_int]
    set_num_threads.restype = None
    return Blas(
        name="openblas",
        sgemm_addr=_address(library.scipy_cblas_sgemm),
        dgemm_addr=_address(library.scipy_cblas_dgemm),
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
        set_num_threads = library.MKL_Set_Num_Threads
        set_num_threads.argtypes = [ctypes.c_int]
        set_num_threads.restype = None
        return Blas(
            name="mkl",
            sgemm_addr=_address(library.cblas_sgemm),
            dgemm_addr=_address(library.cblas_dgemm),
            convention="cblas",
            set_threads=set_num_threads,
            threads_addr=_address(set_num_threads),
            handle=library,
        )
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


def call_gemm_ctypes(
    blas: Blas,
    transa: bool,
    transb: bool,
    m: int,
    n: int,
    k: int,
    alpha: float,
    a: np.ndarray,
    lda: int,
    b: np.ndarray,
    ldb: int,
    beta: float,
    c: np.ndarray,
    ldc: int,
) -> None:
    """Compute row-major ``C = alpha * op(A) @ op(B) + beta * C`` in place through ctypes.

    The arrays must be C-contiguous and share C's dtype; ``lda``/``ldb``/``ldc`` are
    row strides in elements, as in CBLAS row-major. Callers validate shapes.
    """
    dtype = c.dtype
    scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    pointer = ctypes.c_void_p
    addr = blas.gemm_addr(dtype)
    if blas.convention == "cblas":
        function = ctypes.CFUNCTYPE(
            None, *[ctypes.c_int] * 6, scalar, pointer, ctypes.c_int, pointer, ctypes.c_int,
            scalar, pointer, ctypes.c_int,
        )(addr)  # fmt: skip
        function(
            CBLAS_ROW_MAJOR,
            CBLAS_TRANS if transa else CBLAS_NO_TRANS,
            CBLAS_TRANS if transb else CBLAS_NO_TRANS,
            m, n, k, scalar(alpha), a.ctypes.data, lda, b.ctypes.data, ldb,
            scalar(beta), c.ctypes.data, ldc,
        )  # fmt: skip
        return
    function = ctypes.CFUNCTYPE(None, *[pointer] * 13)(addr)

    def ref(value: ctypes._SimpleCData) -> int:
        return ctypes.cast(ctypes.pointer(value), ctypes.c_void_p).value

    ints = [ctypes.c_int(v) for v in (n, m, k, ldb, lda, ldc)]
    chars = [ctypes.c_char(b"T" if t else b"N") for t in (transb, transa)]
    scalars = [scalar(alpha), scalar(beta)]
    # Column-major C^T = op(B)^T op(A)^T: swap A and B, and m and n.
    function(
        ref(chars[0]), ref(chars[1]), ref(ints[0]), ref(ints[1]), ref(ints[2]),
        ref(scalars[0]), b.ctypes.data, ref(ints[3]), a.ctypes.data, ref(ints[4]),
        ref(scalars[1]), c.ctypes.data, ref(ints[5]),
    )  # fmt: skip


_CHOICES: dict[str, str] = {}


# The tuning file holds one short entry per GEMM shape and candidate set.
_MAX_TUNING_BYTES = 1 << 20


def _default_cache_dir() -> Path:
    """The directory of ``blas.json``: rnnc's cache root (``$RNNC_CACHE_DIR`` first)."""
    return diskcache.default_root()


def _time_gemm(blas: Blas, m: int, n: int, k: int, dtype: np.dtype, reps: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = np.zeros((m, n), dtype)
    call_gemm_ctypes(blas, False, False, m, n, k, 1.0, a, k, b, n, 0.0, c, n)  # warm up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call_gemm_ctypes(blas, False, False, m, n, k, 1.0, a, k, b, n, 0.0, c, n)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def split_candidate(name: str) -> tuple[Blas, int | None]:
    """``"openblas@1"`` -> (the library, 1 thread); a plain name keeps its thread count."""
    base, _, threads = name.partition("@")
    if threads and (not threads.isdigit() or int(threads) < 1):
        raise ValueError(f"bad thread count in BLAS candidate {name!r}")
    return get(base), (int(threads) if threads else None)


def choose(
    m: int,
    n: int,
    k: int,
    dtype: np.dtype | type,
    candidates: Iterable[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    reps: int = 5,
) -> str:
    """Return the fastest BLAS among candidates for one GEMM shape, measured once.

    A candidate is a library name, or ``name@threads`` for that library at a thread count.

    The choice is remembered in memory and in ``blas.json`` under ``cache_dir``
    (default: rnnc's cache directory, ``$RNNC_CACHE_DIR`` or ``~/.cache/rnnc``), keyed by
    dtype, shape and candidate set; a stored choice is used only if it is one of the
    candidates. With one candidate nothing is measured.
    """
    dtype = np.dtype(dtype)
    names = sorted(set(candidates) if candidates is not None else available())
    if not names:
        raise ValueError("choose() needs at least one BLAS candidate")
    for name in names:
        split_candidate(name)  # raises for an unknown name, listing the available ones
    if len(names) == 1:
        return names[0]
    key = f"{dtype.name}:{m}x{n}x{k}:{','.join(names)}"
    if key in _CHOICES:
        return _CHOICES[key]
    path = Path(cache_dir if cache_dir is not None else _default_cache_dir()) / "blas.json"
    stored = _read_choices(path)
    if stored.get(key) in names:
        _CHOICES[key] = stored[key]
        return stored[key]
    timings = {}
    for name in names:
        library, threads = split_candidate(name)
        if threads is not None:
            set_threads(threads, library)
        timings[name] = _time_gemm(library, m, n, k, dtype, reps)
    best = min(names, key=timings.__getitem__)
    _CHOICES[key] = best
    stored = _read_choices(path)  # another process may have written meanwhile
    stored[key] = best
    _write_choices(path, stored)
    return best


def _read_choices(path: Path) -> dict[str, str]:
    """The stored choices; a file that is not a JSON object of strings is deleted."""
    data = diskcache.read_file(path, _MAX_TUNING_BYTES)  # a regular file of ours, or None
    if data is None:
        return {}
    try:
        choices = json.loads(data)
    except (ValueError, RecursionError):
        choices = None
    if not isinstance(choices, dict):
        diskcache.discard(path)
        return {}
    return {k: v for k, v in choices.items() if isinstance(v, str)}


def _write_choices(path: Path, choices: dict[str, str]) -> None:
    # Through rnnc.diskcache: a private directory, an atomic rename, nothing left behind on
    # failure. An unusable directory only costs measuring again.
    if diskcache.private_directory(path.parent) is not None:
        data = json.dumps(choices, indent=1, sort_keys=True).encode()
        if len(data) <= _MAX_TUNING_BYTES:
            diskcache.write_file(path, data)


def gemm_function_type(convention: Convention, dtype: np.dtype | type) -> ir.FunctionType:
    """Return the LLVM type of a GEMM routine in the given convention and dtype."""
    dtype = np.dtype(dtype)
    scalar = ir.FloatType() if dtype == np.float32 else ir.DoubleType()
    i32 = ir.IntType(32)
    ptr = ir.PointerType(scalar)
    if convention == "cblas":
        arguments = [i32] * 6 + [scalar, ptr, i32, ptr, i32, scalar, ptr, i32]
    elif convention == "fortran":
        arguments = [ir.PointerType(ir.IntType(8))] * 13
    else:
        raise ValueError(f"convention must be 'cblas' or 'fortran', got {convention!r}")
    return ir.FunctionType(ir.VoidType(), arguments)


def _as_i32(value: ir.Value | int) -> ir.Value:
    return ir.Constant(ir.IntType(32), value) if isinstance(value, int) else value


def emit_gemm_call(
    builder: ir.IRBuilder,
    blas_addr: int,
    convention: Convention,
    dtype: np.dtype | type,
    transa: bool,
    transb: bool,
    m: ir.Value | int,
    n: ir.Value | int,
    k: ir.Value | int,
    alpha: ir.Value | float,
    a_ptr: ir.Value,
    lda: ir.Value | int,
    b_ptr: ir.Value,
    ldb: ir.Value | int,
    beta: ir.Value | float,
    c_ptr: ir.Value,
    ldc: ir.Value | int,
) -> ir.Instruction:
    """Emit a call computing row-major ``C = alpha * op(A) @ op(B) + beta * C``.

    Integers are i32 values or Python ints, alpha and beta are scalars of the dtype
    or Python floats, and the matrix pointers are any pointer values. The BLAS is
    reached through ``inttoptr`` of ``blas_addr``, so no symbol has to be resolved.
    """
    function_type = gemm_function_type(convention, dtype)
    scalar = ir.FloatType() if np.dtype(dtype) == np.float32 else ir.DoubleType()
    i64 = ir.IntType(64)
    function = builder.inttoptr(ir.Constant(i64, blas_addr), function_type.as_pointer())
    alpha = ir.Constant(scalar, alpha) if isinstance(alpha, float | int) else alpha
    beta = ir.Constant(scalar, beta) if isinstance(beta, float | int) else beta
    matrix = ir.PointerType(scalar)
    a_ptr, b_ptr, c_ptr = (builder.bitcast(p, matrix) for p in (a_ptr, b_ptr, c_ptr))
    if convention == "cblas":
        i32 = ir.IntType(32)
        arguments = [
            ir.Constant(i32, CBLAS_ROW_MAJOR),
            ir.Constant(i32, CBLAS_TRANS if transa else CBLAS_NO_TRANS),
            ir.Constant(i32, CBLAS_TRANS if transb else CBLAS_NO_TRANS),
            _as_i32(m), _as_i32(n), _as_i32(k), alpha, a_ptr, _as_i32(lda),
            b_ptr, _as_i32(ldb), beta, c_ptr, _as_i32(ldc),
        ]  # fmt: skip
        return builder.call(function, arguments)
    # Fortran takes every argument by address; m/n and A/B swap places so that the
    # column-major routine computes the row-major product.
    entry = builder.function.entry_basic_block
    byte_pointer = ir.PointerType(ir.IntType(8))

    def by_address(value: ir.Value) -> ir.Value:
        # The slots live in the entry block, which runs once, so a call inside the
        # time loop does not grow the stack on every step. A separate builder keeps
        # the caller's insertion point valid.
        if builder.block is entry:
            slot = builder.alloca(value.type)
        else:
            entry_builder = ir.IRBuilder(entry)
            entry_builder.position_at_start(entry)
            slot = entry_builder.alloca(value.type)
        builder.store(value, slot)
        return builder.bitcast(slot, byte_pointer)

    char = ir.IntType(8)
    arguments = [
        by_address(ir.Constant(char, ord("T" if transb else "N"))),
        by_address(ir.Constant(char, ord("T" if transa else "N"))),
        by_address(_as_i32(n)),
        by_address(_as_i32(m)),
        by_address(_as_i32(k)),
        by_address(alpha),
        builder.bitcast(b_ptr, byte_pointer),
        by_address(_as_i32(ldb)),
        builder.bitcast(a_ptr, byte_pointer),
        by_address(_as_i32(lda)),
        by_address(beta),
        builder.bitcast(c_ptr, byte_pointer),
        by_address(_as_i32(ldc)),
    ]
    return builder.call(function, arguments)
