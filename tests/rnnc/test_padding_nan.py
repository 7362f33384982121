"""NaN and Inf in the padding past ``lengths`` reach no result: outputs, states, gradients.

PyTorch's packed sequences never read the padding. rnnc runs every step of every sequence, so
the mask-lengths rewrite selects (``where``) the inputs to zero past each length: a product
with the mask would not do, as 0 * NaN is NaN in the backward's partials and in the hoisted
weight-gradient GEMM ``X^T dG``. Each run with NaN/Inf padding must be finite, equal the float64
oracle (optimize=False) on zero padding, equal its own run on zero padding bit for bit (the
padding is never read), and give input gradients of exactly zero past the lengths.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc.interop import weights

T, B, I, E, H = 5, 3, 3, 2, 4
LENGTHS = np.array([5, 2, 3])
PAST = np.arange(T)[:, None] >= LENGTHS[None, :]  # (T, B): the padding


def two_inputs_cell() -> rnnc.Cell:
    """An Elman cell with a second input ``m`` declared ``grad=False`` and a gate on ``x``."""
    c = rnnc.Cell("padded")
    x, m, h = c.input("x", I), c.input("m", E, grad=False), c.state("h", H)
    W, V, U = c.param("W", (I, H)), c.param("V", (E, H)), c.param("U", (H, H))
    b = c.param("b", (H,))
    new = rnnc.tanh(x @ W + m @ V + h @ U + b) * rnnc.sigmoid(x @ W)
    c.update(h=new)
    c.output("y", new)
    return c


def pad(a: np.ndarray, fill: float) -> np.ndarray:
    """``a`` (T, B, n) with the steps past each length set to ``fill``."""
    return np.where(PAST[:, :, None], fill, a)


def run(fn, xs: dict[str, np.ndarray], params, dtype=np.float64, fill: float = 0.0
        ) -> dict[str, np.ndarray]:
    """Inference, training forward and backward (the output cotangent past the lengths set to
    ``fill``: a packed sequence has no output there to take it): every result by name."""
    rng = np.random.default_rng(1)
    xs = {n: v.astype(dtype) for n, v in xs.items()}
    params = {n: v.astype(dtype) for n, v in params.items()}
    h0 = {"h": rng.uniform(-0.5, 0.5, (B, H)).astype(dtype)}
    ys, st = fn(xs, params, states=h0, lengths=LENGTHS)
    ys_f, st_f, tape = fn.forward(xs, params, states=h0, lengths=LENGTHS)
    g = fn.backward(tape, {"y": pad(rng.standard_normal((T, B, H)), fill).astype(dtype)},
                    {"h": rng.standard_normal((B, H)).astype(dtype)})
    out = {"y": ys["y"], "h": st["h"], "forward y": ys_f["y"], "forward h": st_f["h"],
           "grad x": g.x["x"], "grad h": g.states["h"]}
    out.update({f"grad {n}": v for n, v in g.params.items()})
    return out


@pytest.fixture(scope="module")
def case():
    cell = two_inputs_cell()
    rng = np.random.default_rng(0)
    xs = {"x": rng.standard_normal((T, B, I)), "m": rng.standard_normal((T, B, E))}
    params = cell.init_params(seed=0, dtype=np.float64)
    zero = {n: pad(v, 0.0) for n, v in xs.items()}
    want = run(rnnc.compile(cell, backend="numpy", optimize=False), zero, params)
    return cell, xs, params, want


def check(fn, case, fill: float, dtype=np.float64, atol=1e-12) -> None:
    _, xs, params, want = case
    got = run(fn, {n: pad(v, fill) for n, v in xs.items()}, params, dtype, fill)
    clean = run(fn, {n: pad(v, 0.0) for n, v in xs.items()}, params, dtype)
    for name, value in got.items():
        assert np.isfinite(value).all(), name
        np.testing.assert_array_equal(value, clean[name], err_msg=name)
        np.testing.assert_allclose(value, want[name], rtol=0, atol=atol, err_msg=name)
    assert (got["grad x"][PAST] == 0).all()


@pytest.mark.parametrize("fill", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("optimize", [True, False])
def test_numpy_padding_reaches_no_result(case, fill, optimize):
    check(rnnc.compile(case[0], backend="numpy", optimize=optimize), case, fill)


def test_numpy_float32_padding_reaches_no_result(case):
    check(rnnc.compile(case[0], backend="numpy"), case, np.nan, np.float32, atol=1e-5)


@pytest.mark.parametrize("backend", ["llvm", "cuda"])
def test_compiled_backends_padding_reaches_no_result(case, backend):
    pytest.importorskip(f"rnnc.backends.{backend}.runtime")
    options = {"emulate": True} if backend == "cuda" else {}
    check(rnnc.compile(case[0], backend=backend, **options), case, np.nan)


def test_layer_padding_matches_torch_packed():
    """A bidirectional two-layer GRU with NaN padding equals nn.GRU over packed sequences,
    which never reads the padding, gradients included."""
    torch = pytest.importorskip("torch")
    rnn_utils = torch.nn.utils.rnn
    torch.manual_seed(0)
    module = torch.nn.GRU(I, H, num_layers=2, bidirectional=True, dtype=torch.float64)
    layer = rnnc.RNN("gru", I, H, num_layers=2, bidirectional=True, dtype=np.float64)
    layer.load_torch(module)
    rng = np.random.default_rng(2)
    x = pad(rng.standard_normal((T, B, I)), np.nan)
    d_y = pad(rng.standard_normal((T, B, 2 * H)), 0.0)
    xt = torch.tensor(x, requires_grad=True)
    packed = rnn_utils.pack_padded_sequence(xt, torch.tensor(LENGTHS), enforce_sorted=False)
    out, fin = module(packed)
    out, _ = rnn_utils.pad_packed_sequence(out, total_length=T)
    (out * torch.tensor(d_y)).sum().backward()
    y, st, tape = layer.forward(x, lengths=LENGTHS)
    g = layer.backward(tape, d_y)
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(st["h"], fin.detach().numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(g.x, xt.grad.numpy(), rtol=0, atol=1e-9)
    grads = weights.layers_to_torch_state_dict("gru", g.params)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=0, atol=1e-9, err_msg=name)


def test_layer_extra_input_padding_is_never_read():
    """rnnc.RNN with an extra input (NaN padded) and a grad=False one: the results equal the
    zero-padded run bit for bit, and are finite."""

    def cell(n_in: int, n_h: int) -> rnnc.Cell:
        c = rnnc.Cell("extra")
        x, u, m = c.input("x", n_in), c.input("u", E), c.input("m", E, grad=False)
        h = c.state("h", n_h)
        W, V, S = c.param("W", (n_in, n_h)), c.param("V", (E, n_h)), c.param("S", (E, n_h))
        new = rnnc.tanh(x @ W + u @ V + m @ S + h)
        c.update(h=new)
        c.output("y", new)
        return c

    layer = rnnc.RNN(cell, I, H, num_layers=2, bidirectional=True, dtype=np.float64, seed=0)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, B, I))
    extra = {"u": rng.standard_normal((T, B, E)), "m": rng.standard_normal((T, B, E))}
    d_y = rng.standard_normal((T, B, 2 * H))

    def results(fill: float) -> dict[str, np.ndarray]:
        y, st, tape = layer.forward(pad(x, fill), lengths=LENGTHS,
                                    extra={n: pad(v, fill) for n, v in extra.items()})
        g = layer.backward(tape, d_y)
        out = {"y": y, "h": st["h"], "grad x": g.x, "grad u": g.extra["u"]}
        out.update({f"grad {k}.{n}": v for k, row in enumerate(g.params)
                    for d, p in enumerate(row) for n, v in p.items()})
        return out

    clean = results(0.0)
    for fill in (np.nan, np.inf):
        for name, value in results(fill).items():
            assert np.isfinite(value).all(), (fill, name)
            np.testing.assert_array_equal(value, clean[name], err_msg=f"{fill} {name}")
    assert (clean["grad x"][PAST] == 0).all() and (clean["grad u"][PAST] == 0).all()


@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_double_backward_padding_reaches_no_result(case, fill):
    """Second order too: padded inputs and a padded cotangent of the input gradient."""
    cell, xs, params, _ = case
    rng = np.random.default_rng(4)
    d_y, g_x = rng.standard_normal((T, B, H)), rng.standard_normal((T, B, I))

    def results(fn, fill: float) -> dict[str, np.ndarray]:
        padded = {n: pad(v, fill) for n, v in xs.items()}
        _, _, tape = fn.forward(padded, params, lengths=LENGTHS)
        d_out, d_st, g = fn.double_backward(tape, {"y": pad(d_y, fill)}, None,
                                            {"x": pad(g_x, fill)}, None, None)
        out = {"d y": d_out["y"], "x": g.x["x"], "h": g.states["h"]}
        out.update({f"param {n}": v for n, v in g.params.items()})
        return out

    want = results(rnnc.compile(cell, backend="numpy", optimize=False), 0.0)
    fn = rnnc.compile(cell, backend="numpy")
    clean, got = results(fn, 0.0), results(fn, fill)
    for name, value in got.items():
        assert np.isfinite(value).all(), name
        np.testing.assert_array_equal(value, clean[name], err_msg=name)
        np.testing.assert_allclose(value, want[name], rtol=0, atol=1e-12, err_msg=name)


def test_lengths_keep_the_parameter_blocks():
    """W is shared by a matmul of x and one of h: fuse-gate-matmuls packs it with the first
    group it meets. Selecting x past the lengths must not change which one that is, or the
    masked programs read parameter blocks the call's layout does not have."""
    c = rnnc.Cell("shared")
    x, h = c.input("x", H), c.state("h", H)
    W, V, A = c.param("W", (H, H)), c.param("V", (H, H)), c.param("A", (H, H))
    new = rnnc.tanh(x @ W + x @ V + h @ A + h @ W)
    c.update(h=new)
    c.output("y", new)
    params = c.init_params(seed=0, dtype=np.float64)
    xs = pad(np.random.default_rng(5).standard_normal((T, B, H)), np.nan)
    oracle = rnnc.compile(c, backend="numpy", optimize=False)
    fn = rnnc.compile(c, backend="numpy")
    for program in ("inference", "forward", "backward"):
        assert "W|V" in fn.ir(program, "f64", lengths=True), program
    want = oracle(pad(xs, 0.0), params, lengths=LENGTHS)
    got = fn(xs, params, lengths=LENGTHS)
    np.testing.assert_allclose(got[0]["y"], want[0]["y"], rtol=0, atol=1e-12)
    _, _, tape = fn.forward(xs, params, lengths=LENGTHS)
    _, _, want_tape = oracle.forward(pad(xs, 0.0), params, lengths=LENGTHS)
    d_y = {"y": np.ones((T, B, H))}
    g, want_g = fn.backward(tape, d_y), oracle.backward(want_tape, d_y)
    for name, value in g.params.items():
        np.testing.assert_allclose(value, want_g.params[name], rtol=0, atol=1e-12)
