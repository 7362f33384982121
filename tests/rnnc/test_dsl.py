"""The tracing DSL: operators, slicing, functions and composites against float64 NumPy formulas."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import rnnc

T, B, N = 3, 2, 4


def one_state_cell(build: Callable, x_size: int = N, h_size: int = N) -> rnnc.Cell:
    """A cell whose next ``h`` (also output ``y``) is ``build(x, h, W)``; W is (x_size, h_size)."""
    c = rnnc.Cell("expr")
    x = c.input("x", x_size)
    h = c.state("h", h_size)
    W = c.param("W", (x_size, h_size))
    h_new = build(x, h, W)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def check(build: Callable, oracle: Callable, x_size: int = N, h_size: int = N,
          positive_x: bool = False) -> None:
    """Run ``build`` over T steps in float64 and compare with the NumPy loop of ``oracle``."""
    cell = one_state_cell(build, x_size, h_size)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, x_size))
    if positive_x:
        x = np.abs(x) + 0.5
    h0 = 0.5 * rng.standard_normal((B, h_size))
    params = cell.init_params(seed=0, dtype=np.float64)
    ys, final = rnnc.compile(cell, backend="numpy")(x, params, states={"h": h0})
    h, out = h0, []
    for t in range(T):
        h = oracle(x[t], h, params["W"])
        out.append(h)
    np.testing.assert_allclose(ys["y"], np.stack(out), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(final["h"], h, rtol=1e-12, atol=1e-12)


OPERATORS = {
    "add": (lambda x, h, W: x + h, lambda x, h, W: x + h),
    "add_scalar_right": (lambda x, h, W: h + 2, lambda x, h, W: h + 2),
    "add_scalar_left": (lambda x, h, W: 2.5 + h, lambda x, h, W: 2.5 + h),
    "sub": (lambda x, h, W: x - h, lambda x, h, W: x - h),
    "sub_scalar_right": (lambda x, h, W: h - 1, lambda x, h, W: h - 1),
    "sub_scalar_left": (lambda x, h, W: 1 - h, lambda x, h, W: 1 - h),
    "mul": (lambda x, h, W: x * h, lambda x, h, W: x * h),
    "mul_scalar_right": (lambda x, h, W: h * 0.5, lambda x, h, W: h * 0.5),
    "mul_scalar_left": (lambda x, h, W: 3 * h, lambda x, h, W: 3 * h),
    "mul_numpy_scalar_left": (lambda x, h, W: np.float64(0.25) * h, lambda x, h, W: 0.25 * h),
    "div": (lambda x, h, W: h / (1 + x * x), lambda x, h, W: h / (1 + x * x)),
    "div_scalar_right": (lambda x, h, W: h / 4, lambda x, h, W: h / 4),
    "div_scalar_left": (lambda x, h, W: 1 / (2 + h * h), lambda x, h, W: 1 / (2 + h * h)),
    "neg": (lambda x, h, W: -h + x, lambda x, h, W: x - h),
    "pos": (lambda x, h, W: +h, lambda x, h, W: h),
    "matmul": (lambda x, h, W: rnnc.tanh(x @ W), lambda x, h, W: np.tanh(x @ W)),
    "chain": (
        lambda x, h, W: rnnc.tanh(0.5 * (x @ W) - h / 3 + 1),
        lambda x, h, W: np.tanh(0.5 * (x @ W) - h / 3 + 1),
    ),
}


@pytest.mark.parametrize("name", list(OPERATORS))
def test_operator(name: str) -> None:
    build, oracle = OPERATORS[name]
    check(build, oracle)


FUNCTIONS = {
    "sigmoid": (rnnc.sigmoid, lambda a: 1 / (1 + np.exp(-a))),
    "tanh": (rnnc.tanh, np.tanh),
    "relu": (rnnc.relu, lambda a: np.maximum(a, 0)),
    "exp": (lambda v: rnnc.exp(-v * v), lambda a: np.exp(-a * a)),
    "log": (lambda v: rnnc.log(1 + v * v), lambda a: np.log(1 + a * a)),
    "sqrt": (lambda v: rnnc.sqrt(1 + v * v), lambda a: np.sqrt(1 + a * a)),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_function(name: str) -> None:
    f, g = FUNCTIONS[name]
    check(lambda x, h, W: f(x + h), lambda x, h, W: g(x + h))


def test_feature_slicing() -> None:
    check(lambda x, h, W: rnnc.tanh(x[:, 0:3] + x[:, 3:6] * h),
          lambda x, h, W: np.tanh(x[:, 0:3] + x[:, 3:6] * h), x_size=6, h_size=3)
    check(lambda x, h, W: h * x[..., 1:4] + x[:, :1] - x[:, -1:],
          lambda x, h, W: h * x[:, 1:4] + x[:, :1] - x[:, -1:], x_size=6, h_size=3)
    # An integer index keeps the axis: (B, 1), which broadcasts over features.
    check(lambda x, h, W: h * x[:, 2], lambda x, h, W: h * x[:, 2:3], x_size=6, h_size=3)
    check(lambda x, h, W: h + x[:, -1], lambda x, h, W: h + x[:, 5:6], x_size=6, h_size=3)


def test_slicing_outside_the_feature_axis_is_an_error() -> None:
    c = rnnc.Cell()
    x = c.input("x", 4)
    with pytest.raises(rnnc.ShapeError, match="feature axis"):
        x[0]
    with pytest.raises(rnnc.ShapeError, match="positive integer step"):
        x[:, ::-1]  # strided slices x[:, ::2] are fine: tests/rnnc/test_strided_slices.py


def test_concat() -> None:
    # Equal feature sizes.
    check(lambda x, h, W: rnnc.concat([h[:, 2:], x[:, :2]]),
          lambda x, h, W: np.concatenate([h[:, 2:], x[:, :2]], axis=1))
    check(lambda x, h, W: rnnc.concat((x[:, :1], h[:, :3])) * 2,
          lambda x, h, W: np.concatenate([x[:, :1], h[:, :3]], axis=1) * 2)


def test_concat_with_differing_feature_sizes() -> None:
    check(lambda x, h, W: rnnc.concat([x[:, :1], h[:, 1:]]),
          lambda x, h, W: np.concatenate([x[:, :1], h[:, 1:]], axis=1))
    check(lambda x, h, W: rnnc.concat([x[:, :1], h[:, 1:3], x[:, 3:]]),
          lambda x, h, W: np.concatenate([x[:, :1], h[:, 1:3], x[:, 3:]], axis=1))


def test_concat_of_one_state_with_matmul() -> None:
    # [x | h] @ W with x of 2 features and h of 4: the usual fused-input formulation.
    c = rnnc.Cell("concat_rnn")
    x = c.input("x", 2)
    h = c.state("h", N)
    W = c.param("W", (2 + N, N))
    h_new = rnnc.tanh(rnnc.concat([x, h]) @ W)
    c.update(h=h_new)
    c.output("y", h_new)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((T, B, 2))
    params = c.init_params(dtype=np.float64)
    ys, _ = rnnc.compile(c, backend="numpy")(xs, params)
    hh, out = np.zeros((B, N)), []
    for t in range(T):
        hh = np.tanh(np.concatenate([xs[t], hh], axis=1) @ params["W"])
        out.append(hh)
    np.testing.assert_allclose(ys["y"], np.stack(out), rtol=1e-12, atol=1e-12)


def test_where() -> None:
    check(lambda x, h, W: rnnc.where(x, h, -h), lambda x, h, W: np.where(x > 0, h, -h))
    check(lambda x, h, W: rnnc.where(x - 0.5, 1.0, h), lambda x, h, W: np.where(x > 0.5, 1.0, h))
    check(lambda x, h, W: rnnc.where(x, 0.0, 2.0) + h,
          lambda x, h, W: np.where(x > 0, 0.0, 2.0) + h)


def test_mean_and_sum_keep_the_feature_axis() -> None:
    check(lambda x, h, W: h - rnnc.mean(h) + rnnc.sum(x),
          lambda x, h, W: h - h.sum(axis=1, keepdims=True) / N + x.sum(axis=1, keepdims=True))
    c = rnnc.Cell()
    assert rnnc.mean(c.input("x", 5)).shape == ("B", 1)


def test_vector_param_broadcasts_over_batch() -> None:
    c = rnnc.Cell("bias")
    x = c.input("x", N)
    h = c.state("h", N)
    b = c.param("b", (N,))
    h_new = h + x * b
    assert h_new.shape == ("B", N)
    c.update(h=h_new)
    c.output("y", h_new)
    xs = np.random.default_rng(2).standard_normal((T, B, N))
    params = c.init_params(dtype=np.float64)
    ys, final = rnnc.compile(c, backend="numpy")(xs, params)
    np.testing.assert_allclose(final["h"], (xs * params["b"]).sum(axis=0), rtol=1e-12)


# ---------------------------------------------------------------- composites


def test_softsign() -> None:
    check(lambda x, h, W: rnnc.softsign(x + h), lambda x, h, W: (x + h) / (1 + np.abs(x + h)))


def test_hard_sigmoid() -> None:
    # 3x spreads the inputs over both clipped regions and the linear one.
    check(lambda x, h, W: rnnc.hard_sigmoid(3 * x + h),
          lambda x, h, W: np.clip(0.2 * (3 * x + h) + 0.5, 0, 1))


def test_layer_norm() -> None:
    def oracle(x, h, W, gamma=None, beta=None):
        a = x + h
        mu = a.sum(axis=1, keepdims=True) / a.shape[1]
        var = ((a - mu) ** 2).sum(axis=1, keepdims=True) / a.shape[1]
        y = (a - mu) / np.sqrt(var + 1e-5)
        if gamma is not None:
            y = y * gamma + beta
        return y

    check(lambda x, h, W: rnnc.layer_norm(x + h), oracle)

    c = rnnc.Cell("ln")
    x = c.input("x", N)
    h = c.state("h", N)
    g = c.param("g", (N,))
    b = c.param("b", (N,))
    h_new = rnnc.layer_norm(x + h, g, b, eps=1e-3)
    c.update(h=h_new)
    c.output("y", h_new)
    xs = np.random.default_rng(3).standard_normal((T, B, N))
    params = c.init_params(seed=3, dtype=np.float64)
    ys, _ = rnnc.compile(c, backend="numpy")(xs, params)
    hh, out = np.zeros((B, N)), []
    for t in range(T):
        a = xs[t] + hh
        mu = a.mean(axis=1, keepdims=True)
        hh = (a - mu) / np.sqrt(((a - mu) ** 2).mean(axis=1, keepdims=True) + 1e-3)
        hh = hh * params["g"] + params["b"]
        out.append(hh)
    np.testing.assert_allclose(ys["y"], np.stack(out), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- parameters and dtypes


def test_init_params_reproducible_and_uniform() -> None:
    H = 16
    cell = rnnc.cells.lstm(5, H)
    a, b = cell.init_params(seed=3), cell.init_params(seed=3)
    other = cell.init_params(seed=4)
    assert list(a) == list(cell.params)
    bound = 1 / np.sqrt(H)
    for name, shape in cell.sizes("param").items():
        assert a[name].shape == shape and a[name].dtype == np.float32
        assert a[name].flags.c_contiguous
        np.testing.assert_array_equal(a[name], b[name])
        assert not np.array_equal(a[name], other[name]), name
        assert np.all(np.abs(a[name]) <= bound), name
    # Spread over the whole interval, not a narrower one.
    w = np.concatenate([v.ravel() for v in a.values()])
    assert w.min() < -0.9 * bound and w.max() > 0.9 * bound
    assert abs(w.mean()) < 0.1 * bound
    f64 = cell.init_params(seed=3, dtype=np.float64)
    assert all(v.dtype == np.float64 for v in f64.values())


def test_init_params_custom_init() -> None:
    c = rnnc.Cell()
    x = c.input("x", 2)
    h = c.state("h", 3)
    W = c.param("W", (2, 3), init=lambda rng, shape: np.eye(*shape))
    b = c.param("b", 3, init=0.25)
    c.update(h=h + x @ W + b)
    p = c.init_params()
    np.testing.assert_array_equal(p["W"], np.eye(2, 3, dtype=np.float32))
    np.testing.assert_array_equal(p["b"], np.full(3, 0.25, np.float32))


def test_float64_runs_and_follows_x() -> None:
    cell = rnnc.cells.gru(3, 4)
    fn = rnnc.compile(cell, backend="numpy")
    x = np.random.default_rng(5).standard_normal((4, 2, 3))
    p64 = cell.init_params(seed=1, dtype=np.float64)
    ys64, st64 = fn(x, p64)
    assert ys64["y"].dtype == np.float64 and st64["h"].dtype == np.float64
    p32 = {k: v.astype(np.float32) for k, v in p64.items()}
    ys32, st32 = fn(x.astype(np.float32), p32)
    assert ys32["y"].dtype == np.float32 and st32["h"].dtype == np.float32
    np.testing.assert_allclose(ys32["y"], ys64["y"], rtol=0, atol=1e-5)
    # float64 keeps more digits than float32 could: the runs differ in their low bits.
    assert not np.array_equal(ys64["y"], ys64["y"].astype(np.float32).astype(np.float64))
