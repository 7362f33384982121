"""Interpret a program step by step with NumPy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc import ops
from rnnc.backends.numpy.rules import RULES
from rnnc.ir import ARG, FUSED, GET, Graph, Program, Scan

NP_DTYPES = {"f32": np.float32, "f64": np.float64}


def resolve(shape: tuple, dims: Mapping[str, int]) -> tuple[int, ...]:
    """Replace the symbols T and B by their sizes."""
    return tuple(dims[d] if isinstance(d, str) else d for d in shape)


def run_graph(g: Graph, env: Mapping[str, np.ndarray], dtype: Any,
              nodes: list | None = None) -> dict[str, np.ndarray]:
    """Evaluate ``g`` reading its args from ``env``; return its outputs by name.

    ``nodes`` is ``g.nodes()`` when the caller already has it (the loop evaluates one body
    many times and sorts it once)."""
    vals: dict[int, Any] = {}
    for node in g.nodes() if nodes is None else nodes:
        if node.op is ARG:
            vals[node.id] = env[node.attrs["name"]]
        elif node.op is FUSED:
            region: Graph = node.attrs["region"]
            inner = {region.node(a).attrs["name"]: vals[i]
                     for a, i in zip(region.args().values(), node.inputs, strict=True)}
            vals[node.id] = tuple(run_graph(region, inner, dtype).values())
        elif node.op is GET:
            vals[node.id] = vals[node.inputs[0]][node.attrs["index"]]
        elif node.op is ops.constant:
            vals[node.id] = np.asarray(node.attrs["value"], dtype=dtype)
        else:
            out = RULES[node.op](*(vals[i] for i in node.inputs), **node.attrs)
            vals[node.id] = np.asarray(out, dtype=dtype)
    return {name: vals[o] for name, o in g.outputs.items()}


def run_scan(scan: Scan, env: Mapping[str, np.ndarray], dims: Mapping[str, int], dtype: Any
             ) -> dict[str, np.ndarray]:
    """Run the loop; return stacked outputs, summed outputs and final carries by name."""
    T = dims["T"]
    body = scan.body
    out: dict[str, np.ndarray] = {}
    for name in scan.stacked:
        shape = resolve(body.node(body.outputs[name]).shape, dims)
        out[name] = np.zeros((T,) + shape, dtype=dtype)
    for name in scan.summed:
        out[name] = np.zeros(resolve(body.node(body.outputs[name]).shape, dims), dtype=dtype)
    local = {name: env[name] for name in scan.consts}
    nodes = body.nodes()
    carry = {c.name: env[c.init] for c in scan.carries}
    for t in (range(T - 1, -1, -1) if scan.reverse else range(T)):
        local.update({name: env[name][t] for name in scan.seqs})
        local.update(carry)
        step = run_graph(body, local, dtype, nodes)
        carry = {c.name: step[c.name] for c in scan.carries}
        for name in scan.stacked:
            out[name][t] = step[name]
        for name in scan.summed:
            out[name] += step[name]
    for c in scan.carries:
        if c.final is not None:
            out[c.final] = np.array(carry[c.name], dtype=dtype)
    return out


def run_program(p: Program, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                ) -> dict[str, np.ndarray]:
    """Run pre, scan and post over ``env``; return the program's results."""
    dtype = NP_DTYPES[p.dtype]
    env = dict(env)
    env.update(run_graph(p.pre, env, dtype))
    env.update(run_scan(p.scan, env, dims, dtype))
    env.update(run_graph(p.post, env, dtype))
    return {name: env[name] for name in p.results}


class NumpyBackend:
    """Runs programs with the interpreter; nothing is compiled."""

    name = "numpy"

    def __init__(self, **options: Any) -> None:
        if options:
            from rnnc.errors import RnncValueError

            raise RnncValueError(f"backend 'numpy' takes no options, got {sorted(options)}")

    def build(self, program: Program):
        """A callable ``(env, dims) -> results`` for ``program``."""
        return lambda env, dims: run_program(program, env, dims)
