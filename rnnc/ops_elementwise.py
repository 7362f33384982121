"""The elementwise family: each op declared once with its shape rule, NumPy reference, VJP,
DSL docstring and the operands its tests draw; :data:`FAMILY` is the family's table.

An elementwise op reads element j of each operand (after broadcasting) to make element j of its
result. The arithmetic and the functions are declared here, the comparing and selecting ops in
``rnnc.ops_compare``. Adding one means one ``_declare`` here (or there), one entry in
``rnnc/backends/llvm/scalar.py`` (``SCALAR``) and one in ``rnnc/backends/cuda/rules.py``
(``RULES``); nothing else names it. ``rnnc.ops`` collects the op, ``rnnc.dsl`` makes it a
function ``rnnc.<name>`` with the docstring below, the NumPy backend runs its reference, and the
tests (``tests/rnnc/test_elementwise_family.py``,
``tests/backends/test_elementwise_family_backends.py``) check its shape rule, its VJP against
float64 central differences and every backend against its reference by iterating over
``DRAWN``, the members with operand draws; ``tests/backends/test_op_families.py`` checks that
every member has its two backend rules, a docstring and its DSL function.

A VJP rule receives an emitter ``e`` (``e(op, *inputs, **attrs) -> value``), the cotangent
``g`` of the result, the inputs ``xs``, the result ``y`` and the attributes; it returns one
cotangent per input, at the shape of the result (None: the gradient is zero everywhere it
exists, as for ``floor``); the autodiff transform reduces broadcast cotangents back to the
input's shape. A rule names the ops of its own module directly and those of another family
through ``op_named``, looked up when the rule runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from rnnc import ops_compare
from rnnc.op_types import (
    Member,
    Op,
    OpKind,
    away_from_zero,
    const,
    declare_elementwise,
    normal,
    off_integers,
    register,
)
from rnnc.ops_compare import vjp_zero


def _same_dtype(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.asarray(y).astype(np.asarray(x).dtype, copy=False)


def _dividends(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-6.0, 6.0, shape)


def _above_minus_one(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-0.9, 3.0, shape)


# ---------------------------------------------------------------- arithmetic


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split on sign so exp never overflows; the result is exact at saturation.
    with np.errstate(over="ignore"):
        z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z)).astype(x.dtype, copy=False)


def _power_ref(x, exponent: float):
    """C99 ``pow(x, exponent)``: NumPy's, except that NumPy computes ``x ** 0.5`` as ``sqrt(x)``,
    which gives -0 at -0 and NaN at -inf where ``pow`` gives +0 and +inf."""
    x = np.asarray(x)
    out = np.power(x, np.asarray(exponent, x.dtype))
    if exponent == 0.5:
        out = np.where(x == -np.inf, np.asarray(np.inf, x.dtype), out + x.dtype.type(0.0))
    return out


def _softplus_ref(x):
    # max(x, 0) + log1p(exp(-|x|)): exp never overflows and large |x| keeps full precision.
    x = np.asarray(x)
    return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(x.dtype, copy=False)


def _constant_ref(value: float, dtype=np.float64):
    return np.asarray(value, dtype=dtype)


def _vjp_add(e, g, xs, y):
    return g, g


def _vjp_sub(e, g, xs, y):
    return g, e(neg, g)


def _vjp_mul(e, g, xs, y):
    a, b = xs
    return e(mul, g, b), e(mul, g, a)


def _vjp_div(e, g, xs, y):
    a, b = xs
    ga = e(div, g, b)
    return ga, e(neg, e(mul, ga, y))


def _vjp_neg(e, g, xs, y):
    return (e(neg, g),)


def _vjp_exp(e, g, xs, y):
    return (e(mul, g, y),)


def _vjp_log(e, g, xs, y):
    return (e(div, g, xs[0]),)


def _vjp_tanh(e, g, xs, y):
    return (e(mul, g, e(sub, const(e, 1.0), e(mul, y, y))),)


def _vjp_sigmoid(e, g, xs, y):
    return (e(mul, g, e(mul, y, e(sub, const(e, 1.0), y))),)


def _vjp_sqrt(e, g, xs, y):
    return (e(div, e(mul, g, const(e, 0.5)), y),)


def _vjp_rsqrt(e, g, xs, y):
    return (e(mul, g, e(mul, const(e, -0.5), e(mul, y, e(mul, y, y)))),)


def _vjp_power(e, g, xs, y, exponent):
    # p * x^(p-1), not p * y / x, which is 0/0 at x = 0.
    slope = e(power, xs[0], exponent=exponent - 1.0)
    return (e(mul, g, e(mul, slope, const(e, exponent))),)


def _vjp_softplus(e, g, xs, y):
    return (e(mul, g, e(sigmoid, xs[0])),)


def _vjp_stop_gradient(e, g, xs, y):
    return (None,)


def _vjp_constant(e, g, xs, y, value):
    return ()


# ---------------------------------------------------------------- functions

def _libm(function: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    """A float64 libm function applied element by element, in the operand's dtype."""
    vectorized = np.frompyfunc(function, 1, 1)

    def ref(x):
        x = np.asarray(x)
        return vectorized(x.astype(np.float64)).astype(x.dtype)
    return ref


_erf = _libm(math.erf)
_erfc = _libm(math.erfc)


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


def _vjp_mod(e, g, xs, y):
    # a % b = a - b floor(a / b): d/da = 1, d/db = -floor(a / b) (away from the jumps).
    a, b = xs
    quotient = e(floor, e(div, a, b))
    return g, e(neg, e(mul, g, quotient))


def _vjp_sin(e, g, xs, y):
    return (e(mul, g, e(cos, xs[0])),)


def _vjp_cos(e, g, xs, y):
    return (e(neg, e(mul, g, e(sin, xs[0]))),)


def _vjp_log_sigmoid(e, g, xs, y):
    # d/dx log sigmoid(x) = sigmoid(-x): exact in both tails.
    return (e(mul, g, e(sigmoid, e(neg, xs[0]))),)


def _vjp_silu(e, g, xs, y):
    # s (1 + x (1 - s)) with s = sigmoid(x).
    x = xs[0]
    s = e(sigmoid, x)
    inner = e(add, const(e, 1.0), e(mul, x, e(sub, const(e, 1.0), s)))
    return (e(mul, g, e(mul, s, inner)),)


def _gaussian(e, x, scale: float):
    """scale * exp(-x^2 / 2)."""
    half_square = e(mul, e(mul, x, x), const(e, -0.5))
    return e(mul, e(exp, half_square), const(e, scale))


def _vjp_gelu(e, g, xs, y):
    # Phi(x) + x phi(x), with Phi(x) = erfc(-x / sqrt 2) / 2.
    x = xs[0]
    cdf = e(mul, e(sub, const(e, 1.0), e(erf, e(mul, x, const(e, -math.sqrt(0.5))))),
            const(e, 0.5))
    density = e(mul, x, _gaussian(e, x, 1.0 / math.sqrt(2.0 * math.pi)))
    return (e(mul, g, e(add, cdf, density)),)


def _vjp_erf(e, g, xs, y):
    # 2 / sqrt(pi) exp(-x^2), written as the Gaussian of x sqrt 2.
    scaled = e(mul, xs[0], const(e, math.sqrt(2.0)))
    return (e(mul, g, _gaussian(e, scaled, 2.0 / math.sqrt(math.pi))),)


def _vjp_log1p(e, g, xs, y):
    return (e(div, g, e(add, xs[0], const(e, 1.0))),)


def _vjp_expm1(e, g, xs, y):
    return (e(mul, g, e(add, y, const(e, 1.0))),)


# ---------------------------------------------------------------- the family


_MEMBERS: list[Member] = []
_declare = functools.partial(declare_elementwise, _MEMBERS)

# Written as operators on values (+ - * / unary - **), so no DSL function of their own.
_OPERATOR = {"dsl_function": False}
add = _declare("add", 2, np.add, _vjp_add, "``a + b``.", **_OPERATOR)
sub = _declare("sub", 2, np.subtract, _vjp_sub, "``a - b``.", **_OPERATOR)
mul = _declare("mul", 2, np.multiply, _vjp_mul, "``a * b``.", **_OPERATOR)
div = _declare("div", 2, np.divide, _vjp_div, "``a / b``.", **_OPERATOR)
neg = _declare("neg", 1, np.negative, _vjp_neg, "``-x``.", **_OPERATOR)
# attribute: exponent, a float (x ** p for a constant Python number p).
power = _declare("power", 1, _power_ref, _vjp_power, "``x ** exponent``, C99's ``pow``.",
                 **_OPERATOR)
exp = _declare("exp", 1, np.exp, _vjp_exp, "Elementwise exp.")
log = _declare("log", 1, np.log, _vjp_log, "Elementwise log.")
tanh = _declare("tanh", 1, np.tanh, _vjp_tanh, "Elementwise tanh.")
sigmoid = _declare("sigmoid", 1, _sigmoid, _vjp_sigmoid, "Elementwise sigmoid.")
sqrt = _declare("sqrt", 1, np.sqrt, _vjp_sqrt, "Elementwise sqrt.")
rsqrt = _declare("rsqrt", 1, lambda x: 1 / np.sqrt(x), _vjp_rsqrt, "Elementwise rsqrt.")
softplus = _declare("softplus", 1, _softplus_ref, _vjp_softplus,
                    "``log(1 + exp(x))``, computed without overflow; its gradient is "
                    "sigmoid(x).")
# The identity, with no gradient: what autodiff must treat as a constant.
stop_gradient = _declare("stop_gradient", 1, lambda x: np.array(x, copy=True),
                         _vjp_stop_gradient,
                         "``x`` itself, with no gradient: autodiff treats it as a constant.")
floor = _declare("floor", 1, np.floor, vjp_zero,
                 "Elementwise floor, the largest integer ``<= x``; its gradient is 0.",
                 (off_integers,))
round_ = _declare("round", 1, np.round, vjp_zero,
                  "Elementwise rounding to the nearest integer, halves to even like NumPy and "
                  "torch (``round(2.5) = 2``); its gradient is 0.", (off_integers,))
mod = _declare("mod", 2, np.mod, _vjp_mod,
               "``a % b`` with the sign of ``b``, like Python and NumPy (``-1 % 3 = 2``); "
               "also ``a % b`` on traced values. Gradients 1 for ``a``, ``-floor(a / b)`` "
               "for ``b``.", (_dividends, away_from_zero))
floor_divide = _declare("floor_divide", 2, np.floor_divide, vjp_zero,
                        "``a // b`` as Python and NumPy compute it, ``(a - a % b) / b`` rounded "
                        "to an integer (``1 // 0.1 = 9``, where ``floor(1 / 0.1) = 10``); also "
                        "``a // b`` on traced values. Its gradient is 0.",
                        (_dividends, away_from_zero))
sin = _declare("sin", 1, np.sin, _vjp_sin, "Elementwise sine (radians).", (normal(3.0),))
cos = _declare("cos", 1, np.cos, _vjp_cos, "Elementwise cosine (radians).", (normal(3.0),))
log_sigmoid = _declare("log_sigmoid", 1, _log_sigmoid_ref, _vjp_log_sigmoid,
                       "``log(sigmoid(x))`` as ``min(x, 0) - log1p(exp(-|x|))``: finite and "
                       "exact for large ``|x|``; its gradient is ``sigmoid(-x)``.",
                       (normal(4.0),))
silu = _declare("silu", 1, _silu_ref, _vjp_silu,
                "``x * sigmoid(x)`` (SiLU, swish).", (normal(3.0),))
gelu = _declare("gelu", 1, _gelu_ref, _vjp_gelu,
                "``x * Phi(x)`` with the exact normal CDF, ``0.5 x (1 + erf(x / sqrt 2))`` "
                "(torch's default GELU).", (normal(3.0),))
erf = _declare("erf", 1, _erf, _vjp_erf, "Elementwise error function.", (normal(1.5),))
log1p = _declare("log1p", 1, np.log1p, _vjp_log1p,
                 "``log(1 + x)``, accurate for small ``x``.", (_above_minus_one,))
expm1 = _declare("expm1", 1, np.expm1, _vjp_expm1,
                 "``exp(x) - 1``, accurate for small ``x``.", (normal(2.0),))

# A Python number in a cell (and every constant a VJP rule emits): a source, not a member.
constant = register(Op("constant", OpKind.SOURCE, 0, lambda value: (), _constant_ref,
                       _vjp_constant, doc="A constant scalar.", dsl_function=False))

# The family's table: the comparing and selecting ops first, then the rest in declaration order.
FAMILY: tuple[Member, ...] = (*ops_compare.DECLARED, *_MEMBERS)
MEMBERS: dict[str, Member] = {m.op.name: m for m in FAMILY}
# The members the table-driven tests run (those with operand draws; see Member).
DRAWN: tuple[Member, ...] = tuple(m for m in FAMILY if m.draws)
