"""autodiff recomputes elementwise expansions (passes/_expansions.py): a value wider per row
than an operand, such as the selective SSM's ``exp(dt[:, :, None] * A)``, is made again in the
backward from its narrower operands instead of being saved as a whole ``(T, B, D, N)``
sequence; values as wide as their operands are saved as before. Gradients against the
unoptimized traced program, with lengths and in reverse."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rnnc
from rnnc.passes import run as run_passes

D, N = 4, 3
T, B = 4, 3
LENGTHS = np.array([4, 2, 1])


def expanding_cell() -> rnnc.Cell:
    """A ``(D, N)`` state decayed by ``exp(x[:, :, None] * P)``, an expansion of the input."""
    c = rnnc.Cell("expanding")
    x = c.input("x", D)
    h = c.state("h", (D, N))
    P = c.param("P", (D, N))
    new = rnnc.exp(x[:, :, None] * P) * h + rnnc.tanh(x)[:, :, None]
    c.update(h=new)
    c.output("y", new.sum(axis=-1))
    return c


def _state_wide_saves(cell: rnnc.Cell) -> list[str]:
    forward = run_passes(cell.program(), ["autodiff-forward"])
    (plan,) = forward.saves
    return [name for name, ty in plan if math.prod(ty.shape[2:]) == D * N]


def test_selective_ssm_saves_its_states_only():
    """Of the values as wide as the state, the forward saves ``h`` and ``h'`` (the backward
    reads them), not ``exp(dt * A)``."""
    assert len(_state_wide_saves(rnnc.cells.selective_ssm(D, N))) == 2


def test_expansion_of_an_input_is_not_saved():
    assert len(_state_wide_saves(expanding_cell())) == 1  # the old state h, for P's gradient


@pytest.mark.parametrize("name", ["lstm", "gru", "layer_norm_gru"])
def test_values_as_wide_as_their_operands_are_saved(name, monkeypatch):
    """Cells of ``(B, n)`` values save what they saved without the rule (a layer norm's
    ``(B, 1)`` statistics broadcast against the ``(B, n)`` values they normalize, which are
    saved or read anyway)."""
    from rnnc.passes import autodiff

    program = getattr(rnnc.cells, name)(3, 4).program()
    names = ["canonicalize", "fuse-gate-matmuls", "autodiff-forward"]
    with_rule = run_passes(program, names).saves
    monkeypatch.setattr(autodiff, "expands", lambda *args: False)
    assert run_passes(program, names).saves == with_rule


@pytest.mark.parametrize("backend", ["numpy", "llvm"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gradients_match_the_unoptimized_program(reverse, backend):
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    cell = expanding_cell()
    rng = np.random.default_rng(3)
    params = {"P": 0.3 * rng.standard_normal((D, N))}
    x = rng.standard_normal((T, B, D))
    states = {"h": rng.standard_normal((B, D, N))}
    d_y = rng.standard_normal((T, B, D))
    d_h = rng.standard_normal((B, D, N))
    grads = []
    for fn in (rnnc.compile(cell, optimize=False, reverse=reverse),
               rnnc.compile(cell, backend=backend, reverse=reverse)):
        _, _, tape = fn.forward(x, params, states=states, lengths=LENGTHS)
        grads.append(fn.backward(tape, d_outputs={"y": d_y}, d_states={"h": d_h}))
    want, got = grads
    np.testing.assert_allclose(got.x, want.x, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got.params["P"], want.params["P"], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got.states["h"], want.states["h"], rtol=1e-9, atol=1e-11)
