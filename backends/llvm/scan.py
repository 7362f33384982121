"""The LLVM kernels of the ops over the time axis: ``linear_scan`` and ``last_step``.

``linear_scan`` is one loop over the steps (in the scan's direction) around a loop over the
batch rows and a vectorized loop over the features. The running value lives in a workspace
buffer of one step, updated in place (``c = A[t] * c + Bv[t]``), so that the inner loop has no
dependence between iterations and no alias with the result; each step also writes the value
before it (``exclusive``) or after it into the result's slice for that step. ``A`` and ``Bv``
broadcast to the result: an axis of size 1 (or a missing leading one) has stride 0.

Every element of a step (a batch row and a feature: a *column* of the flattened rows x
features) is its own recurrence, so the kernel takes a range ``[first, stop)`` of those
columns: a thread team's build (:mod:`rnnc.backends.llvm.team`) gives each thread its own
block, in whole vectors, and every element is computed by the same operations in the same
order whatever the block: the results are bitwise those of one thread. The kernel also takes
a range of the steps, for a team that splits a scan too narrow for that into chunks of steps
(:mod:`rnnc.backends.llvm.scan_chunks`).
"""

from __future__ import annotations

from llvmlite import ir

from rnnc.backends.llvm.context import I64, Buffer, Context, Shape
from rnnc.backends.llvm.kernels import Kernel, emit_loop
from rnnc.ir import Node


def operand_strides(kernel: Kernel, shape: Shape, out: Shape
                    ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """An operand's strides in elements along the result's (step, row, feature) axes, the rows
    being every axis between the first and the last; 0 along a broadcast axis."""
    b = kernel.builder
    zero = ir.Constant(I64, 0)
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    rows = full[1:-1]
    if any(d != 1 for d in rows) and tuple(rows) != tuple(out[1:-1]):
        raise NotImplementedError(f"linear_scan: operand {shape} broadcasts over some row axes "
                                  f"of {out} only")
    feature = zero if full[-1] == 1 else ir.Constant(I64, 1)
    width = kernel.dim(full[-1]) if full[-1] != 1 else ir.Constant(I64, 1)
    row = zero if all(d == 1 for d in rows) else width
    per_step = width
    for d in rows:
        per_step = b.mul(per_step, kernel.dim(d)) if d != 1 else per_step
    step = zero if full[0] == 1 else per_step
    return step, row, feature


def emit_linear_scan(ctx: Context, node: Node, out: Buffer, a: Buffer, b: Buffer, c0: Buffer
                     ) -> None:
    """``out = linear_scan[reverse, exclusive](a, b, c0)`` over every column."""
    emit_linear_scan_columns(ctx, node, (out, a, b, c0), ctx.slot(c0.shape),
                             (ir.Constant(I64, 0), ctx.numel(out.shape[1:])))


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def emit_linear_scan_columns(ctx: Context, node: Node, buffers: tuple[Buffer, ...],
                             work: Buffer, columns: tuple[ir.Value, ir.Value],
                             steps: tuple[ir.Value, ir.Value] | None = None) -> None:
    """The columns ``[first, stop)`` of the flattened (rows x features) of
    ``out = linear_scan(a, b, c0)``, ``buffers`` being ``(out, a, b, c0)``; ``work`` (of
    ``c0``'s shape) holds the running value at those columns. ``steps``: only the steps
    ``[first, stop)`` in scan order (counted from the last step when reversed), from ``c0``
    (a chunk of the steps, :mod:`rnnc.backends.llvm.scan_chunks`); default all of them."""
    out, a, b, c0 = buffers
    reverse, exclusive = bool(node.attrs.get("reverse")), bool(node.attrs.get("exclusive"))
    kernel = Kernel(ctx, "linear_scan", [a, b, c0, work, out], scalars=2 if steps is None else 4)
    kb = kernel.builder
    first, stop = kernel.scalars[:2]
    rows = ir.Constant(I64, 1)
    for d in out.shape[1:-1]:
        rows = kb.mul(rows, kernel.dim(d))
    n = kernel.dim(out.shape[-1])
    strides = [operand_strides(kernel, buf.shape, out.shape) for buf in (a, b)]
    per_step = kb.mul(rows, n)
    A, Bv, C0, C, Out = (buf.ptr for buf in kernel.buffers)
    emit_loop(kb, first, stop, 1, lambda q: kb.store(kb.load(kb.gep(C0, [q], inbounds=True)),
                                                     kb.gep(C, [q], inbounds=True)))
    # The rows that hold some of the columns: [first // n, ceil(stop / n)).
    row_range = (kb.sdiv(first, n), kb.sdiv(kb.add(stop, kb.sub(n, ir.Constant(I64, 1))), n))

    def step(k: ir.Value) -> None:
        t = kb.sub(kb.sub(kernel.T, ir.Constant(I64, 1)), k) if reverse else k

        def row(r: ir.Value) -> None:
            start = kb.mul(r, n)
            low = kb.sub(first, start)
            low = kb.select(kb.icmp_signed("<", low, ir.Constant(I64, 0)), ir.Constant(I64, 0),
                            low)
            high = _min(kb, kb.sub(stop, start), n)

            def feature(j: ir.Value) -> None:
                at = kb.add(start, j)
                av, bv = (kb.load(kb.gep(ptr, [kb.add(kb.add(kb.mul(t, st), kb.mul(r, sr)),
                                                      kb.mul(j, sj))], inbounds=True))
                          for ptr, (st, sr, sj) in zip((A, Bv), strides, strict=True))
                cell = kb.gep(C, [at], inbounds=True)
                before = kb.load(cell)
                after = kb.fadd(kb.fmul(av, before), bv)
                kb.store(after, cell)
                kb.store(before if exclusive else after,
                         kb.gep(Out, [kb.add(kb.mul(t, per_step), at)], inbounds=True))

            emit_loop(kb, low, high, 1, feature)

        emit_loop(kb, *row_range, 1, row)

    if steps is None:
        kernel.loop(kernel.T, step)
        kernel.finish(scalars=columns)
    else:
        emit_loop(kb, *kernel.scalars[2:], 1, step)
        kernel.finish(scalars=columns + steps)


def emit_last_step(ctx: Context, node: Node, out: Buffer, x: Buffer) -> None:
    """``out = x[T-1]`` (``x[0]`` with ``reverse``): a copy of one step's slice."""
    b = ctx.builder
    if node.attrs.get("reverse"):
        step = ir.Constant(I64, 0)
    else:
        step = b.sub(ctx.T, ir.Constant(I64, 1))
    start = b.gep(x.ptr, [b.mul(step, ctx.numel(x.shape[1:]))], inbounds=True)
    ctx.copy(out, Buffer(start, out.shape))
