"""Which columns of a step's recurrent product each column of its fused epilogue reads.

A step of a gated cell is a recurrent product ``P = h @ U`` (the gates' matrices side by side,
``G`` gates of ``H`` columns) and a fused elementwise region that slices ``P`` into gates and
combines them. A thread of a team (LLVM) or a block (CUDA) that owns the hidden units
``[a, b)`` can compute only the product columns ``g*H + [a, b)`` of every gate ``g`` and then
the epilogue of those units, with no barrier between the product and the epilogue, when the
epilogue is *unit-local*: column ``j`` of every result reads columns of ``P`` only from unit
``j`` (columns ``k`` with ``k % H == j``).

:func:`column_reads` finds, by brute force over the concrete feature widths, the columns of one
region argument that each column of each result reads, through elementwise ops (a width-1
operand broadcasts), layout ops (their ``pieces`` rule) and reductions (over the features: every
column; over the rows: the same column). :func:`unit_width` says whether a region is unit-local
in ``P`` and with which ``H``; results that do not read ``P`` (a bias added to the step's input
projection) split the same way. LSTM, GRU, peephole LSTM, MGU and Elman steps are; a layer norm
over the gates (it reads every column) or a shift of the units is not.

It is the test a split of each step by hidden units applies first: the LLVM backend's thread
team (``backends/llvm/split.py``: one barrier per step) and the CUDA backend's fused
product-and-epilogue kernel.
"""

from __future__ import annotations

import math

from rnnc import ops
from rnnc.ir import ARG, Graph

_NONE: frozenset[int] = frozenset()
# Reductions whose result keeps the operand's columns (it sums over the batch rows).
_PER_COLUMN = frozenset({"sum_rows"})


def _width(shape: tuple) -> int:
    return int(shape[-1]) if shape else 1


def column_reads(region: Graph, operand: str) -> dict[str, list[frozenset[int]]] | None:
    """For each result of ``region`` by output name, the columns of the argument ``operand``
    that each of its columns reads, directly or through other values; None where an op's
    column dependence is unknown (an op of another kind)."""
    source = region.args()[operand]
    reads: dict[int, list[frozenset[int]]] = {}
    for nid in region.topo():
        node = region.node(nid)
        width = _width(node.shape)
        kind = node.op.kind
        inputs = [reads[i] for i in node.inputs]
        if node.op is ARG:
            reads[nid] = [frozenset({j}) for j in range(width)] if nid == source else \
                [_NONE] * width
        elif kind is ops.OpKind.LAYOUT:
            pieces = node.op.pieces(*(len(cols) for cols in inputs), **node.attrs)
            reads[nid] = [_piece_reads(pieces, inputs, j) for j in range(width)]
        elif kind is ops.OpKind.REDUCE and node.op.name not in _PER_COLUMN:
            every = frozenset().union(*(c for cols in inputs for c in cols))
            reads[nid] = [every] * width
        elif kind in (ops.OpKind.ELEMENTWISE, ops.OpKind.SOURCE, ops.OpKind.REDUCE):
            reads[nid] = [frozenset().union(*(cols[j if len(cols) == width else 0]
                                              for cols in inputs)) for j in range(width)]
        else:
            return None
    return {name: reads[nid] for name, nid in region.outputs.items()}


def _piece_reads(pieces: tuple[ops.Piece, ...], inputs: list[list[frozenset[int]]], j: int
                 ) -> frozenset[int]:
    """What column ``j`` of a layout op's result reads, by the piece that holds it."""
    piece = next(p for p in pieces if p.start <= j < p.stop)
    if not piece.reads(j):
        return _NONE
    cols = inputs[piece.operand]
    return cols[min(max(piece.column(j), 0), len(cols) - 1)]


def unit_width(region: Graph, operand: str) -> int | None:
    """The most units ``H`` (above 1) such that the operand's width and every result's width are
    multiples of ``H`` and column ``j`` of every result reads only columns ``k`` of ``operand``
    with ``k % H == j % H``: then units ``[a, b)`` need the operand's columns ``g*H + [a, b)``
    and give the results' columns ``g*H + [a, b)``, for every ``g``. None if there is none."""
    reads = column_reads(region, operand)
    if not reads:
        return None
    common = _width(region.node(region.args()[operand]).shape)
    for cols in reads.values():
        common = math.gcd(common, len(cols))
    for H in range(common, 1, -1):
        if common % H == 0 and all(k % H == j % H for cols in reads.values()
                                   for j, ks in enumerate(cols) for k in ks):
            return H
    return None
