"""The rules of the ``amax``/``amin`` reductions and ``stop_gradient``. ``rnnc.ops`` declares
each op once from these; the conventions are those of ``rnnc.op_rules``. (The elementwise
comparing and selecting ops live in their family, ``rnnc.ops_elementwise``.)

``amax(x)`` and ``amin(x)`` split the cotangent evenly over the tied elements, as PyTorch's
``amax``, so that it is a subgradient and sums to the incoming one; ``stop_gradient`` passes
none.
"""

from __future__ import annotations

import numpy as np

from rnnc.op_rules import const
from rnnc.op_types import op_named as _op

# ---------------------------------------------------------------- references


def stop_gradient_ref(x):
    return np.array(x, copy=True)


# ---------------------------------------------------------------- vjp rules


def vjp_amax(e, g, xs, y):
    return _split_over_ties(e, g, e(_op("greater_equal"), xs[0], y))


def vjp_amin(e, g, xs, y):
    return _split_over_ties(e, g, e(_op("less_equal"), xs[0], y))


def _split_over_ties(e, g, selected):
    """``g`` shared evenly by the elements of each row that ``selected`` marks with 1."""
    share = e(_op("div"), g, e(_op("sum"), selected))
    return (e(_op("where"), selected, share, const(e, 0.0)),)


def vjp_stop_gradient(e, g, xs, y):
    return (None,)
