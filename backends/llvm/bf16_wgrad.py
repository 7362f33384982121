"""The bfloat16 weight gradient ``out = a^T @ g`` (``matmul[transpose_a]``) on the kernels of
:mod:`rnnc.backends.llvm.bf16`, with a depth known only at the call.

``a`` is K x M and ``g`` K x N (float32, every leading axis flattened into the K rows: ``T *
B`` for the hoisted weight gradient, ``B`` for a per-step one), ``out`` M x N. Both operands
change at every call, so at each call:

- ``a^T`` is converted into ``abuf``, M rows of ``Kp`` bf16 (zero from K on), the A format
  of every tier (:func:`transpose_convert_function`), two K rows at a time: one 32-bit pair
  word per column of ``a``;
- ``g`` is packed into the VNNI pair layout by column panels (:func:`pack_rows_function`),
  nothing cached: the layout of :func:`rnnc.backends.llvm.bf16.pack_function` with ``Kp``
  the call's;
- the tier's GEMM with a runtime depth (``bf16.gemm_function(module, tier, None, n)``) runs
  ``out = abuf @ packed``: ``vdpbf16ps`` or AMX tiles, float32 accumulation, the same
  rounding model as the emulation.

``Kp`` (K rounded up to :data:`~rnnc.backends.llvm.bf16.K_BLOCK`) is a runtime value while
workspace slots are sized by symbolic shapes, so each workspace is one of two slots
(:func:`_workspace`). In a team build, outside the time loop, every thread converts its share
of ``abuf``'s rows and packs the panels it then multiplies (:func:`emit_wgrad`).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from rnnc.backends.llvm import bf16
from rnnc.backends.llvm.bf16 import BF16P, F32, I16, K_BLOCK, PANEL, to_bf16
from rnnc.backends.llvm.context import I32, I64, Buffer, Context, Shape
from rnnc.backends.llvm.dpbf16 import depth_values
from rnnc.backends.llvm.kernels import emit_loop
from rnnc.backends.llvm.team import Team

LANES = 16  # columns of ``a`` converted at once: one zmm of float32


_c = bf16._c  # an i64 constant


def _interleave(b: ir.IRBuilder, even: ir.Value, odd: ir.Value, count: int) -> ir.Value:
    """Two vectors of ``count`` bf16 as one of ``count`` pairs ``(even[j], odd[j])``."""
    order = [j // 2 + count * (j % 2) for j in range(2 * count)]
    return b.shuffle_vector(even, odd, ir.Constant(ir.VectorType(I32, 2 * count), order))


def _transpose(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The transpose of a square of vectors (``rows[i][j]`` becomes ``out[j][i]``): the
    off-diagonal blocks swapped at every scale, half the width first, in shuffles."""
    count = len(rows)
    rows = list(rows)
    step = count // 2
    while step:
        first = [j if not j & step else count + j - step for j in range(count)]
        second = [j + step if not j & step else count + j for j in range(count)]
        masks = [ir.Constant(ir.VectorType(I32, count), order) for order in (first, second)]
        for i in range(count):
            if not i & step:
                low, high = rows[i], rows[i + step]
                rows[i], rows[i + step] = (b.shuffle_vector(low, high, mask) for mask in masks)
        step //= 2
    return rows


def _convert_columns(b: ir.IRBuilder, a: ir.Value, m: int, k: ir.Value, r0: ir.Value,
                     row_word: Callable[[ir.Value, ir.Value], ir.Value]) -> None:
    """Columns ``r0 .. r0 + LANES`` of ``a`` (K x m) into ``abuf`` (``row_word(r, q)``: the
    address of pair word ``q`` of its row ``r``): pairs of K rows loaded as vectors, rounded,
    interleaved; :data:`LANES` pairs at a time transposed in registers and stored as one
    vector per column, the pairs left one word per column, an odd last K row with zero."""
    vec = ir.VectorType(F32, LANES)

    def load(row: ir.Value) -> ir.Value:
        src = b.gep(a, [b.add(b.mul(row, _c(m)), r0)])
        return to_bf16(b, b.load(b.bitcast(src, vec.as_pointer()), align=4))

    def words_of(q: ir.Value) -> ir.Value:
        """Pair ``q`` of every column: one 32-bit word per lane."""
        even = load(b.mul(q, _c(2)))
        odd = load(b.add(b.mul(q, _c(2)), _c(1)))
        return b.bitcast(_interleave(b, even, odd, LANES), ir.VectorType(I32, LANES))

    def block(qb: ir.Value) -> None:
        q0 = b.mul(qb, _c(LANES))
        rows = _transpose(b, [words_of(b.add(q0, _c(j))) for j in range(LANES)])
        for lane, row in enumerate(rows):
            dst = b.bitcast(row_word(b.add(r0, _c(lane)), q0), row.type.as_pointer())
            b.store(row, dst, align=4)

    def pair(q: ir.Value) -> None:
        both = words_of(q)
        for lane in range(LANES):
            b.store(b.extract_element(both, _c(lane)), row_word(b.add(r0, _c(lane)), q))

    blocks = emit_loop(b, _c(0), b.sdiv(k, _c(2 * LANES)), 1, block)
    end = emit_loop(b, b.mul(blocks, _c(LANES)), b.sdiv(k, _c(2)), 1, pair)
    with b.if_then(b.icmp_signed("!=", b.srem(k, _c(2)), _c(0))):
        # The last, odd K row: its pair's second half is zero.
        last = b.zext(b.bitcast(load(b.sub(k, _c(1))), ir.VectorType(I16, LANES)),
                      ir.VectorType(I32, LANES))
        for lane in range(LANES):
            b.store(b.extract_element(last, _c(lane)), row_word(b.add(r0, _c(lane)), end))


def transpose_convert_function(module: ir.Module, m: int) -> ir.Function:
    """``rnnc.bf16.tconvert.M(i64 k, float* a, i16* abuf, i64 first, i64 stop)``: rows
    ``first .. stop`` of ``abuf = bf16(a^T)`` for ``a`` K x M: ``abuf[r, :Kp]`` holds column
    ``r`` of ``a`` rounded to nearest even, zero from K to ``Kp``."""
    fptr = F32.as_pointer()
    fn, new = bf16.internal_function(module, f"rnnc.bf16.tconvert.{m}",
                                     [I64, fptr, BF16P, I64, I64])
    if not new:
        return fn
    k, a, abuf, first, stop = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    kp = depth_values(b, k)[0]
    words = b.bitcast(abuf, I32.as_pointer())  # abuf as pair words: Kp / 2 per row
    half = b.sdiv(kp, _c(2))

    def row_word(r: ir.Value, q: ir.Value) -> ir.Value:
        return b.gep(words, [b.add(b.mul(r, half), q)])

    def single(r: ir.Value) -> None:
        """One column of ``a`` (the rows left after whole vectors), value by value."""
        dst = b.gep(abuf, [b.mul(r, kp)])
        emit_loop(b, _c(0), k, 1, lambda kk: b.store(
            to_bf16(b, b.load(b.gep(a, [b.add(b.mul(kk, _c(m)), r)]))), b.gep(dst, [kk])))
        with b.if_then(b.icmp_signed("!=", b.srem(k, _c(2)), _c(0))):
            b.store(ir.Constant(I16, 0), b.gep(dst, [k]))

    whole = b.add(first, b.mul(b.sdiv(b.sub(stop, first), _c(LANES)), _c(LANES)))
    emit_loop(b, first, whole, LANES, lambda r0: _convert_columns(b, a, m, k, r0, row_word))
    emit_loop(b, whole, stop, 1, single)
    # Zero pair words from the last (half) pair on: the padding AMX's tiles read.
    pairs = b.sdiv(b.add(k, _c(1)), _c(2))
    emit_loop(b, first, stop, 1, lambda r: emit_loop(
        b, pairs, half, 1, lambda q: b.store(ir.Constant(I32, 0), row_word(r, q))))
    b.ret_void()
    return fn


def pack_rows_function(module: ir.Module, n: int) -> ir.Function:
    """``rnnc.bf16.gpack.N(i64 k, float* g, i16* packed, i64 first, i64 stop)``: panels
    ``first .. stop`` of ``g`` (K x N) in the VNNI pair layout of
    :func:`rnnc.backends.llvm.bf16.pack_function`, ``Kp`` the call's: ``packed[p][q][c][j]
    = bf16(g[2q + j, PANEL * p + c])``, zero outside ``g``."""
    fptr = F32.as_pointer()
    fn, new = bf16.internal_function(module, f"rnnc.bf16.gpack.{n}", [I64, fptr, BF16P, I64, I64])
    if not new:
        return fn
    k, g, packed, first, stop = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    kp = depth_values(b, k)[0]
    half = b.sdiv(kp, _c(2))
    vec = ir.VectorType(F32, PANEL)

    def pair_row(p: ir.Value, q: ir.Value) -> ir.Value:
        return b.gep(packed, [b.mul(b.add(b.mul(p, half), q), _c(2 * PANEL))])

    def inside(p: ir.Value, q: ir.Value) -> None:
        """Pair row ``q`` of a whole panel, both K rows inside ``g``: in vectors."""
        rows = [to_bf16(b, b.load(b.bitcast(
            b.gep(g, [b.add(b.mul(b.add(b.mul(q, _c(2)), _c(j)), _c(n)), b.mul(p, _c(PANEL)))]),
            vec.as_pointer()), align=4)) for j in range(2)]
        out = b.bitcast(pair_row(p, q), ir.VectorType(I16, 2 * PANEL).as_pointer())
        b.store(_interleave(b, rows[0], rows[1], PANEL), out, align=2)

    def edge(p: ir.Value, q: ir.Value) -> None:
        """Pair row ``q`` reaching past ``g``'s last row or column: value by value, zero
        outside (the load's index clamped to 0 there, so that it stays inside)."""
        row = pair_row(p, q)
        for c in range(PANEL):
            col = b.add(b.mul(p, _c(PANEL)), _c(c))
            for j in range(2):
                kk = b.add(b.mul(q, _c(2)), _c(j))
                within = b.and_(b.icmp_signed("<", kk, k), b.icmp_signed("<", col, _c(n)))
                index = b.select(within, b.add(b.mul(kk, _c(n)), col), _c(0))
                value = b.select(within, b.load(b.gep(g, [index])), ir.Constant(F32, 0))
                b.store(to_bf16(b, value), b.gep(row, [_c(2 * c + j)]))

    def panel(p: ir.Value) -> None:
        whole = b.icmp_signed("<=", b.mul(b.add(p, _c(1)), _c(PANEL)), _c(n))
        with b.if_else(whole) as (full, partial):
            with full:
                end = emit_loop(b, _c(0), b.sdiv(k, _c(2)), 1, lambda q: inside(p, q))
                emit_loop(b, end, half, 1, lambda q: edge(p, q))
            with partial:
                emit_loop(b, _c(0), half, 1, lambda q: edge(p, q))

    emit_loop(b, first, stop, 1, panel)
    b.ret_void()
    return fn


class _Workspace:
    """An ``i16*`` workspace of ``width`` rows of ``Kp`` bf16 for the K rows of ``lead``: a
    slot of ``K * width`` float32 words (``2 K >= Kp`` bf16 a row from K = 31 on), or, for K
    below :data:`K_BLOCK`, one of ``Kp = K_BLOCK`` bf16 a row."""

    def __init__(self, ctx: Context, lead: Shape, width: int) -> None:
        self.big = ctx.slot(tuple(lead) + (width,))
        self.small = ctx.slot((K_BLOCK // 2 * width,))

    def pointer(self, b: ir.IRBuilder, k: ir.Value) -> ir.Value:
        chosen = b.select(b.icmp_signed(">=", k, _c(K_BLOCK)), self.big.ptr, self.small.ptr)
        return b.bitcast(chosen, BF16P)


def emit_wgrad(ctx: Context, out: Buffer, a: Buffer, g: Buffer, tier: bf16.Tier | None = None,
               team: Team | None = None) -> None:
    """``out = bf16(a)^T @ bf16(g)`` summed in float32, at the call's depth; with ``team``
    (outside the time loop), split between the threads: ``abuf``'s rows, then the column
    panels."""
    tier = tier or bf16.host_tier()
    m, n = a.shape[-1], g.shape[-1]
    spaces = [_Workspace(ctx, a.shape[:-1], width) for width in (m, bf16.panel_count(n) * PANEL)]
    panels = _c(bf16.panel_count(n))

    def run(split: bool) -> None:
        # Everything is computed here: in a team build only this code runs on every thread.
        b = ctx.builder
        k = ctx.numel(a.shape[:-1])
        abuf, packed = (space.pointer(b, k) for space in spaces)
        rows, columns = (team.share(_c(m)), team.share(panels)) if split else \
            ((_c(0), _c(m)), (_c(0), panels))
        b.call(transpose_convert_function(ctx.module, m), [k, a.ptr, abuf, *rows])
        b.call(pack_rows_function(ctx.module, n), [k, g.ptr, packed, *columns])
        if split:  # every thread's rows of abuf written before any thread multiplies
            team.barrier()
        b.call(bf16.gemm_function(ctx.module, tier, None, n),
               [_c(m), abuf, packed, out.ptr, *columns, k])

    if team is None:
        run(False)
        return
    team.everyone(lambda: run(True))
