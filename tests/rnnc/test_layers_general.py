"""rnnc.RNN over general cells: extra per-step inputs, output widths other than hidden_size,
states of different sizes, against a float64 NumPy loop written out here step by step."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc.dsl import Cell, tanh
from rnnc.errors import RnncError
from tests.numeric import central_difference

I, H, T, B = 2, 3, 4, 3
E, K, M = 2, 4, 5  # extra input width, output width, second state's size
LENGTHS = np.array([3, 4, 1])


# --------------------------------------------------------------------------- the cells


def two_inputs(n_in: int, n_h: int) -> Cell:
    """h' = tanh(x W + u V + h U + b): the extra input u."""
    c = Cell("two_inputs")
    x, u, h = c.input("x", n_in), c.input("u", E), c.state("h", n_h)
    W, V = c.param("W", (n_in, n_h)), c.param("V", (E, n_h))
    U, b = c.param("U", (n_h, n_h)), c.param("b", (n_h,))
    h_new = tanh(x @ W + u @ V + h @ U + b)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def projected(n_in: int, n_h: int) -> Cell:
    """h' = tanh(x W + h U + b), y = h' P: an output of K features, not hidden_size."""
    c = Cell("projected")
    x, h = c.input("x", n_in), c.state("h", n_h)
    W, U, b = c.param("W", (n_in, n_h)), c.param("U", (n_h, n_h)), c.param("b", (n_h,))
    P = c.param("P", (n_h, K))
    h_new = tanh(x @ W + h @ U + b)
    c.update(h=h_new)
    c.output("y", h_new @ P)
    return c


def two_states(n_in: int, n_h: int) -> Cell:
    """m' = tanh(x A + h C + m G), h' = tanh(x W + m' D + h U): states of H and M features."""
    c = Cell("two_states")
    x, h, m = c.input("x", n_in), c.state("h", n_h), c.state("m", M)
    A, C, G = c.param("A", (n_in, M)), c.param("C", (n_h, M)), c.param("G", (M, M))
    W, D, U = c.param("W", (n_in, n_h)), c.param("D", (M, n_h)), c.param("U", (n_h, n_h))
    m_new = tanh(x @ A + h @ C + m @ G)
    h_new = tanh(x @ W + m_new @ D + h @ U)
    c.update(h=h_new, m=m_new)
    c.output("y", h_new)
    return c


def general(n_in: int, n_h: int) -> Cell:
    """All three at once: an extra input, two states of different sizes, y of K features
    (and a second output, so the layer stacks the one named "y")."""
    c = Cell("general")
    x, u = c.input("x", n_in), c.input("u", E)
    h, m = c.state("h", n_h), c.state("m", M)
    A, C, G = c.param("A", (E, M)), c.param("C", (n_h, M)), c.param("G", (M, M))
    W, V, D = c.param("W", (n_in, n_h)), c.param("V", (E, n_h)), c.param("D", (M, n_h))
    U, P = c.param("U", (n_h, n_h)), c.param("P", (n_h, K))
    m_new = tanh(u @ A + h @ C + m @ G)
    h_new = tanh(x @ W + u @ V + m_new @ D + h @ U)
    c.update(h=h_new, m=m_new)
    c.output("z", h_new)
    c.output("y", h_new @ P)
    return c


# One step of each cell in NumPy on single vectors: (params, x, extra, states) -> (y, states).
def _two_inputs_step(p, x, ex, st):
    h = np.tanh(x @ p["W"] + ex["u"] @ p["V"] + st["h"] @ p["U"] + p["b"])
    return h, {"h": h}


def _projected_step(p, x, ex, st):
    h = np.tanh(x @ p["W"] + st["h"] @ p["U"] + p["b"])
    return h @ p["P"], {"h": h}


def _two_states_step(p, x, ex, st):
    m = np.tanh(x @ p["A"] + st["h"] @ p["C"] + st["m"] @ p["G"])
    h = np.tanh(x @ p["W"] + m @ p["D"] + st["h"] @ p["U"])
    return h, {"h": h, "m": m}


def _general_step(p, x, ex, st):
    m = np.tanh(ex["u"] @ p["A"] + st["h"] @ p["C"] + st["m"] @ p["G"])
    h = np.tanh(x @ p["W"] + ex["u"] @ p["V"] + m @ p["D"] + st["h"] @ p["U"])
    return h @ p["P"], {"h": h, "m": m}


CELLS = {"two_inputs": (two_inputs, _two_inputs_step, H),
         "projected": (projected, _projected_step, K),
         "two_states": (two_states, _two_states_step, H),
         "general": (general, _general_step, K)}


def reference(step, layer, params, x, extra, lengths, states):
    """The layer's forward as a plain loop: time-major x and extra, (L*D, B, size) states."""
    L, D = layer.num_layers, layer.num_directions
    width = layer.output_size
    inp, final = x, {n: np.zeros_like(v) for n, v in states.items()}
    for k in range(L):
        ex = extra if k == 0 or layer.extra_inputs == "all" else \
            {n: np.zeros_like(v) for n, v in extra.items()}
        outs = []
        for d in range(D):
            y = np.zeros((T, B, width))
            for b in range(B):
                st = {n: v[k * D + d, b] for n, v in states.items()}
                steps = range(lengths[b]) if d == 0 else reversed(range(lengths[b]))
                for t in steps:
                    y[t, b], st = step(params[k][d], inp[t, b],
                                       {n: v[t, b] for n, v in ex.items()}, st)
                for n in final:
                    final[n][k * D + d, b] = st[n]
            outs.append(y)
        inp = np.concatenate(outs, axis=2)
    return inp, final


def setup(name, backend="numpy", extra_inputs="all", seed=0):
    factory, step, width = CELLS[name]
    layer = rnnc.RNN(factory, I, H, num_layers=2, bidirectional=True, dtype=np.float64,
                     seed=seed, backend=backend, extra_inputs=extra_inputs)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I))
    extra = {n: rng.standard_normal((T, B, s)) for n, s in layer.extra_sizes.items()}
    states = {n: rng.standard_normal((4, B, s)) for n, s in layer.state_sizes.items()}
    return layer, step, x, extra, states


def backend_kw(name: str) -> str:
    if name == "llvm":
        pytest.importorskip("rnnc.backends.llvm.runtime", reason="rnnc.backends.llvm.runtime")
    return name


# --------------------------------------------------------------------------- forward


CASES = [(c, "numpy") for c in CELLS] + [("general", "llvm"), ("two_inputs", "llvm")]


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_forward_matches_numpy_loop(name, backend):
    layer, step, x, extra, states = setup(name, backend_kw(backend))
    assert layer.output_size == CELLS[name][2]
    assert layer.layer_input_size(1) == 2 * layer.output_size
    y, final = layer(x, LENGTHS, states, extra=extra)
    want_y, want_final = reference(step, layer, layer.params, x, extra, LENGTHS, states)
    assert y.shape == (T, B, 2 * layer.output_size)
    np.testing.assert_allclose(y, want_y, rtol=1e-10, atol=1e-12)
    for n, v in want_final.items():
        np.testing.assert_allclose(final[n], v, rtol=1e-10, atol=1e-12)


def test_state_sizes_and_names():
    layer = rnnc.RNN(general, I, H, backend="numpy")
    assert layer.state_sizes == {"h": H, "m": M}
    assert layer.extra_sizes == {"u": E}
    assert (layer.input_name, layer.output_name, layer.output_size) == ("x", "y", K)


def test_proj_size_is_the_general_output_width():
    layer = rnnc.RNN("lstm", I, H + 2, num_layers=2, bidirectional=True, proj_size=2,
                     backend="numpy")
    assert (layer.output_size, layer.layer_input_size(1)) == (2, 4)
    assert layer.state_sizes == {"h": 2, "c": H + 2}
    y, st = layer(np.zeros((T, B, I), np.float32))
    assert y.shape == (T, B, 4) and st["h"].shape == (4, B, 2)


# --------------------------------------------------------------------------- gradients




def check_gradients(layer, step, x, extra, states):
    rng = np.random.default_rng(9)
    w_y = rng.standard_normal((T, B, 2 * layer.output_size))
    w_st = {n: rng.standard_normal(v.shape) for n, v in states.items()}
    params = [[{n: a.copy() for n, a in p.items()} for p in row] for row in layer.params]

    def loss():
        y, fin = reference(step, layer, params, x, extra, LENGTHS, states)
        return float((y * w_y).sum() + sum((fin[n] * w).sum() for n, w in w_st.items()))

    _, _, tape = layer.forward(x, LENGTHS, states, extra=extra)
    g = layer.backward(tape, w_y, w_st)
    tol = {"rtol": 1e-6, "atol": 1e-7}
    np.testing.assert_allclose(g.x, central_difference(loss, x), **tol)
    assert sorted(g.extra) == sorted(extra)
    for n, v in extra.items():
        np.testing.assert_allclose(g.extra[n], central_difference(loss, v), **tol)
    for n, v in states.items():
        np.testing.assert_allclose(g.states[n], central_difference(loss, v), **tol)
    for k, row in enumerate(params):
        for d, p in enumerate(row):
            for n, a in p.items():
                np.testing.assert_allclose(g.params[k][d][n], central_difference(loss, a), **tol,
                                           err_msg=f"{n} layer {k} direction {d}")
    return g


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_gradients_central_differences(name, backend):
    layer, step, x, extra, states = setup(name, backend_kw(backend))
    check_gradients(layer, step, x, extra, states)


@pytest.mark.parametrize("backend", ["numpy", "llvm"])
def test_extra_inputs_first_layer_only(backend):
    layer, step, x, extra, states = setup("general", backend_kw(backend), "first")
    y, _ = layer(x, LENGTHS, states, extra=extra)
    np.testing.assert_allclose(y, reference(step, layer, layer.params, x, extra, LENGTHS,
                                            states)[0], rtol=1e-10, atol=1e-12)
    everywhere, *_ = setup("general", "numpy", "all")
    assert not np.allclose(y, everywhere(x, LENGTHS, states, extra=extra)[0])
    check_gradients(layer, step, x, extra, states)


def test_batch_first_extra_inputs():
    layer, _, x, extra, states = setup("general")
    bf, *_ = setup("general")
    bf.batch_first = True
    y, fin, tape = layer.forward(x, LENGTHS, states, extra=extra)
    y_bf, fin_bf, tape_bf = bf.forward(x.transpose(1, 0, 2), LENGTHS, states,
                                       extra={n: v.transpose(1, 0, 2) for n, v in extra.items()})
    np.testing.assert_array_equal(y_bf, y.transpose(1, 0, 2))
    d_y = np.random.default_rng(3).standard_normal(y.shape)
    g, g_bf = layer.backward(tape, d_y), bf.backward(tape_bf, d_y.transpose(1, 0, 2))
    np.testing.assert_array_equal(g_bf.extra["u"], g.extra["u"].transpose(1, 0, 2))
    assert g.extra["u"].shape == (T, B, E) and not g.extra["u"][LENGTHS[2]:, 2].any()


def test_empty_batch_extra_gradients():
    layer = rnnc.RNN(general, I, H, dtype=np.float64, backend="numpy")
    y, _, tape = layer.forward(np.zeros((T, 0, I)), extra={"u": np.zeros((T, 0, E))})
    assert y.shape == (T, 0, K)
    assert layer.backward(tape, y).extra["u"].shape == (T, 0, E)


def test_double_backward_extra_cotangents():
    """The derivative of backward w.r.t. d_y, contracted with g_extra, equals the extra
    inputs' gradient of the loss <d_y, y> contracted with g_extra (backward is linear in d_y)."""
    layer, _, x, extra, states = setup("general")
    _, _, tape = layer.forward(x, LENGTHS, states, extra=extra)
    rng = np.random.default_rng(4)
    d_y = rng.standard_normal((T, B, 2 * K))
    g_extra = {"u": rng.standard_normal((T, B, E))}
    zeros = layer.backward(tape, d_y)
    g_params = [[{n: np.zeros_like(a) for n, a in p.items()} for p in row]
                for row in zeros.params]
    c_dy, _, c = layer.double_backward(
        tape, d_y, {n: np.zeros_like(v) for n, v in states.items()}, np.zeros_like(x),
        g_params, {n: np.zeros_like(v) for n, v in states.items()}, g_extra)
    # <c_dy, e> = <backward(e).extra, g_extra> for any e
    e = rng.standard_normal(d_y.shape)
    lhs = float((c_dy * e).sum())
    rhs = float((layer.backward(tape, e).extra["u"] * g_extra["u"]).sum())
    np.testing.assert_allclose(lhs, rhs, rtol=1e-10)
    assert c.extra["u"].shape == (T, B, E) and np.isfinite(c.extra["u"]).all()


# --------------------------------------------------------------------------- errors


@pytest.fixture
def no_native(monkeypatch):
    """Make any run of a compiled direction fail: the checks must come first."""
    from rnnc.layers import run

    def refuse(*args, **kwargs):
        raise AssertionError("a compiled function ran before the arguments were checked")

    monkeypatch.setattr(run, "_run_direction", refuse)


def test_factory_first_input_width():
    with pytest.raises(RnncError, match=r"input size 2, its cell's first input 'x' .* 5"):
        rnnc.RNN(lambda i, h: two_inputs(5, h), I, H, backend="numpy")


def test_factory_cells_must_stack():
    def varying(n_in, n_h):
        return general(n_in, n_h) if n_in == I else two_inputs(n_in, n_h)

    with pytest.raises(RnncError, match="cells differ between layers"):
        rnnc.RNN(varying, I, H, num_layers=2, backend="numpy")


def test_extra_inputs_option():
    with pytest.raises(RnncError, match="extra_inputs must be 'all'.* or 'first'"):
        rnnc.RNN(general, I, H, extra_inputs="last", backend="numpy")


@pytest.mark.parametrize(("extra", "match"), [
    (None, r"missing extra input 'u'"),
    ({}, r"missing extra input 'u'"),
    ({"u": np.zeros((T, B, E)), "v": np.zeros((T, B, E))}, r"unknown extra input 'v'.*\['u'\]"),
    ({"u": np.zeros((T, B, E + 1))}, r"'u' must have shape \(T, B, size\) = \(4, 3, 2\)"),
    ({"u": np.zeros((T + 1, B, E))}, r"'u' must have shape .* like x, got \(5, 3, 2\)"),
    ({"u": np.zeros((T, B, E), np.float32)}, r"'u' is float32, expected float64"),
    ([np.zeros((T, B, E))], r"extra must be a dict"),
])
def test_extra_input_errors(no_native, extra, match):
    layer = rnnc.RNN(general, I, H, dtype=np.float64, backend="numpy")
    x = np.zeros((T, B, I))
    with pytest.raises(RnncError, match=match):
        layer(x, extra=extra)
    with pytest.raises(RnncError, match=match):
        layer.forward(x, extra=extra)


def test_extra_given_to_one_input_cell(no_native):
    layer = rnnc.RNN("gru", I, H, backend="numpy")
    with pytest.raises(RnncError, match="unknown extra input 'u'; cell 'gru' has no extra"):
        layer(np.zeros((T, B, I), np.float32), extra={"u": np.zeros((T, B, E), np.float32)})
