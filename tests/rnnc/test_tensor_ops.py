"""The tensor op family (rnnc/ops_tensor.py) and values with feature shapes in the DSL.

Each op: its shape rule and NumPy reference against hand-written formulas (loops, not
``np.einsum``), its errors; its VJP through autodiff against float64 central differences;
every backend against the unoptimized traced program. The DSL: declarations with shapes,
indexing with ``None`` and ``...``, ``reshape``, sums over an axis, ``rnnc.einsum``.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import rnnc
from rnnc import ops_tensor as tensor
from rnnc.errors import ShapeError
from tests.numeric import central_difference

T, B = 3, 2


def _headwise(x, w):
    """(rows, H, d) x (H, d, e) -> (rows, H, e), head by head."""
    return np.stack([x[..., k, :] @ w[k] for k in range(w.shape[0])], axis=-2)


def test_reshape_rule_and_reference():
    assert tensor.reshape.shape(("B", 6), rank=1, shape=(2, 3)) == ("B", 2, 3)
    assert tensor.reshape.shape(("T", "B", 2, 3), rank=2, shape=(6,)) == ("T", "B", 6)
    assert tensor.reshape.shape(("B", 1), rank=1, shape=(1, 1)) == ("B", 1, 1)
    x = np.arange(12.0).reshape(2, 6)
    np.testing.assert_array_equal(tensor.reshape.ref(x, rank=1, shape=(2, 3)),
                                  [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]])
    with pytest.raises(ShapeError, match="6 elements"):
        tensor.reshape.shape(("B", 6), rank=1, shape=(4,))
    with pytest.raises(ShapeError, match="row axes"):
        tensor.reshape.shape(("T", "B", 6), rank=2, shape=(6,))
    with pytest.raises(ShapeError, match="row axes"):
        tensor.reshape.shape(("B", 6), rank=2, shape=(6,))
    assert tensor.reshape.shape((2, 3), rank=2, shape=(1, 6)) == (1, 6)  # a parameter


def test_sums_over_axes():
    x = np.arange(24.0).reshape(2, 3, 4)
    assert tensor.sum_axis.shape(("B", 3, 4), axis=-2) == ("B", 1, 4)
    want = np.array([[[x[b, :, j].sum() for j in range(4)]] for b in range(2)])
    np.testing.assert_array_equal(tensor.sum_axis.ref(x, axis=-2), want)
    assert tensor.sum_lead.shape(("T", "B", 3, 4), rank=2) == (3, 4)
    np.testing.assert_array_equal(tensor.sum_lead.ref(x, rank=2), x[0] + x[1])
    np.testing.assert_array_equal(tensor.sum_lead.ref(x, rank=1), x.reshape(6, 4).sum(0))
    with pytest.raises(ShapeError, match="row axes"):
        tensor.sum_axis.shape(("T", "B", 3, 4), axis=-3)
    with pytest.raises(ShapeError, match="negative feature axis"):
        tensor.sum_axis.shape(("B", 3, 4), axis=-3)
    with pytest.raises(ShapeError, match="negative feature axis"):
        tensor.sum_axis.shape(("B", 3, 4), axis=1)
    with pytest.raises(ShapeError, match="at least one axis"):
        tensor.sum_lead.shape(("B", 3), rank=0)


def test_einsum_rule_and_reference():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((T, B, 2, 3)), rng.standard_normal((2, 3, 4))
    spec = "...hd,hde->...he"
    assert tensor.einsum.shape(("T", "B", 2, 3), (2, 3, 4), spec=spec) == ("T", "B", 2, 4)
    np.testing.assert_allclose(tensor.einsum.ref(x, w, spec=spec), _headwise(x, w))
    g = rng.standard_normal((B, 2, 4))
    # Over the rows: the weight's gradient, a (2, 3, 4) sum of outer products per head.
    want = np.zeros((2, 3, 4))
    for b in range(B):
        for k in range(2):
            want[k] += np.outer(x[0, b, k], g[b, k])
    assert tensor.einsum.shape(("B", 2, 4), ("B", 2, 3), spec="...he,...hd->hde") == (2, 3, 4)
    np.testing.assert_allclose(tensor.einsum.ref(g, x[0], spec="...he,...hd->hde"), want)


@pytest.mark.parametrize("shapes,spec,match", [
    ((("B", 2, 3), (2, 4, 4)), "...hd,hde->...he", "sizes"),
    ((("B", 2, 3), (2, 3)), "...hd,hde->...he", "3 feature axes"),
    ((("B", 3, 3),), "...ij->...j", "one operand only"),
    ((("B", 3, 3), (3, 3)), "...ii,ij->...j", "each once"),
    (((2, 3), (3, 4)), "ij,jk->...ik", "no operand has"),
    ((("B", 2, 3), (2, 3, 4)), "...hd,hde->...heq", "output axis"),
    ((("B", 2, 3), (2, 3, 4)), "...hd,hde->he", "two batched"),
    ((("B", 2, 3), ("T", "B", 2, 3)), "...hd,...hd->...h", "different rows"),
    ((("B", 3),), "...i", "inputs->output"),
])
def test_einsum_errors(shapes, spec, match):
    with pytest.raises(ShapeError, match=match):
        tensor.einsum.shape(*shapes, spec=spec)


# ---------------------------------------------------------------- the DSL


def test_declarations_with_shapes():
    c = rnnc.Cell()
    x = c.input("x", (2, 3))
    h = c.state("h", (2, 4))
    W = c.param("W", (2, 3, 4))
    assert x.shape == ("B", 2, 3) and h.shape == ("B", 2, 4) and W.shape == (2, 3, 4)
    assert c.sizes("input") == {"x": ("B", 6)}  # the sequence is (T, B, 6), row-major
    assert rnnc.einsum("hd,hde->he", x, W).shape == ("B", 2, 4)
    assert h[:, :, :, None].shape == ("B", 2, 4, 1) and h[..., None, :].shape == ("B", 2, 1, 4)
    assert h[:, None].shape == ("B", 1, 2, 4)
    assert W[None].shape == (1, 2, 3, 4)
    assert h.reshape(-1).shape == ("B", 8) and h.reshape(4, 2).shape == ("B", 4, 2)
    assert rnnc.reshape(h, (8,)).shape == ("B", 8)
    assert h.sum().shape == ("B", 2) and h.sum(0, keepdims=True).shape == ("B", 1, 4)
    assert h.mean(-2).shape == ("B", 4)
    assert h[:, :, 1:3].shape == ("B", 2, 2) and h[..., ::2].shape == ("B", 2, 2)
    for bad in (0, (), (2, 0), (2, "a")):
        with pytest.raises(rnnc.CellError):
            c.state(f"s{len(str(bad))}", bad)


@pytest.mark.parametrize("index,match", [
    (lambda h: h[None], "before the rows"),
    (lambda h: h[..., None, ...], "at most one"),
    (lambda h: h[:, 0, None], "takes ':'"),
    (lambda h: h[:, 1], "feature axis"),
    (lambda h: h.sum(2), "not a feature axis"),
    (lambda h: h.reshape(3, 3), "8 elements"),
    (lambda h: rnnc.einsum("...hd->...h", h), "no '...'"),
    (lambda h: rnnc.einsum("hd,hd->h", h, 2.0), "traced"),
    (lambda h: rnnc.einsum("hd->hq", h), "output axis"),
])
def test_dsl_errors_name_the_index(index, match):
    c = rnnc.Cell()
    h = c.state("h", (2, 4))
    with pytest.raises((ShapeError, rnnc.RnncTypeError), match=match):
        index(h)


def test_output_must_be_flat():
    c = rnnc.Cell()
    c.input("x", 2)
    h = c.state("h", (2, 4))
    with pytest.raises(ShapeError, match="reshape it"):
        c.output("y", h)


# ---------------------------------------------------------------- every op, end to end


def heads_cell() -> rnnc.Cell:
    """A cell that uses every tensor op: an input read per head, a head-wise product with a
    3-D parameter, broadcasting with a 2-D parameter and across new axes, sums over inner
    axes, and an einsum that falls back to the plain loop nest (no per-head GEMM form)."""
    c = rnnc.Cell("heads")
    x = c.input("x", (2, 3))
    h = c.state("h", (2, 4))
    W = c.param("W", (2, 3, 4))
    U = c.param("U", (2, 4, 4))
    b = c.param("b", (2, 4))
    v = c.param("v", (4, 4))
    pre = rnnc.einsum("hd,hde->he", x, W) + rnnc.einsum("hd,hde->he", h, U) + b
    mix = rnnc.einsum("hd,de->he", h, v)  # a shared (d, e) block: the generic loop nest
    new = rnnc.tanh(pre + 0.5 * mix) * (1.0 + 0.1 * h.sum(0)[:, None, :])
    new = new + 0.2 * (x.mean(-1)[:, :, None, None] * h[:, None, :, :]).sum(-2)
    c.update(h=new)
    c.output("y", new.reshape(-1))
    return c


def _problem(seed=0):
    cell = heads_cell()
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(v.shape) * 0.5
              for k, v in cell.init_params(dtype=np.float64).items()}
    x = rng.standard_normal((T, B, 6))
    h0 = rng.standard_normal((B, 2, 4))
    return cell, params, x, h0


def _loop(p, x, h, lengths):
    """The heads cell step by step, head by head."""
    ys = []
    for t in range(T):
        x3 = x[t].reshape(B, 2, 3)
        pre = _headwise(x3, p["W"]) + _headwise(h, p["U"]) + p["b"]
        mix = np.stack([h[:, k] @ p["v"] for k in range(2)], axis=1)
        new = np.tanh(pre + 0.5 * mix) * (1.0 + 0.1 * (h[:, 0] + h[:, 1]))[:, None, :]
        new = new + 0.2 * x3.mean(-1)[:, :, None] * h.sum(1)[:, None, :]
        live = (t < lengths)[:, None, None]
        h = np.where(live, new, h)
        ys.append(np.where(live, new, 0.0).reshape(B, 8))
    return np.stack(ys), h


def test_heads_cell_gradients_match_central_differences():
    cell, p, x, h0 = _problem(1)
    lengths = np.array([3, 1])
    rng = np.random.default_rng(2)
    wy, wh = rng.standard_normal((T, B, 8)), rng.standard_normal(h0.shape)

    def loss():
        ys, h = _loop(p, x, h0, lengths)
        return float((ys * wy).sum() + (h * wh).sum())

    fn = rnnc.compile(cell, backend="numpy")
    ys, st, tape = fn.forward(x, p, states={"h": h0}, lengths=lengths)
    want_y, want_h = _loop(p, x, h0, lengths)
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(st["h"], want_h, rtol=1e-12, atol=1e-12)
    g = fn.backward(tape, d_outputs={"y": wy}, d_states={"h": wh})
    for k in p:
        np.testing.assert_allclose(g.params[k], central_difference(loss, p[k]), rtol=1e-6,
                                   atol=1e-8, err_msg=k)
    np.testing.assert_allclose(g.x, central_difference(loss, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.states["h"], central_difference(loss, h0), rtol=1e-6,
                               atol=1e-8)


def test_input_einsum_is_hoisted_out_of_the_loop():
    """The input's head-wise product runs once over all steps; the two that read the state
    stay in the loop."""
    counts = rnnc.compile(heads_cell(), backend="numpy").op_counts("inference")
    assert counts["outside"]["einsum"] == 1 and counts["loop"]["einsum"] == 2


def _emulator_options(backend):
    if backend == "llvm":
        pytest.importorskip("llvmlite")
        return {"backend": "llvm"}
    if shutil.which("g++") is None:
        pytest.skip("the CUDA emulation needs a C++ compiler")
    return {"backend": "cuda", "emulate": True}


def _backend_cases():
    """LLVM in float64 forward in time runs by default; the other cases build seconds of
    kernels each and run with the slow tests."""
    for backend in ("llvm", "cuda"):
        for dtype in (np.float64, np.float32):
            for reverse in (False, True):
                slow = backend == "cuda" or dtype == np.float32 or reverse
                yield pytest.param(backend, dtype, reverse, marks=[pytest.mark.slow] * slow,
                                   id=f"{backend}-{np.dtype(dtype).name}-{reverse}")


@pytest.mark.parametrize("backend,dtype,reverse", list(_backend_cases()))
def test_heads_cell_on_every_backend(backend, dtype, reverse):
    """Forward and every gradient against the unoptimized traced program, with lengths (the
    LLVM head-wise GEMMs, their transposed and weight-gradient forms, and the loop nests; the
    CUDA emulation's element rules)."""
    cell, p, x, h0 = _problem(3)
    p = {k: v.astype(dtype) for k, v in p.items()}
    x, h0 = x.astype(dtype), h0.astype(dtype)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == np.float64 else {"rtol": 2e-4,
                                                                       "atol": 2e-5}
    lengths = np.array([3, 2])
    out = []
    for fn in (rnnc.compile(cell, optimize=False, reverse=reverse),
               rnnc.compile(cell, reverse=reverse, **_emulator_options(backend))):
        ys, st, tape = fn.forward(x, p, states={"h": h0}, lengths=lengths)
        g = fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])},
                        d_states={"h": np.ones_like(h0)})
        out.append({"y": ys["y"], "h": st["h"], "x": g.x, "h0": g.states["h"], **g.params})
    for k in out[0]:
        np.testing.assert_allclose(out[1][k], out[0][k], err_msg=k, **tol)
