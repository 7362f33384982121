"""CUDA rules: one C expression per primitive, rendered at one element of the result.

A rule receives a :class:`Site`, the place in a kernel where one element of a node's result is
computed, and returns a C expression for that element. ``site.at(i)`` is operand ``i`` at the
same element (after broadcasting), ``site.at(i, col=...)`` at another column, and
``site.loop(count, term)`` accumulates ``term(k)`` over ``k < count`` (reductions). Operands are
emitted as named temporaries before the expression that uses them, so evaluation order is the
rule's reading order. Every layout op has the same rule,
:func:`rnnc.backends.cuda.pieces.layout_rule`, which reads the op's index rule (``Op.pieces``):
a new layout op needs nothing here.

The renderers follow tinygrad's ``cstyle``: :class:`CStyleRenderer` knows C (types, literals,
math function names, small helper functions) and :class:`CudaRenderer` overrides only what
differs on the GPU (qualifiers, the fast ``__expf`` inside sigmoid).

Numerics, chosen to match the NumPy reference without fast-math flags:

- ``sigmoid`` splits on the sign like the reference, ``e = exp(-|x|)``, ``x >= 0 ? 1/(1+e) :
  e/(1+e)``: never overflows, is exactly 0 or 1 at saturation and NaN only for NaN input. On
  the GPU the float version uses ``__expf`` (2 ulp, its argument is never positive so it
  cannot overflow; results below the float normal range flush to 0). Double uses ``exp``.
- ``tanh`` is ``tanhf``/``tanh``: saturates to ±1 and is accurate near 0, where the
  ``1 - 2/(exp(2x)+1)`` shortcut cancels.
- ``rsqrt`` is ``1 / sqrt(x)`` (correctly rounded, like the reference); ``relu`` keeps NaN
  like ``np.maximum``; ``where`` tests ``c > 0`` like the reference; ``x ** p`` is C's ``pow``
  (``x ** ±0.5`` a square root with pow's values at -0 and -inf).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from rnnc import ops, philox
from rnnc import ops_compare as compare
from rnnc import ops_elementwise as elementwise
from rnnc.backends.cuda import tensor
from rnnc.backends.cuda.pieces import layout_rule


class Site(Protocol):
    """Where a rule renders: one element of one node's result inside a kernel."""

    r: CStyleRenderer
    attrs: dict
    arity: int
    col: str
    row: str

    def at(self, i: int, row: str | None = None, col: str | None = None) -> str:
        """Operand ``i`` at this element, or at ``row``/``col`` of the operand's own shape."""

    def width(self, i: int) -> int:
        """The last dimension of operand ``i`` (1 for a scalar)."""

    def rows(self, i: int) -> str:
        """The number of rows of operand ``i`` (the product of its leading dims) as C."""

    def loop(self, count: str, term: Callable[[str], str],
             combine: Callable[[str, str], str] | None = None, init: str | None = None) -> str:
        """A temporary holding the sum of ``term(k)`` for ``k`` in ``0..count``; with
        ``combine``, ``acc = combine(acc, term(k))`` folded from ``init`` instead."""


class CStyleRenderer:
    """C for one floating type (``"f32"`` or ``"f64"``): literals, calls, helper functions."""

    qualifier = "static inline"
    # C99's math functions a rule may call by name (CUDA has each in float and double); any
    # other name is a helper rnnc_<name> of the prelude.
    functions = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "pow",
                 "hypot", "fabs", "floor", "ceil", "trunc", "rint", "fmod", "copysign", "sin",
                 "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh",
                 "acosh", "atanh", "erf", "erfc", "lgamma", "tgamma")

    def __init__(self, dtype: str) -> None:
        assert dtype in ("f32", "f64"), dtype
        self.dtype = dtype
        self.ctype = "float" if dtype == "f32" else "double"
        self.zero = self.literal(0.0)
        self.one = self.literal(1.0)

    def literal(self, value: float) -> str:
        """``value`` as a C literal of this type, exact for the type (inf/NaN as 1/0, 0/0)."""
        value = float(value)
        suffix = "f" if self.dtype == "f32" else ""
        if math.isnan(value) or math.isinf(value):
            numerator = "0.0" if math.isnan(value) else "1.0" if value > 0 else "-1.0"
            return f"({numerator}{suffix} / 0.0{suffix})"
        text = _floatish(f"{value:.9g}" if self.dtype == "f32" else repr(value)) + suffix
        return f"({text})" if value < 0 else text

    def call(self, function: str, *args: str) -> str:
        """A math function call: ``exp`` is ``expf`` for float; helpers are overloaded."""
        if function in self.functions and self.dtype == "f32":
            function += "f"
        elif function not in self.functions:
            function = f"rnnc_{function}"
        return f"{function}({', '.join(args)})"

    def exp_in_sigmoid(self, x: str) -> str:
        """exp(x) for x <= 0 inside sigmoid."""
        return self.call("exp", x)

    def prelude(self) -> str:
        """Helper functions the rules call, for this type."""
        t, q = self.ctype, self.qualifier
        fabs = "fabsf" if self.dtype == "f32" else "fabs"
        return (
            f"{q} {t} rnnc_sigmoid({t} x) {{\n"
            f"    const {t} e = {self.exp_in_sigmoid(f'-{fabs}(x)')};\n"
            f"    const {t} s = {self.one} / ({self.one} + e);\n"
            f"    return x >= {self.zero} ? s : e * s;\n"
            f"}}\n"
            f"{q} {t} rnnc_softplus({t} x) {{\n"
            f"    const {t} tail = {self.call('log1p', self.call('exp', f'-{fabs}(x)'))};\n"
            f"    return (x < {self.zero} ? {self.zero} : x) + tail;\n"
            f"}}\n"
            f"{q} long long rnnc_clamp(long long v, long long lo, long long hi) {{\n"
            f"    return v < lo ? lo : (v > hi ? hi : v);\n"
            f"}}\n"
            f"{q} long long rnnc_max(long long a, long long b) {{ return a > b ? a : b; }}\n"
            + self.elementwise_helpers() + self.bernoulli_helper()
        )

    def elementwise_helpers(self) -> str:
        """The elementwise family's helpers: NumPy's floor-mod (fmod moved by ``b`` when the
        signs differ, a zero taking ``b``'s sign) and floor division (NumPy's npy_divmod),
        log_sigmoid, GELU and SiLU written as their references are."""
        t, q, zero, one = self.ctype, self.qualifier, self.zero, self.one
        fmod, fabs = self.call("fmod", "a", "b"), self.call("fabs", "x")
        return (
            f"{q} {t} rnnc_mod({t} a, {t} b) {{\n"
            f"    const {t} r = {fmod};\n"
            f"    if (r == {zero}) return {self.call('copysign', zero, 'b')};\n"
            f"    return ((r < {zero}) != (b < {zero})) ? r + b : r;\n"
            f"}}\n"
            f"{q} {t} rnnc_floor_divide({t} a, {t} b) {{\n"
            f"    if (b == {zero}) return a / b;\n"
            f"    const {t} r = {fmod};\n"
            f"    {t} q = (a - r) / b;\n"
            f"    if (r != {zero} && ((r < {zero}) != (b < {zero}))) q -= {one};\n"
            f"    if (q == {zero}) return {self.call('copysign', zero, 'a / b')};\n"
            f"    const {t} f = {self.call('floor', 'q')};\n"
            f"    return q - f > {self.literal(0.5)} ? f + {one} : f;\n"
            f"}}\n"
            f"{q} {t} rnnc_log_sigmoid({t} x) {{\n"
            f"    const {t} tail = {self.call('log1p', self.call('exp', f'-{fabs}'))};\n"
            f"    return (x > {zero} ? {zero} : x) - tail;\n"
            f"}}\n"
            f"{q} {t} rnnc_gelu({t} x) {{\n"
            f"    return {self.literal(0.5)} * x * "
            f"{self.call('erfc', f'x * {self.literal(-math.sqrt(0.5))}')};\n"
            f"}}\n"
            f"{q} {t} rnnc_silu({t} x) {{ return x * rnnc_sigmoid(x); }}\n"
        )

    def bernoulli_helper(self) -> str:
        """``rnnc_bernoulli``: Philox4x32-10 of one mask element (``rnnc.philox``) from the
        key's and its counter row's 16-bit halves, its column, the op's attributes and the
        threshold; 1.0 where the first word is below it."""
        t, q, u = self.ctype, self.qualifier, "unsigned int"
        halves = ", ".join(f"{t} {n}" for n in ("k0l", "k0h", "k1l", "k1h", "tl", "th", "bl", "bh"))

        def word(low: str, high: str) -> str:
            return f"(({u}){low} | (({u}){high} << 16))"

        return (
            f"{q} {t} rnnc_bernoulli({halves}, long long col, {u} size, {u} stream,\n"
            f"        int per_step, unsigned long long limit) {{\n"
            f"    {u} k0 = {word('k0l', 'k0h')}, k1 = {word('k1l', 'k1h')};\n"
            f"    {u} c0 = {word('bl', 'bh')} * size + ({u})col;\n"
            f"    {u} c1 = per_step ? {word('tl', 'th')} : 0u, c2 = stream, c3 = 0u;\n"
            f"    for (int r = 0; r < {philox.ROUNDS}; ++r) {{\n"
            f"        if (r) {{ k0 += {philox.W0:#x}u; k1 += {philox.W1:#x}u; }}\n"
            f"        const {u} hi0 = __umulhi({philox.M0:#x}u, c0), lo0 = {philox.M0:#x}u * c0;\n"
            f"        const {u} hi1 = __umulhi({philox.M1:#x}u, c2), lo1 = {philox.M1:#x}u * c2;\n"
            f"        c0 = hi1 ^ c1 ^ k0;\n"
            f"        c1 = lo1;\n"
            f"        c2 = hi0 ^ c3 ^ k1;\n"
            f"        c3 = lo0;\n"
            f"    }}\n"
            f"    return (unsigned long long)c0 < limit ? {self.one} : {self.zero};\n"
            f"}}\n"
        )


class CudaRenderer(CStyleRenderer):
    """CUDA C: device helpers, and the fast exponential where it is safe."""

    qualifier = "__device__ __forceinline__"

    def exp_in_sigmoid(self, x: str) -> str:
        # __expf of a non-positive argument cannot overflow; 2 ulp is far below the tolerance.
        return f"__expf({x})" if self.dtype == "f32" else f"exp({x})"


def _floatish(text: str) -> str:
    """A decimal that C reads as floating point: ``1`` becomes ``1.0``."""
    return text if any(c in text for c in ".eEn") else text + ".0"


def _binary(symbol: str) -> Callable[[Site], str]:
    return lambda s: f"({s.at(0)} {symbol} {s.at(1)})"


def _function(name: str) -> Callable[[Site], str]:
    return lambda s: s.r.call(name, s.at(0))


def _relu(s: Site) -> str:
    x = s.at(0)
    return f"({x} < {s.r.zero} ? {s.r.zero} : {x})"


def _power(s: Site) -> str:
    """C's ``pow``; ``x ** ±0.5`` by a square root, with pow's values where sqrt's differ
    (+0 at -0: ``x + 0`` is +0 there; inf or 0 at -inf)."""
    x, p = s.at(0), s.attrs["exponent"]
    if p not in (0.5, -0.5):
        return s.r.call("pow", x, s.r.literal(p))
    root = s.r.call("sqrt", f"({x} + {s.r.zero})")
    at_minus_inf = s.r.literal(math.inf if p > 0 else 0.0)
    value = root if p > 0 else f"({s.r.one} / {root})"
    return f"({x} == {s.r.literal(-math.inf)} ? {at_minus_inf} : {value})"


def _comparison(symbol: str) -> Callable[[Site], str]:
    # C's comparisons are ordered: with NaN they are false, 0.0, as in NumPy.
    return lambda s: f"({s.at(0)} {symbol} {s.at(1)} ? {s.r.one} : {s.r.zero})"


def _select_first(symbol: str) -> Callable[[Site], str]:
    """``a symbol b ? a : b``, NaN if either is: maximum (">=") and minimum ("<=")."""
    def rule(s: Site) -> str:
        a, b = s.at(0), s.at(1)
        return f"(({a} {symbol} {b} || {a} != {a}) ? {a} : {b})"
    return rule


def _extreme(symbol: str) -> Callable[[Site], str]:
    """amax (">") and amin ("<") over the feature axis; NaN once any element is NaN."""
    def rule(s: Site) -> str:
        start = s.r.literal(-math.inf if symbol == ">" else math.inf)
        return s.loop(str(s.width(0)), lambda k: s.at(0, col=k),
                      lambda acc, x: f"({x} {symbol} {acc} || {x} != {x}) ? {x} : {acc}", start)
    return rule


def _clip(s: Site) -> str:
    # Ordered compares keep NaN, as np.clip does.
    x, lo, hi = s.at(0), s.r.literal(s.attrs["lo"]), s.r.literal(s.attrs["hi"])
    return f"({x} < {lo} ? {lo} : ({x} > {hi} ? {hi} : {x}))"


def _where(s: Site) -> str:
    return f"({s.at(0)} > {s.r.zero} ? {s.at(1)} : {s.at(2)})"


def _bernoulli(s: Site) -> str:
    """A mask element: the key, its counter row, its column and the op's attributes."""
    key = [s.at(0, col=str(k)) for k in range(4)]
    counter = [s.at(1, col=str(k)) for k in range(4)]
    a = s.attrs
    return s.r.call("bernoulli", *key, *counter, s.col, f"{a['size']}u", f"{a['stream']}u",
                    "1" if a["per"] == "step" else "0", f"{philox.threshold(a['p'])}ULL")


def _sum(s: Site) -> str:
    return s.loop(str(s.width(0)), lambda k: s.at(0, col=k))


def _mean(s: Site) -> str:
    return f"({_sum(s)} / {s.r.literal(s.width(0))})"


def _sum_rows(s: Site) -> str:
    return s.loop(s.rows(0), lambda k: s.at(0, row=k, col=s.col))


def _matmul(s: Site) -> str:
    # The element-level meaning of matmul; codegen sends GEMMs to cuBLAS instead.
    if s.attrs.get("transpose_a"):
        return s.loop(s.rows(0), lambda k: f"({s.at(0, row=k, col=s.row)} * "
                                           f"{s.at(1, row=k, col=s.col)})")
    if s.attrs.get("transpose_b"):
        return s.loop(str(s.width(0)), lambda k: f"({s.at(0, col=k)} * "
                                                 f"{s.at(1, row=s.col, col=k)})")
    return s.loop(str(s.width(0)), lambda k: f"({s.at(0, col=k)} * {s.at(1, row=k, col=s.col)})")


RULES: dict[ops.Op, Callable[[Site], str]] = {
    ops.add: _binary("+"),
    ops.sub: _binary("-"),
    ops.mul: _binary("*"),
    ops.div: _binary("/"),
    ops.neg: lambda s: f"(-{s.at(0)})",
    ops.exp: _function("exp"),
    ops.log: _function("log"),
    ops.tanh: _function("tanh"),
    ops.sigmoid: _function("sigmoid"),
    ops.relu: _relu,
    ops.sqrt: _function("sqrt"),
    ops.rsqrt: lambda s: f"({s.r.one} / {s.r.call('sqrt', s.at(0))})",
    ops.where: _where,
    ops.less: _comparison("<"),
    ops.less_equal: _comparison("<="),
    ops.greater: _comparison(">"),
    ops.greater_equal: _comparison(">="),
    ops.maximum: _select_first(">="),
    ops.minimum: _select_first("<="),
    ops.abs_: _function("fabs"),
    ops.power: _power,
    ops.softplus: _function("softplus"),
    ops.stop_gradient: lambda s: s.at(0),
    ops.bernoulli: _bernoulli,
    elementwise.floor: _function("floor"),
    elementwise.round_: _function("rint"),  # the default rounding mode: halves to even
    elementwise.mod: lambda s: s.r.call("mod", s.at(0), s.at(1)),
    elementwise.floor_divide: lambda s: s.r.call("floor_divide", s.at(0), s.at(1)),
    compare.clip: _clip,
    elementwise.sin: _function("sin"),
    elementwise.cos: _function("cos"),
    elementwise.log_sigmoid: _function("log_sigmoid"),
    elementwise.silu: _function("silu"),
    elementwise.gelu: _function("gelu"),
    elementwise.erf: _function("erf"),
    elementwise.log1p: _function("log1p"),
    elementwise.expm1: _function("expm1"),
    ops.matmul: _matmul,
    ops.sum_: _sum,
    ops.mean: _mean,
    ops.amax: _extreme(">"),
    ops.amin: _extreme("<"),
    ops.sum_rows: _sum_rows,
    ops.constant: lambda s: s.r.literal(s.attrs["value"]),
    **{op: layout_rule(op) for op in ops.PRIMITIVES if op.kind is ops.OpKind.LAYOUT},
    **tensor.RULES,  # reshape, sums over inner axes, einsum: rnnc/ops_tensor.py
}
