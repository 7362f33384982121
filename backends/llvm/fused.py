"""A fused node's region as loops: per element, or one row at a time when it reduces.

:func:`emit_fused` cuts a long region into parts of at most ``LlvmSchedule.kernel_nodes``
nodes (a value a later part reads goes through a workspace slot). A part without reductions
is one loop nest per output shape, evaluated per element (:mod:`rnnc.backends.llvm.region`).
A part with reductions over the feature axis (``sum``, ``mean``, ``amax``, ``amin``) is
computed row by row: the leading (row) dims of all its values broadcast to one row shape,
``(B,)`` in the loop or ``(T, B)`` outside it (:func:`row_shape`; codegen lowers a region
without one node by node). The kernel is one loop nest over the rows; for each row it
emits, in dependence order, one loop over the row per reduction, then one loop per output
width that computes the region's outputs::

    for each row r:
        m = 0;  for j < n: m += x[r, j]                    mean of the row
        m /= n
        v = 0;  for j < n: v += (x[r, j] - m) ** 2         reads m as a scalar of the row
        v /= n
        for j < n: out[r, j] = (x[r, j] - m) * rsqrt(v + eps) * g[j] + b[j]

A reduction reading another's result reads the scalar its loop left; the elementwise operands
of a reduction are recomputed inside its loop (they are cheap, and the row is in cache). A
value that a reduction's loop computes at its own column and that a later loop would compute
again (the cell state that layer norm normalizes after the gate math made it; the gradient of
the gates that two reductions of a backward region read) is kept in a row of stack memory by
that loop, and later loops load it instead (:func:`_stage_plan`). The column loops have no
dependence between iterations, so they vectorize; a ``sum``/``mean`` accumulator may be
reassociated, so its loop vectorizes too (into partial sums).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import scalar
from rnnc.backends.llvm.context import I64, Buffer, Context, Shape
from rnnc.backends.llvm.kernels import Kernel
from rnnc.backends.llvm.region import (
    Reads,
    Region,
    Span,
    broadcast_index,
    emit_region,
    per_element,
)
from rnnc.backends.steps import GraphSteps
from rnnc.errors import ShapeError
from rnnc.ir import ARG, Node
from rnnc.op_types import broadcast_shapes

# The most stack memory the staged rows of one row kernel take; a value beyond it is
# recomputed by the loops that read it. (Kernels are inlined, so their rows share one frame.)
STAGE_BYTES = 64 * 1024


def _sum(b: ir.IRBuilder, acc: ir.Value, x: ir.Value) -> ir.Value:
    # reassoc lets the loop vectorizer keep partial sums; NaN and inf still propagate.
    return b.fadd(acc, x, flags=("reassoc",))


def _extreme(better: str) -> Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]:
    """amax (">") or amin ("<"): once the best is NaN no ordered compare replaces it."""
    def combine(b: ir.IRBuilder, acc: ir.Value, x: ir.Value) -> ir.Value:
        take = b.or_(b.fcmp_ordered(better, x, acc), b.fcmp_unordered("uno", x, x))
        return b.select(take, x, acc)
    return combine


# Per reduction: the accumulator's start, how an element joins it, and whether the row's
# result is the accumulator divided by the width.
REDUCTIONS: dict[ops.Op, tuple[float, Callable[..., ir.Value], bool]] = {
    ops.sum_: (0.0, _sum, False),
    ops.mean: (0.0, _sum, True),
    ops.amax: (-math.inf, _extreme(">"), False),
    ops.amin: (math.inf, _extreme("<"), False),
}


def lead(shape: Shape) -> Shape:
    """The row dims of a value: every axis but the feature axis (none for a scalar)."""
    return tuple(shape[:-1])


def row_shape(nodes: Iterable[Node]) -> Shape | None:
    """The row shape the leading dims of every node broadcast to, or None if they do not."""
    try:
        return tuple(broadcast_shapes((), *(lead(node.shape) for node in nodes)))
    except ShapeError:
        return None


def reduces(nodes: Iterable[Node]) -> bool:
    """Whether some node is a reduction over the feature axis."""
    return any(node.op in REDUCTIONS for node in nodes)


class _RowRegion(Region):
    """A region evaluated inside one row: reduction results are scalars of the row, and a
    staged operand is a row in stack memory."""

    def __init__(self, kernel: Kernel, nodes: Mapping[int, Node], leaves: dict[int, int]
                 ) -> None:
        super().__init__(kernel, nodes, leaves)
        self.known: dict[int, ir.Value] = {}  # node id -> its value in this row
        self.staged: dict[int, ir.Value] = {}  # node id -> pointer to its row

    def _reads(self, nid: int, index: tuple) -> Reads:
        if nid in self.known:
            value = self.known[nid]
            return [], lambda _: value
        if nid in self.staged:
            b, row = self.k.builder, self.staged[nid]
            column = index[-1] if index else ir.Constant(I64, 0)
            return [], lambda _: b.load(b.gep(row, [ir.Constant(I64, 0), column]))
        return super()._reads(nid, index)


class _RowKernel:
    """The kernel of one region (or one part of a long region) over its rows."""

    def __init__(self, ctx: Context, nodes: Mapping[int, Node], members: list[int],
                 leaves: dict[int, Buffer], outputs: dict[int, Buffer], rows: Shape) -> None:
        self.ctx, self.nodes, self.rows = ctx, nodes, rows
        leaf_ids, self.output_ids = list(leaves), list(outputs)
        self.kernel = Kernel(ctx, "rows", [leaves[n] for n in leaf_ids] + list(outputs.values()))
        self.region = _RowRegion(self.kernel, nodes, {n: k for k, n in enumerate(leaf_ids)})
        self.first_output = len(leaf_ids)
        self.reductions = [n for n in members if nodes[n].op in REDUCTIONS]
        # Stack memory is made first, in the entry block, so that it is promoted to registers
        # (an accumulator) or allocated once (a staged row).
        b = self.kernel.builder
        self.plan = _stage_plan(nodes, members, self.reductions, self.output_ids, ctx.itemsize)
        self.scratch = {nid: b.alloca(ir.ArrayType(ctx.scalar, nodes[nid].shape[-1]))
                        for kept in self.plan.values() for nid in kept}
        self.accumulators = {red: b.alloca(ctx.scalar) for red in self.reductions}

    def at(self, row: tuple, shape: Shape, column: ir.Value | None) -> tuple:
        """The index of a ``shape``-shaped value in row ``row`` (at ``column``)."""
        index = broadcast_index(row, self.rows, lead(shape))
        return index + (column,) if shape else index

    def emit(self) -> None:
        self.kernel.nest(self.rows, self.row)
        self.kernel.finish()

    def row(self, row: tuple) -> None:
        """One row: each reduction's loop in dependence order, then the outputs' loops."""
        for red in self.reductions:
            self.reduce(red, row)
        widths: dict[int, list[int]] = {}
        for pos, nid in enumerate(self.output_ids):
            shape = self.nodes[nid].shape
            widths.setdefault(shape[-1] if shape else 1, []).append(pos)
        for width, positions in widths.items():
            def column(j: ir.Value, positions: list[int] = positions) -> None:
                for pos in positions:
                    nid = self.output_ids[pos]
                    index = self.at(row, self.nodes[nid].shape, j)
                    self.kernel.store(self.first_output + pos, index,
                                      self.region.value(nid, index))

            if width == 1:
                column(ir.Constant(I64, 0))
            else:
                self.kernel.loop(ir.Constant(I64, width), column)
            self.region.memo.clear()

    def reduce(self, red: int, row: tuple) -> None:
        """The loop of reduction ``red`` over its operand's row; its result becomes known."""
        b, kernel, region = self.kernel.builder, self.kernel, self.region
        start, combine, mean = REDUCTIONS[self.nodes[red].op]
        x = self.nodes[red].inputs[0]
        shape = self.nodes[x].shape
        acc = self.accumulators[red]
        b.store(ir.Constant(self.ctx.scalar, start), acc)

        def step(j: ir.Value) -> None:
            index = self.at(row, shape, j)
            value = region.value(x, index)
            for nid in self.plan[red]:  # of x's shape: at x's index, already computed
                row_of = b.gep(self.scratch[nid], [ir.Constant(I64, 0), j])
                b.store(region.value(nid, index), row_of)
            b.store(combine(b, b.load(acc), value), acc)

        kernel.loop(ir.Constant(I64, shape[-1]), step)
        region.memo.clear()
        total = b.load(acc)
        if mean:
            total = b.fdiv(total, ir.Constant(self.ctx.scalar, float(shape[-1])))
        region.known[red] = total
        region.staged.update((nid, self.scratch[nid]) for nid in self.plan[red])


def _reached(nodes: Mapping[int, Node], inside: set[int], targets: list[int], stop: set[int]
             ) -> tuple[set[int], set[int]]:
    """The region nodes a loop computing ``targets`` evaluates, walking up from them to the
    leaves, reductions (scalars of the row) and ``stop``; and the ``stop`` nodes it reads."""
    seen: set[int] = set()
    hits: set[int] = set()
    stack = list(targets)
    while stack:
        nid = stack.pop()
        if nid in stop:
            hits.add(nid)
        elif nid in inside and nid not in seen:
            seen.add(nid)
            if nodes[nid].op not in REDUCTIONS:
                stack.extend(nodes[nid].inputs)
    return seen, hits


def _aligned(nodes: Mapping[int, Node], inside: set[int], x: int, skip: set[int]) -> set[int]:
    """``x`` and the nodes of its shape that elementwise ops lead to it from: in the loop over
    ``x``'s row they are computed at the loop's own column, so the loop sees their whole row."""
    found, stack = set(), [x]
    while stack:
        nid = stack.pop()
        if nid in found or nid in skip or nid not in inside or nodes[nid].op in REDUCTIONS:
            continue
        found.add(nid)
        if nodes[nid].op in scalar.SCALAR:
            stack.extend(i for i in nodes[nid].inputs if nodes[i].shape == nodes[nid].shape)
    return found


def _stage_plan(nodes: Mapping[int, Node], members: list[int], reductions: list[int],
                outputs: list[int], itemsize: int) -> dict[int, list[int]]:
    """For each reduction, the nodes its loop keeps in stack rows: those it computes at its
    own column (:func:`_aligned`) that a later loop (a later reduction's, or the outputs')
    would otherwise compute again, the ones nearest the later loops; within
    :data:`STAGE_BYTES` in all."""
    inside = set(members)
    loops = [[nodes[red].inputs[0]] for red in reductions] + [list(outputs)]
    staged: set[int] = set()
    room = STAGE_BYTES
    plan: dict[int, list[int]] = {}
    for k, red in enumerate(reductions):
        evaluated, _ = _reached(nodes, inside, loops[k], staged)
        here = evaluated & _aligned(nodes, inside, loops[k][0], staged)
        wanted: set[int] = set()
        for later in loops[k + 1:]:
            wanted |= _reached(nodes, inside, later, staged | here)[1] & here
        plan[red] = []
        for nid in sorted(wanted, key=members.index):
            size = nodes[nid].shape[-1] * itemsize
            if size <= room:
                plan[red].append(nid)
                room -= size
        staged |= set(plan[red])
    return plan


def emit_rows(ctx: Context, nodes: Mapping[int, Node], members: list[int],
              leaves: dict[int, Buffer], outputs: dict[int, Buffer]) -> None:
    """Compute ``outputs`` (node id -> destination) of the region ``members`` (node ids in
    topological order, reductions among them) from its ``leaves``, row by row.

    The leading dims of ``members`` must broadcast (:func:`row_shape`); an output of fewer
    rows is written by every row, with the same value."""
    rows = row_shape(nodes[n] for n in [*members, *outputs])
    assert rows is not None, "a region with reductions needs a row shape"
    _RowKernel(ctx, nodes, members, leaves, outputs, rows).emit()


def fusible(region: GraphSteps) -> bool:
    """Whether :func:`emit_fused` can compute ``region``: each op per element or a reduction
    over the feature axis, and where it reduces, a row shape for all of it."""
    nodes = [step.node for step in region.steps if step.op is not ARG]
    if not all(per_element(node.op) or node.op in REDUCTIONS for node in nodes):
        return False
    return not reduces(nodes) or row_shape(nodes) is not None


def per_element_nest(region: GraphSteps, kernel_nodes: int) -> bool:
    """Whether :func:`emit_fused` computes ``region`` as one nest of per-element loops, which
    a span of columns can restrict (no value goes through a workspace slot or a row's
    reduction, either of which another column would read) of at most ``kernel_nodes``
    nodes (LlvmSchedule.kernel_nodes)."""
    nodes = [step.node for step in region.steps if step.op not in (ARG, ops.constant)]
    return fusible(region) and len(nodes) <= kernel_nodes and not reduces(nodes)


def _emit_part(ctx: Context, nodes: Mapping[int, Node], members: list[int],
               leaves: dict[int, Buffer], outputs: dict[int, Buffer], span: Span | None = None
               ) -> None:
    if reduces(nodes[n] for n in members):
        emit_rows(ctx, nodes, members, leaves, outputs)
    else:
        emit_region(ctx, nodes, leaves, outputs, "fused", span)


def emit_fused(ctx: Context, region: GraphSteps, leaves: dict[int, Buffer],
               outputs: dict[int, Buffer], span: Span | None = None) -> None:
    """Emit a :func:`fusible` region as loops of at most ``kernel_nodes`` nodes each; with
    ``span`` (a :func:`per_element_nest` region), only at the span's columns of each output.

    The nodes are cut into consecutive parts of their topological order; a value that a
    later part reads is stored by its own part into a workspace slot, which the later
    part loads. A typical cell's region is one part: one loop nest, nothing stored."""
    kernel_nodes = ctx.schedule.kernel_nodes
    assert span is None or per_element_nest(region, kernel_nodes), "a span needs one nest"
    nodes = {step.slot: step.node for step in region.steps}
    order = [step.slot for step in region.steps if step.slot not in leaves
             and step.op not in (ARG, ops.constant)]
    if len(order) <= kernel_nodes:
        _emit_part(ctx, nodes, order, leaves, outputs, span)
        return
    part = {nid: k // kernel_nodes for k, nid in enumerate(order)}
    last_reader: dict[int, int] = {}  # node id -> the last part that reads it
    for step in region.steps:
        for i in step.inputs:
            last_reader[i] = max(last_reader.get(i, -1), part.get(step.slot, -1))
    stored: dict[int, Buffer] = dict(leaves)
    for first in range(0, len(order), kernel_nodes):
        members = order[first:first + kernel_nodes]
        here = part[members[0]]
        reads = {i for nid in members for i in nodes[nid].inputs if i in stored}
        # Outputs that are no part's node (a constant) are written with the first part.
        writes = {} if first else {n: b for n, b in outputs.items() if n not in part}
        for nid in members:
            if nid in outputs:
                writes[nid] = outputs[nid]
            elif last_reader.get(nid, -1) > here:
                writes[nid] = ctx.slot(nodes[nid].shape)
        if writes:
            _emit_part(ctx, nodes, members, {i: stored[i] for i in sorted(reads)}, writes)
        stored.update(writes)
