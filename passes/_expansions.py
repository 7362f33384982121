"""autodiff's save plan: elementwise expansions are recomputed in the backward, never saved.

An expansion is an elementwise value wider per batch row than one of its operands, whose other
operands are free for the backward to read (parameter-only values, inputs, constants) or
expansions themselves: ``exp(dt[:, :, None] * A)`` of the selective SSM, with ``dt`` ``(B, D)``
and ``A`` ``(D, N)``, is ``(B, D, N)``. Saved, it is a ``(T, B, D, N)`` sequence the forward
writes and the backward reads back (134 MB at T=1024, B=8, D=256, N=16), where its narrower
operands are ``N`` times smaller and the arithmetic, fused with the backward step's other
elementwise work, costs less than moving it. Values as wide as all their operands (the gates of
an LSTM, ``sigmoid(x)``) are saved as before.
"""

from __future__ import annotations

from collections.abc import Callable, Set

from rnnc import ops
from rnnc.ir import Graph, Node


def row_width(shape: tuple) -> int | None:
    """Elements per batch row of a per-step value; None for one without batch rows."""
    if not shape or shape[0] != "B":
        return None
    width = 1
    for d in shape[1:]:
        width *= int(d)
    return width


def expands(fwd: Graph, node: Node, expansions: Set[int], free: Callable[[int], bool]) -> bool:
    """Whether ``node`` is an expansion: elementwise and deterministic, each operand free to
    read (``free``), an expansion or narrower per row, and at least one of them an expansion or
    narrower. ``expansions`` holds those found before it in topological order."""
    if node.op.kind is not ops.OpKind.ELEMENTWISE or node.op.random or not node.inputs:
        return False
    width = row_width(node.shape)
    if width is None:
        return False
    wider = False
    for i in node.inputs:
        narrow = row_width(fwd.node(i).shape)
        if i in expansions or narrow is not None and narrow < width:
            wider = True
        elif not free(i):
            return False
    return wider
