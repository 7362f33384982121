"""What a process keeps of the functions it compiled is bounded: the layers' shared functions
(least recently used first out), the optimized programs, and nothing of a function once it
and its layers are gone."""

from __future__ import annotations

import gc
import weakref
from collections import OrderedDict

import numpy as np
import pytest

import rnnc
from rnnc import passes, process
from rnnc.layers import rnn as layer_module


def _layer(in_size: int) -> rnnc.RNN:
    layer = rnnc.RNN("gru", in_size, 3, backend="numpy")
    layer(np.ones((2, 1, in_size), np.float32))
    return layer


def test_the_layers_shared_functions_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(process, "LAYER_CACHE_FUNCTIONS", 3)
    monkeypatch.setattr(layer_module, "_CACHE", OrderedDict())
    first = weakref.ref(_layer(101).function(0))
    for in_size in range(102, 108):  # six more distinct layers, each dropped at once
        _layer(in_size)
        assert len(layer_module._CACHE) <= 3
    gc.collect()
    assert first() is None  # evicted, and nothing else kept it


def test_a_layer_keeps_an_evicted_function_and_gives_the_same_results(monkeypatch) -> None:
    monkeypatch.setattr(process, "LAYER_CACHE_FUNCTIONS", 1)
    monkeypatch.setattr(layer_module, "_CACHE", OrderedDict())
    kept = _layer(201)
    x = np.sin(np.arange(4 * 2 * 201, dtype=np.float32)).reshape(4, 2, 201)
    before, _ = kept(x)
    _layer(202)  # evicts layer 201's function from the shared cache
    after, _ = kept(x)
    np.testing.assert_array_equal(before, after)
    assert _layer(201).function(0) is not kept.function(0)  # compiled again, not shared


def test_the_optimized_programs_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(passes, "CACHE_SIZE", 4)
    monkeypatch.setattr(passes, "_CACHE", OrderedDict())
    for k in range(6):
        cell = rnnc.cells.rnn(2 + k, 2)
        rnnc.compile(cell)(np.ones((1, 1, 2 + k), np.float32), cell.init_params(seed=0))
        assert len(passes._CACHE) <= 4


@pytest.mark.parametrize("backend", ["numpy", "llvm", "cuda"])
def test_a_dropped_function_is_freed(backend: str) -> None:
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    options = {"emulate": True} if backend == "cuda" else {}
    cell = rnnc.cells.rnn(2, 3)
    fn = rnnc.compile(cell, backend=backend, **options)
    ys, _, tape = fn.forward(np.ones((2, 1, 2), np.float32), cell.init_params(seed=0))
    fn.backward(tape, {"y": np.ones_like(ys["y"])})
    dropped = weakref.ref(fn)
    del fn, tape
    gc.collect()
    assert dropped() is None


def test_a_zero_bound_shares_nothing_and_layers_still_run(monkeypatch) -> None:
    monkeypatch.setattr(process, "LAYER_CACHE_FUNCTIONS", 0)
    monkeypatch.setattr(layer_module, "_CACHE", OrderedDict())
    y, _ = _layer(5)(np.ones((2, 1, 5), np.float32))
    assert y.shape == (2, 1, 3) and np.isfinite(y).all() and not layer_module._CACHE
