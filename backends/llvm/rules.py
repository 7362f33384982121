"""LLVM rules: one emitter per primitive, and the per-element arithmetic of elementwise ops.

``SCALAR[op](builder, *values, **attrs) -> value`` is the arithmetic of an elementwise op on
one element: its values are scalars of the program's dtype (or vectors of them, after
vectorization), and the node's attributes follow as keywords (``power``'s ``exponent``).
Adding an elementwise primitive adds one line here.

``RULES[op](ctx, node, out, *operands)`` lowers one node of ``ctx.nodes``: it writes the node's
value into the buffer ``out`` (a loop, a GEMM or a store). Operands are the buffers of the
node's inputs. Elementwise and layout ops are one loop over the node
(:mod:`rnnc.backends.llvm.region`), so a new layout op needs only its index rule in
``rnnc.ops``.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from rnnc import ops
from rnnc import ops_elementwise as elementwise
from rnnc.backends.llvm import gemm, libm, mathlib, philox, powers, region
from rnnc.backends.llvm.context import Buffer, Context
from rnnc.backends.llvm.kernels import Kernel, emit_reduce, emit_sum_rows
from rnnc.backends.llvm.scan import emit_last_step, emit_linear_scan
from rnnc.ir import Node


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
    elementwise.clip: _clip,  # with the node's attributes lo and hi
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



def _loop(ctx: Context, node: Node, out: Buffer, *operands: Buffer) -> None:
    """An elementwise or layout node: one loop nest over its result."""
    leaves = dict(zip(node.inputs, operands, strict=True))
    region.emit_region(ctx, ctx.nodes, leaves, {node.id: out}, node.op.name)


def _matmul(ctx: Context, node: Node, out: Buffer, a: Buffer, b: Buffer) -> None:
    rows = ctx.numel(a.shape[:-1])
    if node.attrs.get("transpose_a"):
        # Every leading axis is contracted: (rows, K)^T (rows, N).
        k, n = a.shape[-1], b.shape[-1]
        gemm.emit_blas_gemm(ctx, True, False, ((k,), (n,), a.shape[:-1]), ctx.dim(k), n, rows,
                            a.ptr, k, b.ptr, n, out.ptr, n)
        return
    transposed = bool(node.attrs.get("transpose_b"))
    n, k = b.shape if transposed else b.shape[::-1]

    def blas() -> None:
        gemm.emit_blas_gemm(ctx, False, transposed, (a.shape[:-1], (n,), (k,)), rows, n, k,
                            a.ptr, k, b.ptr, k if transposed else n, out.ptr, n)

    if transposed:
        _own_or_blas(ctx, rows, a, b, out, n, k, transposed, blas)
        return
    builder = ctx.builder
    small = builder.icmp_signed("<=", rows, ir.Constant(rows.type, gemm.SMALL_ROWS))
    with builder.if_else(small) as (few_rows, many_rows):
        with few_rows:
            gemm.emit_small_gemm(ctx, rows, a, b, out)
        with many_rows:
            _own_or_blas(ctx, rows, a, b, out, n, k, transposed, blas)


def _own_or_blas(ctx: Context, rows: ir.Value, a: Buffer, b: Buffer, out: Buffer, n: int,
                 k: int, transposed: bool, blas: Callable[[], None]) -> None:
    """A per-step product of moderate size runs on rnnc's own register-tiled kernel; a large
    one (many rows, or the hoisted projection over all steps) on the BLAS.

    The own kernel is emitted only where its shape fits: a branch that can never be taken
    would still be compiled, and in a cell of hundreds of matmuls that dead code dominated
    the compile time."""
    if not (a.shape[:-1] == ("B",) and gemm.fits(ctx, n)):
        blas()
        return
    builder = ctx.builder
    moderate = builder.icmp_signed("<=", builder.mul(rows, ir.Constant(rows.type, n * k)),
                                   ir.Constant(rows.type, ctx.own_max_work))
    with builder.if_else(moderate) as (mid, large):
        with mid:
            gemm.emit_panel_gemm(ctx, rows, a, b, out, transposed=transposed)
        with large:
            blas()


def _reduce(ctx: Context, node: Node, out: Buffer, a: Buffer) -> None:
    emit_reduce(ctx, a, out, mean=node.op is ops.mean)


def _extreme(ctx: Context, node: Node, out: Buffer, a: Buffer) -> None:
    """``out[..., 0]`` = the largest (amax) or smallest (amin) of ``a[..., :]``; NaN if any
    element is NaN, as in NumPy."""
    kernel = Kernel(ctx, node.op.name, [a, out])
    better = ">" if node.op is ops.amax else "<"
    # Made first, in the entry block: one stack slot (promoted to a register), not one per row.
    best = kernel.builder.alloca(ctx.scalar)

    def row(index: tuple) -> None:
        b = kernel.builder
        b.store(kernel.load(0, index + (ir.Constant(ir.IntType(64), 0),)), best)

        def step(j: ir.Value) -> None:
            x, current = kernel.load(0, index + (j,)), b.load(best)
            # Once best is NaN no ordered compare takes x, so NaN stays.
            take = b.or_(b.fcmp_ordered(better, x, current), b.fcmp_unordered("uno", x, x))
            b.store(b.select(take, x, current), best)

        kernel.loop(kernel.dim(a.shape[-1]), step)
        kernel.store(1, index + (ir.Constant(ir.IntType(64), 0),), b.load(best))

    kernel.nest(a.shape[:-1], row)
    kernel.finish()


def _sum_rows(ctx: Context, node: Node, out: Buffer, a: Buffer) -> None:
    emit_sum_rows(ctx, a, out)


def _constant(ctx: Context, node: Node, out: Buffer) -> None:
    ctx.builder.store(ir.Constant(ctx.scalar, float(node.attrs["value"])), out.ptr)


RULES: dict[ops.Op, Callable[..., None]] = {
    **{op: _loop for op in SCALAR},
    **{op: _loop for op in INDEXED},
    **{op: _loop for op in ops.PRIMITIVES if op.kind is ops.OpKind.LAYOUT},
    ops.matmul: _matmul,
    ops.sum_: _reduce,
    ops.mean: _reduce,
    ops.amax: _extreme,
    ops.amin: _extreme,
    ops.sum_rows: _sum_rows,
    ops.constant: _constant,
    ops.linear_scan: emit_linear_scan,  # over the time axis, outside the loop: scan.py
    ops.last_step: emit_last_step,
}
