"""The reductions: ``sum``, ``mean``, ``amax`` and ``amin`` over the feature axis, and
``sum_rows`` over the rows, each declared once with its shape rule, NumPy reference, VJP and
DSL docstring.

A feature reduction keeps its axis as 1: ``(B, n) -> (B, 1)``. ``amax(x)`` and ``amin(x)``
split the cotangent evenly over the tied elements, as PyTorch's ``amax``, so that it is a
subgradient and sums to the incoming one.
"""

from __future__ import annotations

from rnnc.errors import ShapeError
from rnnc.op_types import Op, OpKind, Shape, const, fmt_shape, op_named, register


def reduce_shape(a: Shape) -> Shape:
    if len(a) < 1:
        raise ShapeError(f"reduction over features needs an array, got {fmt_shape(a)}")
    return a[:-1] + (1,)


def sum_rows_shape(a: Shape) -> Shape:
    return a[-1:]


def _vjp_sum(e, g, xs, y):
    return (e(op_named("expand"), g, size=e.shape(xs[0])[-1]),)


def _vjp_mean(e, g, xs, y):
    n = e.shape(xs[0])[-1]
    return (e(op_named("expand"), e(op_named("mul"), g, const(e, 1.0 / n)), size=n),)


def _split_over_ties(e, g, selected):
    """``g`` shared evenly by the elements of each row that ``selected`` marks with 1."""
    share = e(op_named("div"), g, e(sum_, selected))
    return (e(op_named("where"), selected, share, const(e, 0.0)),)


def _vjp_amax(e, g, xs, y):
    return _split_over_ties(e, g, e(op_named("greater_equal"), xs[0], y))


def _vjp_amin(e, g, xs, y):
    return _split_over_ties(e, g, e(op_named("less_equal"), xs[0], y))


def _vjp_sum_rows(e, g, xs, y):
    # Broadcast g over the rows of x; where() broadcasts without reading x's values.
    return (e(op_named("where"), const(e, 1.0), g, xs[0]),)


def _over_features(name: str, ref, vjp, doc: str) -> Op:
    return register(Op(name, OpKind.REDUCE, 1, reduce_shape, ref, vjp, doc=doc))


_KEPT = "kept as an axis of 1: ``(B, n) -> (B, 1)``"
sum_ = _over_features("sum", lambda x: x.sum(axis=-1, keepdims=True), _vjp_sum,
                      f"Sum over the feature axis, {_KEPT}.")
mean = _over_features("mean", lambda x: x.mean(axis=-1, keepdims=True), _vjp_mean,
                      f"Mean over the feature axis, {_KEPT}.")
amax = _over_features("amax", lambda x: x.max(axis=-1, keepdims=True), _vjp_amax,
                      f"Maximum over the feature axis, {_KEPT}; its gradient is shared evenly "
                      f"by the elements equal to the maximum.")
amin = _over_features("amin", lambda x: x.min(axis=-1, keepdims=True), _vjp_amin,
                      f"Minimum over the feature axis, {_KEPT}; its gradient is shared evenly "
                      f"by the elements equal to the minimum.")
# Over the rows (batch and time): the gradient of a broadcast parameter; only autodiff makes it.
sum_rows = register(Op("sum_rows", OpKind.REDUCE, 1, sum_rows_shape,
                       lambda x: x.reshape(-1, x.shape[-1]).sum(axis=0), _vjp_sum_rows,
                       doc="The sum over every leading axis: ``(..., n) -> (n,)``.",
                       dsl_function=False))
