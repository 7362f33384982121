"""Backends: each turns an optimized program into a callable over arrays.

A backend is any object with the :class:`Backend` protocol: a ``name``, a ``device`` (None for
a host backend) and ``build(program, mode)``, which returns a :class:`Runner`, called once per
sequence as ``runner(env, dims)`` with the named arrays and the sizes of the symbols ``T`` and
``B`` (``runner.on_device(env, dims)`` for device arrays). A backend's options are its
constructor's keyword arguments (``get(name, **options)``); the constructor checks them.

:data:`REGISTRY` is the one list of backends: a name and a loader returning the backend class.
A backend is one package here whose ``__init__`` defines ``backend_class()`` and one line in
the registry (docs/architecture.md, "How to add a backend").
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.ir import Program


@runtime_checkable
class Runner(Protocol):
    """One built program: the program's results by name for the arrays ``env``.

    A host backend's runners subclass this class for :meth:`on_device`'s default."""

    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]: ...

    def on_device(self, env: Mapping[str, Any], dims: Mapping[str, int]) -> dict[str, Any]:
        """A device call: ``env`` holds the backend device's arrays, and so do the results.

        The API makes device calls only on a backend whose ``device`` is not None, so a host
        runner never gets one; the default refuses it rather than reading device memory."""
        raise RnncTypeError("this runner runs on the host: pass NumPy arrays, or compile with "
                            "backend='cuda' to run device arrays")


@runtime_checkable
class Backend(Protocol):
    """What the API calls on a backend object."""

    name: str
    # How the API adopts and makes device arrays (rnnc.device.Device); None on the host.
    device: Any

    def build(self, program: Program, mode: str) -> Runner:
        """A runner for ``program``, the optimized program of ``mode`` ("inference",
        "forward", "backward" or a second-order mode such as "backward.forward"), built once
        per program."""
        ...


def _package(name: str) -> Callable[[], type]:
    """The loader of a backend in the package ``rnnc.backends.<name>``: its
    ``backend_class()``, imported on first use (a backend's libraries load only if it runs)."""
    return lambda: importlib.import_module(f"rnnc.backends.{name}").backend_class()


# name -> loader of the backend class; the loader raises BackendUnavailable with the reason.
REGISTRY: dict[str, Callable[[], type]] = {
    "numpy": _package("numpy"),
    "llvm": _package("llvm"),
    "cuda": _package("cuda"),
}


def names() -> tuple[str, ...]:
    """The registered backends' names, in registry order."""
    return tuple(REGISTRY)


def backend_class(name: str) -> type:
    """The class of backend ``name``; RnncError if it is unknown or cannot load here."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise RnncValueError(f"unknown backend {name!r}; expected one of {', '.join(names())}")
    return REGISTRY[name]()


def runs_parallel_scan(name: str) -> bool:
    """Whether backend ``name`` runs the parallel-scan pass unless told otherwise: its class's
    ``parallel_scan`` (default True), read without building the backend (no GPU needed)."""
    return bool(getattr(backend_class(name), "parallel_scan", True))


def get(name: str, **options: Any) -> Backend:
    """The backend object called ``name``; raise RnncError if it is unknown or unavailable,
    or if it takes none of ``options`` (the backend's constructor says which)."""
    return backend_class(name)(**options)


def is_backward(mode: str) -> bool:
    """Whether ``mode``'s program is a backward one (it takes cotangents): "backward" and the
    second-order modes made from it ("backward.forward", "backward.backward")."""
    return "backward" in mode.split(".")


def refuse_unknown_options(name: str, init: Callable[..., Any], options: Mapping[str, Any]
                           ) -> None:
    """Refuse ``options`` that the backend ``name``'s constructor ``init`` does not name,
    listing the ones it takes."""
    takes = [p.name for p in inspect.signature(init).parameters.values()
             if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        listed = ", ".join(f"{t}=" for t in takes) or "none"
        raise RnncTypeError(f"backend {name!r} takes no option {unknown[0]!r}; the options it "
                            f"takes are: {listed}")
