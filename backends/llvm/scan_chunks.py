"""``linear_scan`` split over its steps across a thread team: reduce, then scan.

A team build (:mod:`rnnc.backends.llvm.team`) splits a ``linear_scan`` by columns when each
thread's columns of one step fill a page (``LlvmSchedule.scan_thread_min_bytes``); a narrower
scan (``B = 1, H = 512`` in float32 is 2 KiB a step) is split over its steps instead, one chunk of
consecutive steps per thread, in scan order (from the last step when reversed): thread ``k``
owns the steps ``[S_k, S_k+1)``, ``S_0 = 0``, ``S_N = T``.

- Thread 0 owns the first chunk, whose carry-in is ``c0``: it scans it at once, in one pass.
- Every other thread ``k`` first reduces the chunk *before* its own, ``k - 1``: ``A_k``, the
  product of ``a`` over that chunk, and ``V_k``, the value the chunk maps 0 to (thread 1: the
  value it maps ``c0`` to, the carry out of the first chunk), both per column, into the
  team's workspace, without writing the result. Threads 1 .. N-1 meet at a barrier of their
  own, which thread 0 never waits at; then each composes its carry-in from the workspace
  (``X = V_1``, then ``X = A_j X + V_j`` for ``j = 2 .. k``: no second barrier) and scans its
  chunk from it, writing the result (``exclusive``: the value before each step).

Thread 0 makes one pass over its steps, the others two, and thread 1's reduction of the
first chunk is what the others wait for: with ``r`` the time of a reduction step over that
of a scan step, all threads finish together when the first chunk has ``1 / (1 - r)`` times
the steps of each other chunk (``L0 = r L0 + L``). ``LlvmSchedule.scan_first_chunk_weight`` is
that ratio in sixteenths, from the measurement in ``docs/passes.md`` (parallel-scan).

On a team of two, thread 1 reduces the first chunk from ``c0`` by the scan's own operations:
the results are bitwise those of one thread. On larger teams the carries are composed in
another order than one thread's loop: the results agree within rounding, and are the same on
every run of a team of the same size.

The workspace is one fixed slot of ``LlvmSchedule.scan_workspace_bytes`` shared by every
chunked scan of a program, :data:`BUFFERS_PER_THREAD` column vectors per thread (``A``,
``V``, the carry-in and the running value), so a team of ``N`` chunks a scan of ``columns``
columns only where :func:`fits`; pages of the slot that no thread touches cost no memory.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from rnnc.backends.llvm.context import I64, Buffer, Context, Shape
from rnnc.backends.llvm.kernels import Kernel, emit_loop
from rnnc.backends.llvm.scan import emit_linear_scan_columns, operand_strides
from rnnc.backends.schedule import LlvmSchedule
from rnnc.ir import Node

# Column vectors a thread keeps in the workspace (A, V, the carry-in, the running value): a
# fact of the algorithm. The workspace's size is the schedule's (scan_workspace_bytes).
BUFFERS_PER_THREAD = 4
# The smallest normal float and double: a product of coefficients below it is flushed to 0,
# since arithmetic on subnormal numbers is many times slower and the carry it scales is
# then lost to rounding anyway.
_TINY = {"f32": 1.1754943508222875e-38, "f64": 2.2250738585072014e-308}


def fits(columns: int, threads: int, itemsize: int, workspace: int) -> bool:
    """Whether a workspace of ``workspace`` bytes holds a team of ``threads`` chunking a scan
    of ``columns``."""
    return threads * BUFFERS_PER_THREAD * columns * itemsize <= workspace


def chunk_bounds(steps: int, threads: int, weight: int | None = None) -> list[int]:
    """``[S_0, .., S_N]``: thread ``k`` scans the steps ``[S_k, S_k+1)`` in scan order, the
    first chunk ``weight`` sixteenths of each other's (None: the schedule's default; the
    generated code computes the same integers)."""
    weight = LlvmSchedule().scan_first_chunk_weight if weight is None else weight
    units = weight + 16 * (threads - 1)
    return [0] + [steps * (weight + 16 * (k - 1)) // units for k in range(1, threads + 1)]


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _bound(b: ir.IRBuilder, steps: ir.Value, k: ir.Value, size: ir.Value, first: int
           ) -> ir.Value:
    """``S_k`` of :func:`chunk_bounds` for the i64 values ``k`` and ``size``, the first
    chunk's weight ``first``."""
    units = b.add(_c(first), b.mul(_c(16), b.sub(size, _c(1))))
    weight = b.add(_c(first), b.mul(_c(16), b.sub(k, _c(1))))
    return b.select(b.icmp_signed("==", k, _c(0)), _c(0), b.sdiv(b.mul(steps, weight), units))


def emit_chunked_scan(ctx: Context, node: Node, buffers: tuple[Buffer, ...], space: Buffer,
                      thread: tuple[ir.Value, ir.Value], meet: Callable[[], None],
                      weight: int) -> None:
    """This thread's part of ``out = linear_scan(a, b, c0)``, ``buffers`` being
    ``(out, a, b, c0)``, split over the steps; ``thread`` is ``(tid, team size)``, ``space``
    the workspace, ``meet()`` emits the barrier of threads 1 .. N-1 and ``weight`` is the
    first chunk's (:func:`chunk_bounds`)."""
    out, a, b_, c0 = buffers
    b = ctx.builder
    tid, size = thread
    total = ctx.numel(out.shape[1:])

    def column_vector(k: ir.Value, which: int) -> Buffer:
        at = b.add(b.mul(k, _c(BUFFERS_PER_THREAD)), _c(which))
        return Buffer(b.gep(space.ptr, [b.mul(at, total)], inbounds=True), c0.shape)

    carry = column_vector(tid, 2)
    with b.if_then(b.icmp_signed(">", tid, _c(0))):
        previous = b.sub(tid, _c(1))
        steps = (_bound(b, ctx.T, previous, size, weight), _bound(b, ctx.T, tid, size, weight))
        from_start = b.zext(b.icmp_signed("==", tid, _c(1)), I64)
        _emit_reduce(ctx, node, out.shape,
                     (a, b_, c0, column_vector(tid, 0), column_vector(tid, 1)),
                     (*steps, from_start))
        meet()
        _emit_carry(ctx, space, carry, (tid, total))
    start = Buffer(b.select(b.icmp_signed("==", tid, _c(0)), c0.ptr, carry.ptr), c0.shape)
    steps = (_bound(b, ctx.T, tid, size, weight),
             _bound(b, ctx.T, b.add(tid, _c(1)), size, weight))
    emit_linear_scan_columns(ctx, node, (out, a, b_, start), column_vector(tid, 3),
                             (_c(0), total), steps)


def _emit_reduce(ctx: Context, node: Node, out_shape: Shape, buffers: tuple[Buffer, ...],
                 scalars: tuple[ir.Value, ...]) -> None:
    """``A = prod a`` and ``V = a * V + b`` over the steps ``[first, stop)`` in scan order,
    ``buffers`` being ``(a, b, c0, A, V)`` and ``scalars`` ``(first, stop, from_start)``: ``V``
    starts at ``c0`` where ``from_start`` is 1, else at 0; ``out_shape``: the result's."""
    reverse = bool(node.attrs.get("reverse"))
    kernel = Kernel(ctx, "linear_scan_reduce", list(buffers), scalars=3)
    kb = kernel.builder
    first, stop, from_start = kernel.scalars
    n = kernel.dim(out_shape[-1])
    rows = _c(1)
    for d in out_shape[1:-1]:
        rows = kb.mul(rows, kernel.dim(d))
    strides = [operand_strides(kernel, buf.shape, out_shape) for buf in buffers[:2]]
    A, Bv, C0, P, V = (buf.ptr for buf in kernel.buffers)
    one, zero = ir.Constant(ctx.scalar, 1.0), ir.Constant(ctx.scalar, 0.0)
    tiny = ir.Constant(ctx.scalar, _TINY[ctx.dtype])
    fabs = ctx.module.declare_intrinsic("llvm.fabs", [ctx.scalar])
    start = kb.icmp_signed("!=", from_start, _c(0))

    def init(q: ir.Value) -> None:
        kb.store(one, kb.gep(P, [q], inbounds=True))
        kb.store(kb.select(start, kb.load(kb.gep(C0, [q], inbounds=True)), zero),
                 kb.gep(V, [q], inbounds=True))

    emit_loop(kb, _c(0), kb.mul(rows, n), 1, init)

    def step(s: ir.Value) -> None:
        t = kb.sub(kb.sub(kernel.T, _c(1)), s) if reverse else s

        def feature(r: ir.Value, j: ir.Value) -> None:
            at = kb.add(kb.mul(r, n), j)
            av, bv = (kb.load(kb.gep(ptr, [kb.add(kb.add(kb.mul(t, st), kb.mul(r, sr)),
                                                  kb.mul(j, sj))], inbounds=True))
                      for ptr, (st, sr, sj) in zip((A, Bv), strides, strict=True))
            product, value = kb.gep(P, [at], inbounds=True), kb.gep(V, [at], inbounds=True)
            p = kb.fmul(kb.load(product), av)
            kb.store(kb.select(kb.fcmp_ordered("<", kb.call(fabs, [p]), tiny), zero, p), product)
            # The scan's own operations (no fused multiply-add): bitwise one thread's value.
            kb.store(kb.fadd(kb.fmul(av, kb.load(value)), bv), value)

        emit_loop(kb, _c(0), rows, 1, lambda r: emit_loop(kb, _c(0), n, 1,
                                                            lambda j: feature(r, j)))

    emit_loop(kb, first, stop, 1, step)
    kernel.finish(scalars=scalars)


def _emit_carry(ctx: Context, space: Buffer, carry: Buffer,
                scalars: tuple[ir.Value, ir.Value]) -> None:
    """``carry = V_1``, then ``carry = A_j * carry + V_j`` for ``j = 2 .. k``: the carry into
    chunk ``k``, ``scalars`` being ``(k, columns)``."""
    kernel = Kernel(ctx, "linear_scan_carry", [space, carry], scalars=2)
    kb = kernel.builder
    k, total = kernel.scalars
    W, X = (buf.ptr for buf in kernel.buffers)

    def vector(j: ir.Value, which: int) -> ir.Value:
        at = kb.add(kb.mul(j, _c(BUFFERS_PER_THREAD)), _c(which))
        return kb.gep(W, [kb.mul(at, total)], inbounds=True)

    first = vector(_c(1), 1)
    emit_loop(kb, _c(0), total, 1, lambda q: kb.store(
        kb.load(kb.gep(first, [q], inbounds=True)), kb.gep(X, [q], inbounds=True)))

    def compose(j: ir.Value) -> None:
        product, value = vector(j, 0), vector(j, 1)

        def column(q: ir.Value) -> None:
            x = kb.gep(X, [q], inbounds=True)
            scaled = kb.fmul(kb.load(kb.gep(product, [q], inbounds=True)), kb.load(x))
            kb.store(kb.fadd(scaled, kb.load(kb.gep(value, [q], inbounds=True))), x)

        emit_loop(kb, _c(0), total, 1, column)

    emit_loop(kb, _c(2), kb.add(k, _c(1)), 1, compose)
    kernel.finish(scalars=scalars)
