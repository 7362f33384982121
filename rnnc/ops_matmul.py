"""``matmul``, the one op that contracts: declared with its shape rule, NumPy reference and VJP.

``matmul(a, b)`` is ``a @ b`` for a per-step value or sequence ``a`` and a matrix parameter
``b`` ``(k, n)``; ``transpose_b`` reads ``b`` as stored and multiplies by its transpose (``x @
W.T``, tied weights); ``transpose_a`` contracts every leading axis of ``a`` and ``b``, ``sum_r
a[r]^T b[r]`` (the gradient of a weight). Backends send it to GEMMs; the element-level meaning
is the reference.
"""

from __future__ import annotations

from rnnc.errors import ShapeError
from rnnc.op_types import Op, OpKind, Shape, fmt_shape, register
from rnnc.precision import BF16, matmul_attrs, round_bf16


def matmul_shape(a: Shape, b: Shape, transpose_a: bool = False,
                  transpose_b: bool = False, precision: str | None = None) -> Shape:
    if precision not in (None, "fp32", BF16):
        raise ShapeError(f"matmul's precision must be 'fp32' or 'bf16', got {precision!r}")
    if len(a) < 1 or len(b) < 1:
        raise ShapeError(f"matmul needs arrays, got {fmt_shape(a)} @ {fmt_shape(b)}")
    if transpose_a:
        # Contract every leading axis: sum over rows of a[r, :]^T b[r, :].
        if transpose_b or a[:-1] != b[:-1]:
            raise ShapeError(f"matmul[transpose_a] needs equal leading axes, got "
                             f"{fmt_shape(a)}, {fmt_shape(b)}")
        return (a[-1], b[-1])
    if len(b) != 2 or any(isinstance(d, str) for d in b):
        raise ShapeError(f"matmul's right operand must be a matrix (k, n) without batch axes, "
                         f"got {fmt_shape(b)}")
    k, n = (b[1], b[0]) if transpose_b else b
    if a[-1] != k:
        raise ShapeError(
            f"matmul: inner sizes differ: {fmt_shape(a)} @ "
            f"{fmt_shape(b)}{'^T' if transpose_b else ''} (expected left operand with {k} "
            f"features, got {a[-1]})"
        )
    return a[:-1] + (n,)


def matmul_ref(a, b, transpose_a=False, transpose_b=False, precision=None):
    if precision == BF16:  # bfloat16 operands, products summed in float32 (rnnc.precision)
        a, b = round_bf16(a), round_bf16(b)
    if transpose_a:
        return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])
    return a @ (b.T if transpose_b else b)


def vjp_matmul(e, g, xs, y, transpose_a=False, transpose_b=False, precision=None):
    a, b = xs
    # The gradient GEMMs of a bfloat16 GEMM are bfloat16 GEMMs too (autocast's rule).
    at = matmul_attrs(precision)
    if transpose_a:
        # y = sum_r a_r^T b_r: the cotangents are per row again.
        return e(matmul, b, g, transpose_b=True, **at), e(matmul, a, g, **at)
    if transpose_b:
        return e(matmul, g, b, **at), e(matmul, g, a, transpose_a=True, **at)
    return (e(matmul, g, b, transpose_b=True, **at),
            e(matmul, a, g, transpose_a=True, **at))


# Written a @ b on values (x @ W.T for transpose_b): no DSL function of its own.
matmul = register(Op("matmul", OpKind.MATMUL, 2, matmul_shape, matmul_ref, vjp_matmul,
                     doc="``a @ b``.", dsl_function=False))
