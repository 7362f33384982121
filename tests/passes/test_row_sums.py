"""hoist-sequence's rule (d): a parameter's gradient summed over the batch rows at every step
(``sum_lead``, ``sum_rows``, then a linear map) is summed per row by the loop and over the rows
once after it.

The backward loop of the selective SSM and of a cell with parameters under elementwise maps
(``exp(a)``, ``softplus(q)``) holds no row sum any more; their gradients match the unoptimized
traced program, with lengths and in reverse, on NumPy and LLVM; the pass is idempotent.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rnnc
from rnnc import ops
from rnnc.passes import pipeline
from rnnc.passes import run as run_passes
from rnnc.passes._graphs import per_step
from rnnc.printer import format_program

T, B = 5, 3
LENGTHS = np.array([5, 3, 1])
ROW_SUMS = ("sum_lead", "sum_rows")


def decay_cell() -> rnnc.Cell:
    """A cell whose parameters ``a`` and ``q`` reach the step through elementwise maps: their
    gradients are row sums followed by ``mul`` (and ``div`` on the way)."""
    c = rnnc.Cell("decay")
    x, h = c.input("x", 2), c.state("h", 3)
    W = c.param("W", (2, 3))
    a, q = c.param("a", (3,)), c.param("q", (3,))
    new = rnnc.tanh(h * rnnc.exp(a) + x @ W) / rnnc.softplus(q)
    c.update(h=new)
    c.output("y", new)
    return c


CELLS = {"selective_ssm": lambda: rnnc.cells.selective_ssm(4, 3), "decay": decay_cell}


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "parallel-scan"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_backward_loop_sums_no_rows(name, scan):
    """No row sum is left in the backward loop: the loop sums each contribution per row (a
    summed output of per-step shape) and ``post`` sums over the rows once."""
    program = CELLS[name]().program()
    backward = run_passes(program, pipeline("backward", parallel_scan=scan))
    body = backward.scan.body
    assert not [n for n in body.nodes() if n.op.name in ROW_SUMS], format_program(backward)
    per_row = [n for n in backward.scan.summed if per_step(body.node(body.outputs[n]).shape)]
    assert per_row, format_program(backward)
    assert any(n.op in (ops.sum_lead, ops.sum_rows) for n in backward.post.nodes())
    # Before the rule, the selective SSM's loop summed A_log's gradient over the rows.
    if name == "selective_ssm":
        assert "grad.A_log" in backward.post.outputs


@pytest.mark.parametrize("name", sorted(CELLS))
def test_rule_is_idempotent(name):
    program = CELLS[name]().program()
    names = pipeline("backward", parallel_scan=False)
    once = run_passes(program, names[:names.index("hoist-sequence") + 1])
    again = run_passes(once, ["hoist-sequence"])
    assert format_program(again) == format_program(once)


def _problem(cell: rnnc.Cell):
    rng = np.random.default_rng(5)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=2, dtype=np.float64).items()}
    x = rng.standard_normal((T, B, cell.sizes("input")["x"][-1]))
    states = {k: 0.5 * rng.standard_normal((B,) + shape[1:])
              for k, shape in cell.sizes("state").items()}
    return params, x, states


def _gradients(fn, params, x, states, lengths):
    ys, st, tape = fn.forward(x, params, states=states, lengths=lengths)
    rng = np.random.default_rng(6)
    d_y = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
    d_s = {k: rng.standard_normal(v.shape) for k, v in st.items()}
    g = fn.backward(tape, d_outputs=d_y, d_states=d_s)
    return {"x": g.x, **{f"param {k}": v for k, v in g.params.items()},
            **{f"state {k}": v for k, v in g.states.items()}}


def _cases():
    """(name, lengths, reverse, backend): every case on NumPy, those with lengths on LLVM (a
    build takes seconds)."""
    for name in sorted(CELLS):
        for lengths, reverse, backend in itertools.product((None, LENGTHS), (False, True),
                                                           ("numpy", "llvm")):
            if backend == "numpy" or lengths is not None:
                tag = f"{name}-{'lengths' if lengths is not None else 'full'}-" \
                      f"{'reverse' if reverse else 'forward'}-{backend}"
                yield pytest.param(name, lengths, reverse, backend, id=tag)


@pytest.mark.parametrize("name,lengths,reverse,backend", list(_cases()))
def test_gradients_match_the_unoptimized_program(name, lengths, reverse, backend):
    """Every gradient of the optimized backward (loop form, float64) against the traced
    program without optimization passes."""
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    cell = CELLS[name]()
    params, x, states = _problem(cell)
    want = _gradients(rnnc.compile(cell, optimize=False, reverse=reverse), params, x, states,
                      lengths)
    got = _gradients(rnnc.compile(cell, backend=backend, reverse=reverse, parallel_scan=False),
                     params, x, states, lengths)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-11, err_msg=k)
