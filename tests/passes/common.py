"""Helpers for the pass tests: run a program with the NumPy interpreter before and after passes."""

from __future__ import annotations

import numpy as np

import rnnc
from rnnc.backends.numpy.runtime import run_program
from rnnc.ir import Program, retype
from rnnc.names import final_state
from rnnc.passes import PASSES, run
from rnnc.printer import format_program
from tests.strategies import random_data

# The minimal gated unit of the README's "Your own cell", as rnnc ships it.
mgu = rnnc.cells.mgu


def standard_cells() -> dict[str, rnnc.Cell]:
    return {"rnn": rnnc.cells.rnn(3, 4), "rnn_relu": rnnc.cells.rnn(3, 4, "relu"),
            "lstm": rnnc.cells.lstm(3, 4), "gru": rnnc.cells.gru(3, 4),
            "gru_v3": rnnc.cells.gru(3, 4, reset_after=False), "mgu": mgu(3, 4)}


def environment(cell: rnnc.Cell, T: int = 4, B: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs, user parameters and initial states of ``cell`` by environment name (float64)."""
    x, params, states = random_data(cell, T, B, seed)
    xs = x if isinstance(x, dict) else {next(iter(cell.inputs)): x}
    return {**xs, **params, **states}


def packed(program: Program, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``env`` with user parameters packed into the program's parameter blocks."""
    env = dict(env)
    for block in program.layout:
        if len(block.members) > 1 or block.members[0][0] != block.name:
            env[block.name] = np.concatenate([env[m] for m, _, _ in block.members], axis=-1)
    return env


def execute(program: Program, env: dict[str, np.ndarray], T: int, B: int
            ) -> dict[str, np.ndarray]:
    return run_program(retype(program, "f64"), packed(program, env), {"T": T, "B": B})


def check_pass(program: Program, name: str, env: dict[str, np.ndarray], T: int, B: int,
               rtol: float = 1e-9) -> Program:
    """Run pass ``name``; check semantics kept, verify (by the manager) and idempotence."""
    after = run(program, [name])
    before_out = execute(program, env, T, B)
    after_out = execute(after, env, T, B)
    assert set(before_out) == set(after_out)
    for key, want in before_out.items():
        np.testing.assert_allclose(after_out[key], want, rtol=rtol, atol=1e-12, err_msg=key)
    again = PASSES[name](after)
    assert format_program(again) == format_program(after), f"{name} is not idempotent"
    return after


def states_final(cell: rnnc.Cell) -> list[str]:
    return [final_state(s) for s in cell.states]


def head_gates_cell(name: str = "gates", heads: int = 2, d: int = 3) -> rnnc.Cell:
    """Two head-wise gates, each one einsum of the input and one of the state by its own
    ``(heads, d, d)`` weight (``Wz, Wf, Rz, Rf``): what fuse-gate-matmuls packs into two
    blocks, and whose four weight gradients are einsums summed over the rows."""
    c = rnnc.Cell(name)
    x, h = c.input("x", (heads, d)), c.state("h", (heads, d))
    Wz, Wf, Rz, Rf = (c.param(n, (heads, d, d)) for n in ("Wz", "Wf", "Rz", "Rf"))
    z = rnnc.tanh(rnnc.einsum("hd,hde->he", x, Wz) + rnnc.einsum("hd,hde->he", h, Rz))
    f = rnnc.sigmoid(rnnc.einsum("hd,hde->he", x, Wf) + rnnc.einsum("hd,hde->he", h, Rf))
    new = f * h + (1 - f) * z
    c.update(h=new)
    c.output("y", new.reshape(-1))
    return c
