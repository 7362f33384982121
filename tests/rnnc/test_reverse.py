"""Reverse scans: ``rnnc.compile(cell, reverse=True)`` runs the cell over t = T-1, ..., 0.

The oracle is an independent float64 NumPy loop that runs each sequence backwards from its own
last step (PyTorch's reverse direction over packed sequences): the steps past a sequence's
length are never run, so their outputs are zero and the initial state reaches the last valid
step unchanged. Gradients are central differences of that loop. Every backend (and the
unoptimized oracle, ``optimize=False``) must agree with it: outputs, final states and the
gradients of inputs, parameters and initial states, with and without lengths.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

import rnnc
from rnnc.errors import BackendUnavailable

T, B, I, H = 4, 3, 2, 3
LENGTHS = np.array([4, 1, 3])


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _rnn_step(p, x, s):
    h = np.tanh(x @ p["W_ih"] + p["b_ih"] + s["h"] @ p["W_hh"] + p["b_hh"])
    return h, {"h": h}


def _lstm_step(p, x, s):
    z = {g: x @ p[f"W_i{g}"] + p[f"b_i{g}"] + s["h"] @ p[f"W_h{g}"] + p[f"b_h{g}"]
         for g in "ifgo"}
    c = _sigmoid(z["f"]) * s["c"] + _sigmoid(z["i"]) * np.tanh(z["g"])
    h = _sigmoid(z["o"]) * np.tanh(c)
    return h, {"h": h, "c": c}


def _gru_step(p, x, s):
    h = s["h"]
    r = _sigmoid(x @ p["W_ir"] + p["b_ir"] + h @ p["W_hr"] + p["b_hr"])
    z = _sigmoid(x @ p["W_iz"] + p["b_iz"] + h @ p["W_hz"] + p["b_hz"])
    n = np.tanh(x @ p["W_in"] + p["b_in"] + r * (h @ p["W_hn"] + p["b_hn"]))
    h = (1 - z) * n + z * h
    return h, {"h": h}


CELLS = {"rnn": (rnnc.cells.rnn, _rnn_step), "lstm": (rnnc.cells.lstm, _lstm_step),
         "gru": (rnnc.cells.gru, _gru_step)}


def reference(step, x, params, states, lengths):
    """Each sequence b run over t = len_b - 1, ..., 0; zero outputs at t >= len_b."""
    y = np.zeros((T, B, H))
    final = {n: np.zeros_like(v) for n, v in states.items()}
    for b in range(B):
        s = {n: v[b:b + 1] for n, v in states.items()}
        for t in range(T - 1 if lengths is None else lengths[b] - 1, -1, -1):
            out, s = step(params, x[t, b:b + 1], s)
            y[t, b] = out[0]
        for n in final:
            final[n][b] = s[n][0]
    return y, final


def _data(name: str):
    rng = np.random.default_rng(3)
    cell = CELLS[name][0](I, H)
    params = {n: rng.uniform(-0.6, 0.6, s) for n, s in cell.sizes("param").items()}
    states = {n: rng.uniform(-0.5, 0.5, (B, s[-1])) for n, s in cell.sizes("state").items()}
    x = rng.standard_normal((T, B, I))
    d_y = rng.standard_normal((T, B, H))
    d_states = {n: rng.standard_normal((B, H)) for n in states}
    return cell, x, params, states, d_y, d_states


@cache
def expected(name: str, with_lengths: bool):
    """The reference's outputs, final states and (central differences) gradients of
    ``sum(y * d_y) + sum(final * d_states)``."""
    _, x, params, states, d_y, d_states = _data(name)
    step, lengths = CELLS[name][1], LENGTHS if with_lengths else None

    def loss() -> float:
        y, final = reference(step, x, params, states, lengths)
        return float((y * d_y).sum() + sum((final[n] * d_states[n]).sum() for n in final))

    grads = {}
    for label, arrays in (("x", {"x": x}), ("param", params), ("state", states)):
        for key, arr in arrays.items():
            g = np.zeros_like(arr)
            for idx in np.ndindex(arr.shape):
                keep = arr[idx]
                arr[idx] = keep + 1e-6
                plus = loss()
                arr[idx] = keep - 1e-6
                minus = loss()
                arr[idx] = keep
                g[idx] = (plus - minus) / 2e-6
            grads[f"{label} {key}"] = g
    y, final = reference(step, x, params, states, lengths)
    return y, final, grads


BACKENDS = [pytest.param(("numpy", {"optimize": False}), id="oracle"),
            pytest.param(("numpy", {}), id="numpy"), pytest.param(("llvm", {}), id="llvm"),
            pytest.param(("cuda", {"emulate": True}), id="cuda-emulated"),
            pytest.param(("cuda", {}), id="cuda-gpu", marks=pytest.mark.cuda)]


def _compile(cell: rnnc.Cell, backend: str, options: dict) -> rnnc.Function:
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    try:
        return rnnc.compile(cell, backend, reverse=True, **options)
    except BackendUnavailable as err:  # no GPU, or no C++ compiler to emulate one
        pytest.skip(str(err))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_reverse_matches_numpy_loop(name: str, with_lengths: bool, backend) -> None:
    cell, x, params, states, d_y, d_states = _data(name)
    fn = _compile(cell, *backend)
    lengths = LENGTHS if with_lengths else None
    want_y, want_final, want_grads = expected(name, with_lengths)
    ys, final = fn(x, params, states, lengths)
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-12, atol=1e-13)
    for n, v in want_final.items():
        np.testing.assert_allclose(final[n], v, rtol=1e-12, atol=1e-13, err_msg=n)
    ys, final, tape = fn.forward(x, params, states, lengths)
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-12, atol=1e-13)
    g = fn.backward(tape, {"y": d_y}, d_states)
    got = {"x x": g.x, **{f"param {k}": v for k, v in g.params.items()},
           **{f"state {k}": v for k, v in g.states.items()}}
    assert sorted(got) == sorted(want_grads)
    for key, want in want_grads.items():
        np.testing.assert_allclose(got[key], want, rtol=1e-6, atol=1e-8, err_msg=key)


def test_autodiff_of_a_reverse_scan_runs_forward() -> None:
    fn = rnnc.compile(rnnc.cells.lstm(I, H), reverse=True, backend="numpy")
    for masked in (False, True):
        assert fn.program("inference", lengths=masked).scan.reverse
        assert fn.program("forward", lengths=masked).scan.reverse
        assert not fn.program("backward", lengths=masked).scan.reverse
        assert fn.program("backward.backward", lengths=masked).scan.reverse
    assert "scan reverse" in fn.ir() and "scan forward" in fn.ir("backward")


def test_reverse_is_part_of_the_identity() -> None:
    cell = rnnc.cells.gru(I, H)
    forward, reverse = rnnc.compile(cell, backend="numpy"), rnnc.compile(cell, reverse=True,
                                                                         backend="numpy")
    assert forward.program().fingerprint() != reverse.program().fingerprint()
    assert not forward.program().scan.reverse and reverse.program().scan.reverse


def test_reverse_must_be_a_bool() -> None:
    with pytest.raises(rnnc.RnncTypeError, match="reverse must be True or False"):
        rnnc.compile(rnnc.cells.rnn(I, H), reverse=1, backend="numpy")


def test_check_validates_a_reverse_function() -> None:
    fn = rnnc.compile(rnnc.cells.gru(I, H), check=True, reverse=True, backend="numpy")
    assert fn.reverse


def test_reverse_double_backward_matches_central_differences() -> None:
    cell, x, params, states, d_y, d_states = _data("gru")
    fn = rnnc.compile(cell, reverse=True, backend="numpy")
    rng = np.random.default_rng(4)
    u_x = rng.standard_normal(x.shape)
    u_params = {n: rng.standard_normal(a.shape) for n, a in params.items()}
    d_out = {"y": d_y}

    def loss() -> float:
        g = fn.backward(fn.forward(x, params, states, LENGTHS)[2], d_out, d_states)
        return float((g.x * u_x).sum() + sum((g.params[n] * u_params[n]).sum() for n in params))

    tape = fn.forward(x, params, states, LENGTHS)[2]
    c_dy, c_ds, c = fn.double_backward(tape, d_out, d_states, {"x": u_x}, u_params, None)
    arrays = [x, *params.values(), *states.values(), d_y, *d_states.values()]
    grads = [c.x, *(c.params[n] for n in params), *(c.states[n] for n in states), c_dy["y"],
             *(c_ds[n] for n in d_states)]
    v = [rng.standard_normal(a.shape) for a in arrays]
    for a, d in zip(arrays, v, strict=True):
        a += 1e-5 * d
    plus = loss()
    for a, d in zip(arrays, v, strict=True):
        a -= 2e-5 * d
    minus = loss()
    for a, d in zip(arrays, v, strict=True):
        a += 1e-5 * d
    want = (plus - minus) / 2e-5
    got = sum(float((g * d).sum()) for g, d in zip(grads, v, strict=True))
    assert abs(got - want) <= 1e-7 * (1 + abs(want)), (got, want)

