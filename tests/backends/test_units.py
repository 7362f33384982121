"""The column analysis of a step's epilogue (``backends/units.py``), against perturbation.

For each cell, the fused region that reads the step's recurrent product is evaluated with
random operands; each column of the product is then changed alone, and the result columns
that move must be among those :func:`column_reads` says read it. Which cells are unit-local
(``unit_width``) is checked by hand: the gated cells are, a layer norm over the gates and a
shift of the units are not.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc import backends  # noqa: F401  (rnnc.backends is the backends/ package)
from rnnc.backends.numpy.runtime import run_graph
from rnnc.backends.steps import program_steps
from rnnc.backends.units import column_reads, unit_width
from rnnc.ir import FUSED


def _epilogue(cell: rnnc.Cell, mode: str = "inference"):
    """The first fused step of the loop body that reads a matmul, and that operand's name."""
    program = rnnc.compile(cell, backend="numpy").program(mode, "f64")
    body = program_steps(program).body
    products = {s.slot for s in body.steps if s.op is rnnc.ops.matmul}
    for step in body.steps:
        if step.op is FUSED and products & set(step.inputs):
            k = next(i for i, slot in enumerate(step.inputs) if slot in products)
            return step, step.region.args[k]
    raise AssertionError("no fused step reads a product")


def _shift_cell() -> rnnc.Cell:
    c = rnnc.Cell("shift")
    x = c.input("x", 3)
    h = c.state("h", 4)
    p = h @ c.param("U", (4, 4)) + x @ c.param("W", (3, 4))
    shifted = rnnc.concat([p[:, 1:], p[:, :1]])
    c.update(h=rnnc.tanh(shifted))
    c.output("y", rnnc.tanh(shifted) * 2.0)
    return c


def _norm_cell() -> rnnc.Cell:
    c = rnnc.Cell("norm")
    x = c.input("x", 3)
    h = c.state("h", 4)
    p = h @ c.param("U", (4, 8)) + x @ c.param("W", (3, 8))
    p = p - rnnc.mean(p)
    c.update(h=rnnc.tanh(p[:, :4]) * rnnc.sigmoid(p[:, 4:]))
    c.output("y", h * 1.0)
    return c


CASES = {
    "lstm": (lambda: rnnc.cells.lstm(3, 4), 4),
    "gru": (lambda: rnnc.cells.gru(3, 4), 4),
    "peephole_lstm": (lambda: rnnc.cells.peephole_lstm(3, 4), 4),
    "mgu": (lambda: rnnc.cells.mgu(3, 4), 4),
    "rnn": (lambda: rnnc.cells.rnn(3, 4), 4),
    "shift": (_shift_cell, None),
    "layer norm": (_norm_cell, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unit_width(name: str) -> None:
    make, want = CASES[name]
    step, operand = _epilogue(make())
    assert unit_width(step.attrs["region"], operand) == want


@pytest.mark.parametrize("name", sorted(CASES))
def test_column_reads_cover_every_perturbation(name: str) -> None:
    make, _ = CASES[name]
    step, operand = _epilogue(make())
    region = step.region
    reads = column_reads(step.attrs["region"], operand)
    assert reads is not None
    rng = np.random.default_rng(0)
    shapes = {s.name: s.node.shape for s in region.steps if s.name is not None}
    env = {n: rng.standard_normal([2 if d == "B" else d for d in shapes[n]]) for n in region.args}
    base = run_graph(region, env, np.float64)
    width = env[operand].shape[-1]
    for k in range(width):
        moved = dict(env)
        moved[operand] = env[operand].copy()
        moved[operand][..., k] += 0.37
        after = run_graph(region, moved, np.float64)
        for out, value in after.items():
            changed = np.flatnonzero(np.any(np.abs(value - base[out]) > 1e-12,
                                            axis=tuple(range(value.ndim - 1))))
            for j in changed:
                assert k in reads[out][j], (out, j, k, sorted(reads[out][j]))
