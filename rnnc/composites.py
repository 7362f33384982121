"""Composite functions: built from primitives, so every backend and autodiff get them free."""

from __future__ import annotations

from rnnc import ops
from rnnc.dsl import Value, apply, mean, relu, rsqrt


def abs(x: Value) -> Value:  # noqa: A001 - mirrors NumPy's name
    """Elementwise absolute value, as relu(x) + relu(-x)."""
    return relu(x) + relu(-x)


def softsign(x: Value) -> Value:
    """x / (1 + |x|)."""
    return x / (1.0 + abs(x))


def hard_sigmoid(x: Value) -> Value:
    """clip(0.2 x + 0.5, 0, 1), Keras' definition."""
    z = 0.2 * x + 0.5
    return relu(z) - relu(z - 1.0)


def layer_norm(x: Value, gamma: Value | None = None, beta: Value | None = None,
               eps: float = 1e-5) -> Value:
    """Normalize over the feature axis, then scale by ``gamma`` and shift by ``beta``."""
    centred = x - mean(x)
    y = centred * rsqrt(mean(centred * centred) + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def neg(x: Value) -> Value:
    """-x."""
    return apply(ops.neg, x)
