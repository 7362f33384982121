"""Zoneout and variational-dropout LSTMs against float64 NumPy loops written from their papers.

The loops draw their masks with the reference Philox (``rnnc.philox.mask``, itself checked
against Random123's known answers in ``test_random.py``), in the order the cells call
``rnnc.bernoulli``: stream 0 first, then stream 1.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc import philox
from tests.numeric import central_difference

T, B, I, H = 4, 3, 3, 4
SEED = 2024
LENGTHS = np.array([4, 2, 1])
try:
    import llvmlite  # noqa: F401

    BACKENDS = [("numpy", {}), ("llvm", {}), ("cuda", {"emulate": True})]
except ImportError:
    BACKENDS = [("numpy", {}), ("cuda", {"emulate": True})]
IDS = [name for name, _ in BACKENDS]
Z_C, Z_H, P_X, P_H = 0.3, 0.2, 0.25, 0.4


def sig(v):
    return 1 / (1 + np.exp(-v))


def lstm(p, x, h, c):
    """PyTorch's LSTM step: (h~, c~)."""
    pre = {g: x @ p[f"W_i{g}"] + p[f"b_i{g}"] + h @ p[f"W_h{g}"] + p[f"b_h{g}"] for g in "ifgo"}
    c_new = sig(pre["f"]) * c + sig(pre["i"]) * np.tanh(pre["g"])
    return sig(pre["o"]) * np.tanh(c_new), c_new


def step_zoneout(p, x, s, t, training):
    h_new, c_new = lstm(p, x, s["h"], s["c"])
    if training:  # Krueger et al.: a unit keeps its old value where its mask is 1
        m_c = philox.mask(SEED, t, len(x), H, Z_C, 0)
        m_h = philox.mask(SEED, t, len(x), H, Z_H, 1)
    else:  # the expectation
        m_c, m_h = np.full((len(x), H), Z_C), np.full((len(x), H), Z_H)
    c = m_c * s["c"] + (1 - m_c) * c_new
    h = m_h * s["h"] + (1 - m_h) * h_new
    return h, {"h": h, "c": c}


def step_variational(p, x, s, t, training):
    h = s["h"]
    if training:  # Gal & Ghahramani: one mask per sequence, scaled by 1 / (1 - p)
        x = x * philox.mask(SEED, 0, len(x), I, 1 - P_X, 0, "sequence") / (1 - P_X)
        h = h * philox.mask(SEED, 0, len(x), H, 1 - P_H, 1, "sequence") / (1 - P_H)
    h, c = lstm(p, x, h, s["c"])
    return h, {"h": h, "c": c}


STEPS = {"zoneout_lstm": step_zoneout, "variational_lstm": step_variational}


def make_cell(name, training=True):
    if name == "zoneout_lstm":
        return rnnc.cells.zoneout_lstm(I, H, Z_C, Z_H, training=training)
    return rnnc.cells.variational_lstm(I, H, P_X, P_H, training=training)


def reference(name, p, x, states, training=True, lengths=None):
    """The NumPy loop, with PyTorch's packed-sequence semantics for ``lengths``."""
    s, ys = dict(states), []
    for t, x_t in enumerate(x):
        y, new = STEPS[name](p, x_t, s, t, training)
        live = np.ones((len(x_t), 1)) if lengths is None else (t < lengths)[:, None] * 1.0
        s = {k: live * new[k] + (1 - live) * s[k] for k in s}
        ys.append(live * y)
    return np.stack(ys), s


def problem(name, seed=0, training=True):
    cell = make_cell(name, training)
    rng = np.random.default_rng(seed)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=seed, dtype=np.float64).items()}
    x = rng.standard_normal((T, B, I))
    states = {k: 0.5 * rng.standard_normal((B, H)) for k in ("h", "c")}
    return cell, params, x, states


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
@pytest.mark.parametrize("name", sorted(STEPS))
def test_forward_matches_the_numpy_loop(name, backend, options, lengths) -> None:
    cell, p, x, s0 = problem(name)
    fn = rnnc.compile(cell, backend=backend, **options)
    want_y, want_s = reference(name, p, x, s0, lengths=lengths)
    ys, st = fn(x, p, states=s0, lengths=lengths, seed=SEED)
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-10, atol=1e-12)
    for k in want_s:
        np.testing.assert_allclose(st[k], want_s[k], rtol=1e-10, atol=1e-12, err_msg=k)
    # float32 draws the same masks: the result is the float64 one up to rounding.
    p32 = {k: v.astype(np.float32) for k, v in p.items()}
    s32 = {k: v.astype(np.float32) for k, v in s0.items()}
    ys32, _ = fn(x.astype(np.float32), p32, states=s32, lengths=lengths, seed=SEED)
    np.testing.assert_allclose(ys32["y"], want_y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
@pytest.mark.parametrize("name", sorted(STEPS))
def test_gradients_match_central_differences(name, backend, options) -> None:
    cell, p, x, s0 = problem(name, seed=1)
    rng = np.random.default_rng(2)
    wy = rng.standard_normal((T, B, H))
    ws = {k: rng.standard_normal(v.shape) for k, v in s0.items()}

    def loss() -> float:
        ys, st = reference(name, p, x, s0, lengths=LENGTHS)
        return float((ys * wy).sum() + sum((st[k] * ws[k]).sum() for k in st))

    fn = rnnc.compile(cell, backend=backend, **options)
    _, _, tape = fn.forward(x, p, states=s0, lengths=LENGTHS, seed=SEED)
    g = fn.backward(tape, d_outputs={"y": wy}, d_states=ws)
    np.testing.assert_allclose(g.x, central_difference(loss, x), rtol=1e-5, atol=1e-7)
    for k in s0:
        np.testing.assert_allclose(g.states[k], central_difference(loss, s0[k]), rtol=1e-5,
                                   atol=1e-7, err_msg=k)
    for k in p:
        np.testing.assert_allclose(g.params[k], central_difference(loss, p[k]), rtol=1e-5,
                                   atol=1e-7, err_msg=k)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_evaluation_cells_are_the_expectation_and_need_no_seed(name) -> None:
    cell, p, x, s0 = problem(name, training=False)
    fn = rnnc.compile(cell, backend="numpy")
    assert not fn.draws_masks
    ys, st = fn(x, p, states=s0)
    want_y, want_s = reference(name, p, x, s0, training=False)
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-10, atol=1e-12)
    for k in want_s:
        np.testing.assert_allclose(st[k], want_s[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_same_parameters_as_the_lstm(name) -> None:
    assert make_cell(name).sizes("param") == rnnc.cells.lstm(I, H).sizes("param")
    assert name in rnnc.cells.PUBLISHED


@pytest.mark.parametrize("factory,kwargs,match", [
    (rnnc.cells.zoneout_lstm, {"zoneout_c": 1.5}, r"zoneout_c must be a probability in \[0, 1\]"),
    (rnnc.cells.zoneout_lstm, {"zoneout_h": "0.1"}, r"zoneout_h must be a probability"),
    (rnnc.cells.variational_lstm, {"dropout_x": 1.0},
     r"dropout_x must be a probability in \[0, 1\)"),
    (rnnc.cells.variational_lstm, {"dropout_h": -0.5}, r"dropout_h must be a probability"),
])
def test_bad_probabilities_are_refused(factory, kwargs, match) -> None:
    with pytest.raises(rnnc.CellError, match=match):
        factory(I, H, **kwargs)
