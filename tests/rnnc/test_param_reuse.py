"""Tests of a compiled call's reuse of its packed parameters while they are unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc.layout import unchanged

I, H, T, B = 5, 4, 6, 3


@pytest.fixture(scope="module")
def lstm():
    cell = rnnc.cells.lstm(I, H)
    return cell, rnnc.compile(cell), rnnc.compile(cell, optimize=False)


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((T, B, I)).astype(np.float32)


def test_weights_updated_in_place_are_packed_again(lstm):
    cell, fn, oracle = lstm
    params = cell.init_params(seed=1)
    x = _x()
    first = fn(x, params)[0]["y"]
    np.testing.assert_allclose(first, oracle(x, params)[0]["y"], rtol=1e-5, atol=1e-6)
    for name in params:  # an optimizer's step: the same arrays, new values
        params[name] *= np.float32(1.5)
    again = fn(x, params)[0]["y"]
    np.testing.assert_allclose(again, oracle(x, params)[0]["y"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(again, first)


def test_a_tape_keeps_its_weights_when_the_next_call_has_new_ones(lstm):
    cell, fn, oracle = lstm
    params = cell.init_params(seed=2)
    x = _x(1)
    _, _, tape = fn.forward(x, params)
    want = oracle.backward(oracle.forward(x, params)[2], {"y": np.ones((T, B, H), np.float32)})
    old = {n: v.copy() for n, v in params.items()}
    for name in params:
        params[name] += np.float32(0.25)
    fn(x, params)  # packs the new values; the tape's buffer must stay as it was
    got = fn.backward(tape, {"y": np.ones((T, B, H), np.float32)})
    for name in old:
        np.testing.assert_allclose(got.params[name], want.params[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bad", ["shape", "dtype", "missing", "unknown", "list"])
def test_bad_parameters_after_a_reused_call_still_raise(lstm, bad):
    cell, fn, _ = lstm
    params = cell.init_params(seed=3)
    x = _x()
    fn(x, params)
    fn(x, params)  # the second call reuses the packed buffer
    broken = dict(params)
    name = next(iter(params))
    if bad == "shape":
        broken[name] = np.zeros((7, 7), np.float32)
    elif bad == "dtype":
        broken[name] = params[name].astype(np.float64)
    elif bad == "missing":
        del broken[name]
    elif bad == "unknown":
        broken["W_extra"] = params[name]
    else:
        broken[name] = params[name].tolist()
    with pytest.raises(rnnc.RnncError):
        fn(x, broken)


def test_reuse_compares_bits_not_values():
    flat = np.zeros(4, np.float32)
    views = {"a": flat[:2], "b": flat[2:]}
    same = {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}
    assert unchanged((flat, views), same) is flat
    negative_zero = {"a": np.array([0.0, -0.0], np.float32), "b": same["b"]}
    assert unchanged((flat, views), negative_zero) is None
    flat[0] = np.nan
    assert unchanged((flat, views), {"a": np.array([np.nan, 0], np.float32),
                                     "b": same["b"]}) is flat
    assert unchanged((flat, views), {"a": np.array([-np.nan, 0], np.float32),
                                     "b": same["b"]}) is None
    assert unchanged((flat, views), {"a": same["a"].astype(np.float64), "b": same["b"]}) is None
    assert unchanged((flat, views), {"a": same["a"]}) is None
    assert unchanged(None, same) is None
