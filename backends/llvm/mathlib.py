"""Vectorizable exp, log, tanh and sigmoid written directly in LLVM IR (and from them log1p,
softplus, whose error the table does not bound, and powers, in ``powers.py``).

LLVM lowers its own ``llvm.exp``/``llvm.log`` intrinsics to scalar libm calls,
which stops the loop vectorizer. These emitters build the functions from plain
arithmetic, compares, selects, integer bit operations and the ``llvm.fabs``,
``llvm.minnum``, ``llvm.maxnum`` and ``llvm.fmuladd`` intrinsics, all of which
have vector forms, so a loop that applies them becomes one ``<16 x float>`` (or
``<8 x double>``) body on AVX-512.

Every emitter takes a value of type ``float``, ``double`` or a vector of those and
returns a value of the same type. No fast-math flags are set: they would let LLVM
fold away the NaN and infinity handling, and the loop vectorizes without them.

Maximum error measured against a float64 (for float32) or longdouble (for
float64) reference, over every 997th float32 bit pattern or a million random
float64 bit patterns, dense samples of each function's working range, and the
special and threshold values (``tests/backends/test_llvm_mathlib.py``, which
asserts the bound column). Errors are in ULP of the target type at the exact
value; denormal results count in units of the smallest denormal.

=========  ================  ================  =========
function   float32 measured  float64 measured  bound
=========  ================  ================  =========
exp        0.86 ULP          0.86 ULP          1 ULP
log        0.79 ULP          0.77 ULP          1 ULP
tanh       1.36 ULP          1.32 ULP          1.5 ULP
sigmoid    2.08 ULP          2.39 ULP          2.5 ULP
x ** p     0.50 ULP          1.49 ULP          2 ULP
=========  ================  ================  =========

``x ** p`` is measured for p in 1.5, 2.5, -1.5, 1/3, -2.7, 0.1, 7.25 and ±0.5 (an integer p up
to 64 is a chain of products instead; past 64 the error grows with p, to about 5 ULP at 65).

Special values: ``exp(+inf) = +inf``, ``exp(-inf) = 0``, overflow gives ``+inf`` and
underflow gives denormals then ``0``; ``log(±0) = -inf``, ``log(x < 0) = NaN``,
``log(+inf) = +inf``, denormal inputs are rescaled, not flushed; ``tanh`` returns exactly
``±1`` once the true value rounds there and keeps ``-0``; ``sigmoid`` is never NaN
for a non-NaN input, lies in ``[0, 1]``, and keeps relative accuracy for large
negative inputs (it is ``exp(x)/(1+exp(x))`` there, so denormal results appear);
``x ** p`` has C99 ``pow``'s values. NaN inputs give NaN everywhere (but ``1 ** p`` is 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

__all__ = ["Emitter", "emit_exp", "emit_log", "emit_log1p", "emit_sigmoid", "emit_softplus",
           "emit_tanh", "exp_value", "intrinsic", "log_reduced", "vector_width"]


@dataclass(frozen=True)
class _Format:
    """Bit layout and constants of one IEEE binary format."""

    bits: int
    mantissa_bits: int
    bias: int
    # exp: clamping keeps the reduced exponent inside two normal scale factors;
    # outside these bounds the result is +inf or 0 whatever the clamped input.
    exp_low: float
    exp_high: float
    ln2_high: float
    ln2_low: float
    exp_poly: tuple[float, ...]
    # log: musl's split of ln 2 and the Lg coefficients of log1p on the reduced range.
    log_ln2_high: float
    log_ln2_low: float
    log_even: tuple[float, ...]
    log_odd: tuple[float, ...]
    smallest_normal: float
    sqrt_half_bits: int


_F32 = _Format(
    bits=32,
    mantissa_bits=23,
    bias=127,
    exp_low=-104.0,
    exp_high=89.0,
    ln2_high=0.693359375,
    ln2_low=-2.12194440e-4,
    # Cephes expf: exp(r) = 1 + r + r^2 * P(r) on |r| <= ln2/2; coefficients of P,
    # highest degree first.
    exp_poly=(
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    ),
    log_ln2_high=6.9313812256e-01,
    log_ln2_low=9.0580006145e-06,
    log_even=(0.40000972152, 0.24279078841),
    log_odd=(0.66666662693, 0.28498786688),
    smallest_normal=2.0**-126,
    sqrt_half_bits=0x3F3504F3,
)

_F64 = _Format(
    bits=64,
    mantissa_bits=52,
    bias=1023,
    exp_low=-746.0,
    exp_high=710.0,
    ln2_high=6.93147180369123816490e-01,
    ln2_low=1.90821492927058770002e-10,
    # Taylor coefficients 1/j! for j = 13 .. 2; the truncation error at |r| = ln2/2 is
    # below 1e-17, a tenth of a float64 ULP.
    exp_poly=tuple(1.0 / math.factorial(j) for j in range(13, 1, -1)),
    log_ln2_high=6.93147180369123816490e-01,
    log_ln2_low=1.90821492927058770002e-10,
    log_even=(
        3.999999999940941908e-01,
        2.222219843214978396e-01,
        1.531383769920937332e-01,
    ),
    log_odd=(
        6.666666666666735130e-01,
        2.857142874366239149e-01,
        1.818357216161805012e-01,
        1.479819860511658591e-01,
    ),
    smallest_normal=2.0**-1022,
    sqrt_half_bits=0x3FE6A09E667F3BCD,
)


def vector_width(dtype_bits: int) -> int:
    """Return the number of lanes of a 512-bit (AVX-512) vector of this float width."""
    if dtype_bits not in (32, 64):
        raise ValueError(f"dtype_bits must be 32 or 64, got {dtype_bits}")
    return 512 // dtype_bits


def intrinsic(module: ir.Module, name: str, type_: ir.Type, arity: int) -> ir.Function:
    """The declaration of ``llvm.<name>`` taking ``arity`` values of ``type_`` (float, double
    or a vector of them) and returning one, declared in ``module`` once."""
    element = type_.element if isinstance(type_, ir.VectorType) else type_
    suffix = "f32" if isinstance(element, ir.FloatType) else "f64"
    if isinstance(type_, ir.VectorType):
        suffix = f"v{type_.count}{suffix}"
    full = f"llvm.{name}.{suffix}"
    existing = module.globals.get(full)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(type_, [type_] * arity), full)


class Emitter:
    """Typed constant and intrinsic helpers for one float or float-vector type."""

    def __init__(self, builder: ir.IRBuilder, value: ir.Value) -> None:
        self.b = builder
        self.type = value.type
        element = self.type.element if isinstance(self.type, ir.VectorType) else self.type
        if isinstance(element, ir.FloatType):
            self.fmt = _F32
        elif isinstance(element, ir.DoubleType):
            self.fmt = _F64
        else:
            raise TypeError(f"expected float, double or a vector of them, got {self.type}")
        self.lanes = self.type.count if isinstance(self.type, ir.VectorType) else 0
        integer = ir.IntType(self.fmt.bits)
        self.int_type = ir.VectorType(integer, self.lanes) if self.lanes else integer

    def _splat(self, scalar_type: ir.Type, value: float | int) -> ir.Constant:
        if self.lanes:
            return ir.Constant(ir.VectorType(scalar_type, self.lanes), [value] * self.lanes)
        return ir.Constant(scalar_type, value)

    def f(self, value: float) -> ir.Constant:
        element = self.type.element if self.lanes else self.type
        return self._splat(element, value)

    def i(self, value: int) -> ir.Constant:
        return self._splat(ir.IntType(self.fmt.bits), value)

    def _intrinsic(self, name: str, arity: int) -> ir.Function:
        return intrinsic(self.b.module, name, self.type, arity)

    def fabs(self, x: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("fabs", 1), [x])

    def minnum(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("minnum", 2), [x, y])

    def maxnum(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("maxnum", 2), [x, y])

    def muladd(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        # fmuladd fuses where the CPU has FMA and splits otherwise; llvm.fma would
        # become a libm call on CPUs without FMA.
        return self.b.call(self._intrinsic("fmuladd", 3), [x, y, z])

    def horner(self, x: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
        """Evaluate a polynomial given highest-degree coefficient first."""
        acc = self.f(coefficients[0])
        for c in coefficients[1:]:
            acc = self.muladd(acc, x, self.f(c))
        return acc

    def is_nan(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def copysign(self, magnitude: ir.Value, sign_source: ir.Value) -> ir.Value:
        sign_mask = 1 << (self.fmt.bits - 1)
        m = self.b.bitcast(magnitude, self.int_type)
        s = self.b.bitcast(sign_source, self.int_type)
        m = self.b.and_(m, self.i(sign_mask - 1))
        s = self.b.and_(s, self.i(sign_mask))
        return self.b.bitcast(self.b.or_(m, s), self.type)

    def pow2(self, n: ir.Value) -> ir.Value:
        """Build 2**n from an integer n in the normal exponent range."""
        biased = self.b.add(n, self.i(self.fmt.bias))
        return self.b.bitcast(self.b.shl(biased, self.i(self.fmt.mantissa_bits)), self.type)


def emit_exp(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Emit exp(x) for a float, double or float-vector value."""
    e = Emitter(builder, x)
    return exp_value(e, x)


def exp_value(e: Emitter, x: ir.Value) -> ir.Value:
    b, fmt = e.b, e.fmt
    # minnum/maxnum drop a NaN operand, so NaN is put back at the end.
    xc = e.maxnum(e.minnum(x, e.f(fmt.exp_high)), e.f(fmt.exp_low))
    # Round to nearest by adding and subtracting 1.5 * 2^mantissa: exact for the
    # clamped range and needs no rounding intrinsic (which is a libm call on CPUs
    # without SSE4.1).
    magic = e.f(1.5 * 2.0**fmt.mantissa_bits)
    t = b.fsub(b.fadd(b.fmul(xc, e.f(1.4426950408889634)), magic), magic)
    # Cody-Waite: ln2_high has trailing zero bits, so t * ln2_high is exact.
    r = e.muladd(t, e.f(-fmt.ln2_high), xc)
    r = e.muladd(t, e.f(-fmt.ln2_low), r)
    # Horner all the way down to the constant 1 so that the last step, 1 + r*q,
    # is a single rounding where the CPU fuses the multiply-add.
    p = e.horner(r, fmt.exp_poly + (1.0, 1.0))
    # 2^n as two factors, each a normal number, so results near overflow and in
    # the denormal range are produced by one correctly rounded multiply.
    n = b.fptosi(t, e.int_type)
    n_half = b.ashr(n, e.i(1))
    scaled = b.fmul(b.fmul(p, e.pow2(n_half)), e.pow2(b.sub(n, n_half)))
    return b.select(e.is_nan(x), x, scaled)


def log_reduced(e: Emitter, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """musl's reduction of log(x), x > 0 finite: x = 2**k * (1 + f) with 1 + f in
    [sqrt(1/2), sqrt(2)); returns ``(k, f, hfsq, tail)`` as floats, where
    log(1 + f) = f - hfsq + tail, hfsq = f*f/2 and ``tail`` is small (|tail| < f**3)."""
    b, fmt = e.b, e.fmt
    # Denormals are scaled into the normal range and the exponent corrected.
    denormal = b.fcmp_ordered("<", x, e.f(fmt.smallest_normal))
    xs = b.select(denormal, b.fmul(x, e.f(2.0**fmt.mantissa_bits)), x)
    k_adjust = b.select(denormal, e.i(-fmt.mantissa_bits), e.i(0))
    # Shift the mantissa into [sqrt(1/2), sqrt(2)) so that f = m - 1 is small and the
    # exponent k absorbs the rest.
    one_bits = fmt.bias << fmt.mantissa_bits
    mantissa_mask = (1 << fmt.mantissa_bits) - 1
    bits = b.add(b.bitcast(xs, e.int_type), e.i(one_bits - fmt.sqrt_half_bits))
    k = b.sub(b.ashr(bits, e.i(fmt.mantissa_bits)), e.i(fmt.bias))
    k = b.add(k, k_adjust)
    m_bits = b.add(b.and_(bits, e.i(mantissa_mask)), e.i(fmt.sqrt_half_bits))
    f = b.fsub(b.bitcast(m_bits, e.type), e.f(1.0))
    s = b.fdiv(f, b.fadd(f, e.f(2.0)))
    z = b.fmul(s, s)
    w = b.fmul(z, z)
    t1 = b.fmul(w, e.horner(w, tuple(reversed(fmt.log_even))))
    t2 = b.fmul(z, e.horner(w, tuple(reversed(fmt.log_odd))))
    hfsq = b.fmul(b.fmul(f, f), e.f(0.5))
    tail = b.fmul(s, b.fadd(hfsq, b.fadd(t2, t1)))
    return b.sitofp(k, e.type), f, hfsq, tail


def emit_log(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Emit the natural logarithm of a float, double or float-vector value."""
    e = Emitter(builder, x)
    b, fmt = builder, e.fmt
    dk, f, half_f_squared, result = log_reduced(e, x)
    result = b.fadd(result, b.fmul(dk, e.f(fmt.log_ln2_low)))
    result = b.fsub(result, half_f_squared)
    result = b.fadd(result, f)
    result = b.fadd(result, b.fmul(dk, e.f(fmt.log_ln2_high)))
    # Special cases, applied last so that NaN, 0, negatives and +inf win.
    inf = e.f(float("inf"))
    result = b.select(b.fcmp_ordered("==", x, inf), inf, result)
    result = b.select(b.fcmp_ordered("==", x, e.f(0.0)), e.f(float("-inf")), result)
    result = b.select(b.fcmp_ordered("<", x, e.f(0.0)), e.f(float("nan")), result)
    return b.select(e.is_nan(x), x, result)


# Cephes tanhf: tanh(x) = x + x^3 * P(x^2) for |x| < 0.625, highest degree first.
_TANH_F32 = (
    -5.70498872745e-3,
    2.06390887954e-2,
    -5.37397155531e-2,
    1.33314422036e-1,
    -3.33332819422e-1,
)
# Cephes tanh: tanh(x) = x + x^3 * P(x^2) / Q(x^2) for |x| < 0.625; Q is monic.
_TANH_F64_P = (
    -9.64399179425052238628e-1,
    -9.92877231001918586564e1,
    -1.61468768441708447952e3,
)
_TANH_F64_Q = (
    1.0,
    1.12811678491632931402e2,
    2.23548839060100448583e3,
    4.84406305325125486048e3,
)


def emit_tanh(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Emit tanh(x) for a float, double or float-vector value."""
    e = Emitter(builder, x)
    b = builder
    # tanh is odd: work on |x| and copy the sign back, which also keeps -0 and
    # puts NaN through unchanged.
    a = e.fabs(x)
    z = b.fmul(a, a)
    # Near zero a polynomial keeps relative accuracy where 1 - 2/(exp(2x)+1) cancels.
    if e.fmt.bits == 32:
        ratio = e.horner(z, _TANH_F32)
    else:
        ratio = b.fdiv(e.horner(z, _TANH_F64_P), e.horner(z, _TANH_F64_Q))
    small = e.muladd(b.fmul(a, z), ratio, a)
    # Away from zero: exp(2|x|) overflows to +inf for large |x|, 2/inf is 0, and
    # the result is exactly 1, so saturation needs no extra branch.
    s = exp_value(e, b.fadd(a, a))
    large = b.fsub(e.f(1.0), b.fdiv(e.f(2.0), b.fadd(s, e.f(1.0))))
    # An unordered compare sends NaN to the large branch, which propagates it.
    magnitude = b.select(b.fcmp_ordered("<", a, e.f(0.625)), small, large)
    return e.copysign(magnitude, x)


def emit_sigmoid(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Emit 1 / (1 + exp(-x)) for a float, double or float-vector value."""
    e = Emitter(builder, x)
    b = builder
    # exp(-|x|) lies in (0, 1], so nothing overflows and no inf/inf NaN arises.
    ex = exp_value(e, b.fsub(e.f(-0.0), e.fabs(x)))
    q = b.fdiv(ex, b.fadd(ex, e.f(1.0)))
    # q = sigmoid(-|x|) keeps relative accuracy down to denormals; the positive
    # side is 1 - q, which is exactly 1 only once q is below half an ULP of 1.
    one_minus_q = b.fsub(e.f(1.0), q)
    return b.select(b.fcmp_ordered("<", x, e.f(0.0)), q, one_minus_q)


def emit_log1p(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Emit log(1 + x), accurate for small x.

    With u = 1 + x rounded, log1p(x) = log(u) * x / (u - 1): the quotient corrects the
    rounding of u (Goldberg, "What every computer scientist should know about floating-point
    arithmetic", theorem 4); where u rounds to 1, log1p(x) = x to within an ULP."""
    e = Emitter(builder, x)
    b = builder
    u = b.fadd(x, e.f(1.0))
    corrected = b.fdiv(b.fmul(emit_log(b, u), x), b.fsub(u, e.f(1.0)))
    # u = +inf gives inf/inf: log(inf) = inf is already right there.
    corrected = b.select(b.fcmp_ordered("==", u, e.f(float("inf"))), u, corrected)
    return b.select(b.fcmp_ordered("==", u, e.f(1.0)), x, corrected)


def emit_softplus(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Emit log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): nothing overflows."""
    e = Emitter(builder, x)
    b = builder
    tail = emit_log1p(b, exp_value(e, b.fsub(e.f(-0.0), e.fabs(x))))
    # An ordered compare sends NaN to x, and NaN + tail is NaN.
    positive = b.select(b.fcmp_ordered("<", x, e.f(0.0)), e.f(0.0), x)
    return b.fadd(positive, tail)
