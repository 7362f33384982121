"""The comparing and selecting ops of the elementwise family: comparisons, ``maximum``,
``minimum``, ``abs``, ``where``, ``relu`` and ``clip``, each declared once with its shape rule,
NumPy reference, VJP and DSL docstring. ``rnnc.ops_elementwise`` collects them into the
family's table with the rest (the conventions are written there).

Ties, where the derivative of a selection is not defined, are broken so that the cotangents
are a subgradient and sum to the incoming one: maximum(a, b) and minimum(a, b) send the whole
cotangent to a where a == b (the value returned is a there too); abs(x) has gradient sign(x),
0 at 0; comparisons are steps, 0.0/1.0 masks of the operands' dtype with no gradient.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rnnc.errors import ShapeError
from rnnc.op_types import (
    Member,
    Shape,
    away_from_zero,
    const,
    declare_elementwise,
    elementwise_shape,
    normal,
    off_integers,
    op_named,
)

# ---------------------------------------------------------------- references


def _comparison(compare: Callable) -> Callable:
    def ref(a, b):
        a, b = np.asarray(a), np.asarray(b)
        return compare(a, b).astype(np.result_type(a, b))
    return ref


def _maximum_ref(a, b):
    # a at ties (it differs from b there only as -0.0 vs 0.0) and NaN from either operand.
    a, b = np.asarray(a), np.asarray(b)
    return np.where((a >= b) | np.isnan(a), a, b).astype(np.result_type(a, b), copy=False)


def _minimum_ref(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.where((a <= b) | np.isnan(a), a, b).astype(np.result_type(a, b), copy=False)


def _where_ref(c, a, b):
    return np.where(c > 0, a, b)


def _relu_ref(x):
    return np.maximum(x, 0).astype(x.dtype, copy=False)


def _clip_ref(x, lo: float, hi: float):
    x = np.asarray(x)
    return np.clip(x, np.asarray(lo, x.dtype), np.asarray(hi, x.dtype))


def _clip_shape(x: Shape, lo: Any = None, hi: Any = None) -> Shape:
    for name, bound in (("lo", lo), ("hi", hi)):
        if isinstance(bound, bool) or not isinstance(bound, (int, float, np.integer,
                                                             np.floating)):
            raise ShapeError(f"clip's {name} must be a constant Python number, got "
                             f"{type(bound).__name__}; for a traced bound write "
                             f"rnnc.minimum(rnnc.maximum(x, lo), hi)")
        if math.isnan(bound):
            raise ShapeError(f"clip's {name} must not be NaN")
    if lo > hi:
        raise ShapeError(f"clip needs lo <= hi, got lo={lo}, hi={hi}")
    return elementwise_shape(x)


# ---------------------------------------------------------------- vjp rules


def vjp_zero(e, g, xs, y, **_):
    """A step function: its derivative is 0 wherever it exists."""
    return (None,) * len(xs)


def _select_first(e, g, first):
    """The cotangent to a where the mask first is 1, else to b."""
    zero = const(e, 0.0)
    return e(op_named("where"), first, g, zero), e(op_named("where"), first, zero, g)


def _vjp_maximum(e, g, xs, y):
    return _select_first(e, g, e(greater_equal, *xs))


def _vjp_minimum(e, g, xs, y):
    return _select_first(e, g, e(less_equal, *xs))


def _vjp_abs(e, g, xs, y):
    x, neg = xs[0], op_named("neg")
    # sign(x) * g, and 0 at x == 0 (and for NaN): neither where() branch is taken there.
    return (e(where, x, g, e(where, e(neg, x), e(neg, g), const(e, 0.0))),)


def _vjp_where(e, g, xs, y):
    c = xs[0]
    zero = const(e, 0.0)
    return None, e(where, c, g, zero), e(where, c, zero, g)


def _vjp_relu(e, g, xs, y):
    return (e(where, xs[0], g, const(e, 0.0)),)


def _vjp_clip(e, g, xs, y, lo, hi):
    # Gradient 1 on [lo, hi], bounds included (torch.clamp's), 0 outside.
    x = xs[0]
    inside = e(op_named("mul"), e(greater_equal, x, const(e, lo)),
               e(less_equal, x, const(e, hi)))
    return (e(where, inside, g, const(e, 0.0)),)


# ---------------------------------------------------------------- the declarations


DECLARED: list[Member] = []  # in order; rnnc.ops_elementwise.FAMILY holds them with the rest
_declare = functools.partial(declare_elementwise, DECLARED)

_BOTH = (normal(1.0), normal(1.0))
less = _declare("less", 2, _comparison(np.less), vjp_zero,
                "``a < b`` as 1.0 or 0.0 (elementwise, broadcasting); no gradient.", _BOTH)
less_equal = _declare("less_equal", 2, _comparison(np.less_equal), vjp_zero,
                      "``a <= b`` as 1.0 or 0.0 (elementwise, broadcasting); no gradient.", _BOTH)
greater = _declare("greater", 2, _comparison(np.greater), vjp_zero,
                   "``a > b`` as 1.0 or 0.0 (elementwise, broadcasting); no gradient.", _BOTH)
greater_equal = _declare("greater_equal", 2, _comparison(np.greater_equal), vjp_zero,
                         "``a >= b`` as 1.0 or 0.0 (elementwise, broadcasting); no gradient.",
                         _BOTH)
maximum = _declare("maximum", 2, _maximum_ref, _vjp_maximum,
                   "Elementwise maximum, broadcasting; at ties the value and gradient go to "
                   "``a``.", _BOTH)
minimum = _declare("minimum", 2, _minimum_ref, _vjp_minimum,
                   "Elementwise minimum, broadcasting; at ties the value and gradient go to "
                   "``a``.", _BOTH)
abs_ = _declare("abs", 1, np.abs, _vjp_abs,
                "Elementwise absolute value; its gradient is sign(x), 0 at 0.",
                (away_from_zero,))
where = _declare("where", 3, _where_ref, _vjp_where,
                 "``a`` where ``cond > 0``, else ``b`` (elementwise, broadcasting).")
relu = _declare("relu", 1, _relu_ref, _vjp_relu, "Elementwise ``max(x, 0)``, NaN kept.")
clip = _declare("clip", 1, _clip_ref, _vjp_clip,
                "``x`` limited to ``[lo, hi]`` (constant numbers, ``lo <= hi``); its gradient "
                "is 1 on ``[lo, hi]``, bounds included like ``torch.clamp``, 0 outside.",
                (off_integers,), shape=_clip_shape, attributes=("lo", "hi"),
                test_attrs={"lo": -1.0, "hi": 2.0})
