"""LLVM rules: one emitter per primitive.

``RULES[op](ctx, node, out, *operands)`` lowers one node of ``ctx.nodes``: it writes the node's
value into the buffer ``out`` (a loop, a GEMM or a store). Operands are the buffers of the
node's inputs. Elementwise and layout ops are one loop over the node
(:mod:`rnnc.backends.llvm.region`, with the per-element arithmetic of
:mod:`rnnc.backends.llvm.scalar`), so a new layout op needs only its index rule in
``rnnc.ops``.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import bf16_matmul, gemm, region, tensor
from rnnc.backends.llvm.context import Buffer, Context
from rnnc.backends.llvm.kernels import Kernel, emit_reduce, emit_sum_rows
from rnnc.backends.llvm.scalar import INDEXED, SCALAR
from rnnc.backends.llvm.scan import emit_last_step, emit_linear_scan
from rnnc.ir import Node


def _loop(ctx: Context, node: Node, out: Buffer, *operands: Buffer) -> None:
    """An elementwise or layout node: one loop nest over its result."""
    leaves = dict(zip(node.inputs, operands, strict=True))
    region.emit_region(ctx, ctx.nodes, leaves, {node.id: out}, node.op.name)


def _matmul(ctx: Context, node: Node, out: Buffer, a: Buffer, b: Buffer) -> None:
    if bf16_matmul.is_bf16(node):  # operands rounded to bfloat16: its own kernels
        bf16_matmul.emit_matmul(ctx, node, out, a, b, _matmul_f32)
        return
    _matmul_f32(ctx, node, out, a, b)


def _matmul_f32(ctx: Context, node: Node, out: Buffer, a: Buffer, b: Buffer) -> None:
    """A matmul in the program's dtype: the BLAS, the panel kernel or the small kernel."""
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
    small = builder.icmp_signed("<=", rows, ir.Constant(rows.type, ctx.schedule.gemm_small_rows))
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
    **tensor.RULES,  # reshape, sums over inner axes, einsum: rnnc/ops_tensor.py
}
