"""Backends: each turns an optimized program into a callable over arrays.

A backend is any object with the :class:`Backend` protocol: a ``name`` and ``build(program)``,
which returns a :class:`Runner`, called once per sequence as ``runner(env, dims)`` with the
named arrays and the sizes of the symbols ``T`` and ``B``. A backend's options are its
constructor's keyword arguments (``get(name, **options)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rnnc.errors import BackendUnavailable, RnncValueError
from rnnc.ir import Program

NAMES = ("numpy", "llvm", "cuda")


class Runner(Protocol):
    """One built program: the program's results by name for the arrays ``env``."""

    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]: ...


@runtime_checkable
class Backend(Protocol):
    """What the API calls on a backend object."""

    name: str

    def build(self, program: Program) -> Runner:
        """A runner for ``program``, built once per program."""
        ...


def runs_parallel_scan(name: str) -> bool:
    """Whether backend ``name`` runs the parallel-scan pass unless told otherwise: its class's
    ``parallel_scan`` (default True), read without building the backend (no GPU needed)."""
    if name == "numpy":
        return True
    if name == "llvm":
        from rnnc.backends.llvm.runtime import LlvmBackend as cls
    elif name == "cuda":
        from rnnc.backends.cuda.runtime import CudaBackend as cls
    else:
        raise RnncValueError(f"unknown backend {name!r}; expected one of {', '.join(NAMES)}")
    return bool(getattr(cls, "parallel_scan", True))


def get(name: str, **options: Any) -> Backend:
    """The backend object called ``name``; raise RnncError if it is unknown or unavailable."""
    if name == "numpy":
        from rnnc.backends.numpy.runtime import NumpyBackend

        return NumpyBackend(**options)
    if name == "llvm":
        try:
            from rnnc.backends.llvm.runtime import LlvmBackend
        except ImportError as err:
            raise BackendUnavailable(f"backend 'llvm' needs llvmlite: {err}") from None
        return LlvmBackend(**options)
    if name == "cuda":
        try:
            from rnnc.backends.cuda.runtime import CudaBackend
        except ImportError as err:
            raise BackendUnavailable(f"backend 'cuda' cannot be loaded: {err}") from None

        return CudaBackend(**options)
    raise RnncValueError(f"unknown backend {name!r}; expected one of {', '.join(NAMES)}")
