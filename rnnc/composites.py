"""Composite functions: built from primitives, so every backend and autodiff get them free."""

from __future__ import annotations

from rnnc import ops
from rnnc.dsl import Value, amax, apply, exp, log, mean, relu, rsqrt, stop_gradient, where
from rnnc.dsl import abs as abs_
from rnnc.dsl import sum as sum_


def softsign(x: Value) -> Value:
    """x / (1 + |x|)."""
    return x / (1.0 + abs_(x))


def hard_sigmoid(x: Value) -> Value:
    """clip(0.2 x + 0.5, 0, 1), Keras' definition."""
    z = 0.2 * x + 0.5
    return relu(z) - relu(z - 1.0)


def layer_norm(x: Value, gamma: Value | None = None, beta: Value | None = None,
               eps: float = 1e-5) -> Value:
    """Normalize over the feature axis, then scale by ``gamma`` and shift by ``beta``.

    ``layer_norm(x, gamma, beta, eps)`` is ``torch.nn.functional.layer_norm(x, (n,), gamma,
    beta, eps)`` for ``x`` of shape ``(B, n)``: ``gamma`` and ``beta`` are ``(n,)`` parameters
    (an ``nn.LayerNorm``'s ``weight`` and ``bias``), each optional."""
    centred = x - mean(x)
    y = centred * rsqrt(mean(centred * centred) + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def _shifted_exp(x: Value) -> tuple[Value, Value]:
    """(m, exp(x - m)) with m the row's maximum: no exp overflows, the largest term is 1.

    m is a constant to autodiff: the results do not depend on it mathematically, so the exact
    gradient has no term through it (and amax's gradient at ties would only add rounding)."""
    m = stop_gradient(amax(x))
    return m, exp(x - m)


def softmax(x: Value) -> Value:
    """exp(x) / sum(exp(x)) over the feature axis, computed stably: ``(B, n) -> (B, n)``."""
    _, z = _shifted_exp(x)
    return z / sum_(z)


def logsumexp(x: Value) -> Value:
    """log(sum(exp(x))) over the feature axis, computed stably: ``(B, n) -> (B, 1)``.

    As in torch, a row holding +inf gives +inf and a row of -inf gives -inf: an infinite
    maximum is not subtracted (inf - inf is NaN), the row is shifted by 0 instead."""
    m = stop_gradient(amax(x))
    # m - m is 0 where m is finite and NaN where it is not, and where() reads NaN as false.
    shift = where(1.0 - abs_(m - m), m, 0.0)
    return shift + log(sum_(exp(x - shift)))


def neg(x: Value) -> Value:
    """-x."""
    return apply(ops.neg, x)
