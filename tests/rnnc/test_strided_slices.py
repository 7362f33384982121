"""Strided feature slices ``v[:, a:b:s]``: values, gradients, errors, passes and backends.

Oracles: a float64 NumPy loop written here, the unoptimized traced program on the NumPy
interpreter (``optimize=False``) and central differences of it (``tests/numeric.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc import ops, passes
from rnnc.backends.numpy.runtime import run_program
from rnnc.errors import ShapeError
from rnnc.ir import retype
from rnnc.printer import format_program
from tests.numeric import central_difference

T, B = 3, 2
BACKENDS = {"numpy": {"backend": "numpy"}, "llvm": {"backend": "llvm"},
            "cuda": {"backend": "cuda", "emulate": True}}


def strided_cell() -> rnnc.Cell:
    """Strided slices of an input (hoisted into a GEMM), of a concat, of a strided slice, of a
    parameter, and with the defaults ``v[:, ::2]``."""
    c = rnnc.Cell("strided")
    x, h = c.input("x", 7), c.state("h", 3)
    W, U, b = c.param("W", (4, 3)), c.param("U", (3, 3)), c.param("b", (6,))
    both = rnnc.concat([x, h])  # 10 columns
    across = both[:, 1:10:3]  # columns 1, 4, 7: x, x, h
    nested = both[:, 0:10:2][:, 0:5:2]  # columns 0, 4, 8
    new = rnnc.tanh(x[:, 0:7:2] @ W + h @ U + across * nested + b[..., 1:6:2])
    c.update(h=new)
    c.output("y", rnnc.concat([new[:, ::2], nested]))
    return c


def loop(xs, params, h):
    """The cell as a float64 NumPy loop."""
    W, U, b = params["W"], params["U"], params["b"]
    ys = []
    for x in xs:
        both = np.concatenate([x, h], -1)
        across, nested = both[:, 1:10:3], both[:, 0:10:2][:, 0:5:2]
        h = np.tanh(x[:, 0:7:2] @ W + h @ U + across * nested + b[1:6:2])
        ys.append(np.concatenate([h[:, ::2], nested], -1))
    return np.stack(ys), h


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((T, B, 7))
    params = {"W": rng.standard_normal((4, 3)) * 0.5, "U": rng.standard_normal((3, 3)) * 0.5,
              "b": rng.standard_normal(6) * 0.5}
    return xs, params, {"h": rng.standard_normal((B, 3))}


# ---------------------------------------------------------------- the DSL


def test_step_one_keeps_todays_form_and_steps_are_normalized():
    c = rnnc.Cell("forms")
    x = c.input("x", 8)
    nodes = {k: c.graph.node(v.node) for k, v in {
        "plain": x[:, 1:5], "unit": x[:, 1:5:1], "strided": x[:, 0:8:3],
        "same": x[:, 0:7:3], "one": x[:, 2:4:5], "all": x[:, ::2]}.items()}
    assert nodes["plain"].attrs == nodes["unit"].attrs == {"start": 1, "stop": 5}
    # One form per set of columns: stop just past the last column read.
    assert nodes["strided"].attrs == nodes["same"].attrs == {"start": 0, "stop": 7, "step": 3}
    assert nodes["one"].attrs == {"start": 2, "stop": 3}
    assert nodes["all"].attrs == {"start": 0, "stop": 7, "step": 2}
    assert nodes["all"].shape == ("B", 4)
    h = c.state("h", 4)
    c.update(h=h + x[:, 1:5])
    assert "slice[start=1, stop=5](x)" in format_program(c.program(), "t")


@pytest.mark.parametrize("key,match", [
    (slice(5, 1, -1), r"positive integer step a:b:s .*reversed features are not supported"),
    (slice(None, None, -2), "positive integer step"),
    (slice(0, 4, 0), "positive integer step"),
    (slice(0, 4, 1.5), "positive integer step"),
    (slice(0, 4, True), "positive integer step"),
    (slice(4, 2, 2), r"slice \[4:2:2\] out of range for \[B,6\]"),
    ((1, 2), "feature slices must be a:b or a:b:s"),
])
def test_bad_steps_raise_shape_errors(key, match):
    c = rnnc.Cell("bad")
    x = c.input("x", 6)
    with pytest.raises(ShapeError, match=match) as caught:
        x[:, key]
    assert "test_strided_slices.py" in str(caught.value)  # names the user's line


@pytest.mark.parametrize("op,attrs", [(ops.slice_, {"start": 0, "stop": 4, "step": 0}),
                                      (ops.slice_, {"start": 0, "stop": 4, "step": 2.0}),
                                      (ops.pad, {"before": 1, "after": 1, "step": -1})])
def test_op_rules_refuse_bad_steps(op, attrs):
    with pytest.raises(ShapeError, match=f"{op.name} step must be a positive integer"):
        op.shape(("B", 6), **attrs)


def test_values_match_a_numpy_loop():
    xs, params, states = data()
    want_y, want_h = loop(xs, params, states["h"])
    for name, options in BACKENDS.items():
        fn = rnnc.compile(strided_cell(), **options)
        ys, final = fn(xs, params, states)
        np.testing.assert_allclose(ys["y"], want_y, rtol=1e-12, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(final["h"], want_h, rtol=1e-12, atol=1e-12, err_msg=name)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_gradients_match_central_differences(backend):
    """Every gradient through the strided slices (their VJP: a pad with the same step)."""
    xs, params, states = data(1)
    rng = np.random.default_rng(2)
    reference = rnnc.compile(strided_cell(), backend="numpy", optimize=False)
    d_y = rng.standard_normal((T, B, 5))
    d_h = rng.standard_normal((B, 3))

    def loss() -> float:
        ys, final = reference(xs, params, states)
        return float((ys["y"] * d_y).sum() + (final["h"] * d_h).sum())

    fn = rnnc.compile(strided_cell(), **BACKENDS[backend])
    _, _, tape = fn.forward(xs, params, states)
    g = fn.backward(tape, {"y": d_y}, {"h": d_h})
    checks = [(g.x, xs, "x"), (g.states["h"], states["h"], "h")]
    checks += [(g.params[n], params[n], n) for n in params]
    for got, array, name in checks:
        np.testing.assert_allclose(got, central_difference(loss, array), rtol=1e-6, atol=1e-8,
                                   err_msg=f"{name} on {backend}")


def _nodes(graph):
    """Every node of ``graph`` and of the fused regions in it."""
    for node in graph.nodes():
        yield node
        if "region" in node.attrs:
            yield from _nodes(node.attrs["region"])


def test_backward_scatters_with_a_strided_pad():
    program = rnnc.compile(strided_cell(), backend="numpy").program("backward")
    steps = {n.attrs.get("step", 1) for g in (program.pre, program.scan.body, program.post)
             for n in _nodes(g) if n.op is ops.pad}
    assert {2, 3} <= steps


# ---------------------------------------------------------------- passes


def _run(program, xs, params, states):
    env = {"x": xs, **params, **states}
    return run_program(program, env, {"T": T, "B": B})


def test_canonicalize_keeps_strided_slices_exact_and_is_idempotent():
    """canonicalize has no slice rules: CSE merges equal slices only (steps compared), and a
    slice of a slice or of a concat stays as written."""
    c = rnnc.Cell("cse")
    x, h = c.input("x", 8), c.state("h", 1)
    c.update(h=h)
    c.output("y", rnnc.concat([x[:, 0:8:2], x[:, 0:7:2], x[:, 0:8:3], x[:, 0:8][:, 1:8:2]]))
    traced = retype(c.program(), "f64")
    once = passes.run(traced, ["canonicalize"])
    assert passes.run(once, ["canonicalize"]).fingerprint() == once.fingerprint()
    slices = sorted(tuple(sorted(n.attrs.items())) for n in once.scan.body.nodes()
                    if n.op is ops.slice_)
    assert slices == sorted([(("start", 0), ("step", 2), ("stop", 7)),
                             (("start", 0), ("step", 3), ("stop", 7)),
                             (("start", 0), ("stop", 8)),
                             (("start", 1), ("step", 2), ("stop", 8))])
    xs = np.random.default_rng(3).standard_normal((T, B, 8))
    h = {"h": np.zeros((B, 1))}
    np.testing.assert_array_equal(_run(once, xs, {}, h)["y"], _run(traced, xs, {}, h)["y"])


@pytest.mark.parametrize("mode", ["inference", "forward"])
def test_every_pipeline_keeps_the_values(mode):
    """The whole pipeline (hoisting the strided slice of x into the pre-loop GEMM, fusing the
    others) against the unoptimized traced program."""
    xs, params, states = data(4)
    traced = retype(strided_cell().program(), "f64")
    optimized = passes.run(traced, passes.pipeline(mode))
    assert set(optimized.args) == set(traced.args)  # no packed blocks to convert
    got = _run(optimized, xs, params, states)
    want = _run(traced, xs, params, states)
    for name in ("y", "h.final"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- CUDA source


def test_generated_kernels_compile_to_ptx():
    from rnnc.backends.cuda import codegen
    from rnnc.backends.cuda.ptx import available_compiler, compile_ptx

    if available_compiler() is None:
        pytest.skip("no CUDA compiler (nvcc or NVRTC)")
    fn = rnnc.compile(strided_cell(), backend="numpy")
    modules = [codegen.render(fn.program(mode), prefix=f"{mode}_k_")
               for mode in ("inference", "forward", "backward")]
    source = modules[0].prelude + "".join(m.kernel_text for m in modules)
    assert " % 2 == 0 ? " in source  # the backward's strided pad reads through its div piece
    ptx = compile_ptx(source, "sm_80")
    assert all(f".entry {k}(" in ptx for m in modules for k in m.kernels)
