"""The optimized programs of the standard cells: op counts, golden text, flat parameters,
gradients, and variable lengths against PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rnnc
from rnnc.backends.numpy.runtime import run_program
from rnnc.ir import retype
from rnnc.passes import PASSES
from tests.passes.common import environment, mgu, standard_cells

GOLDEN = Path(__file__).parent / "golden"
ONE_MATMUL = ("rnn", "rnn_relu", "lstm", "gru")
TWO_MATMULS = ("gru_v3", "mgu")


def _has_autodiff() -> bool:
    from rnnc.passes import _load

    _load()
    return "autodiff-backward" in PASSES


@pytest.mark.parametrize("name", ONE_MATMUL + TWO_MATMULS)
@pytest.mark.parametrize("mode", ["inference", "backward"])
def test_op_counts(name: str, mode: str) -> None:
    if mode == "backward" and not _has_autodiff():
        pytest.fail("autodiff-backward is not registered")
    counts = rnnc.compile(standard_cells()[name], backend="numpy").op_counts(mode)
    loop, outside = counts["loop"], counts["outside"]
    want = 1 if name in ONE_MATMUL else 2
    assert loop.get("matmul") == want, counts
    # Nothing but matmuls and fused regions in the loop: every elementwise op is fused.
    assert set(loop) <= {"matmul", "fused"}, counts
    assert outside.get("matmul", 0) >= 1, counts
    if mode == "inference":
        assert loop["fused"] == want, counts
    else:
        # The weight-gradient GEMMs run after the loop.
        assert outside["matmul"] >= 2, counts
        assert loop["fused"] <= want + 1, counts


def test_lstm_golden_inference(update_goldens: bool) -> None:
    text = rnnc.compile(rnnc.cells.lstm(3, 4), backend="numpy").ir("inference")
    path = GOLDEN / "lstm_inference.txt"
    if update_goldens:
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), "regenerate golden/lstm_inference.txt if intended"


@pytest.mark.parametrize("name", ["lstm", "gru", "mgu"])
def test_flat_parameters(name: str) -> None:
    cell = standard_cells()[name]
    fn = rnnc.compile(cell, backend="numpy")
    params = cell.init_params(seed=1, dtype=np.float64)
    flat = fn.pack(params)
    assert flat.size == sum(p.size for p in params.values())
    views = fn.unpack(flat)
    for k, v in params.items():
        np.testing.assert_array_equal(views[k], v)
        assert np.shares_memory(views[k], flat)
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    ys_flat, st_flat = fn(x, flat)
    ys, st = fn(x, params)
    np.testing.assert_array_equal(ys_flat["y"], ys["y"])
    layout = fn.program("inference").layout
    members = [m[0] for b in layout for m in b.members]
    assert sorted(members) == sorted(params)


def _loss(cell: rnnc.Cell, env: dict, d: dict, T: int, B: int) -> float:
    out = run_program(retype(cell.program(), "f64"), env, {"T": T, "B": B})
    return float(sum((out[k] * v).sum() for k, v in d.items()))


@pytest.mark.parametrize("name", ["rnn", "lstm", "gru", "gru_v3", "mgu"])
def test_gradients_against_finite_differences(name: str) -> None:
    if not _has_autodiff():
        pytest.fail("autodiff-backward is not registered")
    cell = standard_cells()[name]
    T, B = 3, 2
    env = environment(cell, T, B, seed=2)
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((T, B, 4))
    dh = {s: rng.standard_normal((B, 4)) for s in cell.states}
    fn = rnnc.compile(cell, backend="numpy")
    params = {k: env[k] for k in cell.params}
    _, _, tape = fn.forward(env["x"], params, states={s: env[s] for s in cell.states})
    g = fn.backward(tape, d_outputs={"y": dy}, d_states=dh)
    d = {"y": dy, **{s + ".final": v for s, v in dh.items()}}
    eps = 1e-6
    for key in list(cell.params) + ["x"] + list(cell.states):
        got = g.params[key] if key in cell.params else g.x if key == "x" else g.states[key]
        want = np.zeros_like(env[key])
        for idx in np.ndindex(env[key].shape):
            plus, minus = dict(env), dict(env)
            plus[key] = env[key].copy()
            minus[key] = env[key].copy()
            plus[key][idx] += eps
            minus[key][idx] -= eps
            want[idx] = (_loss(cell, plus, d, T, B) - _loss(cell, minus, d, T, B)) / (2 * eps)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=key)


# ---------------------------------------------------------------- variable lengths


def _torch_module(name: str, I: int, H: int, params: dict):
    torch = pytest.importorskip("torch")
    gates = {"rnn": "", "lstm": "ifgo", "gru": "rzn"}[name]
    cls = {"rnn": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[name]
    mod = cls(I, H).double()

    def block(kind: str) -> np.ndarray:
        if name == "rnn":
            return params[{"Wi": "W_ih", "Wh": "W_hh", "bi": "b_ih", "bh": "b_hh"}[kind]]
        pre = {"Wi": "W_i", "Wh": "W_h", "bi": "b_i", "bh": "b_h"}[kind]
        return np.concatenate([params[pre + g] for g in gates], axis=-1)

    with torch.no_grad():
        mod.weight_ih_l0.copy_(torch.from_numpy(block("Wi").T.copy()))
        mod.weight_hh_l0.copy_(torch.from_numpy(block("Wh").T.copy()))
        mod.bias_ih_l0.copy_(torch.from_numpy(block("bi")))
        mod.bias_hh_l0.copy_(torch.from_numpy(block("bh")))
    return torch, mod


@pytest.mark.parametrize("name", ["rnn", "lstm", "gru"])
def test_lengths_match_pytorch_packed_sequences(name: str) -> None:
    I, H, T, B = 3, 4, 5, 4
    cell = standard_cells()[name]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, B, I))
    params = cell.init_params(seed=5, dtype=np.float64)
    h0 = {s: rng.uniform(-0.5, 0.5, (B, H)) for s in cell.states}
    lengths = np.array([5, 2, 3, 1])
    ys, states = rnnc.compile(cell, backend="numpy")(x, params, states=h0, lengths=lengths)
    torch, mod = _torch_module(name, I, H, params)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.from_numpy(x), torch.from_numpy(lengths), enforce_sorted=False)
    init = torch.from_numpy(h0["h"])[None]
    if name == "lstm":
        init = (init, torch.from_numpy(h0["c"])[None])
    out, final = mod(packed, init)
    y_ref, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    np.testing.assert_allclose(ys["y"], y_ref.detach().numpy(), rtol=0, atol=1e-10)
    finals = {"h": final[0], "c": final[1]} if name == "lstm" else {"h": final}
    for s, v in finals.items():
        np.testing.assert_allclose(states[s], v.detach().numpy()[0], rtol=0, atol=1e-10)


def test_custom_cell_lengths_equal_separate_runs() -> None:
    cell = mgu(3, 4)
    fn = rnnc.compile(cell, backend="numpy")
    T, B = 6, 3
    rng = np.random.default_rng(6)
    x = rng.standard_normal((T, B, 3))
    params = cell.init_params(seed=7, dtype=np.float64)
    h0 = rng.uniform(-0.5, 0.5, (B, 4))
    lengths = np.array([6, 1, 4])
    ys, states = fn(x, params, states={"h": h0}, lengths=lengths)
    for b, n in enumerate(lengths):
        y1, s1 = fn(x[:n, b:b + 1], params, states={"h": h0[b:b + 1]})
        np.testing.assert_allclose(ys["y"][:n, b], y1["y"][:, 0], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(ys["y"][n:, b], 0.0)
        np.testing.assert_allclose(states["h"][b], s1["h"][0], rtol=0, atol=1e-12)
