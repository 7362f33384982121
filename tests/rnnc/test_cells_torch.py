"""The standard cells on the NumPy backend against torch.nn.RNN/LSTM/GRU.

Relative error is ``max|a - b| / max(1, max|b|)`` with ``b`` from PyTorch in float64 (run on the
same, possibly float32-rounded, weights and inputs); it must be <= 1e-5 for float32 and <= 1e-10
for float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc

torch = pytest.importorskip("torch")

TOL = {np.float32: 1e-5, np.float64: 1e-10}
# (T, B, input, hidden): the edge sizes T=1, B=1, H=1 and an input of one feature.
SHAPES = [(5, 3, 4, 6), (1, 1, 1, 1), (1, 3, 2, 1), (7, 1, 3, 5), (4, 2, 1, 3)]
GATES = {"rnn_tanh": "", "rnn_relu": "", "lstm": "ifgo", "gru": "rzn"}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max(1, max|b|)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def torch_module(mode: str, input_size: int, hidden_size: int, seed: int):
    torch.manual_seed(seed)
    if mode == "lstm":
        m = torch.nn.LSTM(input_size, hidden_size)
    elif mode == "gru":
        m = torch.nn.GRU(input_size, hidden_size)
    else:
        m = torch.nn.RNN(input_size, hidden_size, nonlinearity=mode[4:])
    return m.double()


def rnnc_cell(mode: str, input_size: int, hidden_size: int) -> rnnc.Cell:
    if mode == "lstm":
        return rnnc.cells.lstm(input_size, hidden_size)
    if mode == "gru":
        return rnnc.cells.gru(input_size, hidden_size, reset_after=True)
    return rnnc.cells.rnn(input_size, hidden_size, nonlinearity=mode[4:])


def map_by_hand(mode: str, module, dtype) -> dict[str, np.ndarray]:
    """DESIGN's mapping: W_i<g> = weight_ih_l0[j*H:(j+1)*H].T, b_i<g> = bias_ih_l0[j*H:...]."""
    w_ih, w_hh = module.weight_ih_l0.detach().numpy(), module.weight_hh_l0.detach().numpy()
    b_ih, b_hh = module.bias_ih_l0.detach().numpy(), module.bias_hh_l0.detach().numpy()
    if not GATES[mode]:
        out = {"W_ih": w_ih.T, "W_hh": w_hh.T, "b_ih": b_ih, "b_hh": b_hh}
    else:
        H = module.hidden_size
        out = {}
        for j, g in enumerate(GATES[mode]):
            rows = slice(j * H, (j + 1) * H)
            out[f"W_i{g}"] = w_ih[rows].T
            out[f"W_h{g}"] = w_hh[rows].T
            out[f"b_i{g}"] = b_ih[rows]
            out[f"b_h{g}"] = b_hh[rows]
    return {k: np.ascontiguousarray(v, dtype=dtype) for k, v in out.items()}


def map_with_weights_module(mode: str, module, dtype) -> dict[str, np.ndarray]:
    weights = pytest.importorskip("rnnc.interop.weights")
    params = weights.from_torch_layer(
        mode, *(getattr(module, n).detach().numpy() for n in
                ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")))
    return {k: np.ascontiguousarray(v, dtype=dtype) for k, v in params.items()}


def compare(mode: str, shape: tuple[int, int, int, int], dtype, mapper, seed: int = 0) -> None:
    T, B, I, H = shape
    module = torch_module(mode, I, H, seed)
    params = mapper(mode, module, dtype)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    state_names = ("h", "c") if mode == "lstm" else ("h",)
    states = {s: (0.5 * rng.standard_normal((B, H))).astype(dtype) for s in state_names}
    # The oracle runs in float64 on exactly the values rnnc sees.
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            p = getattr(module, name)
            p.copy_(torch.from_numpy(p.detach().numpy().astype(dtype).astype(np.float64)))
        tx = torch.from_numpy(x.astype(np.float64))
        th = {s: torch.from_numpy(v.astype(np.float64))[None] for s, v in states.items()}
        if mode == "lstm":
            ty, (thT, tcT) = module(tx, (th["h"], th["c"]))
            want_states = {"h": thT[0].numpy(), "c": tcT[0].numpy()}
        else:
            ty, thT = module(tx, th["h"])
            want_states = {"h": thT[0].numpy()}
    fn = rnnc.compile(rnnc_cell(mode, I, H), backend="numpy")
    ys, final = fn(x, params, states=states)
    assert ys["y"].dtype == dtype and ys["y"].shape == (T, B, H)
    assert rel_err(ys["y"], ty.numpy()) <= TOL[dtype], (mode, shape, dtype)
    assert set(final) == set(state_names)
    for s in state_names:
        assert final[s].dtype == dtype and final[s].shape == (B, H)
        assert rel_err(final[s], want_states[s]) <= TOL[dtype], (mode, shape, dtype, s)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}B{}I{}H{}".format(*s))
@pytest.mark.parametrize("mode", list(GATES))
def test_standard_cell_matches_torch(mode: str, shape, dtype) -> None:
    compare(mode, shape, dtype, map_with_weights_module, seed=sum(shape))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", list(GATES))
def test_standard_cell_matches_torch_mapped_by_hand(mode: str, dtype) -> None:
    compare(mode, (6, 2, 3, 4), dtype, map_by_hand, seed=7)


@pytest.mark.parametrize("mode", list(GATES))
def test_zero_initial_states_by_default(mode: str) -> None:
    T, B, I, H = 3, 2, 3, 4
    module = torch_module(mode, I, H, 1)
    params = map_by_hand(mode, module, np.float64)
    x = np.random.default_rng(1).standard_normal((T, B, I))
    with torch.no_grad():
        ty = module(torch.from_numpy(x))[0].numpy()
    ys, _ = rnnc.compile(rnnc_cell(mode, I, H), backend="numpy")(x, params)
    assert rel_err(ys["y"], ty) <= 1e-10


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", list(GATES))
def test_empty_sequence_returns_initial_states(mode: str, dtype) -> None:
    B, I, H = 3, 2, 4
    cell = rnnc_cell(mode, I, H)
    params = cell.init_params(seed=0, dtype=dtype)
    rng = np.random.default_rng(0)
    states = {s: rng.standard_normal((B, H)).astype(dtype) for s in cell.states}
    fn = rnnc.compile(cell, backend="numpy")
    ys, final = fn(np.zeros((0, B, I), dtype), params, states=states)
    assert ys["y"].shape == (0, B, H) and ys["y"].dtype == dtype
    for s, v in states.items():
        np.testing.assert_array_equal(final[s], v)
        assert final[s].dtype == dtype
    ys, final = fn(np.zeros((0, B, I), dtype), params)
    for s in states:
        np.testing.assert_array_equal(final[s], np.zeros((B, H), dtype))
