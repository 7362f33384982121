"""The oracle (``optimize=False``) and translation validation (``check=True``).

The oracle is checked against central differences in float64 and against hand-written NumPy
loops; ``check=True`` must pass on correct code and, on injected faults, name the pass or the
backend at fault.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rnnc
from rnnc import backends as backend_registry
from rnnc import check as rnnc_check
from rnnc import ops, passes
from rnnc.backends.numpy.runtime import NumpyBackend
from rnnc.passes import canonicalize as canonicalize_module
from tests.strategies import random_data


@pytest.fixture(autouse=True)
def _fresh_optimized_programs():
    """Faults injected here must not leak optimized programs into other tests."""
    passes.clear_cache()
    yield
    passes.clear_cache()


def _loss(fn, x, params, states, d_out, d_st) -> float:
    ys, st = fn(x, params, states=states)
    return float(sum(np.sum(ys[k] * d_out[k]) for k in ys)
                 + sum(np.sum(st[k] * d_st[k]) for k in st))


@pytest.mark.parametrize("name", ["lstm", "gru", "mgu", "rnn"])
def test_oracle_gradients_match_central_differences(name: str) -> None:
    cell = getattr(rnnc.cells, name)(2, 3)
    fn = rnnc.compile(cell, optimize=False)
    x, params, states = random_data(cell, T=3, B=2, seed=5)
    rng = np.random.default_rng(6)
    ys, st, tape = fn.forward(x, params, states=states)
    d_out = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
    d_st = {k: rng.standard_normal(v.shape) for k, v in st.items()}
    g = fn.backward(tape, d_outputs=d_out, d_states=d_st)
    eps = 1e-6
    for kind, arrays, grads in (("param", params, g.params), ("state", states, g.states),
                                ("input", {"x": x}, {"x": g.x})):
        for key, arr in arrays.items():
            want = np.zeros_like(arr)
            for idx in np.ndindex(arr.shape):
                saved = arr[idx]
                arr[idx] = saved + eps
                plus = _loss(fn, x, params, states, d_out, d_st)
                arr[idx] = saved - eps
                minus = _loss(fn, x, params, states, d_out, d_st)
                arr[idx] = saved
                want[idx] = (plus - minus) / (2 * eps)
            np.testing.assert_allclose(grads[key], want, rtol=1e-6, atol=1e-8,
                                       err_msg=f"{kind} {key}")


def test_oracle_runs_no_optimization_pass() -> None:
    cell = rnnc.cells.lstm(3, 4)
    fn = rnnc.compile(cell, optimize=False)
    traced = cell.program()
    p = fn.program("inference", "f32")
    assert [n.op.name for n in p.scan.body.nodes()] == [n.op.name for n in traced.scan.body.nodes()]
    assert fn.op_counts()["loop"]["matmul"] == 8  # nothing fused, nothing hoisted


def test_oracle_matches_a_hand_written_loop_with_lengths() -> None:
    cell = rnnc.cells.rnn(3, 4)
    x, p, s = random_data(cell, T=5, B=3, seed=2)
    lens = np.array([5, 2, 4])
    ys, st = rnnc.compile(cell, optimize=False)(x, p, states=s, lengths=lens)
    h = s["h"].copy()
    want = np.zeros((5, 3, 4))
    for t in range(5):
        new = np.tanh(x[t] @ p["W_ih"] + p["b_ih"] + h @ p["W_hh"] + p["b_hh"])
        alive = (t < lens)[:, None]
        h = np.where(alive, new, h)
        want[t] = np.where(alive, new, 0.0)
    np.testing.assert_allclose(ys["y"], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(st["h"], h, rtol=1e-12, atol=1e-12)


def test_oracle_is_numpy_only() -> None:
    with pytest.raises(rnnc.RnncValueError, match="backend='numpy'"):
        rnnc.compile(rnnc.cells.rnn(3, 4), backend="llvm", optimize=False)
    with pytest.raises(rnnc.RnncTypeError, match="optimize"):
        rnnc.compile(rnnc.cells.rnn(3, 4), optimize="no", backend="numpy")


@pytest.mark.parametrize("backend", [{"backend": "numpy"}, {"backend": "llvm"},
                                     {"backend": "cuda", "emulate": True}],
                         ids=["numpy", "llvm", "cuda-emulate"])
def test_check_passes_on_correct_code(backend: dict) -> None:
    rnnc.compile(rnnc.cells.mgu(3, 4), check=True, **backend)


def test_check_names_the_faulty_pass(monkeypatch) -> None:
    def drop_bias(g, node):  # a wrong rule: x@W + b -> x@W
        a, b = node.inputs
        if g.node(a).op is ops.matmul and canonicalize_module._is_bias(g, b):
            return a
        return None

    monkeypatch.setattr(canonicalize_module, "RULES", canonicalize_module.RULES
                        + (canonicalize_module.Rule("wrong", ops.add, drop_bias),))
    with pytest.raises(rnnc.CheckError, match="first pass whose output disagrees is "
                                              "'canonicalize'"):
        rnnc.compile(rnnc.cells.rnn(3, 4), check=True, backend="numpy")


class _Faulty(NumpyBackend):
    """The NumPy backend with one wrong result: stands for a code-generation fault."""

    name = "faulty"

    def build(self, program, mode):
        run = super().build(program, mode)

        def wrong(env, dims):
            out = run(env, dims)
            name = sorted(out)[0]
            out[name] = out[name] + 0.01
            return out
        return wrong


def test_check_blames_the_backend_when_every_program_agrees(monkeypatch) -> None:
    real = backend_registry.get
    monkeypatch.setattr(backend_registry, "get",
                        lambda name, **o: _Faulty() if name == "faulty" else real(name, **o))
    with pytest.raises(rnnc.CheckError, match="'faulty' backend"):
        rnnc.compile(rnnc.cells.gru(3, 4), backend="faulty", check=True)


def test_rnnc_check_environment_variable(monkeypatch) -> None:
    real = backend_registry.get
    monkeypatch.setattr(backend_registry, "get",
                        lambda name, **o: _Faulty() if name == "faulty" else real(name, **o))
    rnnc.compile(rnnc.cells.gru(3, 4), backend="faulty")  # no check by default
    monkeypatch.setenv("RNNC_CHECK", "1")
    with pytest.raises(rnnc.CheckError):
        rnnc.compile(rnnc.cells.gru(3, 4), backend="faulty")
    monkeypatch.setenv("RNNC_CHECK", "0")
    rnnc.compile(rnnc.cells.gru(3, 4), backend="faulty")


def _rounding_cell() -> rnnc.Cell:
    """Rounds ``100 x`` to an integer in float32 (adding 2**23 leaves no fraction bits) and
    keeps it in float64: float32 legitimately differs from float64."""
    c = rnnc.Cell("rounding")
    x, h = c.input("x", 3), c.state("h", 3)
    c.update(h=rnnc.tanh(((x * 100.0 + 2.0**23) - 2.0**23) * 0.01 + h))
    c.output("y", h)
    return c


def _cancelling_cell() -> rnnc.Cell:
    """``(x + 1e4)**2 - 1e8 - 2e4 x`` is ``x**2``: in float32 the cancellation leaves O(1)
    rounding errors, in float64 none that matter."""
    c = rnnc.Cell("cancelling")
    x, h = c.input("x", 3), c.state("h", 3)
    big = x + 1e4
    c.update(h=rnnc.tanh((big * big - 1e8 - 2e4 * x) + h))
    c.output("y", h)
    return c


@pytest.mark.parametrize("make,backend", [
    (_rounding_cell, "numpy"), pytest.param(_rounding_cell, "llvm", marks=pytest.mark.slow),
    (_cancelling_cell, "numpy")],
                         ids=["rounding-numpy", "rounding-llvm", "cancel-numpy"])
def test_check_names_float32_sensitivity_not_a_backend(make, backend: str) -> None:
    # Once, float32 runs were compared with the float64 oracle, and the difference blamed on
    # the backend ("the fault is in the 'llvm' backend ... please report").
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    with pytest.warns(rnnc.CheckWarning, match="sensitive to float32 rounding") as caught:
        rnnc.compile(make(), backend=backend, check=True)
    assert "not a fault of rnnc" in str(caught[0].message)


class _Float32Faulty(NumpyBackend):
    """The NumPy backend with one wrong float32 result: a fault of float32 code alone."""

    name = "faulty32"

    def build(self, program, mode):
        run = super().build(program, mode)
        if program.dtype != "f32":
            return run

        def wrong(env, dims):
            out = run(env, dims)
            name = sorted(out)[0]
            out[name] = out[name] + np.float32(0.01)
            return out
        return wrong


def test_check_blames_the_backend_for_a_float32_fault(monkeypatch) -> None:
    # Compared with the float32 oracle, a float32-only fault still counts as one.
    real = backend_registry.get
    monkeypatch.setattr(backend_registry, "get", lambda name, **o: _Float32Faulty()
                        if name == "faulty32" else real(name, **o))
    with pytest.raises(rnnc.CheckError, match=r"float32: .*'faulty32' backend"):
        rnnc.compile(rnnc.cells.gru(3, 4), backend="faulty32", check=True)


def _decay_cell() -> rnnc.Cell:
    """A decay computed from a parameter alone (``exp``), as RG-LRU and Mamba cells do."""
    c = rnnc.Cell("decay")
    x, h = c.input("x", 3), c.state("h", 3)
    c.update(h=rnnc.tanh(rnnc.exp(c.param("A_log", (3,))) * h + x @ c.param("W", (3, 3))))
    c.output("y", h)
    return c


@pytest.mark.parametrize("backend", [
    {"backend": "numpy"}, pytest.param({"backend": "llvm"}, marks=pytest.mark.slow),
    pytest.param({"backend": "cuda", "emulate": True}, marks=pytest.mark.slow)],
    ids=["numpy", "llvm", "cuda-emulate"])
def test_check_second_order_passes_on_correct_code(backend: dict) -> None:
    if backend["backend"] == "llvm":
        pytest.importorskip("llvmlite")
    rnnc.compile(_decay_cell(), check="second-order", **backend)


def _scale_a_summed_gradient(hoist):
    """hoist-sequence, then (in second-order programs only) a summed result doubled."""
    def wrong(program):
        program = hoist(program)
        if len(program.saves) < 2 or not program.scan.summed:
            return program
        body = program.scan.body.copy()
        name = program.scan.summed[0]
        two = body.add(ops.constant, (), {"value": 2.0})
        body.outputs[name] = body.add(ops.mul, (body.outputs[name], two))
        return dataclasses.replace(program, scan=dataclasses.replace(program.scan, body=body))
    return wrong


def test_check_second_order_names_the_faulty_pass(monkeypatch) -> None:
    passes._load()
    monkeypatch.setitem(passes.PASSES, "hoist-sequence",
                        _scale_a_summed_gradient(passes.PASSES["hoist-sequence"]))
    rnnc.compile(_decay_cell(), check=True)  # first order: untouched
    passes.clear_cache()
    with pytest.raises(rnnc.CheckError, match=r"second-order, float64: .* the first pass whose "
                       r"output disagrees is 'hoist-sequence' \(in the forward.backward "
                       r"pipeline\)"):
        rnnc.compile(_decay_cell(), check="second-order")


def test_check_option_values(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(rnnc_check, "check_function",
                        lambda fn, second_order=False: seen.append(second_order))
    rnnc.compile(_decay_cell(), check="second-order")
    monkeypatch.setenv("RNNC_CHECK", "second-order")
    rnnc.compile(_decay_cell())
    monkeypatch.setenv("RNNC_CHECK", "1")
    rnnc.compile(_decay_cell())
    assert seen == [True, True, False]
    with pytest.raises(rnnc.RnncValueError, match="check must be True, False or "
                                                  "'second-order'.*got 'second'"):
        rnnc.compile(_decay_cell(), check="second")
