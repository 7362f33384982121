"""The default backend: LLVM on a CPU (NumPy where LLVM cannot run), the same in
``rnnc.compile``, ``rnnc.RNN`` and ``rnnc.torch.RNN``; NumPy stays the named oracle. Device
data runs on CUDA (tests/rnnc/test_default_backend_device.py); without CUDA it gets an error
that says what to do."""

from __future__ import annotations

import inspect
from collections import OrderedDict

import numpy as np
import pytest

import rnnc
from rnnc import api, backends, settings
from rnnc.errors import RnncTypeError
from rnnc.layers import rnn as rnn_layer


def test_compile_layer_and_torch_module_share_the_default() -> None:
    torch_module = pytest.importorskip("rnnc.interop.torch")
    for entry in (rnnc.compile, api.Function, rnnc.RNN, torch_module.RNN):
        assert inspect.signature(entry).parameters["backend"].default is None, entry
    assert settings.fastest_backend() == "llvm"  # llvmlite is a core dependency
    assert rnnc.compile(rnnc.cells.gru(2, 3)).backend.name == "llvm"
    assert rnnc.RNN("gru", 2, 3).backend == "llvm"
    assert torch_module.RNN("GRU", 2, 3).layer.backend == "llvm"


def test_the_default_runs_the_cell_as_the_oracle_does() -> None:
    cell = rnnc.cells.gru(2, 3)
    params = cell.init_params(seed=0, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((4, 2, 2))
    oracle = rnnc.compile(cell, optimize=False)  # no backend: the NumPy oracle
    assert oracle.backend.name == "numpy"
    got, want = rnnc.compile(cell)(x, params)[0]["y"], oracle(x, params)[0]["y"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_without_a_working_llvm_the_default_is_numpy(monkeypatch) -> None:
    real = backends.get

    def no_llvm(name, **options):
        if name == "llvm":
            raise rnnc.BackendUnavailable("backend 'llvm' needs llvmlite")
        return real(name, **options)

    monkeypatch.setattr(settings, "_FASTEST", None)
    monkeypatch.setattr(backends, "get", no_llvm)
    assert rnnc.compile(rnnc.cells.rnn(2, 3)).backend.name == "numpy"
    monkeypatch.setattr(settings, "_FASTEST", None)  # the next test probes again


class FakeDeviceArray:
    """Looks like CuPy to rnnc's device check: a CUDA array interface."""

    __cuda_array_interface__ = {"shape": (4, 2, 2), "typestr": "<f4", "version": 3,
                                "data": (0, False)}


def test_without_cuda_device_arrays_into_the_default_backend_say_to_pass_cuda(
        monkeypatch) -> None:
    real = backends.get

    def no_cuda(name, **options):
        if name == "cuda":
            raise rnnc.BackendUnavailable("backend 'cuda' needs CuPy and an NVIDIA GPU")
        return real(name, **options)

    monkeypatch.setattr(backends, "get", no_cuda)
    monkeypatch.setattr(rnn_layer, "_CACHE", OrderedDict())  # no twin built by another test
    cell = rnnc.cells.rnn(2, 3)
    why = r"runs device arrays on backend 'cuda', which cannot run here: .*needs CuPy"
    with pytest.raises(RnncTypeError, match=rf"FakeDeviceArray.*backend='cuda'.*{why}"):
        rnnc.compile(cell)(FakeDeviceArray(), cell.init_params(seed=0))
    with pytest.raises(RnncTypeError, match=rf"backend='cuda'.*{why}"):
        rnnc.RNN("rnn_tanh", 2, 3)(FakeDeviceArray())


def test_the_oracle_has_no_device_twin() -> None:
    cell = rnnc.cells.rnn(2, 3)
    with pytest.raises(RnncTypeError, match=r"backend 'numpy' runs on the host"):
        rnnc.compile(cell, optimize=False)(FakeDeviceArray(), cell.init_params(seed=0))
