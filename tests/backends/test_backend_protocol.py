"""Every registered backend has the shape of ``rnnc.backends.Backend``, and a backend is one
registry line: a toy backend registered here compiles and trains a cell end to end."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import rnnc
from rnnc import backends
from rnnc.backends.numpy.runtime import NumpyBackend
from rnnc.errors import BackendUnavailable, RnncTypeError, RnncValueError

OPTIONS = {"numpy": {}, "llvm": {}, "cuda": {"emulate": True}}


def _class(name: str) -> type:
    try:
        return backends.backend_class(name)
    except BackendUnavailable as err:  # llvm without llvmlite: the registry says so
        pytest.skip(str(err))


def test_the_registry_lists_the_three_backends() -> None:
    assert backends.names() == ("numpy", "llvm", "cuda")
    assert set(OPTIONS) == set(backends.names())


@pytest.mark.parametrize("name", backends.names())
def test_backend_class_matches_the_protocol(name: str) -> None:
    cls = _class(name)
    assert cls.name == name
    members = {n for n in dir(backends.Backend) if not n.startswith("_")}
    assert members <= set(dir(cls))
    assert list(inspect.signature(cls.build).parameters) == ["self", "program", "mode"]
    assert list(inspect.signature(backends.Backend.build).parameters) == \
        ["self", "program", "mode"]


@pytest.mark.parametrize("name", backends.names())
def test_built_runner_is_called_with_env_and_dims(name: str) -> None:
    _class(name)
    backend = backends.get(name, **OPTIONS[name])
    assert isinstance(backend, backends.Backend)
    cell = rnnc.cells.rnn(2, 3)
    program = cell.program()
    runner = backend.build(program, "inference")
    assert isinstance(runner, backends.Runner)  # __call__ and on_device
    T, B = 2, 1
    rng = np.random.default_rng(0)
    env = {n: rng.standard_normal(tuple({"T": T, "B": B}.get(d, d) for d in ty.shape))
           .astype(np.float32) for n, (_, ty) in program.args.items()}
    results = runner(env, {"T": T, "B": B})
    assert set(results) == set(program.results)
    want = backends.get("numpy").build(program, "inference")(env, {"T": T, "B": B})
    for key, value in want.items():
        np.testing.assert_allclose(results[key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["numpy", "llvm"])
def test_a_host_backend_has_no_device_and_its_runner_refuses_device_calls(name: str) -> None:
    cls = _class(name)
    assert cls.device is None
    runner = backends.get(name).build(rnnc.cells.rnn(2, 3).program(), "inference")
    with pytest.raises(RnncTypeError, match="runs on the host.*backend='cuda'"):
        runner.on_device({}, {"T": 1, "B": 1})


def test_unknown_backends_and_options_are_refused_by_name() -> None:
    with pytest.raises(RnncValueError, match="unknown backend 'tpu'; expected one of numpy, "
                                             "llvm, cuda"):
        backends.get("tpu")
    with pytest.raises(RnncValueError, match="unknown backend"):
        backends.get(["numpy"])  # not a name at all
    with pytest.raises(RnncValueError, match="backend 'numpy' takes no options"):
        backends.get("numpy", threads=2)
    _class("llvm")
    with pytest.raises(RnncTypeError, match="backend 'llvm' takes no option 'emulate'; the "
                                            "options it takes are: blas=, threads="):
        backends.get("llvm", emulate=True)


def test_cuda_reads_the_mode_it_is_given_not_the_program() -> None:
    # The same forward program: as "inference" its steps fuse (emulation's "auto" is
    # "always"); built as a backward mode, they keep their GEMMs.
    program = rnnc.compile(rnnc.cells.lstm(3, 4), backend="numpy").program("inference")
    cuda = backends.get("cuda", emulate=True)
    assert "fused" in cuda.build(program, "inference").hosts
    for mode in ("backward", "backward.forward", "forward.backward"):
        assert set(cuda.build(program, mode).hosts) == {"gemm"}
    assert backends.is_backward("backward.backward") and not backends.is_backward("forward")


class ToyBackend(NumpyBackend):
    """A new backend: the interpreter under another name, with one option of its own, that
    records the modes it is asked to build."""

    name = "toy"

    def __init__(self, label: str = "toy", **options: object) -> None:
        backends.refuse_unknown_options(self.name, ToyBackend.__init__, options)
        super().__init__()
        self.label = label
        self.modes: list[str] = []

    def build(self, program, mode):
        self.modes.append(mode)
        return super().build(program, mode)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """ToyBackend registered with one line, and removed after the test."""
    monkeypatch.setitem(backends.REGISTRY, "toy", lambda: ToyBackend)


def test_a_backend_registered_with_one_line_runs_end_to_end(toy) -> None:
    assert backends.names()[-1] == "toy"
    cell = rnnc.cells.gru(2, 3)
    params = cell.init_params(seed=0, dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((4, 2, 2))
    fn = rnnc.compile(cell, backend="toy", label="mine")
    assert isinstance(fn.backend, ToyBackend) and fn.backend.label == "mine"
    oracle = rnnc.compile(cell, optimize=False)
    got, want = fn(x, params), oracle(x, params)
    np.testing.assert_allclose(got[0]["y"], want[0]["y"], rtol=1e-12, atol=1e-12)
    d_y = {"y": np.ones_like(want[0]["y"])}
    grads = fn.backward(fn.forward(x, params)[2], d_y)
    want_grads = oracle.backward(oracle.forward(x, params)[2], d_y)
    for name in cell.sizes("param"):
        np.testing.assert_allclose(grads.params[name], want_grads.params[name],
                                   rtol=1e-10, atol=1e-12)
    assert fn.backend.modes == ["inference", "forward", "backward"]  # the API says the mode
    assert rnnc.RNN("gru", 2, 3, backend="toy").backend == "toy"  # the layers know it too
    with pytest.raises(RnncTypeError, match="backend 'toy' takes no option 'threads'; the "
                                            "options it takes are: label="):
        rnnc.compile(cell, backend="toy", threads=2)


def test_a_removed_backend_is_unknown_again() -> None:
    assert "toy" not in backends.names()
    with pytest.raises(RnncValueError, match="unknown backend 'toy'"):
        rnnc.compile(rnnc.cells.rnn(2, 3), backend="toy")
