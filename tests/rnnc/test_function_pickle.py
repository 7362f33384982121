"""A compiled Function pickles as a layer does: its cell and options, not its native code,
which the loaded function builds on first use; a cell that cannot pickle is a clear
RnncPicklingError."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import rnnc
from rnnc.errors import RnncPicklingError


def ones_init(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A module-level initializer: a cell that uses it pickles."""
    return np.ones(shape)


def leaky_cell(in_size: int, hidden: int) -> rnnc.Cell:
    """A custom cell from a module-level factory, with a parameter of its own initializer."""
    c = rnnc.Cell("leaky")
    x, h = c.input("x", in_size), c.state("h", hidden)
    W, U = c.param("W", (in_size, hidden)), c.param("U", (hidden, hidden))
    gain = c.param("gain", (hidden,), init=ones_init)
    c.update(h=0.5 * h + 0.5 * rnnc.tanh(x @ W + h @ U) * gain)
    c.output("y", h)
    return c


def _run(fn: rnnc.api.Function, x: np.ndarray, params: dict):
    ys, st, tape = fn.forward(x, params)
    grads = fn.backward(tape, {"y": np.cos(ys["y"])})
    return (ys["y"], st["h"], grads.x, *(grads.params[n] for n in sorted(grads.params)))


def _oracle(cell: rnnc.Cell, x: np.ndarray, params: dict, reverse: bool):
    fn = rnnc.compile(cell, optimize=False, reverse=reverse)
    return _run(fn, x.astype(np.float64), {k: v.astype(np.float64) for k, v in params.items()})


CASES = [("numpy", {}, rnnc.cells.lstm), ("numpy", {}, leaky_cell),
         ("llvm", {"threads": 1}, leaky_cell), ("cuda", {"emulate": True}, leaky_cell)]


@pytest.mark.parametrize("backend,options,make", CASES,
                         ids=[f"{b}-{m.__name__}" for b, _, m in CASES])
def test_a_pickled_function_loads_and_gives_the_same_results(backend, options, make) -> None:
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    cell = make(3, 4)
    params = cell.init_params(seed=1)
    x = np.sin(np.arange(5 * 2 * 3, dtype=np.float32)).reshape(5, 2, 3)
    fn = rnnc.compile(cell, backend=backend, reverse=True, **options)
    before = _run(fn, x, params)
    loaded = pickle.loads(pickle.dumps(fn))
    assert not loaded._runners  # nothing native came with it: built on first use
    assert (loaded.backend.name, loaded.reverse, loaded._spec) == (backend, True,
                                                                   (backend, options))
    after = _run(loaded, x, params)
    for got, same, want in zip(after, before, _oracle(cell, x, params, True), strict=True):
        np.testing.assert_array_equal(got, same)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_cell_keeps_its_initializers_through_pickle() -> None:
    fn = pickle.loads(pickle.dumps(rnnc.compile(leaky_cell(2, 3))))
    np.testing.assert_array_equal(fn.cell.init_params(seed=0)["gain"], np.ones(3))


def test_a_function_whose_cell_holds_a_lambda_raises_a_clear_error() -> None:
    c = rnnc.Cell("lam")
    x, h = c.input("x", 2), c.state("h", 2)
    W = c.param("W", (2, 2), init=lambda rng, shape: rng.normal(size=shape))
    c.update(h=rnnc.tanh(x @ W + h))
    c.output("y", h)
    with pytest.raises(RnncPicklingError, match="c.param\\(init=...\\) a module-level function"):
        pickle.dumps(rnnc.compile(c))
    assert issubclass(RnncPicklingError, pickle.PicklingError)


def test_ops_pickle_as_the_same_objects() -> None:
    from rnnc import ir, ops

    for op in (*ops.REGISTRY.values(), ir.ARG, ir.GET, ir.FUSED):
        assert pickle.loads(pickle.dumps(op)) is op
