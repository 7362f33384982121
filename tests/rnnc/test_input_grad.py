"""Inputs declared ``grad=False`` and inputs of width 1.

``c.input(name, n, grad=False)`` declares a per-step input that is data (a mask, conditioning
features): autodiff takes no derivative for it, so the backward program returns no
``grad.NAME`` and does no work for it, and ``Grads.x`` leaves it out. An input of width 1
broadcasts against ``(B, n)`` values like any ``(B, 1)`` value, and its gradient (when it has
one) is summed back over the broadcast axis.

The oracles are independent of rnnc: a float64 NumPy loop written out by hand, central
differences of it, and the unoptimized NumPy program (``optimize=False``).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import rnnc
from tests.numeric import central_difference

T, B, I, Z, H = 4, 3, 3, 2, 4
BACKENDS = [pytest.param("numpy", {}, id="numpy"), pytest.param("llvm", {}, id="llvm"),
            pytest.param("cuda", {"emulate": True}, id="cuda-emulated")]
EPS = 1e-6


def gated(grad_m: bool, grad_z: bool = False) -> rnnc.Cell:
    """An Elman cell gated by a width-1 input ``m`` and conditioned on ``z``: ``m`` meets
    ``(B, H)`` values on the left and on the right of +, -, * and /."""
    c = rnnc.Cell("gated")
    x = c.input("x", I)
    m = c.input("m", 1, grad=grad_m)
    z = c.input("z", Z, grad=grad_z)
    h = c.state("h", H)
    W, U = c.param("W", (I, H)), c.param("U", (H, H))
    V, b = c.param("V", (Z, H)), c.param("b", (H,))
    cand = rnnc.tanh(x @ W + h @ U + z @ V + b)
    new = m * cand + (1 - m) * h
    c.update(h=new)
    c.output("y", new / (1 + m * m) + m - h * m)
    return c


def loop(p: dict, xs: dict, h0: np.ndarray, lengths: np.ndarray | None = None):
    """The cell above as a float64 NumPy loop: ``(y, final h)``."""
    h, ys = h0, []
    for t in range(len(xs["x"])):
        x, m, z = xs["x"][t], xs["m"][t], xs["z"][t]
        cand = np.tanh(x @ p["W"] + h @ p["U"] + z @ p["V"] + p["b"])
        new = m * cand + (1 - m) * h
        y = new / (1 + m * m) + m - h * m
        if lengths is not None:  # past a sequence's length: state kept, output zero
            live = (t < lengths)[:, None]
            new, y = np.where(live, new, h), np.where(live, y, 0.0)
        ys.append(y)
        h = new
    return np.stack(ys), h


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = {"x": rng.standard_normal((T, B, I)), "m": rng.uniform(0.1, 0.9, (T, B, 1)),
          "z": rng.standard_normal((T, B, Z))}
    p = gated(True).init_params(seed=seed, dtype=np.float64)
    h0 = rng.uniform(-0.5, 0.5, (B, H))
    dy, dh = rng.standard_normal((T, B, H)), rng.standard_normal((B, H))
    return xs, p, h0, dy, dh


def differences(xs, p, h0, dy, dh, lengths=None) -> dict[str, np.ndarray]:
    """Central differences of ``sum(y * dy) + sum(h_T * dh)`` for every input, parameter
    and the initial state, by name (``x.m`` for input m)."""
    def loss() -> float:
        y, h = loop(p, xs, h0, lengths)
        return float((y * dy).sum() + (h * dh).sum())

    out = {}
    arrays = {**{f"x.{n}": v for n, v in xs.items()}, **{f"p.{n}": v for n, v in p.items()},
              "h": h0}
    for name, arr in arrays.items():
        out[name] = central_difference(loss, arr, EPS)
    return out


@functools.cache
def compiled(backend: str, emulate: bool, grad_m: bool, grad_z: bool) -> rnnc.Function:
    options = {"emulate": True} if emulate else {}
    return rnnc.compile(gated(grad_m, grad_z), backend, **options)


def run(fn: rnnc.Function, lengths=None):
    xs, p, h0, dy, dh = data()
    ys, st, tape = fn.forward(xs, p, {"h": h0}, lengths)
    return ys["y"], st["h"], fn.backward(tape, {"y": dy}, {"h": dh})


# ---------------------------------------------------------------- grad=False


@pytest.mark.parametrize("lengths", [None, np.array([T, 2, 1])], ids=["full", "lengths"])
@pytest.mark.parametrize("backend, options", BACKENDS)
def test_grad_false_inputs_match_the_numpy_loop(backend, options, lengths) -> None:
    xs, p, h0, dy, dh = data()
    want_y, want_h = loop(p, xs, h0, lengths)
    want = differences(xs, p, h0, dy, dh, lengths)
    y, h, g = run(compiled(backend, "emulate" in options, False, False), lengths)
    np.testing.assert_allclose(y, want_y, atol=1e-12)
    np.testing.assert_allclose(h, want_h, atol=1e-12)
    assert isinstance(g.x, dict) and set(g.x) == {"x"}  # m and z have no gradient
    np.testing.assert_allclose(g.x["x"], want["x.x"], atol=1e-7)
    for name in p:
        np.testing.assert_allclose(g.params[name], want[f"p.{name}"], atol=1e-7, err_msg=name)
    np.testing.assert_allclose(g.states["h"], want["h"], atol=1e-7)
    # The oracle, and the same cell with every input differentiable, agree on what remains.
    for ref in (rnnc.compile(gated(False), optimize=False), compiled("numpy", False, True, True)):
        _, _, g_ref = run(ref, lengths)
        np.testing.assert_allclose(g.x["x"], g_ref.x["x"], atol=1e-12)
        for name in p:
            np.testing.assert_allclose(g.params[name], g_ref.params[name], atol=1e-12)


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "oracle"])
def test_the_backward_does_no_work_for_grad_false_inputs(optimize: bool) -> None:
    data_fn = rnnc.compile(gated(False), optimize=optimize, backend="numpy")
    diff_fn = rnnc.compile(gated(True, True), optimize=optimize, backend="numpy")
    for mode in ("backward", "backward.backward", "forward.backward"):
        results = data_fn.program(mode).results
        assert "grad.m" not in results and "grad.z" not in results, mode
        assert {"grad.m", "grad.z"} <= set(diff_fn.program(mode).results), mode
    text = data_fn.ir("backward")
    assert "grad.m" not in text and "grad.z" not in text
    # m's gradient is the only feature-axis sum (m broadcasts), z's the only z @ V.T: gone.
    assert "= sum(" not in text and "= sum(" in diff_fn.ir("backward")
    matmuls = {fn: sum(c.get("matmul", 0) for c in fn.op_counts("backward").values())
               for fn in (data_fn, diff_fn)}
    assert matmuls[data_fn] == matmuls[diff_fn] - 1
    # No node of the backward is dead, and the forward saves nothing for m or z alone.
    body = data_fn.program("backward").scan.body
    assert not body.dead_code()
    saves = {fn: len(fn.program("forward").saves[-1]) for fn in (data_fn, diff_fn)}
    assert saves[data_fn] < saves[diff_fn]
    assert "grad.m" not in rnnc.dump(gated(False), after="autodiff-backward", mode="backward")


def test_a_cell_whose_only_input_is_data() -> None:
    c = rnnc.Cell("integrator")
    m = c.input("m", 1, grad=False)
    h = c.state("h", H)
    a = c.param("a", (H,))
    new = rnnc.tanh(h * a + m)
    c.update(h=new)
    c.output("y", new)
    rng = np.random.default_rng(1)
    m_seq, p = rng.standard_normal((T, B, 1)), c.init_params(dtype=np.float64)
    for fn in (rnnc.compile(c, "llvm", check=True), rnnc.compile(c, optimize=False)):
        ys, _, tape = fn.forward(m_seq, p)
        g = fn.backward(tape, {"y": np.ones_like(ys["y"])})
        assert g.x is None
        assert "grad.m" not in fn.program("backward").results
    # T = 0 returns the same shape of Grads.
    _, _, tape = fn.forward(np.zeros((0, B, 1)), p)
    assert fn.backward(tape).x is None


def test_the_fingerprint_tells_grad_false_apart() -> None:
    assert gated(False).program().fingerprint() != gated(True).program().fingerprint()
    assert gated(True, True).program().no_grad == ()  # unchanged for old cells
    assert gated(False).program().no_grad == ("m", "z")


# ---------------------------------------------------------------- width 1


@pytest.mark.parametrize("backend, options", BACKENDS)
def test_width_one_inputs_broadcast_with_their_gradients(backend, options) -> None:
    xs, p, h0, dy, dh = data()
    want = differences(xs, p, h0, dy, dh)
    y, _, g = run(compiled(backend, "emulate" in options, True, True))
    np.testing.assert_allclose(y, loop(p, xs, h0)[0], atol=1e-12)
    assert g.x["m"].shape == (T, B, 1)  # summed back over the broadcast feature axis
    for name in ("x", "m", "z"):
        np.testing.assert_allclose(g.x[name], want[f"x.{name}"], atol=1e-7, err_msg=name)
    _, _, g_ref = run(rnnc.compile(gated(True, True), optimize=False))
    np.testing.assert_allclose(g.x["m"], g_ref.x["m"], atol=1e-12)


def test_width_one_shape_rules() -> None:
    c = rnnc.Cell("shapes")
    m, x = c.input("m", 1), c.input("x", 3)
    h = c.state("h", 4)
    P = c.param("P", (1, 4))
    for v in (m + h, h - m, m * h, h / m, rnnc.maximum(m, h), rnnc.where(m, h, 0.0), m @ P):
        assert v.shape == ("B", 4)
    with pytest.raises(rnnc.ShapeError):
        x + h  # (B, 3) against (B, 4): only a width of 1 broadcasts


def test_a_narrower_sequence_for_a_wider_input_is_still_refused() -> None:
    xs, p, h0, _, _ = data()
    fn = compiled("numpy", False, False, False)
    with pytest.raises(rnnc.RnncValueError, match="'z' must have 2 features"):
        fn({**xs, "z": xs["z"][:, :, :1]}, p)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("grad", ["no", 0, 1, None, np.bool_(False)])
def test_grad_must_be_a_bool(grad) -> None:
    c = rnnc.Cell()
    with pytest.raises(rnnc.RnncTypeError, match="grad of input 'm' must be True or False"):
        c.input("m", 1, grad=grad)
    assert "m" not in c.inputs


def test_asking_for_the_gradient_of_a_grad_false_input() -> None:
    _, _, g = run(compiled("numpy", False, False, False))
    assert "m" not in g.x
    with pytest.raises(rnnc.RnncValueError, match="input 'm' is declared grad=False"):
        g.x["m"]
    with pytest.raises(KeyError):
        g.x["w"]  # not an input at all: a plain KeyError


def test_a_cotangent_for_a_grad_false_input_is_refused() -> None:
    fn = compiled("numpy", False, False, False)
    xs, p, h0, dy, dh = data()
    _, _, tape = fn.forward(xs, p, {"h": h0})
    with pytest.raises(rnnc.RnncValueError, match="cotangent 'm' given, but input 'm' is "
                                                  "declared grad=False"):
        fn.double_backward(tape, {"y": dy}, None, {"m": np.ones((T, B, 1))}, None, None)
    # Leaving it out (or None) is the way: the other inputs' cotangents still flow.
    u_x = {"x": np.ones((T, B, I)), "m": None}
    dd_y, _, g = fn.double_backward(tape, {"y": dy}, None, u_x, None, None)
    ref = compiled("numpy", False, True, True)
    _, _, tape_ref = ref.forward(xs, p, {"h": h0})
    dd_ref, _, g_ref = ref.double_backward(tape_ref, {"y": dy}, None, {"x": u_x["x"]}, None,
                                           None)
    assert set(g.x) == {"x"}
    np.testing.assert_allclose(dd_y["y"], dd_ref["y"], atol=1e-12)
    for name in p:
        np.testing.assert_allclose(g.params[name], g_ref.params[name], atol=1e-12)
