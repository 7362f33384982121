"""The per-element arithmetic of elementwise ops in LLVM IR.

``SCALAR[op](builder, *values, **attrs) -> value`` is the arithmetic of an elementwise op on
one element: its values are scalars of the program's dtype (or vectors of them, after
vectorization), and the node's attributes follow as keywords (``power``'s ``exponent``).
Adding an elementwise primitive adds one line here. Regions (:mod:`rnnc.backends.llvm.region`)
evaluate fused nodes with it; :mod:`rnnc.backends.llvm.rules` lowers every other node.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from rnnc import ops
from rnnc import ops_compare as compare
from rnnc import ops_elementwise as elementwise
from rnnc.backends.llvm import libm, mathlib, philox, powers


def _sqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.call(b.module.declare_intrinsic("llvm.sqrt", [x.type]), [x])


def _relu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    # An ordered compare keeps NaN, as np.maximum(NaN, 0) does.
    zero = ir.Constant(x.type, 0.0)
    return b.select(b.fcmp_ordered("<", x, zero), zero, x)


def _where(b: ir.IRBuilder, c: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered(">", c, ir.Constant(c.type, 0.0)), x, y)


def _comparison(symbol: str) -> Callable[..., ir.Value]:
    # Ordered: a comparison with NaN is 0.0, as in NumPy.
    return lambda b, x, y: b.uitofp(b.fcmp_ordered(symbol, x, y), x.type)


def _select_first(symbol: str) -> Callable[..., ir.Value]:
    """``x symbol y ? x : y``, NaN if either is: maximum (">=") and minimum ("<=")."""
    def emit(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
        first = b.select(b.fcmp_ordered(symbol, x, y), x, y)
        return b.select(b.fcmp_unordered("uno", x, x), x, first)
    return emit


def _fabs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.call(mathlib.intrinsic(b.module, "fabs", x.type, 1), [x])


def _mod(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """NumPy's floor-mod: fmod (exact), moved by y when its sign differs from y's; a zero
    result takes y's sign."""
    remainder = b.frem(x, y)
    zero = ir.Constant(x.type, 0.0)
    differ = b.xor(b.fcmp_ordered("<", remainder, zero), b.fcmp_ordered("<", y, zero))
    shift = b.and_(b.fcmp_ordered("!=", remainder, zero), differ)
    moved = b.select(shift, b.fadd(remainder, y), remainder)
    signed_zero = b.call(mathlib.intrinsic(b.module, "copysign", x.type, 2), [zero, y])
    return b.select(b.fcmp_ordered("==", remainder, zero), signed_zero, moved)


def _floor_divide(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """NumPy's floor division: (x - fmod(x, y)) / y, one less where the remainder's sign
    differs from y's, then rounded to the nearest integer; x / y where y is 0; a zero quotient
    takes the sign of x / y."""
    zero, one = ir.Constant(x.type, 0.0), ir.Constant(x.type, 1.0)
    remainder = b.frem(x, y)
    quotient = b.fdiv(b.fsub(x, remainder), y)
    differ = b.xor(b.fcmp_ordered("<", remainder, zero), b.fcmp_ordered("<", y, zero))
    shift = b.and_(b.fcmp_ordered("!=", remainder, zero), differ)
    quotient = b.select(shift, b.fsub(quotient, one), quotient)
    floored = b.call(mathlib.intrinsic(b.module, "floor", x.type, 1), [quotient])
    up = b.fcmp_ordered(">", b.fsub(quotient, floored), ir.Constant(x.type, 0.5))
    rounded = b.select(up, b.fadd(floored, one), floored)
    ratio = b.fdiv(x, y)
    signed_zero = b.call(mathlib.intrinsic(b.module, "copysign", x.type, 2), [zero, ratio])
    result = b.select(b.fcmp_ordered("==", quotient, zero), signed_zero, rounded)
    return b.select(b.fcmp_ordered("==", y, zero), ratio, result)


def _clip(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    # Ordered compares keep NaN, as np.clip does.
    low, high = ir.Constant(x.type, float(lo)), ir.Constant(x.type, float(hi))
    return b.select(b.fcmp_ordered("<", x, low), low,
                    b.select(b.fcmp_ordered(">", x, high), high, x))


def _log_sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """min(x, 0) - log1p(exp(-|x|)), as the reference."""
    zero = ir.Constant(x.type, 0.0)
    tail = mathlib.emit_log1p(b, mathlib.emit_exp(b, b.fneg(_fabs(b, x))))
    return b.fsub(b.select(b.fcmp_ordered(">", x, zero), zero, x), tail)


def _gelu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x erfc(-x / sqrt 2): no cancellation for negative x."""
    scaled = b.fmul(x, ir.Constant(x.type, -0.7071067811865476))
    return b.fmul(b.fmul(x, ir.Constant(x.type, 0.5)), libm.call(b, "erfc", scaled))


SCALAR: dict[ops.Op, Callable[..., ir.Value]] = {
    ops.add: lambda b, x, y: b.fadd(x, y),
    ops.sub: lambda b, x, y: b.fsub(x, y),
    ops.mul: lambda b, x, y: b.fmul(x, y),
    ops.div: lambda b, x, y: b.fdiv(x, y),
    ops.neg: lambda b, x: b.fneg(x),
    ops.exp: mathlib.emit_exp,
    ops.log: mathlib.emit_log,
    ops.tanh: mathlib.emit_tanh,
    ops.sigmoid: mathlib.emit_sigmoid,
    ops.relu: _relu,
    ops.sqrt: _sqrt,
    ops.rsqrt: lambda b, x: b.fdiv(ir.Constant(x.type, 1.0), _sqrt(b, x)),
    ops.where: _where,
    ops.less: _comparison("<"),
    ops.less_equal: _comparison("<="),
    ops.greater: _comparison(">"),
    ops.greater_equal: _comparison(">="),
    ops.maximum: _select_first(">="),
    ops.minimum: _select_first("<="),
    ops.abs_: _fabs,
    ops.softplus: mathlib.emit_softplus,
    ops.power: powers.emit_power,  # with the node's attribute exponent
    ops.stop_gradient: lambda b, x: x,
    elementwise.floor: lambda b, x: b.call(mathlib.intrinsic(b.module, "floor", x.type, 1), [x]),
    elementwise.round_: lambda b, x: b.call(mathlib.intrinsic(b.module, "roundeven", x.type, 1),
                                            [x]),
    elementwise.mod: _mod,
    elementwise.floor_divide: _floor_divide,
    compare.clip: _clip,  # with the node's attributes lo and hi
    elementwise.sin: lambda b, x: libm.call(b, "sin", x),
    elementwise.cos: lambda b, x: libm.call(b, "cos", x),
    elementwise.log_sigmoid: _log_sigmoid,
    elementwise.silu: lambda b, x: b.fmul(x, mathlib.emit_sigmoid(b, x)),
    elementwise.gelu: _gelu,
    elementwise.erf: lambda b, x: libm.call(b, "erf", x),
    elementwise.log1p: mathlib.emit_log1p,
    elementwise.expm1: lambda b, x: libm.call(b, "expm1", x),
}

# Per-element ops that read chosen elements of their operands and use the element's own index
# (the Philox counter of ``bernoulli``): ``INDEXED[op](builder, node, index)`` returns the
# reads a region makes for the element at ``index`` and the function combining their values.
INDEXED: dict[ops.Op, Callable[..., philox.Reads]] = {ops.bernoulli: philox.bernoulli_reads}
