"""bfloat16 GEMMs of the CUDA backend (``matmul[precision=bf16]``, :mod:`rnnc.precision`).

On a GPU each operand is rounded to bfloat16 by :data:`ROUND_SOURCE` (round to nearest, ties
to even, NaN kept), stored as 16-bit values, and cuBLAS multiplies them with
``cublasGemmEx(CUDA_R_16BF, CUDA_R_16BF -> CUDA_R_32F, CUBLAS_COMPUTE_32F)``: tensor-core
products summed in float32 on sm_80 and later. In emulation the same operands are rounded by
:func:`rnnc.precision.round_bf16` and multiplied in float32 by NumPy, which is exact: the
product of two bfloat16 values is a float32 value, so only the order of the float32 sums
differs between the two. Everything around the GEMMs (the kernels, the states, the tape)
stays float32.

A GEMM of the time loop rounds only the operands that change from step to step: the plan
rounds each loop-constant operand (the recurrent weight) once per call, before the loop, and
the GEMM reads those bits (:mod:`.bf16_gemm`). The fused-step and persistent kernels
(:mod:`.fused_step`, :mod:`.persistent`) run bfloat16 products too: before the time loop the
plan converts the recurrent weight once into 16-bit bfloat16 bits (half the bytes of
float32), and the kernel reads those
bits, rounds each element of the carried state it loads with :data:`DEVICE_HELPERS` (the same
rounding as :data:`ROUND_SOURCE`), multiplies in float32 (exact: a product of two bfloat16
values is a float32 value) and sums in float32. ``__float_as_uint``/``__uint_as_float`` are the
only intrinsics the helpers use; ``shim.h`` defines them for emulation.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from rnnc.precision import round_bf16

ROUND_KERNEL = "rnnc_round_bf16"
# float32 -> bfloat16 bits, ties to even, NaN kept quiet: the rounding of rnnc.precision.
ROUND_SOURCE = r"""
extern "C" __global__ void rnnc_round_bf16(const float* x, unsigned short* y, long long n) {
    const unsigned int* x_bits = reinterpret_cast<const unsigned int*>(x);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned int bits = x_bits[i];
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
            y[i] = (unsigned short)((bits >> 16) | 0x40u);
        } else {
            y[i] = (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
        }
    }
}
"""
# The kernels' bfloat16 helpers, in the source before the kernels that read bfloat16 weights:
# the bits of a float32 (the rounding above), the float32 of bits, and the two together.
DEVICE_HELPERS = r"""
__device__ __forceinline__ unsigned short rnnc_bf16_bits(float x) {
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float rnnc_bf16_float(unsigned short bits) {
    return __uint_as_float((unsigned int)bits << 16);
}
__device__ __forceinline__ float rnnc_round_bf16(float x) {
    return rnnc_bf16_float(rnnc_bf16_bits(x));
}
"""
_CUDA_R_32F, _CUDA_R_16BF = 0, 14  # cudaDataType_t
_CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT = 68, -1


def widened(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 ``bits`` (uint16; exact), laid out as ``bits``."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def emulated_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None
                    ) -> np.ndarray:
    """``a @ b`` with both operands rounded to bfloat16 and float32 sums, on the CPU; an
    operand given as bfloat16 bits (uint16) is read as it is."""
    a, b = (widened(x) if x.dtype == np.uint16 else round_bf16(x) for x in (a, b))
    return np.matmul(a, b, out=out)


def emulated_bits(x: np.ndarray, out: np.ndarray) -> None:
    """``out`` (uint16) = the bfloat16 bits of ``x`` (float32), as :data:`ROUND_SOURCE` makes
    them on a GPU (ties to even, NaN kept quiet)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
        >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x40)
    out[...] = np.where(nan, quiet, rounded).astype(np.uint16)


@functools.cache
def to_bits_for(xp: Any) -> Any:
    """``convert(x, out)`` of the array module ``xp``: ``out`` (uint16, x's shape) the
    bfloat16 bits of ``x`` (float32): the rounding kernel for CuPy, NumPy in emulation."""
    if getattr(xp, "__name__", "") != "cupy":
        return emulated_bits
    return matmul_for(xp).into


@functools.cache
def matmul_for(xp: Any) -> Any:
    """The bfloat16 ``matmul(a, b, out=)`` of the array module ``xp``: cuBLAS for CuPy, the
    emulation for NumPy."""
    if getattr(xp, "__name__", "") != "cupy":
        return emulated_matmul
    return CublasBf16(xp)


class CublasBf16:
    """``matmul(a, b, out=)`` on CuPy float32 arrays through ``cublasGemmEx`` in bfloat16."""

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self.round = cupy.RawModule(code=ROUND_SOURCE).get_function(ROUND_KERNEL)
        self.one, self.zero = np.ones((), np.float32), np.zeros((), np.float32)

    def to_bf16(self, x: Any) -> Any:
        """``x`` (a float32 view, any strides) as C-ordered bfloat16 bits (uint16); bits
        already (a loop constant converted before the loop) as they are, C-ordered."""
        if x.dtype == np.uint16:
            return self.cupy.ascontiguousarray(x)
        x = self.cupy.ascontiguousarray(x, dtype=np.float32)
        y = self.cupy.empty(x.shape, np.uint16)
        n = x.size
        if n:
            self.round((min((n + 255) // 256, 4096),), (256,), (x, y, np.int64(n)))
        return y

    def into(self, x: Any, out: Any) -> None:
        """``out`` (C-ordered uint16) = the bfloat16 bits of ``x`` (float32): for a C-ordered
        ``x`` (a plan's weights are) one launch, nothing allocated, so a CUDA graph can
        capture it."""
        if not x.flags.c_contiguous:
            out[...] = self.to_bf16(x)
            return
        n = x.size
        if n:
            self.round((min((n + 255) // 256, 4096),), (256,), (x, out, np.int64(n)))

    def __call__(self, a: Any, b: Any, out: Any = None) -> Any:
        cupy = self.cupy
        from cupy.cuda import cublas, device

        m, k = a.shape
        n = b.shape[1]
        target = out if out is not None and out.flags.c_contiguous else \
            cupy.empty((m, n), np.float32)
        a16, b16 = self.to_bf16(a), self.to_bf16(b)
        handle = device.get_cublas_handle()
        cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
        # Row-major C = A B is column-major C^T = B^T A^T: B's bits first, then A's.
        cublas.gemmEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k,
                      self.one.ctypes.data, b16.data.ptr, _CUDA_R_16BF, n,
                      a16.data.ptr, _CUDA_R_16BF, k, self.zero.ctypes.data,
                      target.data.ptr, _CUDA_R_32F, n, _CUBLAS_COMPUTE_32F,
                      _CUBLAS_GEMM_DEFAULT)
        if out is not None and target is not out:
            out[...] = target
        return out if out is not None else target
