"""The rules of the ops that compare and select: comparisons, ``maximum``/``minimum``, ``abs``,
the ``amax``/``amin`` reductions and ``stop_gradient``. ``rnnc.ops`` declares each op once from
these; the conventions are those of ``rnnc.op_rules``.

Ties, where the derivative of a selection is not defined, are broken so that the cotangents are
a subgradient and sum to the incoming one:

- ``maximum(a, b)`` and ``minimum(a, b)`` send the whole cotangent to ``a`` where ``a == b``
  (the value returned is ``a`` there too);
- ``amax(x)`` and ``amin(x)`` split it evenly over the tied elements, as PyTorch's ``amax``;
- ``abs(x)`` has gradient ``sign(x)``, 0 at 0;
- comparisons are steps: no gradient to either operand; ``stop_gradient`` passes none.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rnnc import ops
from rnnc.op_rules import const

# ---------------------------------------------------------------- references


def comparison(compare: Callable) -> Callable:
    """A comparison as a 0.0/1.0 mask of the operands' dtype."""

    def ref(a, b):
        a, b = np.asarray(a), np.asarray(b)
        return compare(a, b).astype(np.result_type(a, b))

    return ref


def maximum_ref(a, b):
    # ``a`` at ties (it differs from b there only as -0.0 vs 0.0) and NaN from either operand.
    a, b = np.asarray(a), np.asarray(b)
    return np.where((a >= b) | np.isnan(a), a, b).astype(np.result_type(a, b), copy=False)


def minimum_ref(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.where((a <= b) | np.isnan(a), a, b).astype(np.result_type(a, b), copy=False)


def stop_gradient_ref(x):
    return np.array(x, copy=True)


# ---------------------------------------------------------------- vjp rules


def vjp_comparison(e, g, xs, y):
    return None, None


def vjp_maximum(e, g, xs, y):
    return _select_first(e, g, e(ops.greater_equal, *xs))


def vjp_minimum(e, g, xs, y):
    return _select_first(e, g, e(ops.less_equal, *xs))


def _select_first(e, g, first):
    """The cotangent to ``a`` where the mask ``first`` is 1, else to ``b``."""
    zero = const(e, 0.0)
    return e(ops.where, first, g, zero), e(ops.where, first, zero, g)


def vjp_abs(e, g, xs, y):
    x = xs[0]
    # sign(x) * g, and 0 at x == 0 (and for NaN): neither where() branch is taken there.
    return (e(ops.where, x, g, e(ops.where, e(ops.neg, x), e(ops.neg, g), const(e, 0.0))),)


def vjp_amax(e, g, xs, y):
    return _split_over_ties(e, g, e(ops.greater_equal, xs[0], y))


def vjp_amin(e, g, xs, y):
    return _split_over_ties(e, g, e(ops.less_equal, xs[0], y))


def _split_over_ties(e, g, selected):
    """``g`` shared evenly by the elements of each row that ``selected`` marks with 1."""
    share = e(ops.div, g, e(ops.sum_, selected))
    return (e(ops.where, selected, share, const(e, 0.0)),)


def vjp_stop_gradient(e, g, xs, y):
    return (None,)
