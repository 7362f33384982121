"""Values with feature shapes in the cell DSL: shapes of declarations, indexing with ``None``
and ``...``, ``reshape``, sums over an axis, and ``rnnc.einsum``.

A value is ``(B, *features)``: ``c.state("h", (D, N))`` is ``(B, D, N)``. Elementwise ops
broadcast like NumPy (a symbol ``B`` matches only itself or 1), so ``dt[:, :, None] * A``
multiplies a ``(B, D, 1)`` value by a ``(D, N)`` parameter into ``(B, D, N)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc import ops
from rnnc.dsl_checks import check_size
from rnnc.errors import CellError, RnncTypeError, ShapeError
from rnnc.ops_tensor import LEAD, parse, unparse

Value = Any  # rnnc.dsl.Value, which imports this module


def feature_shape(size: Any, what: str) -> tuple[int, ...]:
    """The feature shape of a declaration: an int ``n`` is ``(n,)``, a tuple is itself."""
    if isinstance(size, (tuple, list)):
        if not size:
            raise CellError(f"{what} shape must have at least one size, got {size!r}")
        return tuple(check_size(d, what) for d in size)
    return (check_size(size, what),)


def _where() -> str:
    from rnnc.dsl import _user_location

    return _user_location()


def _apply(op: ops.Op, *args: Any, **attrs: Any) -> Value:
    from rnnc.dsl import apply

    return apply(op, *args, **attrs)


def _features(v: Value) -> tuple:
    """The feature axes of ``v``: after its rows (``B``), or all of a parameter's."""
    shape = v.shape
    return tuple(shape[1:]) if shape and shape[0] == "B" else tuple(shape)


def reshape(v: Value, *shape: Any) -> Value:
    """``v`` with its feature axes reshaped to ``shape`` (row-major, like NumPy; one size
    may be -1); the rows stay: a ``(B, H, d)`` value reshaped to ``(H * d,)`` is ``(B, H*d)``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    features = _features(v)
    total = int(np.prod(features))
    if shape.count(-1) == 1:
        known = int(np.prod([d for d in shape if d != -1]))
        shape = tuple(total // known if d == -1 and known and total % known == 0 else d
                      for d in shape)
    return _apply(ops.reshape, v, rank=len(features), shape=tuple(shape))


def _axis(v: Value, axis: Any) -> int:
    features = _features(v)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not (
            -len(features) <= axis < len(features)):
        raise ShapeError(f"axis {axis!r} is not a feature axis of {ops.fmt_shape(v.shape)} "
                         f"(feature axes count from 0 after the rows, or from -1 at the end) "
                         f"(at {_where()})")
    return int(axis) - len(features) if axis >= 0 else int(axis)


def total(v: Value, axis: Any = -1, keepdims: bool = False) -> Value:
    """The sum of ``v`` over one feature axis (``-1``, the last, by default)."""
    axis = _axis(v, axis)
    out = _apply(ops.sum_ if axis == -1 else ops.sum_axis, v,
                 **({} if axis == -1 else {"axis": axis}))
    return out if keepdims else _drop(out, axis)


def average(v: Value, axis: Any = -1, keepdims: bool = False) -> Value:
    """The mean of ``v`` over one feature axis (``-1``, the last, by default)."""
    n = v.shape[_axis(v, axis)]
    return total(v, axis, keepdims) * (1.0 / n)


def _drop(v: Value, axis: int) -> Value:
    features = _features(v)
    if len(features) == 1:
        return v  # a (B, 1) value keeps its one feature
    kept = features[:len(features) + axis] + features[len(features) + axis + 1:]
    return _apply(ops.reshape, v, rank=len(features), shape=kept)


def index(v: Value, key: Any) -> Value:
    """``v[key]``: a slice of the last axis (``v[:, a:b]``, ``v[..., a:b:s]``, ``v[:, :, a:b]``
    for a ``(B, D, N)`` value) or new axes of 1 (``v[:, :, None]``, ``v[..., None, :]``)."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is None for k in key):
        return _add_axes(v, key)
    if (len(key) == 2 and key[0] is Ellipsis) or (
            len(key) == len(v.shape) and all(isinstance(k, slice) and k == slice(None)
                                             for k in key[:-1])):
        return _slice_last(v, key[-1])
    raise ShapeError(f"index the feature axis (the last) as v[:, a:b] or v[..., a:b] (every "
                     f"other axis ':'), "
                     f"got v[{key!r}] of {ops.fmt_shape(v.shape)} (at {_where()})")


def _slice_last(v: Value, key: Any) -> Value:
    n = v.shape[-1]
    if isinstance(key, int):
        key = slice(key, key + 1) if key != -1 else slice(n - 1, n)
    if not isinstance(key, slice):
        raise ShapeError(f"feature slices must be a:b or a:b:s, got {key!r} (at {_where()})")
    step = key.step
    if step is not None and (isinstance(step, bool) or not isinstance(step, int | np.integer)
                             or step < 1):
        raise ShapeError(f"feature slices need a positive integer step a:b:s (s >= 1; "
                         f"reversed features are not supported), got {key!r} (at {_where()})")
    start, stop, step = key.indices(n)
    columns = range(start, stop, step)
    if columns:  # one form per set of columns: stop just past the last, step 1 for one
        stop, step = columns[-1] + 1, step if len(columns) > 1 else 1
    attrs = {"start": start, "stop": stop} | ({"step": step} if step != 1 else {})
    return _apply(ops.slice_, v, **attrs)


def _add_axes(v: Value, key: tuple) -> Value:
    if sum(k is Ellipsis for k in key) > 1:
        raise ShapeError(f"an index has at most one ..., got {key!r} (at {_where()})")
    shape = v.shape
    named = [k for k in key if k is not None and k is not Ellipsis]
    if Ellipsis in key:  # '...' stands for the axes no other entry names
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - len(named)) + key[at + 1:]
    key = key + (slice(None),) * (len(shape) - sum(k is not None for k in key))
    if sum(k is not None for k in key) != len(shape) or any(
            k is not None and k != slice(None) for k in key):
        raise ShapeError(f"an index with None takes ':' or '...' for every axis, got v[{key!r}] "
                         f"of {ops.fmt_shape(shape)}; slice the last axis separately "
                         f"(at {_where()})")
    if shape and shape[0] == "B" and key[0] is None:
        raise ShapeError(f"a new axis cannot go before the rows B of {ops.fmt_shape(shape)} "
                         f"(at {_where()})")
    new, axes = [], iter(shape)
    for k in key:
        new.append(1 if k is None else next(axes))
    features = _features(v)
    lead = len(shape) - len(features)
    return _apply(ops.reshape, v, rank=len(features), shape=tuple(new[lead:]))


def einsum(spec: str, *operands: Value) -> Value:
    """A contraction over feature axes, the batch implied: ``einsum("hd,hde->he", h, R)``
    multiplies each head's ``(B, d)`` slice of ``h`` (``(B, H, d)``) by its own ``(d, e)``
    block of ``R`` (``(H, d, e)``): a block-diagonal product, one batched GEMM per step.

    Letters name feature axes only: a per-step value's rows ``B`` come first and stay, a
    parameter has none. A letter absent from the output is summed over."""
    from rnnc.dsl import Value

    if not isinstance(spec, str) or "->" not in spec or LEAD in spec:
        raise ShapeError(f"einsum spec must name feature axes as 'ab,bc->ac' (the batch is "
                         f"implied, no '...'), got {spec!r} (at {_where()})")
    if not operands or not all(isinstance(o, Value) for o in operands):
        raise RnncTypeError(f"einsum takes traced rnnc values, got "
                            f"{[type(o).__name__ for o in operands]} (at {_where()})")
    inputs, (_, out) = parse(spec.replace(" ", ""))
    batched = [bool(o.shape) and o.shape[0] == "B" for o in operands]
    canonical = unparse([(b, t) for b, (_, t) in zip(batched, inputs, strict=False)],
                        (any(batched), out))
    return _apply(ops.einsum, *operands, spec=canonical)
