"""The cells of rnnc/cells_scan.py against float64 NumPy loops written from their equations.

The compiled functions run the parallel-scan pipeline (no loop left); the loops here are the
papers' equations step by step, with PyTorch's packed-sequence semantics for lengths (a state
holds past its sequence's length, an output is zero there). Gradients are checked against
central differences of the loops.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from tests.numeric import central_difference

T, B, I, H = 5, 3, 3, 4
LENGTHS = np.array([5, 2, 1])
NAMES = ("sru", "sru_square", "min_gru", "min_lstm", "qrnn", "diag_linear")


def sig(v):
    return 1 / (1 + np.exp(-v))


def make_cell(name: str) -> rnnc.Cell:
    if name == "sru_square":
        return rnnc.cells.sru(H, H)
    return rnnc.cells.PUBLISHED[name](I, H)


def step_sru(p, x, s):
    f, r = sig(x["x"] @ p["W_f"] + p["b_f"]), sig(x["x"] @ p["W_r"] + p["b_r"])
    c = f * s["c"] + (1 - f) * (x["x"] @ p["W"])
    highway = x["x"] @ p["W_s"] if "W_s" in p else x["x"]
    return r * np.tanh(c) + (1 - r) * highway, {"c": c}


def step_min_gru(p, x, s):
    z = sig(x["x"] @ p["W_z"] + p["b_z"])
    h = (1 - z) * s["h"] + z * (x["x"] @ p["W_h"] + p["b_h"])
    return h, {"h": h}


def step_min_lstm(p, x, s):
    f, i = (sig(x["x"] @ p[f"W_{g}"] + p[f"b_{g}"]) for g in "fi")
    h = f / (f + i) * s["h"] + i / (f + i) * (x["x"] @ p["W_h"] + p["b_h"])
    return h, {"h": h}


def step_qrnn(p, x, s):
    z, f = (x["x_prev"] @ p[f"V_{g}"] + x["x"] @ p[f"W_{g}"] + p[f"b_{g}"] for g in "zf")
    h = sig(f) * s["h"] + (1 - sig(f)) * np.tanh(z)
    return h, {"h": h}


def step_diag_linear(p, x, s):
    h = p["lam"] * s["h"] + x["x"] @ p["W"]
    return h, {"h": h}


STEPS = {"sru": step_sru, "sru_square": step_sru, "min_gru": step_min_gru,
         "min_lstm": step_min_lstm, "qrnn": step_qrnn, "diag_linear": step_diag_linear}


def reference(name, p, xs, states, lengths=None, reverse=False):
    """The cell's loop; ``xs`` by input name; ``reverse`` runs from the last step."""
    s, ys = dict(states), [None] * T
    for t in range(T - 1, -1, -1) if reverse else range(T):
        y, new = STEPS[name](p, {k: v[t] for k, v in xs.items()}, s)
        live = np.ones((B, 1)) if lengths is None else (t < lengths)[:, None] * 1.0
        s = {k: live * new[k] + (1 - live) * s[k] for k in s}
        ys[t] = live * y
    return np.stack(ys), s


def problem(name, seed=0):
    cell = make_cell(name)
    rng = np.random.default_rng(seed)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=seed, dtype=np.float64).items()}
    xs = {k: rng.standard_normal((T, B, n[-1])) for k, n in cell.sizes("input").items()}
    states = {k: 0.5 * rng.standard_normal((B, n[-1])) for k, n in cell.sizes("state").items()}
    return cell, params, xs, states


def _x(xs):
    return xs if len(xs) > 1 else xs["x"]


# "llvm-loop": llvm's default, without parallel-scan (the cell keeps its time loop).
@pytest.mark.parametrize("backend", ["numpy", "llvm", "llvm-loop"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_numpy_loop(name, lengths, reverse, backend):
    if backend.startswith("llvm"):
        pytest.importorskip("llvmlite")
    cell, p, xs, s0 = problem(name)
    scan = backend != "llvm-loop"
    fn = rnnc.compile(cell, backend=backend.removesuffix("-loop"), reverse=reverse,
                      parallel_scan=True if backend == "llvm" else None)
    assert (fn.op_counts("inference")["loop"] == {}) == scan
    ys, st = fn(_x(xs), p, states=s0, lengths=lengths)
    want_y, want_s = reference(name, p, xs, s0, lengths, reverse)
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-10, atol=1e-12)
    assert sorted(st) == sorted(want_s)
    for k in st:
        np.testing.assert_allclose(st[k], want_s[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_central_differences(name, lengths):
    cell, p, xs, s0 = problem(name, seed=1)
    rng = np.random.default_rng(2)
    wy = rng.standard_normal((T, B, H))
    ws = {k: rng.standard_normal(v.shape) for k, v in s0.items()}

    def loss():
        ys, st = reference(name, p, xs, s0, lengths)
        return float((ys * wy).sum() + sum((st[k] * ws[k]).sum() for k in st))

    fn = rnnc.compile(cell, backend="numpy")
    assert fn.op_counts("backward")["loop"] == {}
    _, _, tape = fn.forward(_x(xs), p, states=s0, lengths=lengths)
    g = fn.backward(tape, d_outputs={"y": wy}, d_states=ws)
    got_x = g.x if isinstance(g.x, dict) else {"x": g.x}
    got = {**{f"param {k}": v for k, v in g.params.items()},
           **{f"input {k}": v for k, v in got_x.items()},
           **{f"state {k}": v for k, v in g.states.items()}}
    want = {**{f"param {k}": central_difference(loss, p[k]) for k in p},
            **{f"input {k}": central_difference(loss, xs[k]) for k in xs},
            **{f"state {k}": central_difference(loss, s0[k]) for k in s0}}
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("name", ["sru", "min_gru", "min_lstm", "diag_linear"])
def test_runs_in_a_bidirectional_two_layer_rnn(name):
    layer = rnnc.RNN(rnnc.cells.PUBLISHED[name], I, H, num_layers=2, bidirectional=True,
                     backend="numpy", seed=0, dtype=np.float64)
    x = np.random.default_rng(3).standard_normal((T, B, I))
    y, states, tape = layer.forward(x, lengths=LENGTHS)
    assert y.shape == (T, B, 2 * H)
    assert np.isfinite(y).all() and not np.allclose(y, 0)
    assert np.all(y[2:, 1] == 0) and np.all(y[1:, 2] == 0)  # zero past each length
    g = layer.backward(tape, np.ones_like(y))
    assert g.x.shape == x.shape and np.isfinite(g.x).all()
    state = "c" if name == "sru" else "h"
    assert states[state].shape == (4, B, H)


def test_qrnn_reads_the_previous_input_as_a_second_input():
    cell = rnnc.cells.qrnn(I, H)
    assert list(cell.sizes("input")) == ["x", "x_prev"]
    assert {"V_z", "V_f", "W_z", "W_f"} <= set(cell.sizes("param"))


def test_sru_highway_needs_a_projection_only_between_sizes():
    assert "W_s" not in rnnc.cells.sru(H, H).sizes("param")
    assert rnnc.cells.sru(I, H).sizes("param")["W_s"] == (I, H)
    assert rnnc.cells.sru(I, H).sizes("state") == {"c": ("B", H)}


def test_diag_linear_decays_start_stable():
    lam = rnnc.cells.diag_linear(I, H).init_params(seed=0)["lam"]
    assert lam.shape == (H,) and np.all((0.5 <= lam) & (lam < 1.0))
