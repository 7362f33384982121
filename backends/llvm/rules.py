"""LLVM rules: one emitter per primitive.

``RULES[op](ctx, node, *operands) -> Buffer`` lowers one node of a graph: it writes the node's
value into ``ctx.out(node)`` (a loop, a BLAS call or a store) and returns that buffer. Operands
are the buffers of the node's inputs. ``SCALAR[op](builder, *values) -> value`` is the
per-element arithmetic of an elementwise op, used when a loop evaluates a region; its values are
scalars of the program's dtype (or vectors of them, after vectorization).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import gemm, mathlib
from rnnc.backends.llvm.kernels import (
    SMALL_ROWS,
    Buffer,
    emit_gemm,
    emit_reduce,
    emit_region,
    emit_small_gemm,
    emit_sum_rows,
)
from rnnc.ir import Node


def _sqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.call(b.module.declare_intrinsic("llvm.sqrt", [x.type]), [x])


def _relu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    # An ordered compare keeps NaN, as np.maximum(NaN, 0) does.
    zero = ir.Constant(x.type, 0.0)
    return b.select(b.fcmp_ordered("<", x, zero), zero, x)


def _where(b: ir.IRBuilder, c: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered(">", c, ir.Constant(c.type, 0.0)), x, y)


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
}


def _loop(ctx: Any, node: Node, *operands: Buffer) -> Buffer:
    """An elementwise or layout node: one loop nest over its result."""
    out = ctx.out(node)
    leaves = dict(zip(node.inputs, operands, strict=True))
    emit_region(ctx, ctx.graph, leaves, {node.id: out}, node.op.name)
    return out


def _matmul(ctx: Any, node: Node, a: Buffer, b: Buffer) -> Buffer:
    out = ctx.out(node)
    rows = ctx.numel_value(a.shape[:-1])
    if node.attrs.get("transpose_a"):
        # Every leading axis is contracted: (rows, K)^T (rows, N).
        k, n = a.shape[-1], b.shape[-1]
        emit_gemm(ctx, True, False, ((k,), (n,), a.shape[:-1]), ctx.dim(k), n, rows, a.ptr, k,
                  b.ptr, n, out.ptr, n)
    elif node.attrs.get("transpose_b"):
        n, k = b.shape
        _own_or_blas(ctx, rows, a, b, out, n * k, transposed=True, blas=lambda: emit_gemm(
            ctx, False, True, (a.shape[:-1], (n,), (k,)), rows, n, k, a.ptr, k, b.ptr, k,
            out.ptr, n))
    else:
        k, n = b.shape
        builder = ctx.builder
        small = builder.icmp_signed("<=", rows, ir.Constant(rows.type, SMALL_ROWS))
        with builder.if_else(small) as (few_rows, many_rows):
            with few_rows:
                emit_small_gemm(ctx, rows, a, b, out)
            with many_rows:
                _own_or_blas(ctx, rows, a, b, out, n * k, transposed=False,
                             blas=lambda: emit_gemm(ctx, False, False, (a.shape[:-1], (n,), (k,)),
                                                    rows, n, k, a.ptr, k, b.ptr, n, out.ptr, n))
    return out


def _own_or_blas(ctx: Any, rows: ir.Value, a: Buffer, b: Buffer, out: Buffer, nk: int,
                 transposed: bool, blas: Callable[[], None]) -> None:
    """A per-step product of moderate size runs on rnnc's own register-tiled kernel; a large
    one (many rows, or the hoisted projection over all steps) on the BLAS.

    The own kernel is emitted only where its shape fits: a branch that can never be taken
    would still be compiled, and in a cell of hundreds of matmuls that dead code dominated
    the compile time."""
    n = b.shape[0] if transposed else b.shape[1]
    if not (a.shape[:-1] == ("B",) and gemm.fits(ctx, n)):
        blas()
        return
    builder = ctx.builder
    moderate = builder.icmp_signed("<=", builder.mul(rows, ir.Constant(rows.type, nk)),
                                   ir.Constant(rows.type, gemm.MAX_WORK))
    with builder.if_else(moderate) as (mid, large):
        with mid:
            gemm.emit_panel_gemm(ctx, rows, a, b, out, transposed=transposed)
        with large:
            blas()


def _reduce(ctx: Any, node: Node, a: Buffer) -> Buffer:
    out = ctx.out(node)
    emit_reduce(ctx, a, out, mean=node.op is ops.mean)
    return out


def _sum_rows(ctx: Any, node: Node, a: Buffer) -> Buffer:
    out = ctx.out(node)
    emit_sum_rows(ctx, a, out)
    return out


def _constant(ctx: Any, node: Node) -> Buffer:
    out = ctx.out(node)
    ctx.builder.store(ir.Constant(ctx.scalar, float(node.attrs["value"])), out.ptr)
    return out


RULES: dict[ops.Op, Callable[..., Buffer]] = {
    **{op: _loop for op in SCALAR},
    ops.slice_: _loop,
    ops.pad: _loop,
    ops.concat: _loop,
    ops.expand: _loop,
    ops.matmul: _matmul,
    ops.sum_: _reduce,
    ops.mean: _reduce,
    ops.sum_rows: _sum_rows,
    ops.constant: _constant,
}
