"""Lowering of a matmul node with ``precision="bf16"``: operands rounded to bfloat16 (nearest
even), products accumulated in float32, a float32 result.

``out = a @ w`` or ``out = a @ w^T`` with ``w`` a fixed matrix (a weight, or anything
without the call's ``T`` and ``B``) in a float32 program runs on the kernels of
:mod:`rnnc.backends.llvm.bf16`, the best tier of the host (AMX, then AVX512-BF16, then the
emulation): ``a`` is converted into a workspace of bf16 rows at each call, ``w`` (or its
transpose) packed into the VNNI pair layout once per run (the marker rule of
:mod:`rnnc.backends.llvm.bf16`). The hoisted sequence projection (``T * B`` rows), the
per-step recurrent product (``B`` rows) and, in the backward, the input gradients
``g @ W^T`` (per step and hoisted) take this path.

The weight gradients ``x^T @ g`` (a transposed first operand with fixed last axes), whose
operands both change at every call and whose depth is the call's, run on the same kernels
with a runtime depth (:mod:`rnnc.backends.llvm.bf16_wgrad`), split between a team's threads
outside the time loop.

Every other bf16 product (a float64 program, a shape those paths do not take) rounds its
operands to bf16 in workspaces and runs the float32 lowering on the rounded values: the same
rounding model, through the BLAS or the panel kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import bf16, bf16_wgrad
from rnnc.backends.llvm.context import I64, Buffer, Context
from rnnc.backends.llvm.kernels import emit_loop
from rnnc.backends.llvm.team import Team
from rnnc.ir import Node

Lowering = Callable[[Context, Node, Buffer, Buffer, Buffer], None]


def is_bf16(node: Node) -> bool:
    """Whether a matmul node multiplies in bfloat16."""
    return node.attrs.get("precision") == "bf16"


def packs(ctx_dtype: str, node: Node, a: tuple, w: tuple) -> bool:
    """Whether the node runs on the packed bf16 kernels (else on rounded float32 copies)."""
    fixed = len(w) == 2 and all(isinstance(d, int) for d in w) and isinstance(a[-1], int)
    return ctx_dtype == "f32" and fixed and not node.attrs.get("transpose_a")


def weight_gradient(ctx_dtype: str, node: Node, a: tuple, g: tuple) -> bool:
    """Whether the node is a weight gradient ``a^T @ g`` on the packed kernels."""
    return ctx_dtype == "f32" and bool(node.attrs.get("transpose_a")) \
        and isinstance(a[-1], int) and isinstance(g[-1], int)


def _weight_shape(node: Node, w: Buffer) -> tuple[int, int, bool]:
    """``(K, N, transposed)`` of the matrix multiplied: ``w``, or ``w^T`` (``w`` N x K)."""
    if node.attrs.get("transpose_b"):
        n, k = w.shape
        return k, n, True
    k, n = w.shape
    return k, n, False


def emit_matmul(ctx: Context, node: Node, out: Buffer, a: Buffer, w: Buffer,
                float32: Lowering, tier: bf16.Tier | None = None,
                team: Team | None = None) -> None:
    """``out = node(a, w)`` in bfloat16; ``float32`` lowers a matmul without rounding (the
    fallback's second half); ``tier`` forces a kernel tier (default: the host's).

    In a thread team's step body (``team``), each thread converts its block of batch rows of
    ``a``, then, after a barrier, packs (at the run's first step) and multiplies its share of
    the column panels, as the float32 panel kernel's split (:mod:`rnnc.backends.llvm.team`).
    """
    if weight_gradient(ctx.dtype, node, a.shape, w.shape):
        bf16_wgrad.emit_wgrad(ctx, out, a, w, tier)
        return
    if not packs(ctx.dtype, node, a.shape, w.shape):
        float32(ctx, node, out, _rounded(ctx, a), _rounded(ctx, w))
        return
    tier = tier or bf16.host_tier()
    k, n, transposed = _weight_shape(node, w)
    abuf = ctx.slot(tuple(a.shape[:-1]) + (bf16.padded_k(k) // 2,))
    packed = ctx.slot((bf16.packed_words(k, n),))
    marker = _marker(ctx)
    convert = bf16.convert_function(ctx.module, k)

    def rows(inputs: list[Buffer], outputs: list[Buffer]) -> None:
        b = ctx.builder
        b.call(convert, [ctx.numel(inputs[0].shape[:-1]), inputs[0].ptr,
                         b.bitcast(outputs[0].ptr, bf16.BF16P)])

    def columns(first: ir.Value, stop: ir.Value) -> None:
        b = ctx.builder
        as_bf16 = [b.bitcast(buf.ptr, bf16.BF16P) for buf in (abuf, packed)]
        b.call(bf16.pack_function(ctx.module, k, n, transposed),
               [w.ptr, as_bf16[1], marker, first, stop])
        b.call(bf16.gemm_function(ctx.module, tier, k, n),
               [ctx.numel(a.shape[:-1]), as_bf16[0], as_bf16[1], out.ptr, first, stop])

    panels = bf16.panel_count(n)
    if team is None:
        rows([a], [abuf])
        columns(ir.Constant(I64, 0), ir.Constant(I64, panels))
        return
    team.rows([a], [abuf], rows)
    team.columns(columns, panels)


def emit_split(ctx: Context, node: Node, out: Buffer, operands: list[Buffer],
               team: Team | None, in_step: bool) -> bool:
    """In a team build: lower ``node`` split between the threads and return True if it is a
    bf16 product on the packed kernels; else emit nothing and return False.

    In the step body (``in_step``), as :func:`emit_matmul` with ``team``; outside the loop
    (the hoisted projection over all steps), on every thread (:meth:`Team.everyone`): each
    converts its share of the rows, then, after a barrier, packs and multiplies its share of
    the column panels for every row. A weight gradient outside the loop: each thread converts
    its share of ``x^T``, packs its column panels of ``g`` and, after a barrier, multiplies
    them (:func:`rnnc.backends.llvm.bf16_wgrad.emit_wgrad`)."""
    if team is None or not (node.op is ops.matmul and is_bf16(node)):
        return False
    shapes = (operands[0].shape, operands[1].shape)
    if weight_gradient(ctx.dtype, node, *shapes) and not in_step:
        bf16_wgrad.emit_wgrad(ctx, out, *operands, team=team)
        return True
    if not packs(ctx.dtype, node, *shapes):
        return False
    if in_step:
        emit_matmul(ctx, node, out, *operands, lambda *_: None, team=team)
        return True
    a, w = operands
    k, n, transposed = _weight_shape(node, w)
    tier = bf16.host_tier()
    abuf = ctx.slot(tuple(a.shape[:-1]) + (bf16.padded_k(k) // 2,))
    packed = ctx.slot((bf16.packed_words(k, n),))
    marker = _marker(ctx)

    def everyone() -> None:
        b = ctx.builder
        rows = ctx.numel(a.shape[:-1])
        first, stop = team.share(rows)
        b.call(bf16.convert_function(ctx.module, k),
               [b.sub(stop, first), b.gep(a.ptr, [b.mul(first, ir.Constant(I64, k))]),
                b.gep(b.bitcast(abuf.ptr, bf16.BF16P),
                      [b.mul(first, ir.Constant(I64, bf16.padded_k(k)))])])
        team.barrier()
        first, stop = team.share(ir.Constant(I64, bf16.panel_count(n)))
        as_bf16 = [b.bitcast(buf.ptr, bf16.BF16P) for buf in (abuf, packed)]
        b.call(bf16.pack_function(ctx.module, k, n, transposed),
               [w.ptr, as_bf16[1], marker, first, stop])
        b.call(bf16.gemm_function(ctx.module, tier, k, n),
               [rows, as_bf16[0], as_bf16[1], out.ptr, first, stop])

    team.everyone(everyone)
    return True


def _marker(ctx: Context) -> ir.Value:
    """A new marker of packed weights: null at the start of every run, so that the weights
    are packed at the run's first call (each thread of a team has its own, for its own
    panels)."""
    fptr = ctx.scalar.as_pointer()
    marker = ctx.entry.alloca(fptr)
    ctx.entry.store(ir.Constant(fptr, None), marker)
    return marker


def _rounded(ctx: Context, src: Buffer) -> Buffer:
    """A new workspace holding ``src`` rounded to bfloat16 (nearest even), in the program's
    dtype."""
    dst = ctx.slot(src.shape)
    b = ctx.builder

    def element(i: ir.Value) -> None:
        value = bf16.from_bf16(b, bf16.to_bf16(b, b.load(b.gep(src.ptr, [i]))))
        b.store(b.fpext(value, ctx.scalar) if ctx.dtype == "f64" else value, b.gep(dst.ptr, [i]))

    emit_loop(b, ir.Constant(I64, 0), ctx.numel(src.shape), 1, element)
    return dst
