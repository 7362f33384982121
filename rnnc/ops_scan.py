"""The scan family, the ops over the time axis: ``linear_scan`` and ``last_step``, each declared
with its shape rule, NumPy reference and VJP.

``linear_scan[reverse, exclusive](A, Bv, c0)`` runs the linear recurrence
``C[t] = A[t] * C[t-1] + Bv[t]`` from ``C[-1] = c0`` over a whole sequence at once; with
``reverse`` it runs from the last step to the first, ``C[t] = A[t] * C[t+1] + Bv[t]`` from
``C[T] = c0``. Its result is the ``[T,...]`` sequence of the values after each step, or with
``exclusive`` the values before each step (``C[t-1]``, the carry the step read). ``A`` and
``Bv`` broadcast to the result (a ``(n,)`` parameter, a ``(T,B,1)`` mask); at least one is a
``[T,...]`` sequence, which gives the number of steps. ``last_step[reverse](X)`` is ``X[T-1]``
(``X[0]`` with ``reverse``): the value a scan in that direction ends with.

Both live outside the loop only (``parallel-scan`` makes them in ``pre``). Their VJPs are scans
too: the cotangent of the carried value obeys ``D[t] = g[t] + A[t+1] * D[t+1]``, a linear
recurrence in the opposite direction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.errors import ShapeError
from rnnc.op_types import Op, OpKind, broadcast_shapes, const, fmt_shape, op_named, register

Shape = tuple[Any, ...]


def linear_scan_shape(a: Shape, b: Shape, c0: Shape, reverse: bool = False,
                      exclusive: bool = False) -> Shape:
    if len(c0) < 1 or "T" in c0:
        raise ShapeError(f"linear_scan: the initial value must be a per-step value like [B,n], "
                         f"got {fmt_shape(c0)}")
    out = ("T",) + tuple(c0)
    for name, s in (("A", a), ("Bv", b)):
        try:
            fits = len(s) <= len(out) and broadcast_shapes(s, out) == out
        except ShapeError:
            fits = False
        if not fits:
            raise ShapeError(f"linear_scan: {name} {fmt_shape(s)} does not broadcast to the "
                             f"result {fmt_shape(out)}")
    if not any(len(s) == len(out) and s[0] == "T" for s in (a, b)):
        raise ShapeError(f"linear_scan: A {fmt_shape(a)} or Bv {fmt_shape(b)} must be a "
                         f"[T,...] sequence (it gives the number of steps)")
    return out


def last_step_shape(x: Shape, reverse: bool = False) -> Shape:
    if len(x) < 2 or x[0] != "T":
        raise ShapeError(f"last_step needs a [T,...] sequence, got {fmt_shape(x)}")
    return tuple(x[1:])


def steps(a: np.ndarray, b: np.ndarray, c0: np.ndarray) -> int:
    """The number of steps of a linear scan: the leading size of its sequence operands."""
    lead = [np.shape(v)[0] for v in (a, b) if np.ndim(v) == np.ndim(c0) + 1]
    if not lead:
        raise ShapeError("linear_scan: A or Bv must be a [T,...] sequence")
    return max(lead)


def linear_scan_ref(a, b, c0, reverse: bool = False, exclusive: bool = False) -> np.ndarray:
    """The recurrence step after step, each step vectorized over the batch and features."""
    c0 = np.asarray(c0)
    T = steps(a, b, c0)
    shape = (T,) + c0.shape
    dtype = np.result_type(a, b, c0)
    a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    out = np.empty(shape, dtype)
    c = c0.astype(dtype)
    for t in range(T - 1, -1, -1) if reverse else range(T):
        if exclusive:
            out[t] = c
        c = a[t] * c + b[t]
        if not exclusive:
            out[t] = c
    return out


def last_step_ref(x, reverse: bool = False) -> np.ndarray:
    x = np.asarray(x)
    return x[0].copy() if reverse else x[-1].copy()


def _zeros_like(e, x):
    """Zeros of ``x``'s shape, without arithmetic on ``x`` (NaN times 0 is NaN)."""
    return e(op_named("where"), const(e, 1.0), const(e, 0.0), x)


def _vjp_linear_scan(e, g, xs, y, reverse=False, exclusive=False):
    a, b, c0 = xs
    back = {"reverse": not reverse, "exclusive": True}
    zero = _zeros_like(e, c0)
    if exclusive:
        # y[t] = C[t-1]: D[s] = dL/dC[s] = g[s+1] + A[s+1] D[s+1], the next step's cotangent.
        d = e(linear_scan, a, g, zero, **back)
        d_c0 = e(last_step, e(op_named("add"), g, e(op_named("mul"), a, d)), reverse=not reverse)
        before = y
    else:
        # y[t] = C[t]: D[t] = g[t] + A[t+1] D[t+1], and H = A * D obeys H[t] = A[t] (g[t] +
        # H[t+1]), a scan over A itself: D = g + H shifted by one step.
        d = e(op_named("add"), g, e(linear_scan, a, e(op_named("mul"), a, g), zero, **back))
        d_c0 = e(last_step, e(op_named("mul"), a, d), reverse=not reverse)
        before = e(linear_scan, a, b, c0, reverse=reverse, exclusive=True)
    return e(op_named("mul"), d, before), d, d_c0


def _vjp_last_step(e, g, xs, y, reverse=False):
    # g at the step taken, zeros elsewhere: an exclusive scan in the other direction starts
    # from g and, with A = Bv = 0, holds 0 after its first step.
    zeros = _zeros_like(e, xs[0])
    return (e(linear_scan, zeros, const(e, 0.0), g, reverse=not reverse, exclusive=True),)


# Only parallel-scan makes them, in ``pre``: no DSL functions.
linear_scan = register(Op("linear_scan", OpKind.SCAN, 3, linear_scan_shape, linear_scan_ref,
                          _vjp_linear_scan, doc="``C[t] = A[t] * C[t-1] + Bv[t]`` from ``c0``.",
                          dsl_function=False))
last_step = register(Op("last_step", OpKind.SCAN, 1, last_step_shape, last_step_ref,
                        _vjp_last_step, doc="The last step of a ``[T,...]`` sequence.",
                        dsl_function=False))
