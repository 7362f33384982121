"""The LLVM backend: compile a program to native code once, then one native call per sequence.

Options (the only place that reads environment variables): ``blas`` (a library name of
:mod:`rnnc.backends.llvm.blas`, default ``$RNNC_BLAS`` or the preferred installed one),
``threads`` (BLAS threads, default ``$RNNC_THREADS`` or the machine's cores) and ``cache_dir``
(default ``$RNNC_CACHE_DIR`` or ``~/.cache/rnnc/llvm``; ``False`` keeps code in memory only).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rnnc.backends.llvm import blas as blas_lib
from rnnc.backends.llvm import cache, codegen
from rnnc.errors import BackendUnavailable, RnncTypeError, RnncValueError
from rnnc.ir import Program
from rnnc.printer import format_program

_ALIGN = 64
# Multiply-adds below which a GEMM runs on one thread, and above which on all, unmeasured.
_ONE_CORE = 1 << 16
_ALL_CORES = 1 << 27
_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_void_p)
_threads_set: dict[str, int] = {}
_threads_lock = threading.Lock()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _resolve(shape: tuple, T: int, B: int) -> tuple[int, ...]:
    return tuple(T if d == "T" else B if d == "B" else d for d in shape)


class Runner:
    """``runner(env, dims) -> results`` for one compiled program; safe from many threads."""

    def __init__(self, compiled: cache.Compiled, libraries: list[blas_lib.Blas], threads: int,
                 dtype: str, compile_seconds: float) -> None:
        self.compiled = compiled
        self.threads = threads
        self.plan = compiled.plan
        self.dtype = np.dtype(codegen.NP_DTYPES[dtype])
        self.libraries = {b.name: b for b in libraries}
        self._tables: dict[tuple[int, int], np.ndarray] = {}
        self._tables_lock = threading.Lock()
        self.function = _SIGNATURE(compiled.address)
        self.compile_seconds = compile_seconds
        self._local = threading.local()
        # BLAS takes 32-bit sizes: the rows of every array (T * B times its fixed leading
        # dims) must stay below 2^31.
        shapes = [s for _, s in self.plan.args + self.plan.results] + list(self.plan.slots)
        self._widest = max([int(np.prod([d for d in s[:-1] if isinstance(d, int)],
                                        dtype=np.int64)) for s in shapes] + [1])

    def gemm_choice(self, T: int, B: int) -> list[str]:
        """What each GEMM site uses at (T, B), as ``library@threads``: the fastest for its
        shape among the installed libraries at one thread or all of them, measured once per
        shape and remembered on disk."""
        names = sorted(
            f"{name}@{t}" for name, lib in self.libraries.items()
            for t in ((1, self.threads) if lib.threads_addr and self.threads > 1 else
                      (self.threads,)))
        choice = []
        for _, _, sizes in self.plan.gemms:
            m, n, k = (int(np.prod(_resolve(d, T, B), dtype=np.int64)) for d in sizes)
            # Only the middle sizes are worth measuring: a tiny product cannot pay for a
            # thread hand-off and a huge one always gains from every core.
            work = m * n * k
            fit = [c for c in names if not c.endswith("@1")] if work >= _ALL_CORES else \
                [c for c in names if c.endswith("@1")] if work <= _ONE_CORE else names
            fit = fit or names
            if len(fit) == 1 or work == 0:
                choice.append(fit[-1])
            else:
                choice.append(blas_lib.choose(m, n, k, self.dtype, fit))
        return choice

    def _gemm_table(self, T: int, B: int) -> np.ndarray:
        with self._tables_lock:
            if (T, B) not in self._tables:
                entries = []
                for name in self.gemm_choice(T, B):
                    library, threads = blas_lib.split_candidate(name)
                    setter = library.threads_addr or 0
                    entries += [library.gemm_addr(self.dtype), setter, threads if setter else 0]
                self._tables[(T, B)] = np.array(entries or [0], dtype=np.uint64)
                while len(self._tables) > 16:
                    self._tables.pop(next(iter(self._tables)))
            return self._tables[(T, B)]

    def _workspace(self, T: int, B: int) -> list[int]:
        """Slot addresses for (T, B), allocated once per shape and per thread."""
        spaces = getattr(self._local, "spaces", None)
        if spaces is None:
            spaces = self._local.spaces = OrderedDict()
        if (T, B) in spaces:
            spaces.move_to_end((T, B))
            return spaces[(T, B)][1]
        sizes = [int(np.prod(_resolve(s, T, B), dtype=np.int64)) * self.dtype.itemsize
                 for s in self.plan.slots]
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += -(-max(size, 1) // _ALIGN) * _ALIGN
        raw = np.empty(total + _ALIGN, np.uint8)
        base = raw.ctypes.data + (-raw.ctypes.data) % _ALIGN
        addresses = [base + off for off in offsets]
        spaces[(T, B)] = (raw, addresses)
        while len(spaces) > 4:  # a few recent shapes; memory stays bounded
            spaces.popitem(last=False)
        return addresses

    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]:
        T, B = dims["T"], dims["B"]
        if not (isinstance(T, int | np.integer) and isinstance(B, int | np.integer)) \
                or T < 0 or B < 0:
            raise RnncValueError(f"dims T and B must be integers >= 0, got T={T!r}, B={B!r}")
        T, B = int(T), int(B)
        if T * B * self._widest >= 2**31:
            raise RnncValueError(f"T={T}, B={B} is too large for 32-bit BLAS sizes")
        pointers: list[int] = []
        for name, shape in self.plan.args:
            arr = env.get(name)
            if not isinstance(arr, np.ndarray):
                raise RnncTypeError(f"{name!r} must be a NumPy array, got {type(arr).__name__}")
            if arr.dtype != self.dtype:
                raise RnncTypeError(f"{name!r} must be {self.dtype}, got {arr.dtype}")
            expected = _resolve(shape, T, B)
            if arr.shape != expected:
                raise RnncValueError(f"{name!r} must have shape {expected}, got {arr.shape}")
            if not (arr.flags.c_contiguous and arr.flags.aligned):
                raise RnncValueError(f"{name!r} must be C-contiguous and aligned")
            pointers.append(arr.ctypes.data)
        results = {}
        for name, shape in self.plan.results:
            if name not in results:
                results[name] = np.empty(_resolve(shape, T, B), self.dtype)
            pointers.append(results[name].ctypes.data)
        pointers.extend(self._workspace(T, B))
        table = np.array(pointers, dtype=np.uint64)
        gemms = self._gemm_table(T, B)
        # ctypes releases the GIL for the whole sequence.
        self.function(table.ctypes.data, T, B, gemms.ctypes.data)
        return results


class LlvmBackend:
    """Native code through llvmlite: one LLVM function per program."""

    name = "llvm"

    def __init__(self, blas: str | None = None, threads: int | None = None,
                 cache_dir: str | os.PathLike | bool | None = None) -> None:
        name = blas if blas is not None else os.environ.get("RNNC_BLAS") or None
        try:
            self.blas = blas_lib.get(name)
        except ValueError as err:
            raise BackendUnavailable(f"backend 'llvm': {err}") from None
        # A named library is used for every GEMM; otherwise each GEMM shape gets the fastest
        # installed library of the same calling convention.
        self.libraries = [self.blas] if name else blas_lib.same_convention(self.blas)
        if threads is None:
            env = os.environ.get("RNNC_THREADS")
            if env is not None and not env.strip().isdigit():
                raise RnncValueError(f"RNNC_THREADS must be a positive integer, got {env!r}")
            threads = int(env) if env else _cores()
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise RnncValueError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads
        if cache_dir is False:
            root = None
        elif cache_dir is None or cache_dir is True:
            root = Path(os.environ.get("RNNC_CACHE_DIR")
                        or Path.home() / ".cache" / "rnnc" / "llvm")
        else:
            root = Path(cache_dir)
        self.cache = cache.code_cache(root)

    def _set_threads(self) -> None:
        # The count is process-wide in every BLAS; set it only when it changes, never while
        # this process might be inside a GEMM for another backend object.
        with _threads_lock:
            for library in self.libraries:
                if _threads_set.get(library.name) != self.threads:
                    blas_lib.set_threads(self.threads, library)
                    _threads_set[library.name] = self.threads

    def build(self, program: Program) -> Runner:
        """A callable ``(env, dims) -> results`` running ``program`` natively."""
        self._set_threads()
        start = time.perf_counter()
        k = cache.key(format_program(program), program.dtype, self.blas.convention)
        compiled = self.cache.get(k, lambda: codegen.lower(program, self.blas))
        return Runner(compiled, self.libraries, self.threads, program.dtype,
                      time.perf_counter() - start)
