"""benchmarks/flashrnn_peer.py: FlashRNN (an optional GPU peer) given rnnc's parameters computes
rnnc's LSTM and sLSTM, checked on the CPU through FlashRNN's ``vanilla`` PyTorch backend
against rnnc's unoptimized NumPy program; and the script runs end to end in its ``--dry`` mode.

The sLSTMs differ in how they start: FlashRNN sets ``m' = i~`` while every ``n`` is 0 and
clamps ``n' >= 1``. After stabilization one of ``i = exp(i~ - m')`` and ``f = exp(log f + m -
m')`` is exactly 1, so ``n' = f n + i >= min(n, 1)``: from states with ``n >= 1`` the clamp
never acts and every state agrees; from zero states FlashRNN's first step leaves ``n = 1`` and
both track the same unstabilized states ``c e^m``, ``n e^m``, so ``y`` agrees. From ``n < 1``
with a large ``m`` the clamp acts and they part (checked too, so the condition is needed).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashrnn", reason="flashrnn, an optional GPU peer, is not installed "
                                       "(docs/benchmarks.md)")

import rnnc  # noqa: E402

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
T, B, I, H, HEADS = 6, 3, 5, 8, 2


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("flashrnn_peer",
                                                  BENCHMARKS / "flashrnn_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCHMARKS))  # the script puts its own folder first


def _case(cell: rnnc.Cell, dtype: type) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    x = np.random.default_rng(1).standard_normal((T, B, I)).astype(dtype)
    params = {k: v.astype(dtype) for k, v in cell.init_params(seed=2).items()}
    if "R" in params:  # the sLSTM's recurrence starts small: make it matter
        params["R"] = params["R"] * 4
    return x, params


def _flashrnn(peer, name: str, x: np.ndarray, params: dict, heads: int,
              states: dict[str, np.ndarray] | None = None
              ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """FlashRNN's vanilla backend on rnnc's parameters and states: y and the last states."""
    mapped = {k: torch.from_numpy(np.ascontiguousarray(v))
              for k, v in peer.to_flashrnn(name, params, heads).items()}
    N, D = mapped["b"].shape[1:]
    start = None if states is None else torch.from_numpy(np.stack(
        [states[s].reshape(B, 1, N, D) for s in peer.STATES[name]]))
    dtype = {np.float32: "float32", np.float64: "float64"}[x.dtype.type]
    y, last = peer.flashrnn_forward(name, torch.from_numpy(x), mapped, "vanilla", dtype, start)
    return y.numpy(), {s: last[k, :, 0].reshape(B, -1).numpy()
                       for k, s in enumerate(peer.STATES[name])}


def _oracle(cell: rnnc.Cell, x: np.ndarray, params: dict, states: dict | None = None
            ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    ys, last = rnnc.compile(cell, backend="numpy", optimize=False)(x, params, states)
    return ys["y"], {k: np.asarray(v).reshape(B, -1) for k, v in last.items()}


TOLERANCE = {np.float32: 2e-5, np.float64: 1e-12}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flashrnn_lstm_with_mapped_parameters_is_rnnc_lstm(peer, dtype) -> None:
    cell = rnnc.cells.lstm(I, H)
    x, params = _case(cell, dtype)
    rng = np.random.default_rng(3)
    states = {s: rng.standard_normal((B, H)).astype(dtype) for s in ("h", "c")}
    y, last = _flashrnn(peer, "lstm", x, params, 1, states)
    y_ref, last_ref = _oracle(cell, x, params, states)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=TOLERANCE[dtype])
    for s in ("h", "c"):
        np.testing.assert_allclose(last[s], last_ref[s], rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flashrnn_slstm_from_zero_states_gives_rnnc_slstm_outputs(peer, dtype) -> None:
    cell = rnnc.cells.slstm(I, H, heads=HEADS)
    x, params = _case(cell, dtype)
    y, last = _flashrnn(peer, "slstm", x, params, HEADS)
    y_ref, last_ref = _oracle(cell, x, params)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=tol)
    np.testing.assert_allclose(last["h"], last_ref["h"], rtol=0, atol=tol)
    # c and n differ by the stabilizer alone: c e^m and n e^m are the same states.
    for s in ("c", "n"):
        np.testing.assert_allclose(last[s] * np.exp(last["m"] - last_ref["m"]), last_ref[s],
                                   rtol=100 * tol, atol=tol)
    assert not np.allclose(last["m"], last_ref["m"])  # the first step's m differs indeed


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flashrnn_slstm_from_n_at_least_one_is_rnnc_slstm(peer, dtype) -> None:
    cell = rnnc.cells.slstm(I, H, heads=HEADS)
    x, params = _case(cell, dtype)
    rng = np.random.default_rng(4)
    states = {"h": rng.uniform(-1, 1, (B, HEADS, H // HEADS)),
              "c": rng.standard_normal((B, HEADS, H // HEADS)),
              "n": rng.uniform(1.0, 3.0, (B, HEADS, H // HEADS)),
              "m": rng.standard_normal((B, HEADS, H // HEADS))}
    states = {k: v.astype(dtype) for k, v in states.items()}
    y, last = _flashrnn(peer, "slstm", x, params, HEADS, states)
    y_ref, last_ref = _oracle(cell, x, params, states)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=TOLERANCE[dtype])
    for s in ("h", "c", "n", "m"):
        np.testing.assert_allclose(last[s], last_ref[s], rtol=0, atol=TOLERANCE[dtype])


def test_flashrnn_slstm_parts_from_rnnc_where_its_clamp_acts(peer) -> None:
    # n < 1 under a large m: the forget gate wins the stabilizer, n' = n + i stays below 1,
    # and FlashRNN lifts it to 1. This is why the two tests above need their start states.
    cell = rnnc.cells.slstm(I, H, heads=HEADS)
    x, params = _case(cell, np.float64)
    shape = (B, HEADS, H // HEADS)
    states = {"h": np.zeros(shape), "c": np.full(shape, 0.05), "n": np.full(shape, 0.1),
              "m": np.full(shape, 8.0)}
    y, _ = _flashrnn(peer, "slstm", x, params, HEADS, states)
    y_ref, _ = _oracle(cell, x, params, states)
    assert np.max(np.abs(y - y_ref)) > 0.1


def test_to_flashrnn_names_the_cells_it_maps(peer) -> None:
    with pytest.raises(ValueError, match="cell must be one of .*'gru'"):
        peer.to_flashrnn("gru", {}, 1)


def test_the_script_runs_dry_on_the_cpu(peer, capsys) -> None:
    assert peer.main(["--dry", "--reps", "5", "--warmup", "1"]) == 0
    table = capsys.readouterr().out
    for cell in ("slstm", "lstm"):
        for mode in ("inference", "training"):
            rows = [line.split() for line in table.splitlines()
                    if line.startswith(f"C1-tiny  {cell}") and f" {mode} " in line]
            assert [row[3:5] for row in rows] == [["rnnc", "device"], ["flashrnn", "vanilla"]]
            ratio, difference = float(rows[1][7]), float(rows[1][8])
            assert ratio > 0 and difference < 1e-5  # the mapping holds in the dry run too
    assert "error:" not in table


def test_the_script_says_what_is_missing(peer, monkeypatch, capsys) -> None:
    monkeypatch.setattr(peer, "flashrnn_missing", lambda: "flashrnn does not import (x)")
    assert peer.main(["--dry"]) == 2
    assert "flashrnn does not import (x)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peer.main(["--cells", "gru"])
    assert "FlashRNN runs slstm, lstm, not gru" in capsys.readouterr().err
