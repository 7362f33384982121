"""Comparisons, maximum/minimum, abs, amax/amin, powers, softplus, stop_gradient, softmax,
logsumexp and ``W.T``: what the per-op rows cannot show (ties, stability, the operators,
canonical forms, and the errors of bad use)."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import shutil

import numpy as np
import pytest
import torch

import rnnc
from rnnc import ops, passes
from rnnc.dsl import Value


class Eager:
    """Evaluates each op a VJP rule emits with its NumPy reference."""

    def __call__(self, op, *xs, **attrs):
        return np.asarray(op.ref(*(np.asarray(x, np.float64) for x in xs), **attrs))

    def shape(self, v):
        return np.shape(v)


def _op_of(value: Value) -> ops.Op:
    return value.cell.graph.node(value.node).op


def _cell(build, n: int = 4) -> rnnc.Cell:
    c = rnnc.Cell("probe")
    x = c.input("x", n)
    h = c.state("h", n)
    p = c.param("p", (n,))
    y = build(x, h, p)
    c.update(h=rnnc.tanh(y + h) if y.shape[-1] == n else h)
    c.output("y", y)
    return c


def test_operators_build_comparisons_and_keep_identity_equality() -> None:
    c = rnnc.Cell("ops")
    x = c.input("x", 2)
    assert _op_of(x < 1) is ops.less and _op_of(x <= 1) is ops.less_equal
    assert _op_of(x > 1) is ops.greater and _op_of(x >= 1) is ops.greater_equal
    assert _op_of(1 < x) is ops.greater  # Python reflects 1 < x to x > 1
    assert _op_of(abs(x)) is ops.abs_ and _op_of(x ** 3) is ops.power
    assert (x == x) is True and (x != x) is False and len({x, x}) == 1


def test_ties_go_to_the_first_operand_of_maximum_and_minimum() -> None:
    a = np.array([[1.0, 2.0, -3.0]])
    b = np.array([[1.0, 0.0, -3.0]])
    g = np.array([[5.0, 7.0, 11.0]])
    for op in (ops.maximum, ops.minimum):
        ga, gb = op.vjp(Eager(), g, [a, b], op.ref(a, b))
        assert ga[0, 0] == 5.0 and gb[0, 0] == 0.0, op.name
        assert ga[0, 2] == 11.0 and gb[0, 2] == 0.0, op.name
        np.testing.assert_array_equal(ga + gb, g)


def test_amax_and_amin_share_the_gradient_evenly_over_ties() -> None:
    x = np.array([[3.0, 1.0, 3.0, 3.0], [0.0, -1.0, -1.0, 2.0]])
    g = np.array([[6.0], [4.0]])
    (gx,) = ops.amax.vjp(Eager(), g, [x], ops.amax.ref(x))
    np.testing.assert_array_equal(gx, [[2.0, 0.0, 2.0, 2.0], [0.0, 0.0, 0.0, 4.0]])
    (gx,) = ops.amin.vjp(Eager(), g, [x], ops.amin.ref(x))
    np.testing.assert_array_equal(gx, [[0.0, 6.0, 0.0, 0.0], [0.0, 2.0, 2.0, 0.0]])


def test_abs_has_no_gradient_at_zero() -> None:
    x = np.array([-2.0, 0.0, 3.0])
    (gx,) = ops.abs_.vjp(Eager(), np.ones(3), [x], np.abs(x))
    np.testing.assert_array_equal(gx, [-1.0, 0.0, 1.0])


@pytest.mark.parametrize("backend", ["numpy", "llvm"])
def test_softplus_softmax_and_logsumexp_are_stable(backend: str) -> None:
    def build(x, h, p):
        return rnnc.concat([rnnc.softplus(x * 200.0), rnnc.softmax(x * 500.0),
                            rnnc.logsumexp(x * 500.0)])

    fn = rnnc.compile(_cell(build, n=3), backend=backend)
    xs = np.array([[[-4.0, 0.5, 3.0]], [[2.0, 2.0, -1.0]]])
    ys, _ = fn(xs, {"p": np.zeros(3)})
    z = xs * 500.0
    top = z.max(-1, keepdims=True)
    softmax = np.exp(z - top) / np.exp(z - top).sum(-1, keepdims=True)
    logsumexp = top + np.log(np.exp(z - top).sum(-1, keepdims=True))
    softplus = np.logaddexp(0.0, xs * 200.0)
    want = np.concatenate([softplus, softmax, logsumexp], -1)
    assert np.all(np.isfinite(ys["y"]))
    np.testing.assert_allclose(ys["y"], want, rtol=1e-12, atol=1e-300)


def test_stop_gradient_passes_the_value_and_no_gradient() -> None:
    # p reaches the output only through stop_gradient: its gradient is zero, its value counts.
    fn = rnnc.compile(_cell(lambda x, h, p: x + rnnc.stop_gradient(x * p)), backend="numpy")
    rng = np.random.default_rng(0)
    xs, p = rng.standard_normal((3, 2, 4)), {"p": rng.standard_normal(4)}
    ys, _, tape = fn.forward(xs, p)
    np.testing.assert_allclose(ys["y"][0], xs[0] * (1 + p["p"]))
    grads = fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})
    np.testing.assert_array_equal(grads.params["p"], 0.0)
    assert np.any(grads.x != 0.0)


def test_canonicalize_keeps_stop_gradient_for_autodiff() -> None:
    cell = _cell(lambda x, h, p: x + rnnc.stop_gradient(x * p))
    prepared = passes.run(cell.program(), passes.PREPARE)
    assert "stop_gradient(" in rnnc.printer.format_program(prepared, "prepared")


# x ** ±0.5 stays a power: sqrt and rsqrt differ from pow at -0 and -inf (backends compute
# it by a square root).
@pytest.mark.parametrize("exponent,op", [(2, ops.mul), (0.5, ops.power), (-0.5, ops.power),
                                         (-1, ops.div), (3, ops.power), (1.5, ops.power)])
def test_cheap_powers_become_cheaper_ops(exponent: float, op: ops.Op) -> None:
    cell = _cell(lambda x, h, p: (x * x + 1.0) ** exponent)
    body = passes.run(cell.program(), ("canonicalize",)).scan.body
    names = {node.op.name for node in body.nodes()}
    assert op.name in names and (op is ops.power or "power" not in names), names


def test_x_to_the_first_power_is_x() -> None:
    cell = _cell(lambda x, h, p: x ** 1)
    body = passes.run(cell.program(), ("canonicalize",)).scan.body
    assert "power" not in {node.op.name for node in body.nodes()}


def test_transposed_matrix_is_matmul_transpose_b() -> None:
    c = rnnc.Cell("tied")
    x = c.input("x", 3)
    W = c.param("W", (4, 3))
    y = x @ W.T
    node = c.graph.node(y.node)
    assert node.op is ops.matmul and node.attrs == {"transpose_b": True}
    assert y.shape == ("B", 4)


def test_bad_uses_say_what_is_supported() -> None:
    c = rnnc.Cell("bad")
    x = c.input("x", 3)
    W = c.param("W", (4, 3))
    with pytest.raises(rnnc.ShapeError, match=r"right operand of @"):
        W.T + 1.0
    with pytest.raises(rnnc.ShapeError, match=r"right operand of @"):
        W.T @ x
    with pytest.raises(rnnc.ShapeError, match=r"right operand of @"):
        rnnc.tanh(W.T)
    with pytest.raises(rnnc.ShapeError, match=r"\.T needs a matrix parameter"):
        _ = x.T
    with pytest.raises(rnnc.ShapeError, match=r"constant Python number"):
        x ** x
    with pytest.raises(rnnc.ShapeError, match=r"constant Python number"):
        x ** True
    with pytest.raises(rnnc.ShapeError, match=r"p \*\* x with a traced exponent"):
        2.0 ** x
    with pytest.raises(rnnc.ShapeError, match=r"cannot broadcast"):
        rnnc.maximum(x, W)


LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
LIBM.pow.restype = ctypes.c_double
LIBM.pow.argtypes = (ctypes.c_double, ctypes.c_double)
EVERY_BACKEND = [
    pytest.param({"backend": "numpy"}, id="numpy"),
    pytest.param({"backend": "numpy", "optimize": False}, id="oracle"),
    pytest.param({"backend": "llvm"}, id="llvm", marks=pytest.mark.skipif(
        importlib.util.find_spec("llvmlite") is None, reason="needs llvmlite")),
    pytest.param({"backend": "cuda", "emulate": True}, id="cuda-emulate",
                 marks=pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++")),
                                          reason="CUDA emulation needs a C++ compiler")),
]
EDGES = np.array([-0.0, -np.inf, 0.0, np.inf, 4.0, -4.0, np.nan, 0.25])


@pytest.mark.parametrize("options", EVERY_BACKEND)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_square_root_powers_at_edges_are_c99_pow(options: dict, dtype) -> None:
    # x ** -0.5 became rsqrt(x): -inf at -0 and NaN at -inf, where pow gives +inf and 0.
    fn = rnnc.compile(_cell(lambda x, h, p: rnnc.concat([x ** -0.5, x ** 0.5, x ** 1.5]),
                            n=EDGES.size), **options)
    xs = EDGES.astype(dtype).reshape(1, 1, -1)
    with np.errstate(all="ignore"):
        ys, _ = fn(xs, {"p": np.zeros(EDGES.size, dtype)})
        want = np.array([LIBM.pow(float(v), p) for p in (-0.5, 0.5, 1.5) for v in EDGES]
                        ).astype(dtype)
    got = ys["y"].ravel()
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)
    zero_or_inf = np.isinf(want) | (want == 0)
    np.testing.assert_array_equal(np.signbit(got[zero_or_inf]), np.signbit(want[zero_or_inf]))


@pytest.mark.parametrize("options", EVERY_BACKEND)
def test_logsumexp_of_infinite_rows_is_torchs(options: dict) -> None:
    # A row holding +inf, or all -inf, gave NaN: inf - inf in the shift by the row's maximum.
    rows = np.array([[np.inf, 1.0, -2.0], [-np.inf] * 3, [-np.inf, 3.0, 1.0], [1.0, 2.0, 0.5],
                     [np.inf, -np.inf, 0.0], [np.nan, 1.0, 2.0]])
    c = rnnc.Cell("lse")
    x, h = c.input("x", 3), c.state("h", 1)
    c.update(h=h)
    c.output("y", rnnc.logsumexp(x))
    fn = rnnc.compile(c, **options)
    xs = rows.reshape(1, len(rows), 3)
    with np.errstate(all="ignore"):
        ys, _, tape = fn.forward(xs, {})
        grads = fn.backward(tape, {"y": np.ones((1, len(rows), 1))})
    t = torch.tensor(rows, requires_grad=True)
    want = torch.logsumexp(t, -1, keepdim=True)
    want.sum().backward()
    np.testing.assert_allclose(ys["y"][0], want.detach().numpy(), rtol=1e-12)
    # Gradients: torch's wherever torch's are finite (rows with inf give torch NaN too).
    finite = torch.isfinite(t.grad).numpy()
    np.testing.assert_allclose(grads.x[0][finite], t.grad.numpy()[finite], rtol=1e-12)
