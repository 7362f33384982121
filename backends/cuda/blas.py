"""cuBLAS GEMMs that a CUDA graph can capture: the library called through ctypes.

CuPy refuses every cuBLAS call while a stream captures (its binding's ``setStream`` raises
``NotImplementedError: calling cuBLAS API during stream capture is currently unsupported``), so
a plan whose GEMMs went through ``cupy.matmul`` could never become a CUDA graph. cuBLAS itself
supports capture once its handle has a workspace of its own (the cuBLAS guide, "CUDA Graphs
Support"), so on a GPU each :class:`~.host.Host` makes its GEMMs through :class:`Cublas`: its own
handle, bound to the stream of the call and given a workspace before any capture, and
``cublasGemmEx`` on the operands where they lie, with nothing allocated per call.

A GEMM of row-major 2-D views ``out (m, n) = a (m, k) @ b (k, n)`` is the column-major
``out^T = b^T a^T``. A row-major view whose rows are contiguous is, read column-major, its own
transpose (operation N, leading dimension its row stride); a transposed view of one (columns
contiguous) is the matrix itself (operation T, leading dimension its column stride).
:func:`operand` makes that choice; tests/backends/test_cuda_blas.py checks it against NumPy by
reading the operands as column-major memory, as cuBLAS does.

A batched product (an einsum such as ``"...hd,hde->...he"``, :mod:`.batched`) is one
``cublasGemmStridedBatchedEx``: 3-D views ``out (H, m, n) = a (H, m, k) @ b (H, k, n)`` whose
matrices are each laid out as above, one matrix ``stride`` apart along the first axis.
:func:`strided_batched_arguments` maps them, checked the same way.

A bfloat16 GEMM (:mod:`.bf16_gemm`) calls :meth:`Cublas.gemm` on bfloat16 bits (``CUDA_R_16BF``)
with float32 sums: each loop-constant operand rounded once per call before the loop, each other
operand rounded at each call into bits the call site owns. Where the library cannot be loaded,
the GEMMs go through CuPy as before and the plans run call by call (``launch_report()`` says
why).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import numpy as np

CUDA_R_32F, CUDA_R_64F, CUDA_R_16BF = 0, 1, 14  # cudaDataType_t
COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77  # cublasComputeType_t
OP_N, OP_T = 0, 1
GEMM_DEFAULT = -1
# The handle's workspace: what the cuBLAS guide asks for on Hopper (32 MiB), enough elsewhere.
WORKSPACE_BYTES = 32 << 20


def operand(x: Any) -> tuple[int, int] | None:
    """(operation, leading dimension) that makes cuBLAS read the row-major 2-D view ``x`` as
    ``x^T`` in column-major terms; None where neither its rows nor its columns are
    contiguous (it would need a copy)."""
    rows, cols = x.shape
    s0, s1 = (s // x.itemsize for s in x.strides)
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= cols):
        return OP_N, max(s0 if rows > 1 else cols, 1)
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= rows):
        return OP_T, max(s1 if cols > 1 else rows, 1)
    return None


def gemm_arguments(a: Any, b: Any, out: Any) -> tuple | None:
    """``(op_b, op_a, n, m, k, ld_b, ld_a, ld_out)`` of ``out = a @ b`` as cublasGemmEx's
    column-major ``out^T = b^T a^T``; None where an operand needs a copy or ``out`` is not
    row-major with contiguous rows."""
    (m, k), n = a.shape, b.shape[1]
    oa, ob, oc = operand(a), operand(b), operand(out)
    if oa is None or ob is None or oc is None or oc[0] != OP_N:
        return None
    return ob[0], oa[0], n, m, k, ob[1], oa[1], oc[1]


class _Matrix:
    """The shape and strides of one matrix of a 3-D view (what :func:`operand` reads), also
    for a view with no matrix (a batch of 0)."""

    def __init__(self, x: Any) -> None:
        self.shape, self.strides, self.itemsize = x.shape[1:], x.strides[1:], x.itemsize


def strided_batched_arguments(a: Any, b: Any, out: Any) -> tuple | None:
    """``(op_b, op_a, n, m, k, ld_b, stride_b, ld_a, stride_a, ld_out, stride_out, batch)`` of
    the batched ``out[i] = a[i] @ b[i]`` (3-D views) as cublasGemmStridedBatchedEx's
    column-major ``out[i]^T = b[i]^T a[i]^T``, strides in elements; None where a matrix needs
    a copy or ``out``'s are not row-major with contiguous rows."""
    arguments = gemm_arguments(_Matrix(a), _Matrix(b), _Matrix(out))
    if arguments is None:
        return None
    op_b, op_a, n, m, k, ld_b, ld_a, ld_out = arguments
    stride_a, stride_b, stride_out = (x.strides[0] // x.itemsize for x in (a, b, out))
    return (op_b, op_a, n, m, k, ld_b, stride_b, ld_a, stride_a, ld_out, stride_out,
            out.shape[0])


def _loaded_path(name: str) -> str | None:
    """The file of the shared library ``name`` this process has mapped, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if path.rsplit("/", 1)[-1].startswith(name + ".so"):
                    return path
    except OSError:
        pass
    return None


@functools.cache
def library() -> Any:
    """libcublas: the one CuPy loaded (after its first cuBLAS call), else the loader's; None
    where there is none."""
    candidates = [_loaded_path("libcublas"), ctypes.util.find_library("cublas"),
                  "libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for path in candidates:
        if not path:
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if all(hasattr(lib, f) for f in ("cublasGemmEx", "cublasGemmStridedBatchedEx",
                                         "cublasSetWorkspace_v2")):
            return lib
    return None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLAS {what} failed with status {status}")


class Cublas:
    """A cuBLAS handle of rnnc's own, with its own workspace, for GEMMs that graphs capture;
    made outside any capture (``Cublas.make`` returns None where cuBLAS cannot be loaded)."""

    def __init__(self, cupy: Any, lib: Any) -> None:
        self.cupy, self.lib = cupy, lib
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = cupy.empty(WORKSPACE_BYTES, np.uint8)
        self.stream: int | None = None  # the stream the handle is bound to
        self.scalars = {np.float32: (np.ones((), np.float32), np.zeros((), np.float32)),
                        np.float64: (np.ones((), np.float64), np.zeros((), np.float64))}

    @classmethod
    def make(cls, cupy: Any) -> Cublas | None:
        cupy.cuda.device.get_cublas_handle()  # CuPy loads libcublas (found in the maps)
        lib = library()
        return None if lib is None else cls(cupy, lib)

    def bind(self) -> None:
        """Bind the handle to the current stream, with its workspace again (setting a stream
        resets the workspace to cuBLAS's own pool); a call on the same stream does nothing."""
        stream = self.cupy.cuda.get_current_stream().ptr
        if stream == self.stream:
            return
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)),
               "cublasSetStream")
        _check(self.lib.cublasSetWorkspace_v2(self.handle,
                                              ctypes.c_void_p(self.workspace.data.ptr),
                                              ctypes.c_size_t(WORKSPACE_BYTES)),
               "cublasSetWorkspace")
        self.stream = stream

    def _start(self, results: int, k: int, out: Any) -> bool:
        """Whether a product of ``results`` elements summing ``k`` terms needs cuBLAS (bound
        to the current stream now); none for no result, zeros for no terms."""
        if results == 0:
            return False
        if k == 0:
            out.fill(0)
            return False
        self.bind()
        return True

    def _types(self, data: int, compute: int) -> tuple[int, Any, Any]:
        """The result's cudaDataType and the host scalars 1 and 0 of the compute type."""
        result = CUDA_R_64F if data == CUDA_R_64F else CUDA_R_32F
        return (result, *self.scalars[np.float64 if compute == COMPUTE_64F else np.float32])

    def gemm(self, a: Any, b: Any, out: Any, arguments: tuple, data: int, compute: int
             ) -> None:
        """``out = a @ b`` with :func:`gemm_arguments`' ``arguments``; ``data`` the operands'
        cudaDataType (the result's is float32 for bfloat16 operands)."""
        op_b, op_a, n, m, k, ld_b, ld_a, ld_out = arguments
        if not self._start(m * n, k, out):
            return
        result, one, zero = self._types(data, compute)
        _check(self.lib.cublasGemmEx(
            self.handle, op_b, op_a, n, m, k, ctypes.c_void_p(one.ctypes.data),
            ctypes.c_void_p(b.data.ptr), data, ld_b, ctypes.c_void_p(a.data.ptr), data, ld_a,
            ctypes.c_void_p(zero.ctypes.data), ctypes.c_void_p(out.data.ptr), result, ld_out,
            compute, GEMM_DEFAULT), "cublasGemmEx")

    def gemm_batched(self, a: Any, b: Any, out: Any, arguments: tuple, data: int,
                     compute: int) -> None:
        """``out[i] = a[i] @ b[i]`` for every ``i`` in one call, with
        :func:`strided_batched_arguments`' ``arguments``; ``data`` as for :meth:`gemm`."""
        op_b, op_a, n, m, k, ld_b, stride_b, ld_a, stride_a, ld_out, stride_out, batch = \
            arguments
        if not self._start(m * n * batch, k, out):
            return
        result, one, zero = self._types(data, compute)
        strides = [ctypes.c_longlong(s) for s in (stride_b, stride_a, stride_out)]
        _check(self.lib.cublasGemmStridedBatchedEx(
            self.handle, op_b, op_a, n, m, k, ctypes.c_void_p(one.ctypes.data),
            ctypes.c_void_p(b.data.ptr), data, ld_b, strides[0],
            ctypes.c_void_p(a.data.ptr), data, ld_a, strides[1],
            ctypes.c_void_p(zero.ctypes.data), ctypes.c_void_p(out.data.ptr), result, ld_out,
            strides[2], batch, compute, GEMM_DEFAULT), "cublasGemmStridedBatchedEx")

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            try:
                self.lib.cublasDestroy_v2(handle)
            except Exception:  # the context may be gone at interpreter exit
                pass


def data_types(dtype: Any, precision: str | None) -> tuple[int, int]:
    """(cudaDataType of the operands, cublasComputeType) of a GEMM of ``dtype`` at
    ``precision`` (None: the dtype's own; "tf32"; "bf16": bfloat16 operands, float32 sums)."""
    if np.dtype(dtype) == np.float64:
        return CUDA_R_64F, COMPUTE_64F
    return (CUDA_R_16BF if precision == "bf16" else CUDA_R_32F,
            COMPUTE_32F_FAST_TF32 if precision == "tf32" else COMPUTE_32F)


class DeviceGemm:
    """One call site's ``matmul(a, b, out=)`` through :class:`Cublas`, in the program's dtype
    (``tf32``: float32 in TF32); falls back to ``fallback`` (CuPy) where an operand's layout
    needs a copy. bfloat16 GEMMs are :class:`~.bf16_gemm.Bf16Gemm`."""

    arguments = staticmethod(gemm_arguments)  # the cuBLAS arguments of (a, b, out), or None

    def __init__(self, blas: Cublas, dtype: Any, precision: str | None, fallback: Any) -> None:
        self.blas, self.fallback = blas, fallback
        self.data, self.compute = data_types(dtype, precision)

    def __call__(self, a: Any, b: Any, out: Any) -> Any:
        arguments = self.arguments(a, b, out)
        if arguments is None:
            return self.fallback(a, b, out=out)
        self.multiply(a, b, out, arguments)
        return out

    def multiply(self, a: Any, b: Any, out: Any, arguments: tuple) -> None:
        self.blas.gemm(a, b, out, arguments, self.data, self.compute)


class DeviceBatchedGemm(DeviceGemm):
    """One call site's batched ``matmul(a, b, out=)`` on 3-D views through :class:`Cublas`:
    one cublasGemmStridedBatchedEx for every matrix of the batch, in the program's dtype
    (``tf32``: float32 in TF32); ``fallback`` (CuPy) where a matrix's layout needs a copy."""

    arguments = staticmethod(strided_batched_arguments)

    def multiply(self, a: Any, b: Any, out: Any, arguments: tuple) -> None:
        self.blas.gemm_batched(a, b, out, arguments, self.data, self.compute)
