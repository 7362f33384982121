"""The precision of the CUDA backend's float32 GEMMs: full float32, or TensorFloat-32.

``rnnc.compile(cell, backend="cuda", precision="tf32")`` lets cuBLAS run float32 GEMMs on
tensor cores in TF32: each operand keeps 10 of float32's 23 mantissa bits (the exponent range
is unchanged) and products are summed in float32. It is off by default (``"highest"``), as in
PyTorch (``torch.backends.cuda.matmul.allow_tf32``) and JAX (``precision="highest"``), and it
does not touch float64 programs or the generated kernels (the elementwise math stays float32).

On a GPU the runner sets CuPy's compute type for float32 GEMMs to TF32 while it records or
runs its own calls and restores it afterwards (``cupy._core._routines_linalg``), so other CuPy
code in the process is unaffected. In emulation the same GEMMs round both operands to the
nearest TF32 value (ties to even) before a float32 product (:func:`round_tf32`), a model of
the conversion the tensor cores apply to their inputs; the README gives the error this costs
an LSTM.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from rnnc import precision as precision_option

PRECISIONS = ("highest", "tf32")  # the CUDA names; rnnc.precision adds "fp32" and "bf16"
_DROPPED = 13  # float32 mantissa bits that TF32 does not keep (23 - 10)


def check(precision: Any) -> str:
    """``precision`` by its canonical name (:func:`rnnc.precision.check`): "fp32" (also
    "highest"), "tf32" or "bf16", else an RnncValueError."""
    return precision_option.check(precision, "cuda")


def round_tf32(a: np.ndarray) -> np.ndarray:
    """``a`` (float32) rounded to the nearest TF32 value, ties to even; inf and NaN kept."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    odd = (bits >> _DROPPED) & 1
    rounded = ((bits + np.uint32((1 << (_DROPPED - 1)) - 1) + odd)
               & np.uint32(~((1 << _DROPPED) - 1) & 0xFFFFFFFF)).view(np.float32)
    return np.where(np.isfinite(a), rounded, a).astype(np.float32, copy=False)


class Tf32Numpy:
    """NumPy as the emulated array module, with float32 ``matmul`` in TF32."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if a.dtype == np.float32 and b.dtype == np.float32:
            a, b = round_tf32(a), round_tf32(b)
        return np.matmul(a, b, out=out)


@contextmanager
def tf32_gemms(cupy: Any, on: bool) -> Iterator[None]:
    """CuPy's float32 GEMMs in TF32 inside the block (when ``on``), as they were after it."""
    if not on:
        yield
        return
    from cupy._core import _routines_linalg as linalg

    before = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
    try:
        yield
    finally:
        linalg.set_compute_type(np.float32, before)
