"""Which nodes of a team's step body are split how (:mod:`rnnc.backends.llvm.team`).

A recurrent product ``a @ w`` (``a @ w.T``: backward's ``dG @ Uᵀ``) whose output columns are
whole panels of rnnc's panel kernel is split by those panels (:func:`panel_work`). When the
first node that reads such a product is a fused region that is *unit-local* in it
(:func:`rnnc.backends.units.unit_width`: column ``j`` of every result reads the product only
at columns ``k`` with ``k % H == j % H``), the two go together by hidden units instead
(:func:`unit_readers`): each thread computes the product's columns ``g*H + [a, b)`` of every
gate ``g`` for its units ``[a, b)``, then the region at the same units, with no barrier in
between, since every value the region reads from the product was computed by the same thread.

Outside the loop a team splits each ``linear_scan`` by columns (:meth:`Team.linear_scan
<rnnc.backends.llvm.team.Team.linear_scan>`), or over its steps where its columns are too few
(:mod:`rnnc.backends.llvm.scan_chunks`): :func:`scan_work` is what those splits share, and
:func:`scan_form` which of the two a scan takes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rnnc import ops
from rnnc.backends.llvm import mathlib, scan_chunks, tensor
from rnnc.backends.llvm.fused import per_element_nest
from rnnc.backends.steps import Step, program_steps
from rnnc.backends.units import unit_width
from rnnc.ir import FUSED, Node, Program

# The dims of a sequence that a runner knows only at call time.
_CALL_DIMS = ("T", "B")


def panel_work(node: Node, a: tuple, w: tuple, width: int) -> int:
    """The multiply-adds per batch row of a product a team splits by panels of ``width``
    columns, else 0."""
    if node.attrs.get("transpose_a") or tuple(a[:-1]) != ("B",) or len(w) != 2:
        return 0
    n, k = w if node.attrs.get("transpose_b") else w[::-1]
    return n * k if isinstance(n, int) and isinstance(k, int) and n % width == 0 else 0


def unit_readers(steps: Sequence[Step], width: int, kernel_nodes: int
                 ) -> dict[int, tuple[int, int]]:
    """For each fused step that a team computes together with a product by hidden units, by
    its slot: the product's slot and the units ``H`` of one gate.

    A product of :func:`panel_work` qualifies when the first step of ``steps`` that reads it
    is a fused region computed as one per-element loop nest
    (:func:`rnnc.backends.llvm.fused.per_element_nest`) that is unit-local in it with ``H`` a
    multiple of the panel ``width``: then a thread's units are whole panels of every gate."""
    by_slot = {step.slot: step for step in steps}
    readers: dict[int, tuple[int, int]] = {}
    for k, step in enumerate(steps):
        # A bf16 product has its own split (backends/llvm/bf16_matmul.py), not by units.
        if step.op is not ops.matmul or step.node.attrs.get("precision") == "bf16" \
                or not panel_work(
                step.node, by_slot[step.inputs[0]].node.shape,
                by_slot[step.inputs[1]].node.shape, width):
            continue
        first = next((s for s in steps[k + 1:] if step.slot in s.inputs), None)
        if first is None or first.op is not FUSED or first.slot in readers \
                or not per_element_nest(first.region, kernel_nodes):
            continue
        names = {first.region.args[i] for i, slot in enumerate(first.inputs) if slot == step.slot}
        units = {unit_width(first.node.attrs["region"], name) for name in names}
        H = units.pop() if len(units) == 1 else None
        if H is not None and H % width == 0:
            readers[first.slot] = (step.slot, H)
    return readers


def team_work(program: Program) -> int:
    """The multiply-adds per batch row and step of the step body's products that a thread
    team splits; 0: a team build would run every product on one thread."""
    body = program_steps(program).body
    width = 2 * mathlib.vector_width(64 if program.dtype == "f64" else 32)
    nodes = {step.slot: step.node for step in body.steps}
    return sum(panel_work(step.node, nodes[step.inputs[0]].shape, nodes[step.inputs[1]].shape,
                          width) if step.op is ops.matmul else
               tensor.head_work(step.node, [nodes[i].shape for i in step.inputs])
               for step in body.steps if step.op in (ops.matmul, ops.einsum))


def scan_work(program: Program) -> tuple[int, int]:
    """The multiply-adds per step and batch row of the pre- and post-loop graphs'
    ``linear_scan`` nodes, which a team build splits by columns (the sum of each result's
    fixed dims: its features), and the features of the narrowest of them. (0, 0): none, or
    one with a dim known only at call time beyond ``T`` and ``B``."""
    schedule = program_steps(program)
    widths = []
    for graph in (schedule.pre, schedule.post):
        for step in graph.steps:
            if step.op is ops.linear_scan:
                dims = [d for d in step.node.shape if d not in _CALL_DIMS]
                if not all(isinstance(d, int) for d in dims):
                    return 0, 0
                widths.append(math.prod(dims))
    return sum(widths), min(widths, default=0)


def scan_form(columns: int, itemsize: int, steps: int, threads: int,
              limits: tuple[int, int, int]) -> str | None:
    """How a team of ``threads`` splits a ``linear_scan`` of ``columns`` columns (``B`` times
    its features) over ``steps`` steps, ``limits`` being ``(bytes, steps, workspace bytes)``:
    ``"columns"`` where each thread's columns of a step make at least ``bytes``; else
    ``"steps"`` where there are at least ``steps`` steps a thread and the workspace holds the team
    (:func:`scan_chunks.fits <rnnc.backends.llvm.scan_chunks.fits>`); else None, where a
    team gains nothing (the generated code, which makes the same choice, then splits it by
    columns)."""
    least_bytes, least_steps, workspace = limits
    if columns * itemsize >= threads * least_bytes:
        return "columns"
    if steps >= threads * least_steps and scan_chunks.fits(columns, threads, itemsize, workspace):
        return "steps"
    return None
