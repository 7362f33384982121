"""The bfloat16 GEMM kernels compiled on their own, callable on NumPy arrays: for the kernel
tests and ``benchmarks/gemm_shapes.py --dtype bf16``.

:class:`Bf16Gemm` compiles one tier's kernels for a K x N weight shape and keeps the packed
weights with their marker, as a call site of a program does within one run:
``gemm(a, w)`` converts ``a``, packs ``w`` unless it is the matrix packed last, and
multiplies. :meth:`Bf16Gemm.new_run` forgets the packed matrix (a program's next run).
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from rnnc.backends.llvm import bf16, cache
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
