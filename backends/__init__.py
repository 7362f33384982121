"""Backends: each turns an optimized program into a callable over arrays."""

from __future__ import annotations

from typing import Any

from rnnc.errors import BackendUnavailable, RnncValueError

NAMES = ("numpy", "llvm", "cuda")


def get(name: str, **options: Any):
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
