"""A layer whose cell declares an extra input ``grad=False``: backward and double backward run,
the input's gradient is zero, and every other gradient is what the same cell gives when the
input is differentiable."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc


def _factory(grad: bool):
    def cell(input_size: int, hidden_size: int) -> rnnc.Cell:
        c = rnnc.Cell("zoned")
        x = c.input("x", input_size)
        m = c.input("m", 1, grad=grad)  # a per-step keep mask, broadcast over the units
        h = c.state("h", hidden_size)
        W = c.param("W", (input_size, hidden_size))
        U = c.param("U", (hidden_size, hidden_size))
        new = rnnc.tanh(x @ W + h @ U)
        h_new = m * new + (1.0 - m) * h
        c.update(h=h_new)
        c.output("y", h_new)
        return c
    return cell


@pytest.mark.parametrize("backend", ["numpy", "llvm"])
def test_grad_false_extra_input_in_a_layer(backend):
    rng = np.random.default_rng(0)
    T, B, I, H = 5, 3, 4, 6
    x = rng.standard_normal((T, B, I))
    m = (rng.random((T, B, 1)) > 0.3).astype(np.float64)
    lengths = np.array([5, 2, 4])
    layers = [rnnc.RNN(_factory(g), I, H, num_layers=2, bidirectional=True, backend=backend,
                       dtype=np.float64, seed=1) for g in (True, False)]
    layers[1].params = layers[0].params
    d_y = rng.standard_normal((T, B, 2 * H))
    outs = []
    for layer in layers:
        y, states, tape = layer.forward(x, lengths, extra={"m": m})
        outs.append((y, layer.backward(tape, d_y)))
    (y0, g0), (y1, g1) = outs
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_allclose(g1.x, g0.x, rtol=1e-12, atol=1e-12)
    for k in range(2):
        for d in range(2):
            for n, a in g0.params[k][d].items():
                np.testing.assert_allclose(g1.params[k][d][n], a, rtol=1e-12, atol=1e-12)
    assert np.abs(g0.extra["m"]).max() > 0
    np.testing.assert_array_equal(g1.extra["m"], np.zeros_like(m))


def test_double_backward_skips_a_grad_false_extra_input():
    rng = np.random.default_rng(1)
    T, B, I, H = 4, 2, 3, 5
    x = rng.standard_normal((T, B, I))
    m = (rng.random((T, B, 1)) > 0.3).astype(np.float64)
    layers = [rnnc.RNN(_factory(g), I, H, backend="numpy", dtype=np.float64, seed=2)
              for g in (True, False)]
    layers[1].params = layers[0].params
    d_y = rng.standard_normal((T, B, H))
    u_x = rng.standard_normal((T, B, I))
    results = []
    for layer in layers:
        _, _, tape = layer.forward(x, extra={"m": m})
        d_states = {"h": np.zeros((1, B, H))}
        g_params = [[{n: np.zeros_like(a) for n, a in layer.params[0][0].items()}]]
        results.append(layer.double_backward(tape, d_y, d_states, u_x, g_params,
                                             {"h": np.zeros((1, B, H))}))
    (c_dy0, _, c0), (c_dy1, _, c1) = results
    np.testing.assert_allclose(c_dy1, c_dy0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c1.x, c0.x, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(c1.extra["m"], np.zeros_like(m))
