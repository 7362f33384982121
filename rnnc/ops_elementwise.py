"""The elementwise op family: each op declared once with its shape rule, NumPy reference, VJP,
DSL docstring and the operands its tests draw.

An elementwise op reads element j of each operand (after broadcasting) to make element j of its
result. Adding one means one ``Member`` here, one line in ``rnnc/backends/llvm/scalar.py``
(``SCALAR``) and one in ``rnnc/backends/cuda/rules.py`` (``RULES``); ``rnnc.ops`` registers the
op, ``rnnc.dsl`` makes it a function ``rnnc.<name>`` with the docstring below, and the tests
(``tests/rnnc/test_elementwise_family.py``, ``tests/backends/test_elementwise_family_backends.py``)
check its shape rule, its VJP against float64 central differences and every backend against its
reference by iterating over ``FAMILY``.

A VJP rule receives an emitter ``e``, the cotangent ``g``, the inputs ``xs``, the result ``y``
and the attributes; it returns one cotangent per input (None: the gradient is zero everywhere it
exists, as for ``floor``). Rules name the ops they emit through :func:`_op`, looked up when the
rule runs, so this module imports no other family.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rnnc.errors import ShapeError
from rnnc.op_types import REGISTRY, Op, OpKind, Shape, elementwise_shape, register

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class Member:
    """One op of the family and what documents and tests it.

    ``doc``: the DSL function's docstring. ``attributes``: the names of the constant attributes
    the DSL function takes after its operands (``clip``'s ``lo`` and ``hi``). ``draws``: one
    operand sampler per operand, drawing where the op is differentiable (away from ``floor``'s
    jumps) so central differences hold; ``test_attrs`` the attributes the tests use."""

    op: Op
    doc: str
    draws: tuple[Draw, ...]
    attributes: tuple[str, ...] = ()
    test_attrs: dict[str, Any] = field(default_factory=dict)


def _op(name: str) -> Op:
    return REGISTRY[name]


def _const(e, value: float):
    return e(_op("constant"), value=value)


def _same_dtype(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.asarray(y).astype(np.asarray(x).dtype, copy=False)


# ---------------------------------------------------------------- operand samplers


def _normal(scale: float) -> Draw:
    return lambda rng, shape: rng.standard_normal(shape) * scale


def _off_integers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values whose fraction lies in [0.1, 0.4] or [0.6, 0.9]: away from floor's and round's
    jumps (at integers and at halves)."""
    fraction = rng.uniform(0.1, 0.4, shape) + rng.choice([0.0, 0.5], shape)
    return rng.integers(-4, 4, shape) + fraction


def _away_from_zero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def _dividends(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-6.0, 6.0, shape)


def _above_minus_one(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-0.9, 3.0, shape)


# ---------------------------------------------------------------- references and VJPs


def _elementwise(function: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    """A float64 libm function applied element by element, in the operand's dtype."""
    vectorized = np.frompyfunc(function, 1, 1)

    def ref(x):
        x = np.asarray(x)
        return vectorized(x.astype(np.float64)).astype(x.dtype)
    return ref


_erf = _elementwise(math.erf)
_erfc = _elementwise(math.erfc)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z)).astype(x.dtype, copy=False)


def _log_sigmoid_ref(x):
    # min(x, 0) - log1p(exp(-|x|)): exp never overflows, so it is exact at +-1e4.
    x = np.asarray(x)
    return _same_dtype(x, np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))))


def _silu_ref(x):
    x = np.asarray(x)
    return _same_dtype(x, x * _sigmoid(x))


def _gelu_ref(x):
    # 0.5 x erfc(-x / sqrt 2), which is torch's 0.5 x (1 + erf(x / sqrt 2)) without the
    # cancellation of 1 + erf for negative x.
    x = np.asarray(x)
    return _same_dtype(x, 0.5 * x * _erfc(-x * math.sqrt(0.5)))


def _mod_ref(a, b):
    return np.mod(a, b)


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


def _vjp_zero(e, g, xs, y, **_):
    # A step function: its derivative is 0 wherever it exists.
    return (None,) * len(xs)


def _vjp_mod(e, g, xs, y):
    # a % b = a - b floor(a / b): d/da = 1, d/db = -floor(a / b) (away from the jumps).
    a, b = xs
    quotient = e(floor, e(_op("div"), a, b))
    return g, e(_op("neg"), e(_op("mul"), g, quotient))


def _vjp_clip(e, g, xs, y, lo, hi):
    # Gradient 1 on [lo, hi], bounds included (torch.clamp's), 0 outside.
    x = xs[0]
    inside = e(_op("mul"), e(_op("greater_equal"), x, _const(e, lo)),
               e(_op("less_equal"), x, _const(e, hi)))
    return (e(_op("where"), inside, g, _const(e, 0.0)),)


def _vjp_sin(e, g, xs, y):
    return (e(_op("mul"), g, e(cos, xs[0])),)


def _vjp_cos(e, g, xs, y):
    return (e(_op("neg"), e(_op("mul"), g, e(sin, xs[0]))),)


def _vjp_log_sigmoid(e, g, xs, y):
    # d/dx log sigmoid(x) = sigmoid(-x): exact in both tails.
    return (e(_op("mul"), g, e(_op("sigmoid"), e(_op("neg"), xs[0]))),)


def _vjp_silu(e, g, xs, y):
    # s (1 + x (1 - s)) with s = sigmoid(x).
    x = xs[0]
    s = e(_op("sigmoid"), x)
    inner = e(_op("add"), _const(e, 1.0),
              e(_op("mul"), x, e(_op("sub"), _const(e, 1.0), s)))
    return (e(_op("mul"), g, e(_op("mul"), s, inner)),)


def _gaussian(e, x, scale: float):
    """scale * exp(-x^2 / 2)."""
    half_square = e(_op("mul"), e(_op("mul"), x, x), _const(e, -0.5))
    return e(_op("mul"), e(_op("exp"), half_square), _const(e, scale))


def _vjp_gelu(e, g, xs, y):
    # Phi(x) + x phi(x), with Phi(x) = erfc(-x / sqrt 2) / 2.
    x = xs[0]
    cdf = e(_op("mul"), e(_op("sub"), _const(e, 1.0), e(erf, e(_op("mul"), x, _const(
        e, -math.sqrt(0.5))))), _const(e, 0.5))
    density = e(_op("mul"), x, _gaussian(e, x, 1.0 / math.sqrt(2.0 * math.pi)))
    return (e(_op("mul"), g, e(_op("add"), cdf, density)),)


def _vjp_erf(e, g, xs, y):
    # 2 / sqrt(pi) exp(-x^2), written as the Gaussian of x sqrt 2.
    scaled = e(_op("mul"), xs[0], _const(e, math.sqrt(2.0)))
    return (e(_op("mul"), g, _gaussian(e, scaled, 2.0 / math.sqrt(math.pi))),)


def _vjp_log1p(e, g, xs, y):
    return (e(_op("div"), g, e(_op("add"), xs[0], _const(e, 1.0))),)


def _vjp_expm1(e, g, xs, y):
    return (e(_op("mul"), g, e(_op("add"), y, _const(e, 1.0))),)


# ---------------------------------------------------------------- comparing and selecting
#
# Ties, where the derivative of a selection is not defined, are broken so that the cotangents
# are a subgradient and sum to the incoming one: maximum(a, b) and minimum(a, b) send the whole
# cotangent to a where a == b (the value returned is a there too); abs(x) has gradient sign(x),
# 0 at 0; comparisons are steps, 0.0/1.0 masks of the operands' dtype with no gradient.


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


def _select_first(e, g, first):
    """The cotangent to a where the mask first is 1, else to b."""
    zero = _const(e, 0.0)
    return e(_op("where"), first, g, zero), e(_op("where"), first, zero, g)


def _vjp_maximum(e, g, xs, y):
    return _select_first(e, g, e(greater_equal, *xs))


def _vjp_minimum(e, g, xs, y):
    return _select_first(e, g, e(less_equal, *xs))


def _vjp_abs(e, g, xs, y):
    x, where, neg = xs[0], _op("where"), _op("neg")
    # sign(x) * g, and 0 at x == 0 (and for NaN): neither where() branch is taken there.
    return (e(where, x, g, e(where, e(neg, x), e(neg, g), _const(e, 0.0))),)


# ---------------------------------------------------------------- the family


def _declare(name: str, arity: int, ref, vjp, doc: str, draws: tuple[Draw, ...],
             shape=elementwise_shape, **extra: Any) -> Op:
    op = register(Op(name, OpKind.ELEMENTWISE, arity, shape, ref, vjp))
    _MEMBERS.append(Member(op, doc, draws, **extra))
    return op


_MEMBERS: list[Member] = []

_BOTH = (_normal(1.0), _normal(1.0))
less = _declare("less", 2, _comparison(np.less), _vjp_zero,
                "``a < b`` as 1.0 or 0.0 (elementwise, broadcasting); no gradient.", _BOTH)
less_equal = _declare("less_equal", 2, _comparison(np.less_equal), _vjp_zero,
                      "``a <= b`` as 1.0 or 0.0 (elementwise, broadcasting); no gradient.", _BOTH)
greater = _declare("greater", 2, _comparison(np.greater), _vjp_zero,
                   "``a > b`` as 1.0 or 0.0 (elementwise, broadcasting); no gradient.", _BOTH)
greater_equal = _declare("greater_equal", 2, _comparison(np.greater_equal), _vjp_zero,
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
                (_away_from_zero,))
floor = _declare("floor", 1, np.floor, _vjp_zero,
                 "Elementwise floor, the largest integer ``<= x``; its gradient is 0.",
                 (_off_integers,))
round_ = _declare("round", 1, np.round, _vjp_zero,
                  "Elementwise rounding to the nearest integer, halves to even like NumPy and "
                  "torch (``round(2.5) = 2``); its gradient is 0.", (_off_integers,))
mod = _declare("mod", 2, _mod_ref, _vjp_mod,
               "``a % b`` with the sign of ``b``, like Python and NumPy (``-1 % 3 = 2``); "
               "also ``a % b`` on traced values. Gradients 1 for ``a``, ``-floor(a / b)`` "
               "for ``b``.", (_dividends, _away_from_zero))
floor_divide = _declare("floor_divide", 2, np.floor_divide, _vjp_zero,
                        "``a // b`` as Python and NumPy compute it, ``(a - a % b) / b`` rounded "
                        "to an integer (``1 // 0.1 = 9``, where ``floor(1 / 0.1) = 10``); also "
                        "``a // b`` on traced values. Its gradient is 0.",
                        (_dividends, _away_from_zero))
clip = _declare("clip", 1, _clip_ref, _vjp_clip,
                "``x`` limited to ``[lo, hi]`` (constant numbers, ``lo <= hi``); its gradient "
                "is 1 on ``[lo, hi]``, bounds included like ``torch.clamp``, 0 outside.",
                (_off_integers,), shape=_clip_shape, attributes=("lo", "hi"),
                test_attrs={"lo": -1.0, "hi": 2.0})
sin = _declare("sin", 1, np.sin, _vjp_sin, "Elementwise sine (radians).", (_normal(3.0),))
cos = _declare("cos", 1, np.cos, _vjp_cos, "Elementwise cosine (radians).", (_normal(3.0),))
log_sigmoid = _declare("log_sigmoid", 1, _log_sigmoid_ref, _vjp_log_sigmoid,
                       "``log(sigmoid(x))`` as ``min(x, 0) - log1p(exp(-|x|))``: finite and "
                       "exact for large ``|x|``; its gradient is ``sigmoid(-x)``.",
                       (_normal(4.0),))
silu = _declare("silu", 1, _silu_ref, _vjp_silu,
                "``x * sigmoid(x)`` (SiLU, swish).", (_normal(3.0),))
gelu = _declare("gelu", 1, _gelu_ref, _vjp_gelu,
                "``x * Phi(x)`` with the exact normal CDF, ``0.5 x (1 + erf(x / sqrt 2))`` "
                "(torch's default GELU).", (_normal(3.0),))
erf = _declare("erf", 1, _erf, _vjp_erf, "Elementwise error function.", (_normal(1.5),))
log1p = _declare("log1p", 1, np.log1p, _vjp_log1p,
                 "``log(1 + x)``, accurate for small ``x``.", (_above_minus_one,))
expm1 = _declare("expm1", 1, np.expm1, _vjp_expm1,
                 "``exp(x) - 1``, accurate for small ``x``.", (_normal(2.0),))

FAMILY: tuple[Member, ...] = tuple(_MEMBERS)
MEMBERS: dict[str, Member] = {m.op.name: m for m in FAMILY}
