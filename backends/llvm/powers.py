"""``x ** p`` for a constant p in LLVM IR, with C99 ``pow``'s values, vectorizable like the
rest of ``mathlib`` (plain arithmetic, selects and intrinsics with vector forms).

An integer p up to 64 in magnitude is a chain of products, ±0.5 a square root, any other p
exp(p * log|x|): float32 computes it in float64, float64 carries log|x| and the product as
double-double (a plain float64 product was off by up to 256 ULP, since the error of log|x|
grows with its size and is then multiplied by p). Errors are in ``mathlib``'s table.
"""

from __future__ import annotations

import math

from llvmlite import ir

from rnnc.backends.llvm.mathlib import Emitter, emit_log, exp_value, log_reduced

__all__ = ["emit_power"]


def _two_sum(e: Emitter, a: ir.Value, b_: ir.Value) -> tuple[ir.Value, ir.Value]:
    """a + b as s + err exactly (Knuth), in plain arithmetic."""
    b = e.b
    total = b.fadd(a, b_)
    b_virtual = b.fsub(total, a)
    a_virtual = b.fsub(total, b_virtual)
    err = b.fadd(b.fsub(a, a_virtual), b.fsub(b_, b_virtual))
    return total, err


def _two_product(e: Emitter, a: ir.Value, b_: ir.Value) -> tuple[ir.Value, ir.Value]:
    """a * b as p + err exactly (Dekker), for |a|, |b| below 2**996: no fused multiply-add
    needed, so the result does not depend on the CPU."""
    b = e.b

    def split(v: ir.Value) -> tuple[ir.Value, ir.Value]:
        c = b.fmul(v, e.f(134217729.0))
        hi = b.fsub(c, b.fsub(c, v))
        return hi, b.fsub(v, hi)

    product = b.fmul(a, b_)
    (ah, al), (bh, bl) = split(a), split(b_)
    err = b.fsub(b.fmul(ah, bh), product)
    err = b.fadd(err, b.fmul(ah, bl))
    err = b.fadd(err, b.fmul(al, bh))
    return product, b.fadd(err, b.fmul(al, bl))


def _power_of_positive_f64(e: Emitter, a: ir.Value, exponent: float) -> ir.Value:
    """a ** exponent for finite a > 0 in double precision: exp(exponent * log(a)) with the
    logarithm and the product carried as double-double, so that the product's error is far
    below an ULP of the result even where it is hundreds (plain: up to 256 ULP); then
    exp(y_hi + y_lo) = exp(y_hi) * (1 + y_lo)."""
    b, fmt = e.b, e.fmt
    dk, f, hfsq, tail = log_reduced(e, a)
    # hfsq = f*f/2 rounded; its rounding error exactly (f/2 is exact).
    exact_hfsq, hfsq_err = _two_product(e, b.fmul(f, e.f(0.5)), f)
    log1p_hi, err = _two_sum(e, f, b.fsub(e.f(0.0), exact_hfsq))
    log1p_lo = b.fadd(b.fsub(err, hfsq_err), tail)
    # k * ln2_high is exact (ln2_high ends in zero bits); k * ln2_low is far below an ULP.
    log_hi, err = _two_sum(e, b.fmul(dk, e.f(fmt.log_ln2_high)), log1p_hi)
    log_lo = b.fadd(err, b.fadd(log1p_lo, b.fmul(dk, e.f(fmt.log_ln2_low))))
    log_hi, log_lo = _two_sum(e, log_hi, log_lo)
    y_hi, err = _two_product(e, log_hi, e.f(exponent))
    y_lo = b.fadd(err, b.fmul(log_lo, e.f(exponent)))
    y_hi, y_lo = _two_sum(e, y_hi, y_lo)
    big = exp_value(e, y_hi)
    corrected = e.muladd(big, y_lo, big)
    # At 0 or inf, inf * 0 is NaN: exp(y_hi) is the answer there.
    return b.select(e.is_nan(corrected), big, corrected)


def _power_of_positive(e: Emitter, a: ir.Value, exponent: float) -> ir.Value:
    """a ** exponent for finite a > 0: float32 through float64 (its error is then far below a
    float32 ULP), float64 in double-double."""
    b = e.b
    if e.fmt.bits == 64 and abs(exponent) < 2.0**900:
        return _power_of_positive_f64(e, a, exponent)
    if e.fmt.bits == 64:  # the result is 0 or inf wherever log(a) is not tiny
        return exp_value(e, b.fmul(emit_log(b, a), e.f(exponent)))
    wide_type = ir.VectorType(ir.DoubleType(), e.lanes) if e.lanes else ir.DoubleType()
    wide_a = b.fpext(a, wide_type)
    wide = Emitter(b, wide_a)
    y = b.fmul(emit_log(b, wide_a), wide.f(exponent))
    return b.fptrunc(exp_value(wide, y), e.type)


def _square_root_power(e: Emitter, x: ir.Value, exponent: float) -> ir.Value:
    """x ** 0.5 and x ** -0.5 by a square root (correctly rounded), with pow's values where
    sqrt's differ: +0 at -0 (x + 0.0 turns -0 into +0) and +inf (or +0) at -inf."""
    b = e.b
    root = b.call(e._intrinsic("sqrt", 1), [b.fadd(x, e.f(0.0))])
    if exponent < 0:
        root = b.fdiv(e.f(1.0), root)
    at_minus_inf = e.f(float("inf") if exponent > 0 else 0.0)
    return b.select(b.fcmp_ordered("==", x, e.f(float("-inf"))), at_minus_inf, root)


def _integer_power(e: Emitter, x: ir.Value, exponent: int) -> ir.Value:
    """A chain of squarings and products: exact signs for negative x, at most 12 roundings."""
    b = e.b
    n = abs(exponent)
    result, square = None, x
    while n:
        if n & 1:
            result = square if result is None else b.fmul(result, square)
        n >>= 1
        if n:
            square = b.fmul(square, square)
    if result is None:  # x ** 0 is 1, NaN included, as in C99
        return e.f(1.0)
    return b.fdiv(e.f(1.0), result) if exponent < 0 else result


def emit_power(builder: ir.IRBuilder, x: ir.Value, exponent: float) -> ir.Value:
    """Emit x ** exponent for a constant exponent, with C99 ``pow``'s values.

    An integer exponent up to 64 in magnitude is a chain of products; ±0.5 a square root;
    any other exponent exp(exponent * log|x|), accurate to about an ULP (float32 computes it in
    float64, float64 in double-double), then pow's special values: x < 0 gives NaN unless the
    exponent is an integer (odd: the sign of x), ±0 and ±inf give 0 or inf, 1 gives 1."""
    e = Emitter(builder, x)
    b = builder
    integral = math.isinf(exponent) or float(exponent).is_integer()
    if integral and abs(exponent) <= 64:
        return _integer_power(e, x, int(exponent))
    if exponent in (0.5, -0.5):
        return _square_root_power(e, x, exponent)
    if math.isnan(exponent):
        return b.select(b.fcmp_ordered("==", x, e.f(1.0)), e.f(1.0), e.f(float("nan")))
    a = e.fabs(x)
    result = _power_of_positive(e, a, exponent)
    inf = float("inf")
    result = b.select(b.fcmp_ordered("==", a, e.f(0.0)), e.f(0.0 if exponent > 0 else inf),
                      result)
    result = b.select(b.fcmp_ordered("==", a, e.f(inf)), e.f(inf if exponent > 0 else 0.0),
                      result)
    # 1 ** p is 1 for every p, and so is (-1) ** ±inf.
    one = b.fcmp_ordered("==", a if math.isinf(exponent) else x, e.f(1.0))
    result = b.select(one, e.f(1.0), result)
    odd = integral and not math.isinf(exponent) and abs(exponent) < 2.0**53 \
        and int(exponent) % 2 == 1
    if odd:
        result = e.copysign(result, x)
    elif not integral:  # a negative base to a fractional power; -inf is pow's exception
        negative = b.and_(b.fcmp_ordered("<", x, e.f(0.0)),
                          b.fcmp_ordered("!=", x, e.f(-inf)))
        result = b.select(negative, e.f(float("nan")), result)
    return b.select(e.is_nan(x), x, result)
