"""NumPy meeting a traced value: operators keep working, NumPy's functions say what to call.

``ndarray * value`` or ``np.float32(2) * value`` reach a :class:`rnnc.Value` as the ufunc
``np.multiply``: they run the value's own operator. ``np.tanh(value)``, ``np.concatenate``
and every other NumPy function compute on arrays, not on the cell's program, so they raise an
``RnncTypeError`` naming the rnnc function to call instead (``rnnc.tanh``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.errors import RnncTypeError

# ufunc name -> (the value's method when it is the first operand, when it is the second).
_OPERATORS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"),
    "multiply": ("__mul__", "__rmul__"), "divide": ("__truediv__", "__rtruediv__"),
    "true_divide": ("__truediv__", "__rtruediv__"),
    "matmul": ("__matmul__", "__rmatmul__"), "power": ("__pow__", "__rpow__"),
    "less": ("__lt__", "__gt__"), "less_equal": ("__le__", "__ge__"),
    "greater": ("__gt__", "__lt__"), "greater_equal": ("__ge__", "__le__"),
}
_UNARY = {"negative": "__neg__", "positive": "__pos__", "absolute": "__abs__"}

# NumPy's name -> rnnc's, where they differ.
_RENAMED = {"absolute": "abs", "fabs": "abs", "concatenate": "concat", "hstack": "concat",
            "max": "amax", "min": "amin", "fmax": "maximum", "fmin": "minimum",
            "square": "x ** 2",
            "reciprocal": "1 / x", "power": "x ** p", "matmul": "x @ W", "dot": "x @ W",
            "clip": "rnnc.minimum(rnnc.maximum(x, lo), hi)", "logaddexp": "rnnc.logsumexp"}


def _hint(name: str) -> str:
    """What to write instead of NumPy's ``name`` in a cell."""
    import rnnc

    target = _RENAMED.get(name, name)
    if hasattr(rnnc, target):
        return f"use rnnc.{target} instead"
    if target != name:
        return f"write {target} instead"
    return ("the cell's functions are rnnc's: rnnc.sigmoid, tanh, relu, exp, log, sqrt, "
            "maximum, where, concat, mean, sum, ... (rnnc.FUNCTIONS)")


def refuse(func: str, location: str) -> RnncTypeError:
    """The error for NumPy's ``func`` applied to a traced value."""
    return RnncTypeError(f"np.{func} was called on a traced rnnc value: NumPy computes on "
                         f"arrays, not on the cell's program; {_hint(func)} (at {location})")


def array_ufunc(ufunc: Any, method: str, inputs: tuple, kwargs: dict, location: str) -> Any:
    """``Value.__array_ufunc__``: an operator's ufunc runs the operator, others refuse."""
    from rnnc.dsl import Value

    name = ufunc.__name__
    # NumPy hands a scalar operand over as a 0-d array (for comparisons): a number again.
    inputs = tuple(a.item() if isinstance(a, np.ndarray | np.generic) and np.ndim(a) == 0
                   else a for a in inputs)
    if method == "__call__" and not kwargs:
        if name in _OPERATORS and len(inputs) == 2:
            first, second = _OPERATORS[name]
            if isinstance(inputs[0], Value):
                return getattr(inputs[0], first)(inputs[1])
            return getattr(inputs[1], second)(inputs[0])
        if name in _UNARY and len(inputs) == 1:
            return getattr(inputs[0], _UNARY[name])()
    shown = name if method == "__call__" else f"{name}.{method}"
    raise refuse(shown, location)
