"""A program as flat step lists, built once at compile time, that every backend walks.

Nothing walks the IR while a compiled program runs: a backend calls :func:`program_steps`
when it builds a runner and afterwards only indexes the result. The API::

    steps = program_steps(program)        # ProgramSteps: pre, body, post, scan, ...
    for step in steps.pre.steps:             # Step: one node, operands before users
        step.slot, step.op, step.inputs      # the value's slot (node id), its op, slots read
        step.attrs, step.name                # its attributes; an arg: the name it reads
        step.region                          # a ``fused`` step: the region's GraphSteps
        step.node                            # the IR node itself (its type), for rules
    steps.body.args                          # arg names in node order (a region's operands)
    steps.body.outputs["h"]                  # Output: slot, source (node, index), shape

A ``fused`` step may appear in any of the three graphs (outside the loop its region maps whole
``[T,B,n]`` sequences); its region is scheduled once, with the step.

``Output.source`` looks through ``get``: the node and result index that make the value, so a
backend can write a result straight into the output's destination. :data:`NUMPY_DTYPES` maps a
program's dtype to NumPy's, and :func:`resolve` turns a symbolic shape into sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph, Node, Program, Scan, Shape

NUMPY_DTYPES: dict[str, type[np.floating]] = {"f32": np.float32, "f64": np.float64}


def resolve(shape: Shape, dims: Mapping[str, int]) -> tuple[int, ...]:
    """``shape`` with the symbols T and B replaced by their sizes in ``dims``."""
    return tuple(dims[d] if isinstance(d, str) else d for d in shape)


@dataclass(frozen=True, slots=True)
class Step:
    """One node of a graph: ``slot = op[attrs](*inputs)``, where a slot is a node id.

    The node's fields are copied out, so a backend's loop reads them at the cost of one
    attribute each."""

    node: Node  # the equation itself, for rules that take a node
    slot: int
    op: ops.Op
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    name: str | None  # an arg: the environment name it reads
    region: GraphSteps | None  # a fused node's region


@dataclass(frozen=True)
class Output:
    """A named output of a graph: the slot holding it, what makes it, and its shape."""

    slot: int
    source: tuple[int, int]  # (node, result index); a get's tuple and index, else (slot, 0)
    shape: Shape


@dataclass(frozen=True)
class GraphSteps:
    """One graph's steps in a deterministic topological order, its args and its outputs."""

    steps: tuple[Step, ...]
    args: tuple[str, ...]  # in node order: a fused region's operands bind in this order
    outputs: dict[str, Output]


@dataclass(frozen=True)
class ProgramSteps:
    """A whole program: the three graphs' schedules and the loop's names."""

    pre: GraphSteps
    body: GraphSteps
    post: GraphSteps
    scan: Scan  # seqs, consts, carries, stacked, summed, reverse; its body is not walked
    results: tuple[str, ...]
    dtype: str

    @property
    def numpy_dtype(self) -> type[np.floating]:
        return NUMPY_DTYPES[self.dtype]


def _step(node: Node) -> Step:
    """``node`` as a step; a fused node's region is scheduled too."""
    region = schedule_graph(node.attrs["region"]) if node.op is FUSED else None
    name = node.attrs["name"] if node.op is ARG else None
    return Step(node, node.id, node.op, node.inputs, dict(node.attrs), name, region)


def schedule_graph(g: Graph) -> GraphSteps:
    """``g`` (and each fused region in it) as a schedule."""
    steps = tuple(_step(node) for node in g.nodes())
    by_slot = {step.slot: step.node for step in steps}
    outputs = {}
    for name, slot in g.outputs.items():
        node = by_slot[slot]
        source = (node.inputs[0], node.attrs["index"]) if node.op is GET else (slot, 0)
        outputs[name] = Output(slot, source, node.shape)
    args = tuple(by_slot[s].attrs["name"] for s in sorted(by_slot) if by_slot[s].op is ARG)
    return GraphSteps(steps, args, outputs)


def program_steps(program: Program) -> ProgramSteps:
    """The schedules of ``program``'s pre, body and post graphs."""
    pre, body, post = (schedule_graph(g) for g in program.graphs())
    return ProgramSteps(pre, body, post, program.scan, program.results, program.dtype)
