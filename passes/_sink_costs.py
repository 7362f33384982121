"""What hoist-sequence's rule (b) keeps in the loop, and what ``post`` computes again instead
of reading it stacked: both so that the loop stacks no sequence wider than it needs to.

- A reduction over feature axes of a value that depends on a carry stays in the loop, with
  what it reads. Sunk, the loop would stack its operand, wider than its result and stacked for
  nothing else (it depends on the carry), for ``post`` to read back: in the backward of a cell
  with a ``(D, N)`` state, whole ``(T, B, D, N)`` sequences where the sums over ``N`` or ``D``
  are ``(T, B, D)`` or ``(T, B, N)``.
- A layout op (or ``reshape``) of sequences and loop constants that the loop keeps and ``post``
  reads is made again in ``post`` from those sequences: it moves no arithmetic, and stacked it
  is a whole sequence written and read back (``expand`` of a cotangent ``d.y`` to ``(B, D, N)``
  is ``N`` times the sequence it reads).
"""

from __future__ import annotations

import math

from rnnc import ops
from rnnc.ir import Graph, Scan
from rnnc.passes._graphs import per_step

FEATURE_SUMS = (ops.sum_, ops.mean, ops.amax, ops.amin, ops.sum_axis)


def carried_sums(body: Graph, s: Scan) -> set[int]:
    """Reductions over feature axes, of values that depend on a carry, whose result is
    narrower than their operand."""
    args = body.args()
    carried = body.depends_on({args[c.name] for c in s.carries if c.name in args})
    out = set()
    for nid in carried:
        node = body.node(nid)
        if node.op in FEATURE_SUMS:
            wide = body.node(node.inputs[0]).shape
            if per_step(wide) and math.prod(wide[1:]) > math.prod(node.shape[1:]):
                out.add(nid)
    return out


def remade_layouts(body: Graph, s: Scan) -> set[int]:
    """Layout ops and reshapes that read only sequences with batch rows, loop constants,
    constants and one another: ``post`` makes them again rather than read them stacked."""
    args = body.args()
    sources = {args[n] for n in s.consts if n in args}
    sources |= {args[n] for n in s.seqs if n in args and per_step(body.node(args[n]).shape)}
    out: set[int] = set()
    for node in body.nodes():  # topological order: operands first
        if node.op.kind is not ops.OpKind.LAYOUT and node.op is not ops.reshape:
            continue
        if node.inputs and all(i in out or i in sources or body.node(i).op is ops.constant
                               for i in node.inputs):
            out.add(node.id)
    return out
