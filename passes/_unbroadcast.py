"""The gradient of NumPy broadcasting: a cotangent summed down to its operand's shape.

Autodiff calls :func:`unbroadcast` on every cotangent a VJP rule returns. A ``(B, n)`` program
sums with ``sum`` (an operand of one column), ``sum_rows`` (a parameter vector) and a product
with a column of ones (a ``(1, n)`` operand), as it always has; a value with feature shapes
(``(B, D, N)``) sums over its leading axes with ``sum_lead`` and over an axis of 1 with
``sum_axis`` (``rnnc/ops_tensor.py``).
"""

from __future__ import annotations

from typing import Any

from rnnc import ops

Emitter = Any  # autodiff's _Emitter: e(op, *operands, **attrs) -> node, e.shape(node)


def unbroadcast(e: Emitter, g: int, shape: tuple) -> int:
    """Sum the cotangent ``g`` down to ``shape`` (undo NumPy broadcasting)."""
    have = e.shape(g)
    if have == shape:
        return g
    if len(have) > 2 or len(shape) > 2:  # values with feature shapes: rnnc/ops_tensor.py
        return _unbroadcast_features(e, g, shape)
    if shape and shape[-1] == 1 and have[-1] != 1:
        g = e(ops.sum_, g)
    if len(shape) < len(e.shape(g)):
        g = e(ops.sum_rows, g)
    elif len(shape) == 2 and shape[0] == 1 and e.shape(g)[:-1] != (1,):
        # A (1, n) operand broadcast over rows: contract the rows with a column of ones,
        # ones^T g, which keeps the leading axis of 1 (sum_rows would drop it).
        one = e(ops.constant, value=1.0)
        ones = e(ops.where, one, one, e(ops.slice_, g, start=0, stop=1))
        g = e(ops.matmul, ones, g, transpose_a=True)
    assert e.shape(g) == shape, (have, shape)
    return g


def _unbroadcast_features(e: Emitter, g: int, shape: tuple) -> int:
    """Sum ``g`` over the leading axes ``shape`` lacks, then over each axis it has as 1."""
    if len(shape) < len(e.shape(g)):
        g = e(ops.sum_lead, g, rank=len(shape))
    for axis in range(-len(shape), 0):
        if shape[axis] == 1 and e.shape(g)[axis] != 1:
            g = e(ops.sum_ if axis == -1 else ops.sum_axis, g,
                  **({} if axis == -1 else {"axis": axis}))
    assert e.shape(g) == shape, (e.shape(g), shape)
    return g
