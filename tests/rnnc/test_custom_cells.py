"""Custom cells written in the DSL against float64 NumPy loops written by hand in this file.

The oracles use plain NumPy expressions (np.tanh, 1/(1+exp(-x)), np.mean, ...) and never call
rnnc's op references.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc

T, B, I, H = 5, 3, 4, 6
TOL = {np.float32: 1e-5, np.float64: 1e-10}


def sig(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max(1, max|b|)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def run(cell: rnnc.Cell, x, dtype, seed: int = 0):
    """Compile on NumPy; random params and initial states; return (params, states, ys, final)."""
    params = cell.init_params(seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    states = {n: (0.5 * rng.standard_normal((B, s[-1]))).astype(dtype)
              for n, s in cell.sizes("state").items()}
    ys, final = rnnc.compile(cell, backend="numpy")(x, params, states=states)
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    s64 = {k: v.astype(np.float64) for k, v in states.items()}
    return p64, s64, ys, final


def sequence(dtype, size: int = I, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((T, B, size)).astype(dtype)


DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])


def check(got: dict, want: dict, dtype) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == dtype, k
        assert rel_err(got[k], want[k]) <= TOL[dtype], k


# ---------------------------------------------------------------- GRU v3


@DTYPES
def test_gru_reset_before(dtype) -> None:
    cell = rnnc.cells.gru(I, H, reset_after=False)
    x = sequence(dtype)
    p, s, ys, final = run(cell, x, dtype)
    h = s["h"]
    out = []
    for t in range(T):
        xt = x[t].astype(np.float64)
        r = sig(xt @ p["W_ir"] + p["b_ir"] + h @ p["W_hr"] + p["b_hr"])
        z = sig(xt @ p["W_iz"] + p["b_iz"] + h @ p["W_hz"] + p["b_hz"])
        n = np.tanh(xt @ p["W_in"] + p["b_in"] + (r * h) @ p["W_hn"] + p["b_hn"])
        h = (1 - z) * n + z * h
        out.append(h)
    check(ys, {"y": np.stack(out)}, dtype)
    check(final, {"h": h}, dtype)


# ---------------------------------------------------------------- peephole LSTM


def peephole_lstm(input_size: int, hidden_size: int) -> rnnc.Cell:
    c = rnnc.Cell("peephole_lstm")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    cs = c.state("c", hidden_size)
    W = {g: c.param(f"W_{g}", (input_size, hidden_size)) for g in "ifco"}
    U = {g: c.param(f"U_{g}", (hidden_size, hidden_size)) for g in "ifco"}
    P = {g: c.param(f"p_{g}", (hidden_size,)) for g in "ifo"}
    b = {g: c.param(f"b_{g}", (hidden_size,)) for g in "ifco"}
    i = rnnc.sigmoid(x @ W["i"] + h @ U["i"] + cs * P["i"] + b["i"])
    f = rnnc.sigmoid(x @ W["f"] + h @ U["f"] + cs * P["f"] + b["f"])
    c_new = f * cs + i * rnnc.tanh(x @ W["c"] + h @ U["c"] + b["c"])
    o = rnnc.sigmoid(x @ W["o"] + h @ U["o"] + c_new * P["o"] + b["o"])
    h_new = o * rnnc.tanh(c_new)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


@DTYPES
def test_peephole_lstm(dtype) -> None:
    x = sequence(dtype)
    p, s, ys, final = run(peephole_lstm(I, H), x, dtype)
    h, c = s["h"], s["c"]
    out = []
    for t in range(T):
        xt = x[t].astype(np.float64)
        i = sig(xt @ p["W_i"] + h @ p["U_i"] + c * p["p_i"] + p["b_i"])
        f = sig(xt @ p["W_f"] + h @ p["U_f"] + c * p["p_f"] + p["b_f"])
        c = f * c + i * np.tanh(xt @ p["W_c"] + h @ p["U_c"] + p["b_c"])
        o = sig(xt @ p["W_o"] + h @ p["U_o"] + c * p["p_o"] + p["b_o"])
        h = o * np.tanh(c)
        out.append(h)
    check(ys, {"y": np.stack(out)}, dtype)
    check(final, {"h": h, "c": c}, dtype)


# ---------------------------------------------------------------- MGU (DESIGN's example)


# The minimal gated unit of the README's "Your own cell", as rnnc ships it.
mgu = rnnc.cells.mgu


@DTYPES
def test_mgu(dtype) -> None:
    x = sequence(dtype)
    p, s, ys, final = run(mgu(I, H), x, dtype)
    h = s["h"]
    out = []
    for t in range(T):
        xt = x[t].astype(np.float64)
        f = sig(xt @ p["W_f"] + h @ p["U_f"] + p["b_f"])
        n = np.tanh(xt @ p["W_n"] + (f * h) @ p["U_n"] + p["b_n"])
        h = (1 - f) * h + f * n
        out.append(h)
    check(ys, {"y": np.stack(out)}, dtype)
    check(final, {"h": h}, dtype)


# ---------------------------------------------------------------- layer-norm cell


def ln_rnn(input_size: int, hidden_size: int) -> rnnc.Cell:
    """h' = tanh(LN(x W + h U) * g + b), LN written with rnnc.mean and rnnc.sqrt."""
    c = rnnc.Cell("ln_rnn")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W = c.param("W", (input_size, hidden_size))
    U = c.param("U", (hidden_size, hidden_size))
    g = c.param("g", (hidden_size,), init=lambda rng, shape: rng.uniform(0.5, 1.5, shape))
    b = c.param("b", (hidden_size,))
    a = x @ W + h @ U
    centred = a - rnnc.mean(a)
    normed = centred / rnnc.sqrt(rnnc.mean(centred * centred) + 1e-5)
    h_new = rnnc.tanh(normed * g + b)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


@DTYPES
def test_layer_norm_cell(dtype) -> None:
    x = sequence(dtype)
    p, s, ys, final = run(ln_rnn(I, H), x, dtype)
    h = s["h"]
    out = []
    for t in range(T):
        a = x[t].astype(np.float64) @ p["W"] + h @ p["U"]
        mu = a.sum(axis=1, keepdims=True) / H
        var = ((a - mu) ** 2).sum(axis=1, keepdims=True) / H
        h = np.tanh((a - mu) / np.sqrt(var + 1e-5) * p["g"] + p["b"])
        out.append(h)
    check(ys, {"y": np.stack(out)}, dtype)
    check(final, {"h": h}, dtype)


# ---------------------------------------------------------------- two inputs


def two_input_cell(size_a: int, size_b: int, hidden_size: int) -> rnnc.Cell:
    c = rnnc.Cell("two_inputs")
    a = c.input("a", size_a)
    v = c.input("v", size_b)
    h = c.state("h", hidden_size)
    W_a = c.param("W_a", (size_a, hidden_size))
    W_v = c.param("W_v", (size_b, hidden_size))
    U = c.param("U", (hidden_size, hidden_size))
    gate = rnnc.sigmoid(v @ W_v)
    h_new = rnnc.tanh(a @ W_a * gate + h @ U)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


@DTYPES
def test_multi_input_cell(dtype) -> None:
    xa, xv = sequence(dtype, 2, seed=3), sequence(dtype, 3, seed=4)
    p, s, ys, final = run(two_input_cell(2, 3, H), {"a": xa, "v": xv}, dtype)
    h = s["h"]
    out = []
    for t in range(T):
        gate = sig(xv[t].astype(np.float64) @ p["W_v"])
        h = np.tanh(xa[t].astype(np.float64) @ p["W_a"] * gate + h @ p["U"])
        out.append(h)
    check(ys, {"y": np.stack(out)}, dtype)
    check(final, {"h": h}, dtype)


# ---------------------------------------------------------------- two outputs


def two_output_cell(input_size: int, hidden_size: int) -> rnnc.Cell:
    c = rnnc.Cell("two_outputs")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W = c.param("W", (input_size, hidden_size))
    U = c.param("U", (hidden_size, hidden_size))
    V = c.param("V", (hidden_size, 2))
    h_new = rnnc.tanh(x @ W + h @ U)
    c.update(h=h_new)
    c.output("y", h_new)
    c.output("logits", h_new @ V + h[:, 0:2])
    return c


@DTYPES
def test_two_output_cell(dtype) -> None:
    x = sequence(dtype)
    p, s, ys, final = run(two_output_cell(I, H), x, dtype)
    h = s["h"]
    out, logits = [], []
    for t in range(T):
        h_old = h
        h = np.tanh(x[t].astype(np.float64) @ p["W"] + h @ p["U"])
        out.append(h)
        logits.append(h @ p["V"] + h_old[:, 0:2])
    check(ys, {"y": np.stack(out), "logits": np.stack(logits)}, dtype)
    check(final, {"h": h}, dtype)
