"""Gradients are the same before and after every pass, on standard and random cells.

The reference is the unoptimized route: autodiff applied straight to the traced program, run by
the NumPy interpreter. Then the backward pipeline is replayed one pass at a time from the
autodiff transform on, and every intermediate backward program must give the same results; the
compiled function's gradients (after canonicalize and gate fusion, with packed parameters) must
equal the reference per user parameter.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rnnc
from rnnc import passes
from rnnc.backends.numpy.runtime import run_program
from rnnc.ir import retype
from rnnc.names import MASK, cotangent, final_state, gradient
from rnnc.passes.autodiff import autodiff_backward, autodiff_forward
from rnnc.validate import mask
from tests.passes.common import mgu
from tests.strategies import random_cells, random_data

T, B = 4, 3


def _upstream(cell: rnnc.Cell, rng: np.random.Generator) -> tuple[dict, dict]:
    d_out = {n: rng.standard_normal((T, B, cell.graph.node(v).shape[-1]))
             for n, v in cell.outputs.items()}
    d_st = {n: rng.standard_normal((B, s[-1])) for n, s in cell.sizes("state").items()}
    return d_out, d_st


def _reference(cell, x, params, states, lens, d_out, d_st) -> dict[str, np.ndarray]:
    """Unoptimized: autodiff of the traced (and, with lengths, masked) program."""
    program = retype(cell.program(), "f64")
    if lens is not None:
        program = passes.run(program, ["mask-lengths"])
    xs = x if isinstance(x, dict) else {next(iter(cell.inputs)): x}
    env = {**xs, **params, **states}
    if lens is not None:
        env[MASK] = mask(lens, T, "f64")
    dims = {"T": T, "B": B}
    env.update(run_program(autodiff_forward(program), env, dims))
    env.update({cotangent(n): v for n, v in d_out.items()})
    env.update({cotangent(final_state(n)): v for n, v in d_st.items()})
    return run_program(autodiff_backward(program), env, dims)


def check(cell: rnnc.Cell, seed: int, with_lengths: bool) -> None:
    rng = np.random.default_rng(seed)
    x, params, states = random_data(cell, T, B, seed, np.float64)
    lens = rng.integers(1, T + 1, size=B) if with_lengths else None
    d_out, d_st = _upstream(cell, rng)
    ref = _reference(cell, x, params, states, lens, d_out, d_st)

    fn = rnnc.compile(cell, backend="numpy")
    _, _, tape = fn.forward(x, params, states=states, lengths=lens)
    g = fn.backward(tape, d_out, d_st)
    for name, value in g.params.items():
        np.testing.assert_allclose(value, ref.get(gradient(name), 0 * value), rtol=1e-9,
                                   atol=1e-10, err_msg=f"parameter {name}")
    gx = g.x if isinstance(g.x, dict) else {next(iter(cell.inputs)): g.x}
    for name, value in gx.items():
        np.testing.assert_allclose(value, ref.get(gradient(name), 0 * value), rtol=1e-9,
                                   atol=1e-10, err_msg=f"input {name}")
    for name, value in g.states.items():
        np.testing.assert_allclose(value, ref[gradient(name)], rtol=1e-9, atol=1e-10,
                                   err_msg=f"state {name}")

    # Replay the backward pipeline pass by pass after autodiff: every stage agrees.
    names = passes.pipeline("backward", with_lengths)
    start = names.index("autodiff-backward") + 1
    program = passes.run(retype(cell.program(), "f64"), names[:start])
    env = dict(tape.env)
    env.update({cotangent(n): v for n, v in d_out.items()})
    env.update({cotangent(final_state(n)): v for n, v in d_st.items()})
    dims = {"T": T, "B": B}
    first = run_program(program, env, dims)
    for name in names[start:]:
        program = passes.run(program, [name])
        now = run_program(program, env, dims)
        assert sorted(now) == sorted(first), name
        for key in first:
            np.testing.assert_allclose(now[key], first[key], rtol=1e-9, atol=1e-10,
                                       err_msg=f"{key} after {name}")


@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("name", ["rnn", "rnn_relu", "lstm", "gru", "gru_v3", "mgu"])
def test_standard_cells(name: str, with_lengths: bool) -> None:
    cell = mgu(3, 4) if name == "mgu" else rnnc.cells.STANDARD[name](3, 4)
    check(cell, seed=1, with_lengths=with_lengths)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell=random_cells(), seed=st.integers(0, 2**16), with_lengths=st.booleans())
def test_random_cells(cell: rnnc.Cell, seed: int, with_lengths: bool) -> None:
    check(cell, seed, with_lengths)
