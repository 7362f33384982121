"""The bfloat16 GEMM kernels compiled on their own, callable on NumPy arrays: for the kernel
tests and ``benchmarks/gemm_shapes.py --dtype bf16``.

:class:`Bf16Gemm` compiles one tier's kernels for a K x N weight shape and keeps the packed
weights with their marker, as a call site of a program does within one run:
``gemm(a, w)`` converts ``a``, packs ``w`` unless it is the matrix packed last, and
multiplies. :meth:`Bf16Gemm.new_run` forgets the packed matrix (a program's next run).
:class:`Bf16WeightGradient` compiles the weight gradient's kernels (``a^T @ g``, the depth
the call's) for an M x N result.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from rnnc.backends.llvm import bf16, bf16_wgrad, cache
from rnnc.errors import RnncError, RnncValueError

_FPTR = ir.FloatType().as_pointer()


class Bf16Gemm:
    """``out = bf16(a) @ bf16(w)`` with float32 accumulation on the kernels of ``tier``, for
    ``w`` of shape ``(k, n)``; ``transposed``: ``out = bf16(a) @ bf16(w)^T`` for ``w`` of
    shape ``(n, k)`` (the packing of a gradient product ``g @ W^T``)."""

    def __init__(self, tier: bf16.Tier, k: int, n: int, load: bool = True,
                 transposed: bool = False) -> None:
        if tier not in bf16.TIERS:
            raise RnncValueError(f"bf16 tier must be one of {bf16.TIERS}, got {tier!r}")
        self.tier, self.k, self.n = tier, k, n
        self.w_shape = (n, k) if transposed else (k, n)
        module = ir.Module("rnnc_bf16")
        module.triple = llvm.get_process_triple()
        kernels = [bf16.convert_function(module, k), bf16.pack_function(module, k, n, transposed),
                   bf16.gemm_function(module, tier, k, n)]
        for kernel in kernels:  # exported: each is called from Python
            kernel.linkage = "external"
        self.names = [kernel.name for kernel in kernels]
        self.text = bf16.with_target_features(str(module))
        if not load:  # for assembly() only: a tier this host cannot run
            return
        if tier == "amx" and not bf16.request_amx():
            raise RnncError("the AMX kernels need AMX tiles, which this process does not have "
                            "(no AMX on this CPU, or the kernel refused the tile state)")
        self.engine = llvm.create_mcjit_compiler(cache.optimize(self.text),
                                                 cache._new_target_machine())
        self.engine.finalize_object()
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        types = [ctypes.CFUNCTYPE(None, i64, p, p), ctypes.CFUNCTYPE(None, p, p, p, i64, i64),
                 ctypes.CFUNCTYPE(None, i64, p, p, p, i64, i64)]
        self.convert, self.pack, self.kernel = (
            t(self.engine.get_function_address(name)) for t, name in zip(types, self.names,
                                                                         strict=True))
        self.panels = bf16.panel_count(n)
        self.packed = np.zeros(2 * bf16.packed_words(k, n), np.uint16)
        self.marker = ctypes.c_void_p(0)
        self.abuf = np.zeros(0, np.uint16)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    def new_run(self) -> None:
        """Forget which matrix is packed: the next call packs again."""
        self.marker.value = 0

    def prepare(self, a: np.ndarray, w: np.ndarray) -> None:
        """Convert ``a`` into the bf16 rows and pack ``w`` (unless packed last)."""
        if a.dtype != np.float32 or w.dtype != np.float32 or a.ndim != 2 \
                or a.shape[1] != self.k or w.shape != self.w_shape \
                or not (a.flags.c_contiguous and w.flags.c_contiguous):
            raise RnncValueError(f"Bf16Gemm takes C-contiguous float32 a (M, {self.k}) and w "
                                 f"{self.w_shape}, got a {a.dtype} {a.shape} and w "
                                 f"{w.dtype} {w.shape}")
        size = a.shape[0] * bf16.padded_k(self.k)
        if self.abuf.size < size:
            self.abuf = np.zeros(size, np.uint16)
        self.convert(a.shape[0], a.ctypes.data, self.abuf.ctypes.data)
        self.pack(w.ctypes.data, self.packed.ctypes.data, ctypes.addressof(self.marker), 0,
                  self.panels)

    def multiply(self, rows: int, out: np.ndarray, threads: int = 1) -> None:
        """``out = abuf[:rows] @ packed``, the panels split between ``threads`` threads."""
        if threads == 1:
            self.kernel(rows, self.abuf.ctypes.data, self.packed.ctypes.data, out.ctypes.data, 0,
                        self.panels)
            return
        if self._pool is None or self._pool_size != threads - 1:
            self._pool, self._pool_size = ThreadPoolExecutor(threads - 1), threads - 1
        shares = [(self.panels * t // threads, self.panels * (t + 1) // threads)
                  for t in range(threads)]
        args = (rows, self.abuf.ctypes.data, self.packed.ctypes.data, out.ctypes.data)
        # The calling thread takes the first share; ctypes releases the GIL for every call.
        others = [self._pool.submit(self.kernel, *args, *share) for share in shares[1:]]
        self.kernel(*args, *shares[0])
        for other in others:
            other.result()

    def __call__(self, a: np.ndarray, w: np.ndarray, threads: int = 1) -> np.ndarray:
        self.prepare(a, w)
        out = np.empty((a.shape[0], self.n), np.float32)
        self.multiply(a.shape[0], out, threads)
        return out

    def assembly(self, cpu: str, features: str) -> str:
        """The kernels' assembly for another CPU (an AMX one, say), never run here."""
        target = llvm.Target.from_triple(llvm.get_process_triple())
        machine = target.create_target_machine(cpu=cpu, features=features, opt=3)
        return machine.emit_assembly(llvm.parse_assembly(self.text))


def _compile(tier: bf16.Tier, module: ir.Module, kernels: list[ir.Function]) -> Any:
    """The module's execution engine, its ``kernels`` exported (each is called from Python)."""
    for kernel in kernels:
        kernel.linkage = "external"
    if tier == "amx" and not bf16.request_amx():
        raise RnncError("the AMX kernels need AMX tiles, which this process does not have "
                        "(no AMX on this CPU, or the kernel refused the tile state)")
    engine = llvm.create_mcjit_compiler(cache.optimize(bf16.with_target_features(str(module))),
                                        cache._new_target_machine())
    engine.finalize_object()
    return engine


class Bf16WeightGradient:
    """``out = bf16(a)^T @ bf16(g)`` with float32 accumulation on the kernels of ``tier``, for
    ``a`` (K, m) and ``g`` (K, n), K any: the weight gradient's convert, pack and GEMM."""

    def __init__(self, tier: bf16.Tier, m: int, n: int, load: bool = True) -> None:
        if tier not in bf16.TIERS:
            raise RnncValueError(f"bf16 tier must be one of {bf16.TIERS}, got {tier!r}")
        self.tier, self.m, self.n = tier, m, n
        module = ir.Module("rnnc_bf16_wgrad")
        module.triple = llvm.get_process_triple()
        kernels = [bf16_wgrad.transpose_convert_function(module, m),
                   bf16_wgrad.pack_rows_function(module, n),
                   bf16.gemm_function(module, tier, None, n)]
        self.text = bf16.with_target_features(str(module))
        if not load:  # for assembly() only: a tier this host cannot run
            return
        self.engine = _compile(tier, module, kernels)
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        types = [ctypes.CFUNCTYPE(None, i64, p, p, i64, i64)] * 2 + [
            ctypes.CFUNCTYPE(None, i64, p, p, p, i64, i64, i64)]
        self.convert, self.pack, self.kernel = (
            t(self.engine.get_function_address(kernel.name))
            for t, kernel in zip(types, kernels, strict=True))

    def __call__(self, a: np.ndarray, g: np.ndarray, parts: int = 1) -> np.ndarray:
        """The product, its rows converted and its panels packed and multiplied in ``parts``
        shares one after another (the split of a thread team)."""
        if a.dtype != np.float32 or g.dtype != np.float32 or a.ndim != 2 or g.ndim != 2 \
                or a.shape[1] != self.m or g.shape[1] != self.n or a.shape[0] != g.shape[0] \
                or not (a.flags.c_contiguous and g.flags.c_contiguous):
            raise RnncValueError(f"Bf16WeightGradient takes C-contiguous float32 a (K, {self.m})"
                                 f" and g (K, {self.n}), got a {a.dtype} {a.shape} and g "
                                 f"{g.dtype} {g.shape}")
        k, panels = a.shape[0], bf16.panel_count(self.n)
        kp = bf16.padded_k(max(k, 1))
        # Filled with a pattern: every value the kernels read must be one they wrote.
        abuf = np.full(self.m * kp, 0x7FC0, np.uint16)
        packed = np.full(panels * bf16.PANEL * kp, 0x7FC0, np.uint16)
        out = np.empty((self.m, self.n), np.float32)
        buffers = (abuf.ctypes.data, packed.ctypes.data)
        for part in range(parts):
            self.convert(k, a.ctypes.data, buffers[0], self.m * part // parts,
                         self.m * (part + 1) // parts)
        for part in range(parts):
            first, stop = panels * part // parts, panels * (part + 1) // parts
            self.pack(k, g.ctypes.data, buffers[1], first, stop)
            self.kernel(self.m, *buffers, out.ctypes.data, first, stop, k)
        return out

    def assembly(self, cpu: str, features: str) -> str:
        """The kernels' assembly for another CPU (an AMX one, say), never run here."""
        target = llvm.Target.from_triple(llvm.get_process_triple())
        machine = target.create_target_machine(cpu=cpu, features=features, opt=3)
        return machine.emit_assembly(llvm.parse_assembly(self.text))
