"""Tests of the per-call checks that a compiled function keeps per size: the memory check of
``Function`` and the LLVM runner's argument shapes."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc import validate

I, H = 5, 4


@pytest.fixture(scope="module")
def lstm():
    cell = rnnc.cells.lstm(I, H)
    return cell, rnnc.compile(cell, backend="llvm"), rnnc.compile(cell, optimize=False)


def _x(T: int, B: int) -> np.ndarray:
    return np.random.default_rng(T * 100 + B).standard_normal((T, B, I)).astype(np.float32)


def test_a_size_checked_once_does_not_let_a_larger_call_through(lstm, monkeypatch):
    cell, fn, _ = lstm
    params = cell.init_params(seed=0)
    fn(_x(6, 3), params)  # within memory: this size is not checked again
    fn(_x(6, 3), params)
    monkeypatch.setattr(validate, "physical_memory", lambda: 1024)
    with pytest.raises(rnnc.RnncError, match="bytes of new arrays"):
        fn(_x(60, 3), params)
    with pytest.raises(rnnc.RnncError, match="bytes of new arrays"):
        fn.forward(_x(6, 30), params)


def test_runner_checks_shapes_at_a_size_it_has_run(lstm):
    cell, fn, oracle = lstm
    params = cell.init_params(seed=1)
    for T, B in ((6, 3), (4, 2), (6, 3)):  # a size again after another one
        x = _x(T, B)
        got = fn(x, params)[0]["y"]
        assert got.shape == (T, B, H)
        np.testing.assert_allclose(got, oracle(x, params)[0]["y"], rtol=1e-5, atol=1e-6)
    env = fn._prepare(_x(6, 3), params, None, None)[0]
    run = fn.runner("inference", "f32", False)
    name = next(n for n, v in env.items() if v.ndim == 3)  # the input sequence
    env[name] = np.zeros((6, 4, I), np.float32)
    with pytest.raises(rnnc.RnncError, match="must have shape"):
        run(env, {"T": 6, "B": 3})
