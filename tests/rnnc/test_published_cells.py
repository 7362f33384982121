"""The published cells of rnnc.cells against float64 NumPy loops written from their equations."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from tests.numeric import central_difference

T, B, I, H = 4, 3, 3, 4
P = 2  # lstmp's projection
LENGTHS = np.array([4, 2, 1])
# Cells that draw random masks have their own tests: tests/rnnc/test_random_cells.py.
RANDOM = ("variational_lstm", "zoneout_lstm")
# Cells linear in their carries have theirs too: tests/rnnc/test_cells_scan.py.
SCAN = ("sru", "min_gru", "min_lstm", "qrnn", "diag_linear")
NAMES = sorted(n for n in rnnc.cells.PUBLISHED if n not in RANDOM + SCAN)
LLVM_NAMES = ("ligru", "mlstm", "mogrifier_lstm")
try:
    import llvmlite  # noqa: F401

    LLVM = True
except ImportError:
    LLVM = False


def sig(v):
    return 1 / (1 + np.exp(-v))


def ln(v, gain, shift, eps=1e-5):
    mu = v.mean(-1, keepdims=True)
    return (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + eps) * gain + shift


def lstm_tail(p, x, h, c, bias):
    """The LSTM update from (possibly mogrified) x and h; ``bias(g)`` is gate g's bias."""
    pre = {g: x @ p[f"W_i{g}"] + h @ p[f"W_h{g}"] + bias(g) for g in "ifgo"}
    c = sig(pre["f"]) * c + sig(pre["i"]) * np.tanh(pre["g"])
    return sig(pre["o"]) * np.tanh(c), c


def step_indrnn(p, x, s):
    h = np.maximum(x @ p["W"] + p["u"] * s["h"] + p["b"], 0)
    return h, {"h": h}


def step_ligru(p, x, s):
    h = s["h"]
    z = sig(x @ p["W_z"] + h @ p["U_z"] + p["b_z"])
    cand = np.maximum(x @ p["W_h"] + h @ p["U_h"] + p["b_h"], 0)
    h = z * h + (1 - z) * cand
    return h, {"h": h}


def step_mlstm(p, x, s):
    m = (x @ p["W_mx"]) * (s["h"] @ p["W_mh"])
    pre = {g: x @ p[f"W_{g}x"] + m @ p[f"W_{g}m"] + p[f"b_{g}"] for g in "hifo"}
    c = sig(pre["f"]) * s["c"] + sig(pre["i"]) * pre["h"]
    h = np.tanh(c) * sig(pre["o"])
    return h, {"h": h, "c": c}


def step_layer_norm_gru(p, x, s):
    h = s["h"]
    a = {g: ln(x @ p[f"W_i{g}"], p[f"g_i{g}"], p[f"s_i{g}"]) for g in "rzn"}
    r_ = {g: ln(h @ p[f"W_h{g}"], p[f"g_h{g}"], p[f"s_h{g}"]) for g in "rzn"}
    r, z = sig(a["r"] + r_["r"]), sig(a["z"] + r_["z"])
    n = np.tanh(a["n"] + r * r_["n"])
    h = (1 - z) * n + z * h
    return h, {"h": h}


def step_mogrifier_lstm(p, x, s, rounds=5):
    h = s["h"]
    for k in range(1, rounds + 1):
        if k % 2:
            x = 2 * sig(h @ p[f"Q_{k}"]) * x
        else:
            h = 2 * sig(x @ p[f"R_{k}"]) * h
    h, c = lstm_tail(p, x, h, s["c"], lambda g: p[f"b_{g}"])
    return h, {"h": h, "c": c}


def step_lstmp(p, x, s):
    h, c = lstm_tail(p, x, s["h"], s["c"], lambda g: p[f"b_i{g}"] + p[f"b_h{g}"])
    h = h @ p["W_hr"]
    return h, {"h": h, "c": c}


STEPS = {name: globals()[f"step_{name}"] for name in NAMES}


def reference(name, p, x, states, lengths=None):
    """The cell's NumPy loop with PyTorch's packed-sequence semantics for ``lengths``."""
    s, ys = dict(states), []
    for t, x_t in enumerate(x):
        y, new = STEPS[name](p, x_t, s)
        live = np.ones((x.shape[1], 1)) if lengths is None else (t < lengths)[:, None] * 1.0
        s = {k: live * new[k] + (1 - live) * s[k] for k in s}
        ys.append(live * y)
    return np.stack(ys), s


def make_cell(name):
    return rnnc.cells.lstmp(I, H, P) if name == "lstmp" else rnnc.cells.PUBLISHED[name](I, H)


def problem(name, seed=0):
    """A cell, float64 parameters, input and nonzero initial states."""
    cell = make_cell(name)
    rng = np.random.default_rng(seed)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=seed, dtype=np.float64).items()}
    x = rng.standard_normal((T, B, I))
    states = {k: 0.5 * rng.standard_normal((B, n[-1])) for k, n in cell.sizes("state").items()}
    return cell, params, x, states


def check_forward(name, backend, lengths):
    cell, p, x, s0 = problem(name)
    fn = rnnc.compile(cell, backend=backend)
    ys, st = fn(x, p, states=s0, lengths=lengths)
    want_y, want_s = reference(name, p, x, s0, lengths)
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-10, atol=1e-12)
    assert sorted(st) == sorted(want_s)
    for k in st:
        np.testing.assert_allclose(st[k], want_s[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_numpy_loop(name, lengths):
    check_forward(name, "numpy", lengths)


@pytest.mark.skipif(not LLVM, reason="needs llvmlite")
@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("name", LLVM_NAMES)
def test_forward_matches_numpy_loop_on_llvm(name, lengths):
    check_forward(name, "llvm", lengths)




def _emulator() -> bool:
    import shutil

    return shutil.which("g++") is not None


@pytest.mark.parametrize("backend", ["llvm", "cuda-emulate"])
@pytest.mark.parametrize("name", NAMES)
def test_every_backend_matches_the_oracle_forward_and_gradients(name, backend):
    """Outputs, final states and every gradient on llvm and the CUDA emulation against the
    unoptimized traced program (whose own gradients are checked against central differences
    above), float64, with lengths."""
    if backend == "llvm" and not LLVM:
        pytest.skip("llvm backend needs llvmlite")
    if backend == "cuda-emulate" and not _emulator():
        pytest.skip("the CUDA emulation needs a C++ compiler")
    cell, p, x, s0 = problem(name, seed=3)
    options = {"backend": "cuda", "emulate": True} if backend == "cuda-emulate" else \
        {"backend": backend}
    results = []
    for fn in (rnnc.compile(cell, optimize=False), rnnc.compile(cell, **options)):
        ys, st, tape = fn.forward(x, p, states=s0, lengths=LENGTHS)
        rng = np.random.default_rng(4)
        d_y = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
        d_s = {k: rng.standard_normal(v.shape) for k, v in st.items()}
        g = fn.backward(tape, d_outputs=d_y, d_states=d_s)
        results.append({**{f"y {k}": v for k, v in ys.items()},
                        **{f"state {k}": v for k, v in st.items()}, "grad x": g.x,
                        **{f"grad {k}": v for k, v in g.params.items()},
                        **{f"grad state {k}": v for k, v in g.states.items()}})
    want, got = results
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_central_differences(name, lengths):
    cell, p, x, s0 = problem(name, seed=1)
    rng = np.random.default_rng(2)
    wy = rng.standard_normal((T, B, cell.sizes("state")["h"][-1]))
    ws = {k: rng.standard_normal(v.shape) for k, v in s0.items()}

    def loss():
        ys, st = reference(name, p, x, s0, lengths)
        return float((ys * wy).sum() + sum((st[k] * ws[k]).sum() for k in st))

    fn = rnnc.compile(cell, backend="numpy")
    _, _, tape = fn.forward(x, p, states=s0, lengths=lengths)
    g = fn.backward(tape, d_outputs={"y": wy}, d_states=ws)
    got = {**{f"param {k}": v for k, v in g.params.items()}, "x": g.x,
           **{f"state {k}": v for k, v in g.states.items()}}
    want = {**{f"param {k}": central_difference(loss, p[k]) for k in p},
            "x": central_difference(loss, x),
            **{f"state {k}": central_difference(loss, s0[k]) for k in s0}}
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("name", NAMES)
def test_runs_in_a_bidirectional_two_layer_rnn(name):
    factory = rnnc.cells.PUBLISHED[name]
    layer = rnnc.RNN(factory, I, H, num_layers=2, bidirectional=True, backend="numpy", seed=0,
                     dtype=np.float64)
    x = np.random.default_rng(3).standard_normal((T, B, I))
    width = H // 2 if name == "lstmp" else H  # lstmp's default projection
    y, states, tape = layer.forward(x, lengths=LENGTHS)
    assert y.shape == (T, B, 2 * width)
    assert np.isfinite(y).all() and not np.allclose(y, 0)
    assert np.all(y[2:, 1] == 0) and np.all(y[1:, 2] == 0)  # zero past each length
    g = layer.backward(tape, np.ones_like(y))
    assert g.x.shape == x.shape and np.isfinite(g.x).all()
    assert states["h"].shape == (4, B, width)


def test_lstmp_is_lstm_with_a_projection():
    cell = rnnc.cells.lstmp(I, H)
    assert cell.sizes("state") == {"h": ("B", H // 2), "c": ("B", H)}
    assert cell.sizes("param")["W_hr"] == (H, H // 2)
    ref = rnnc.cells.lstm(I, H, proj_size=3)
    assert rnnc.cells.lstmp(I, H, 3).sizes("param") == ref.sizes("param")
    with pytest.raises(rnnc.CellError):
        rnnc.cells.lstmp(I, H, 0)
    with pytest.raises(rnnc.CellError):
        rnnc.cells.lstmp(I, H, H)


def test_mogrifier_rounds():
    params = rnnc.cells.mogrifier_lstm(I, H, rounds=3).sizes("param")
    assert {k for k in params if k[0] in "QR"} == {"Q_1", "R_2", "Q_3"}
    assert params["Q_1"] == (H, I) and params["R_2"] == (I, H)
    assert not any(k[0] in "QR" for k in rnnc.cells.mogrifier_lstm(I, H, rounds=0).sizes("param"))
    for bad in (-1, 1.5, True):
        with pytest.raises(rnnc.CellError):
            rnnc.cells.mogrifier_lstm(I, H, rounds=bad)


def test_published_cells_are_not_in_named():
    """NAMED drives per-cell compiler tests; the published cells stay in their own dict."""
    assert not set(rnnc.cells.PUBLISHED) & set(rnnc.cells.NAMED)
