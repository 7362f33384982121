"""Interpret a program step by step with NumPy.

The runner walks the program's schedule (:mod:`rnnc.backends.steps`), built once per
program, so the interpreter's loop never walks the IR. A fused node, in the loop or outside it,
is interpreted node by node over its region's schedule (a reduction inside it included).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc import ops
from rnnc.backends import Runner
from rnnc.backends.numpy.rules import RULES
from rnnc.backends.schedule import Schedule, gemm_precision
from rnnc.backends.steps import GraphSteps, ProgramSteps, program_steps, resolve
from rnnc.errors import RnncValueError
from rnnc.ir import ARG, FUSED, GET, Program


def run_graph(graph: GraphSteps, env: Mapping[str, np.ndarray], dtype: Any
              ) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` reading its args from ``env``; its outputs by name."""
    vals: dict[int, Any] = {}
    for step in graph.steps:
        op = step.op
        if op is ARG:
            vals[step.slot] = env[step.name]
        elif op is FUSED:
            operands = (vals[i] for i in step.inputs)
            inner = dict(zip(step.region.args, operands, strict=True))
            vals[step.slot] = tuple(run_graph(step.region, inner, dtype).values())
        elif op is GET:
            vals[step.slot] = vals[step.inputs[0]][step.attrs["index"]]
        elif op is ops.constant:
            vals[step.slot] = np.asarray(step.attrs["value"], dtype=dtype)
        else:
            value = RULES[op](*(vals[i] for i in step.inputs), **step.attrs)
            vals[step.slot] = np.asarray(value, dtype=dtype)
    return {name: vals[output.slot] for name, output in graph.outputs.items()}


def run_scan(schedule: ProgramSteps, env: Mapping[str, np.ndarray],
             dims: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Run the loop; return stacked outputs, summed outputs and final carries by name."""
    scan, body, dtype = schedule.scan, schedule.body, schedule.numpy_dtype
    T = dims["T"]
    out: dict[str, np.ndarray] = {}
    for name in scan.stacked:
        out[name] = np.zeros((T,) + resolve(body.outputs[name].shape, dims), dtype=dtype)
    for name in scan.summed:
        out[name] = np.zeros(resolve(body.outputs[name].shape, dims), dtype=dtype)
    if not (scan.carries or scan.stacked or scan.summed):
        return out  # parallel-scan left an empty loop: no step has anything to compute
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


class NumpyRunner(Runner):
    """A callable running one program; its schedule is built once, here. A host runner: it
    keeps the protocol's :meth:`~rnnc.backends.Runner.on_device`, which refuses."""

    def __init__(self, p: Program) -> None:
        self.schedule = program_steps(p)

    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]:
        schedule, dtype = self.schedule, self.schedule.numpy_dtype
        env = dict(env)
        env.update(run_graph(schedule.pre, env, dtype))
        env.update(run_scan(schedule, env, dims))
        env.update(run_graph(schedule.post, env, dtype))
        return {name: env[name] for name in schedule.results}


def run_program(p: Program, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                ) -> dict[str, np.ndarray]:
    """Run pre, scan and post over ``env``; return the program's results."""
    return NumpyRunner(p)(env, dims)


class NumpyBackend:
    """Runs programs with the interpreter; nothing is compiled."""

    name = "numpy"
    device = None  # runs on the host

    def __init__(self, **options: Any) -> None:
        if options:
            raise RnncValueError(f"backend 'numpy' takes no options, got {sorted(options)}")

    def schedule(self, program: Program, mode: str) -> Schedule:
        """How ``program`` runs: the interpreter has one way, every product in its dtype."""
        return Schedule(precision=gemm_precision(program))

    def build(self, program: Program, mode: str) -> Runner:
        """A callable ``(env, dims) -> results`` for ``program`` (the interpreter runs every
        mode's program alike)."""
        return NumpyRunner(program)
