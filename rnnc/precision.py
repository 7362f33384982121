"""The precision of a program's GEMMs: the compile option ``precision`` and its rounding model.

``rnnc.compile(cell, precision=...)`` takes one of :data:`PRECISIONS`, with the same meaning on
every backend:

- ``"fp32"`` (the default; ``"highest"`` is an alias, the CUDA backend's older name): every
  product in the program's own dtype;
- ``"bf16"``: every ``matmul`` of the cell, and every ``matmul`` autodiff derives from one,
  carries the attribute ``precision="bf16"``. Such a matmul rounds both operands to bfloat16
  (round to nearest, ties to even; NaN stays NaN, overflow goes to infinity) and sums the
  products in float32, the model of ``torch.autocast``, of AMX ``tdpbf16ps`` and of cuBLAS
  with ``CUBLAS_COMPUTE_32F``. The product of two bfloat16 values is exact in float32, so
  rounding the operands and running a float32 GEMM is an exact emulation. Everything else
  (elementwise math, reductions, states, the saved tape, parameter gradients) stays float32;
  bfloat16 needs a float32 program;
- ``"tf32"``: the CUDA backend only (:mod:`rnnc.backends.cuda.precision`): float32 GEMMs on
  tensor cores with 10-bit mantissas. It stays a property of the CUDA runner, not of the IR,
  as TF32 is an implementation choice of cuBLAS that no CPU has a reason to copy.

docs/precision.md gives the error each costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from rnnc.errors import RnncTypeError, RnncValueError

PRECISIONS = ("fp32", "tf32", "bf16")
ALIASES = {"highest": "fp32"}  # the CUDA backend's name for full float32, kept working
BF16 = "bf16"
_BF16_DROPPED = 16  # float32 mantissa bits that bfloat16 does not keep (23 - 7)


def check(precision: Any, backend: str | None = None) -> str:
    """``precision`` by its canonical name, or an RnncValueError naming the choices; "tf32"
    needs ``backend`` "cuda"."""
    name = ALIASES.get(precision, precision) if isinstance(precision, str) else precision
    if name not in PRECISIONS:
        raise RnncValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))} "
                             f"('highest' is 'fp32'), got {precision!r}")
    if name == "tf32" and backend != "cuda":
        raise RnncValueError(f"precision='tf32' is the CUDA backend's (tensor-core GEMMs); "
                             f"backend {backend!r} takes 'fp32' or 'bf16'")
    return name


def check_dtype(precision: str, dtype: str) -> None:
    """Refuse a float64 call of a bf16 function: bfloat16 GEMMs accumulate in float32."""
    if precision == BF16 and dtype != "f32":
        raise RnncTypeError("precision='bf16' runs float32 programs (bfloat16 GEMM operands, "
                            "float32 everything else); this call's inputs are float64: pass "
                            "float32 (or bfloat16) arrays, or compile with precision='fp32'")


def round_to_bits(a: np.ndarray, dropped: int) -> np.ndarray:
    """``a`` (float32) with its ``dropped`` low mantissa bits rounded away, ties to even; NaN
    stays NaN and infinities stay, a finite value past the largest one becomes infinite."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    odd = (bits >> np.uint32(dropped)) & np.uint32(1)
    keep = np.uint32(~((1 << dropped) - 1) & 0xFFFFFFFF)
    rounded = ((bits + np.uint32((1 << (dropped - 1)) - 1) + odd) & keep).view(np.float32)
    return np.where(np.isnan(a), a, rounded).astype(np.float32, copy=False)


def round_bf16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to the nearest bfloat16 value, as float32 (the emulation's operand)."""
    if np.asarray(a).dtype != np.float32:
        raise RnncTypeError(f"a bfloat16 GEMM takes float32 operands, got {np.asarray(a).dtype}")
    return round_to_bits(a, _BF16_DROPPED)


def matmul_attrs(precision: str | None) -> dict[str, str]:
    """The attributes that give a matmul ``precision``: none for float32 (the IR unchanged)."""
    return {} if precision in (None, "fp32") else {"precision": precision}


def mark(program: Any, precision: str) -> Any:
    """``program`` with every matmul of every graph (and fused region) at ``precision``; the
    program itself where that is float32 or "tf32" (a CUDA runner's choice, not the IR's)."""
    if precision != BF16:
        return program
    from rnnc import ops
    from rnnc.ir import FUSED

    def graph(g: Any) -> Any:
        out = g.copy()
        for nid in out.nx.nodes:
            node = out.node(nid)
            if node.op is ops.matmul:
                attrs = {**node.attrs, "precision": precision}
            elif node.op is FUSED:
                attrs = {**node.attrs, "region": graph(node.attrs["region"])}
            else:
                continue
            out.nx.nodes[nid]["node"] = replace(node, attrs=attrs)
        return out

    scan = replace(program.scan, body=graph(program.scan.body))
    return replace(program, pre=graph(program.pre), scan=scan, post=graph(program.post))


def _is_bf16(value: Any) -> bool:
    """Whether ``value`` is a bfloat16 array: ml_dtypes' NumPy dtype or a torch tensor's."""
    return str(getattr(value, "dtype", "")) in ("bfloat16", "torch.bfloat16")


def widen(value: Any, precision: str) -> Any:
    """``value`` (an array, or a dict or sequence of them) with bfloat16 arrays as float32,
    for a "bf16" function; a float32 function gets ``value`` as it is, and its validation
    refuses bfloat16 naming ``precision='bf16'``."""
    if precision != BF16:  # first: every float32 call passes here, and str(dtype) is slow
        return value
    if isinstance(value, Mapping):
        return {k: widen(v, precision) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not _is_bf16(value):
        return type(value)(widen(v, precision) for v in value)
    if not _is_bf16(value):
        return value
    if isinstance(value, np.ndarray):
        return value.astype(np.float32)
    return value.detach().float()  # a torch tensor, on its own device


def widen_call(precision: str, x: Any, params: Any, states: Any) -> tuple[Any, Any, Any]:
    """A call's inputs, parameters and states with bfloat16 arrays as float32 (:func:`widen`)."""
    return widen(x, precision), widen(params, precision), widen(states, precision)
