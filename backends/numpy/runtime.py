"""Interpret a program step by step with NumPy.

Each graph is first flattened into a :class:`Schedule` (its nodes in order with what running
them needs), once per program, so the interpreter's loop never walks the IR.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc import ops
from rnnc.backends.numpy.rules import RULES
from rnnc.ir import ARG, FUSED, GET, Graph, Program, Scan

NP_DTYPES = {"f32": np.float32, "f64": np.float64}


def resolve(shape: tuple, dims: Mapping[str, int]) -> tuple[int, ...]:
    """Replace the symbols T and B by their sizes."""
    return tuple(dims[d] if isinstance(d, str) else d for d in shape)


@dataclass(frozen=True)
class Schedule:
    """One graph as the interpreter runs it: ``(node, kind, payload, inputs)`` in order.

    Kinds: "arg" (payload: the name), "get" (the index), "constant" (the value), "fused"
    (payload: the region's schedule and its argument names in operand order) and "op" (the
    NumPy rule and the node's attributes)."""

    items: tuple[tuple[int, str, Any, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, int], ...]


def schedule(g: Graph) -> Schedule:
    """Flatten ``g`` (and its fused regions) into a schedule."""
    items = []
    for node in g.nodes():
        if node.op is ARG:
            items.append((node.id, "arg", node.attrs["name"], ()))
        elif node.op is GET:
            items.append((node.id, "get", node.attrs["index"], node.inputs))
        elif node.op is ops.constant:
            items.append((node.id, "constant", node.attrs["value"], ()))
        elif node.op is FUSED:
            region: Graph = node.attrs["region"]
            names = tuple(region.node(a).attrs["name"] for a in region.args().values())
            items.append((node.id, "fused", (schedule(region), names), node.inputs))
        else:
            rule: Callable[..., Any] = RULES[node.op]
            items.append((node.id, "op", (rule, dict(node.attrs)), node.inputs))
    return Schedule(tuple(items), tuple(g.outputs.items()))


def run_graph(s: Schedule, env: Mapping[str, np.ndarray], dtype: Any) -> dict[str, np.ndarray]:
    """Evaluate the schedule ``s`` reading its args from ``env``; its outputs by name."""
    vals: dict[int, Any] = {}
    for nid, kind, payload, inputs in s.items:
        if kind == "arg":
            vals[nid] = env[payload]
        elif kind == "fused":
            region, names = payload
            inner = dict(zip(names, (vals[i] for i in inputs), strict=True))
            vals[nid] = tuple(run_graph(region, inner, dtype).values())
        elif kind == "get":
            vals[nid] = vals[inputs[0]][payload]
        elif kind == "constant":
            vals[nid] = np.asarray(payload, dtype=dtype)
        else:
            rule, attrs = payload
            vals[nid] = np.asarray(rule(*(vals[i] for i in inputs), **attrs), dtype=dtype)
    return {name: vals[o] for name, o in s.outputs}


def run_scan(scan: Scan, body: Schedule, shapes: Mapping[str, tuple],
             env: Mapping[str, np.ndarray], dims: Mapping[str, int], dtype: Any
             ) -> dict[str, np.ndarray]:
    """Run the loop; return stacked outputs, summed outputs and final carries by name.

    ``shapes`` holds the per-step shape of every stacked and summed output."""
    T = dims["T"]
    out: dict[str, np.ndarray] = {}
    for name in scan.stacked:
        out[name] = np.zeros((T,) + resolve(shapes[name], dims), dtype=dtype)
    for name in scan.summed:
        out[name] = np.zeros(resolve(shapes[name], dims), dtype=dtype)
    local = {name: env[name] for name in scan.consts}
    carry = {c.name: env[c.init] for c in scan.carries}
    for t in (range(T - 1, -1, -1) if scan.reverse else range(T)):
        local.update({name: env[name][t] for name in scan.seqs})
        local.update(carry)
        step = run_graph(body, local, dtype)
        carry = {c.name: step[c.name] for c in scan.carries}
        for name in scan.stacked:
            out[name][t] = step[name]
        for name in scan.summed:
            out[name] += step[name]
    for c in scan.carries:
        if c.final is not None:
            out[c.final] = np.array(carry[c.name], dtype=dtype)
    return out


def _runner(p: Program) -> Callable[[Mapping[str, np.ndarray], Mapping[str, int]],
                                     dict[str, np.ndarray]]:
    """A callable running ``p``; its schedules are built here, once."""
    dtype = NP_DTYPES[p.dtype]
    pre, body, post = (schedule(g) for g in p.graphs())
    g = p.scan.body
    shapes = {name: g.node(g.outputs[name]).shape for name in p.scan.stacked + p.scan.summed}

    def run(env: Mapping[str, np.ndarray], dims: Mapping[str, int]) -> dict[str, np.ndarray]:
        env = dict(env)
        env.update(run_graph(pre, env, dtype))
        env.update(run_scan(p.scan, body, shapes, env, dims, dtype))
        env.update(run_graph(post, env, dtype))
        return {name: env[name] for name in p.results}
    return run


def run_program(p: Program, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                ) -> dict[str, np.ndarray]:
    """Run pre, scan and post over ``env``; return the program's results."""
    return _runner(p)(env, dims)


class NumpyBackend:
    """Runs programs with the interpreter; nothing is compiled."""

    name = "numpy"

    def __init__(self, **options: Any) -> None:
        if options:
            from rnnc.errors import RnncValueError

            raise RnncValueError(f"backend 'numpy' takes no options, got {sorted(options)}")

    def build(self, program: Program):
        """A callable ``(env, dims) -> results`` for ``program``."""
        return _runner(program)
