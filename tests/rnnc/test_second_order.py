"""Second derivatives (``Function.double_backward``) against central differences of the
first-order gradient, and the errors of its arguments."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from tests.numeric import directional_second_order


def _parameter_nonlinear_cell() -> rnnc.Cell:
    """A cell whose step applies nonlinear functions to parameters alone (RG-LRU's and
    Mamba's decays ``exp(A_log)``, ``softplus(-lam)``, ``sigmoid(lam)``; ``lam * lam``)."""
    c = rnnc.Cell("decays")
    x, h = c.input("x", 2), c.state("h", 2)
    lam, a_log = c.param("lam", (2,)), c.param("A_log", (2,))
    decay = rnnc.exp(a_log) * rnnc.softplus(-lam) * rnnc.sigmoid(lam) * (lam * lam)
    c.update(h=rnnc.tanh(decay * h + x))
    c.output("y", h * h)
    return c


def _arguments(cell: rnnc.Cell, T: int, B: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return {"x": {"x": rng.standard_normal((T, B, 2))},
            "params": cell.init_params(seed=1, dtype=np.float64),
            "states": {"h": rng.uniform(-0.5, 0.5, (B, 2))},
            "d_outputs": {"y": rng.standard_normal((T, B, 2))},
            "d_states": {"h": rng.standard_normal((B, 2))}}


@pytest.mark.parametrize("backend,options,lengths", [
    ("numpy", {}, None), ("numpy", {}, np.array([3, 1])),
    ("llvm", {"cache_dir": False}, None),
    # Six g++ compiles, about 10 s.
    pytest.param("cuda", {"emulate": True}, np.array([2, 3]), marks=pytest.mark.slow)],
    ids=["numpy", "numpy-lengths", "llvm", "cuda-emulate-lengths"])
def test_double_backward_through_parameter_nonlinearities(backend, options, lengths) -> None:
    # Once, hoist-sequence made a loop constant of a per-step value without batch rows (a saved
    # per-step sum over the rows times the parameter's cotangent): an AssertionError.
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    cell = _parameter_nonlinear_cell()
    fn = rnnc.compile(cell, backend=backend, **options)
    for group, got, want in directional_second_order(fn, _arguments(cell, 3, 2), lengths, 7):
        assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), (group, got, want)


@pytest.mark.parametrize("argument,value,message", [
    ("g_params", {"lamb": np.ones(2)}, r"unknown g_params cotangent 'lamb'; expected names "
                                       r"\['A_log', 'lam'\]"),
    ("g_params", {"lam": np.ones(3)}, r"g_params cotangent 'lam' must have shape \(2,\), "
                                      r"got \(3,\)"),
    ("g_params", [np.ones(2)], "g_params cotangents must be a dict"),
    ("g_x", {"y": np.ones((3, 2, 2))}, r"unknown g_x cotangent 'y'; expected names \['x'\]"),
    ("g_x", {"x": np.ones((3, 1, 2))}, r"g_x cotangent 'x' must have shape \(3, 2, 2\)"),
    ("g_states", {"c": np.ones((2, 2))}, r"unknown g_states cotangent 'c'"),
    ("g_states", {"h": np.ones(2)}, r"g_states cotangent 'h' must have shape \(2, 2\)"),
    ("d_outputs", {"z": np.ones((3, 2, 2))}, r"unknown output gradient 'z'"),
    ("d_states", {"h": np.ones((2, 3))}, r"state gradient 'h' must have shape \(2, 2\)")],
    ids=["g_params-unknown", "g_params-shape", "g_params-type", "g_x-unknown", "g_x-shape",
         "g_states-unknown", "g_states-shape", "d_outputs-unknown", "d_states-shape"])
def test_double_backward_refuses_unknown_names_and_wrong_shapes(argument, value, message
                                                                ) -> None:
    # A misspelled g_params key was a zero cotangent, a wrong shape a raw ValueError.
    cell = _parameter_nonlinear_cell()
    fn = rnnc.compile(cell)
    z = _arguments(cell, 3, 2)
    tape = fn.forward(z["x"]["x"], z["params"], states=z["states"])[2]
    args = {"d_outputs": z["d_outputs"], "d_states": None, "g_x": None, "g_params": None,
            "g_states": None, argument: value}
    with pytest.raises(rnnc.RnncError, match=message):
        fn.double_backward(tape, **args)
