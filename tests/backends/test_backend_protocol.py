"""Every backend class has the shape of ``rnnc.backends.Backend``: what the API calls on it."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

import rnnc
from rnnc import backends

CLASSES = {"numpy": ("rnnc.backends.numpy.runtime", "NumpyBackend"),
           "llvm": ("rnnc.backends.llvm.runtime", "LlvmBackend"),
           "cuda": ("rnnc.backends.cuda.runtime", "CudaBackend")}
OPTIONS = {"numpy": {}, "llvm": {}, "cuda": {"emulate": True}}


def _class(name: str) -> type:
    module, attribute = CLASSES[name]
    if name == "llvm":
        pytest.importorskip("llvmlite")
    return getattr(importlib.import_module(module), attribute)


@pytest.mark.parametrize("name", backends.NAMES)
def test_backend_class_matches_the_protocol(name: str) -> None:
    cls = _class(name)
    assert cls.name == name
    members = {n for n in dir(backends.Backend) if not n.startswith("_")}
    assert members <= set(dir(cls))
    want = list(inspect.signature(backends.Backend.build).parameters)
    assert list(inspect.signature(cls.build).parameters) == want


@pytest.mark.parametrize("name", backends.NAMES)
def test_built_runner_is_called_with_env_and_dims(name: str) -> None:
    _class(name)
    backend = backends.get(name, **OPTIONS[name])
    assert isinstance(backend, backends.Backend)
    cell = rnnc.cells.rnn(2, 3)
    program = cell.program()
    runner = backend.build(program)
    T, B = 2, 1
    rng = np.random.default_rng(0)
    env = {n: rng.standard_normal(tuple({"T": T, "B": B}.get(d, d) for d in ty.shape))
           .astype(np.float32) for n, (_, ty) in program.args.items()}
    results = runner(env, {"T": T, "B": B})
    assert set(results) == set(program.results)
