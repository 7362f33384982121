"""Per-element evaluation: the loops that compute a fused region or one elementwise or layout node.

A region (a fused node's graph, or a single node of an outer graph) is evaluated per element,
operands before users, with an index per axis of the value being read (an explicit stack, so a
chain of thousands of ops needs no deep recursion). An operand of a smaller shape is read with
its broadcast axes pinned to 0. A layout op is read through its index rule (``Op.pieces``):
column ``j`` of its result is the piece whose column range holds ``j``, which reads column
``(scale * j + offset) / div`` of its operand (0.0 off that grid), or is 0.0. Every piece is
read and the right one selected, so each read is clamped into its operand and every load stays
inside its buffer.

A thread team's split by hidden units evaluates a region only at a :class:`Span` of each
output's columns (its units in every gate), over all rows; the index stays the element's own,
so every operand is read at the right column.

The per-element arithmetic of each elementwise op is the rule table
``rnnc.backends.llvm.scalar.SCALAR``. A fused node's region is cut into parts and each part
emitted here or, when it reduces over the feature axis, row by row
(:mod:`rnnc.backends.llvm.fused`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import scalar
from rnnc.backends.llvm.context import I64, Buffer, Context, Shape
from rnnc.backends.llvm.kernels import Kernel, emit_loop
from rnnc.ir import Node


def per_element(op: ops.Op) -> bool:
    """Whether a region evaluates ``op`` element by element (reductions need a node's loop)."""
    return op in scalar.SCALAR or op in scalar.INDEXED or op.kind is ops.OpKind.LAYOUT \
        or op is ops.constant


def broadcast_index(index: Sequence[ir.Value], out: Shape, src: Shape) -> tuple:
    """The index into a ``src``-shaped operand of an element at ``index`` of ``out``."""
    zero = ir.Constant(I64, 0)
    lead = len(out) - len(src)
    return tuple(zero if s == 1 and out[lead + ax] != 1 else index[lead + ax]
                 for ax, s in enumerate(src))


# The elements a node reads, as (operand id, index), and the function combining their values.
Reads = tuple[list[tuple[int, tuple]], Callable[[list], ir.Value]]


class Region:
    """Per-element evaluation of a region, given as its nodes by id, whose leaves are kernel
    buffers.

    A value is computed after its operands with an explicit stack, not by recursion: a chain of
    thousands of elementwise ops is as deep as it is long.
    """

    def __init__(self, kernel: Kernel, nodes: Mapping[int, Node], leaves: dict[int, int]) -> None:
        self.k = kernel
        self.nodes = nodes
        self.leaves = leaves  # node id -> kernel buffer number
        # (node, ids of index values) -> (value, index); the index is kept so that no id is
        # reused by a new index value while its key is in the memo.
        self.memo: dict[tuple, tuple[ir.Value, tuple]] = {}
        # id of a column index value -> (the value, lo, hi): the index lies in [lo, hi).
        # A layout node read at such a column reads only the piece holding that range.
        self.ranges: dict[int, tuple[ir.Value, int, int]] = {}

    def known_range(self, value: ir.Value, lo: int, hi: int) -> None:
        """Record that the column index ``value`` lies in ``[lo, hi)``."""
        self.ranges[id(value)] = (value, lo, hi)

    @staticmethod
    def _key(nid: int, index: tuple) -> tuple:
        return (nid,) + tuple(id(i) for i in index)

    def value(self, nid: int, index: tuple) -> ir.Value:
        """Node ``nid`` at element ``index``, emitting what it needs that is not yet emitted."""
        pending: dict[tuple, Reads] = {}
        stack = [(nid, index)]
        while stack:
            top, at = stack[-1]
            key = self._key(top, at)
            if key in self.memo:
                stack.pop()
                continue
            if key not in pending:
                pending[key] = self._reads(top, at)
            reads, finish = pending[key]
            missing = [r for r in reads if self._key(*r) not in self.memo]
            if missing:
                stack.extend(reversed(missing))
                continue
            stack.pop()
            self.memo[key] = (finish([self.memo[self._key(*r)][0] for r in reads]), at)
        return self.memo[self._key(nid, index)][0]

    def _reads(self, nid: int, index: tuple) -> Reads:
        """What node ``nid`` reads at ``index``, and how it combines the values."""
        if nid in self.leaves:
            return [], lambda _: self.k.load(self.leaves[nid], index)
        node = self.nodes[nid]
        if node.op is ops.constant:
            return [], lambda _: ir.Constant(self.k.ctx.scalar, float(node.attrs["value"]))
        if node.op in scalar.SCALAR:
            reads = [(src, broadcast_index(index, node.shape, self.nodes[src].shape))
                     for src in node.inputs]
            return reads, lambda args: scalar.SCALAR[node.op](self.k.builder, *args, **node.attrs)
        if node.op.kind is ops.OpKind.LAYOUT:
            return self._layout_reads(node, index)
        if node.op in scalar.INDEXED:  # reads chosen elements and uses the index (bernoulli)
            return scalar.INDEXED[node.op](self.k.builder, node, index)
        raise NotImplementedError(f"{node.op.name} cannot be evaluated per element")

    def _layout_reads(self, node: Node, index: tuple) -> Reads:
        """A layout node at ``index``: one read per piece of its index rule, then a select of
        the piece holding the column (a piece of no operand is 0.0)."""
        b = self.k.builder
        lead, j = index[:-1], index[-1]
        shapes = [self.nodes[src].shape for src in node.inputs]
        pieces = [p for p in node.op.pieces(*(s[-1] for s in shapes), **node.attrs)
                  if p.start < p.stop]
        known = self.ranges.get(id(j))
        if known is not None:
            direct = self._one_piece(node, index, pieces, shapes, known[1], known[2])
            if direct is not None:
                return direct
        reads: list[tuple[int, tuple]] = []
        arms: list[int | None] = []  # per piece: its position in reads, or None for 0.0
        for piece in pieces:
            if piece.operand is None:
                arms.append(None)
                continue
            shape = shapes[piece.operand]
            column = self._column(j, piece, shape[-1], node.shape[-1])
            arms.append(len(reads))
            reads.append((node.inputs[piece.operand],
                          broadcast_index(lead, node.shape[:-1], shape[:-1]) + (column,)))
        zero = ir.Constant(self.k.ctx.scalar, 0.0)

        def pick(piece: ops.Piece, arm: int | None, values: list) -> ir.Value:
            if arm is None:
                return zero
            if piece.div == 1:
                return values[arm]
            # Off the div grid (between spread-out columns): 0.0.
            rest = b.srem(self._numerator(j, piece), ir.Constant(I64, piece.div))
            return b.select(b.icmp_signed("==", rest, ir.Constant(I64, 0)), values[arm], zero)

        def select(values: list) -> ir.Value:
            result = pick(pieces[-1], arms[-1], values)
            for piece, arm in zip(pieces[-2::-1], arms[-2::-1], strict=True):
                inside = b.icmp_signed("<", j, ir.Constant(I64, piece.stop))
                result = b.select(inside, pick(piece, arm, values), result)
            return result

        return reads, select

    def _one_piece(self, node: Node, index: tuple, pieces: list[ops.Piece], shapes: list,
                   lo: int, hi: int) -> Reads | None:
        """The reads of a layout node at a column known to lie in ``[lo, hi)``, when one plain
        piece (or a piece of zeros) holds that whole range: no select, no clamp. None when the
        range crosses pieces or the piece spreads or skips columns."""
        inside = [p for p in pieces if p.start <= lo and hi <= p.stop]
        if not inside:
            return None
        piece = inside[0]
        if piece.operand is None:
            zero = ir.Constant(self.k.ctx.scalar, 0.0)
            return [], lambda _: zero
        if piece.scale != 1 or piece.div != 1:
            return None
        lead, j = index[:-1], index[-1]
        shape = shapes[piece.operand]
        column = self._numerator(j, piece)
        self.known_range(column, lo + piece.offset, hi + piece.offset)
        read = (node.inputs[piece.operand],
                broadcast_index(lead, node.shape[:-1], shape[:-1]) + (column,))
        return [read], lambda values: values[0]

    def _numerator(self, j: ir.Value, piece: ops.Piece) -> ir.Value:
        """``scale * j + offset``: the operand column times ``div``."""
        b = self.k.builder
        column = j if piece.scale == 1 else b.mul(j, ir.Constant(I64, piece.scale))
        return b.add(column, ir.Constant(I64, piece.offset)) if piece.offset else column

    def _column(self, j: ir.Value, piece: ops.Piece, width: int, n: int) -> ir.Value:
        """The operand column ``piece`` reads at column ``j`` of an ``n``-wide result, clamped
        into ``[0, width)`` on each side that some ``j < n`` would cross."""
        b = self.k.builder
        if piece.scale == 0:
            return ir.Constant(I64, min(max(piece.column(0), 0), width - 1))
        column = self._numerator(j, piece)
        if piece.div != 1:  # rounds toward 0, not down: apart only below 0, clamped below
            column = b.sdiv(column, ir.Constant(I64, piece.div))
        ends = (piece.column(0), piece.column(n - 1))
        if min(ends) < 0:
            low = ir.Constant(I64, 0)
            column = b.select(b.icmp_signed("<", column, low), low, column)
        if max(ends) > width - 1:
            high = ir.Constant(I64, width - 1)
            column = b.select(b.icmp_signed(">", column, high), high, column)
        return column


@dataclass(frozen=True)
class Span:
    """A thread's hidden units ``[first, stop)`` (column numbers, i64 values of ``rnnc_run``)
    of a step whose gates are ``units`` columns wide: a value ``g * units`` wide is computed
    only at its columns ``k * units + [first, stop)``, for every ``k < g``, over all its rows
    (:mod:`rnnc.backends.llvm.team`)."""

    first: ir.Value
    stop: ir.Value
    units: int


def _span_columns(kernel: Kernel, width: int, units: int, index: tuple,
                  body: Callable[[tuple], None]) -> None:
    """``body`` at the columns of each gate that the kernel's span arguments select."""
    b = kernel.builder
    first, stop = kernel.scalars
    for gate in range(width // units):
        offset = ir.Constant(I64, gate * units)
        emit_loop(b, b.add(first, offset), b.add(stop, offset), 1,
                  lambda j: body(index + (j,)))


def _column_cuts(nodes: Mapping[int, Node], shape: Shape) -> list[int]:
    """The column boundaries ``0 = c0 < c1 < ... = width`` of a loop over ``shape``'s last
    axis at which some layout node of the region as wide as it changes piece (just ``0`` and
    the width when none does); [] when the width is not a number.

    A column loop cut there runs each range with every such piece known, so a gate's
    gradient written into its columns of the concatenated gates (backward's pads) is
    computed only at its own columns, in a loop that vectorizes, instead of every gate's
    at every column and a select."""
    width = shape[-1] if shape else None
    if not isinstance(width, int):
        return []
    cuts = {0, width}
    for node in nodes.values():
        if node.op.kind is ops.OpKind.LAYOUT and node.shape and node.shape[-1] == width:
            widths = [nodes[src].shape[-1] if src in nodes else None for src in node.inputs]
            if any(not isinstance(w, int) for w in widths):
                continue
            cuts.update(p.start for p in node.op.pieces(*widths, **node.attrs))
    return sorted(c for c in cuts if 0 <= c <= width)


def _cut_columns(kernel: Kernel, region: Region, cuts: list[int], index: tuple,
                 body: Callable[[tuple], None]) -> None:
    """``body`` at every column, one loop per range between ``cuts``, each range known to
    the region."""
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        def at(j: ir.Value, lo: int = lo, hi: int = hi) -> None:
            region.known_range(j, lo, hi)
            body(index + (j,))
        emit_loop(kernel.builder, ir.Constant(I64, lo), ir.Constant(I64, hi), 1, at)


def emit_region(ctx: Context, nodes: Mapping[int, Node], leaves: dict[int, Buffer],
                outputs: dict[int, Buffer], name: str, span: Span | None = None) -> None:
    """Compute ``outputs`` (node id -> destination) of a region of ``nodes`` from its
    ``leaves``; with ``span``, only at the span's columns of each output.

    Outputs of the same shape share one loop nest.
    """
    groups: dict[Shape, list[int]] = {}
    for nid, buf in outputs.items():
        groups.setdefault(tuple(buf.shape), []).append(nid)
    leaf_ids = list(leaves)
    for shape, nids in groups.items():
        kernel = Kernel(ctx, name, [leaves[n] for n in leaf_ids] + [outputs[n] for n in nids],
                        scalars=0 if span is None else 2)
        region = Region(kernel, nodes, {n: k for k, n in enumerate(leaf_ids)})

        def body(index: tuple, nids: list[int] = nids, region: Region = region,
                 kernel: Kernel = kernel) -> None:
            region.memo.clear()
            for pos, nid in enumerate(nids):
                kernel.store(len(leaf_ids) + pos, index, region.value(nid, index))

        if span is None:
            cuts = _column_cuts(nodes, shape)
            if not cuts:
                kernel.nest(shape, body)
                kernel.finish()
                continue
            kernel.nest(shape[:-1], lambda index, kernel=kernel, cuts=cuts, body=body,
                        region=region: _cut_columns(kernel, region, cuts, index, body))
            kernel.finish()
            continue
        kernel.nest(shape[:-1], lambda index, kernel=kernel, width=shape[-1], body=body:
                    _span_columns(kernel, width, span.units, index, body))
        kernel.finish(scalars=(span.first, span.stop))


def emit_copy(ctx: Context, dst: Buffer, src: Buffer, span: Span) -> None:
    """``dst = src`` at the span's columns of each row."""
    emit_region(ctx, {}, {0: src}, {0: dst}, "copy", span)

