"""The default backend on device data: a function's CUDA twin, and the routing to it.

``rnnc.compile(cell)`` (``backend=None``) compiles for the fastest host backend
(:func:`rnnc.settings.fastest_backend`). A call whose input sequence is a device array (CuPy,
a CUDA tensor: :func:`rnnc.device.is_device`) runs instead on the function's *device twin*:
the same cell compiled with ``backend="cuda"`` (same ``reverse``, ``parallel_scan`` and
``check``; the host backend's own options stay with it, and the twin gets
:func:`rnnc.settings.device_backend_options`), built on the first device call, once, and kept.
The twin records the tapes of those calls, and the function hands such a tape back to it, so
``backward`` and ``double_backward`` take either kind of tape. Where the CUDA backend cannot
run (no CuPy, no GPU), a device call raises the host backend's error, which says how to
convert the data, with the reason.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rnnc import process, settings
from rnnc.device import device_of, is_device
from rnnc.errors import BackendUnavailable, RnncTypeError

Method = TypeVar("Method", bound=Callable[..., Any])


class DeviceTwin:
    """The CUDA twin of one default-backend function: built on first use, once."""

    def __init__(self, cell: Any, reverse: bool, parallel_scan: bool | None,
                 check: bool | str | None, precision: str = "fp32") -> None:
        self._spec = dict(reverse=reverse, parallel_scan=parallel_scan, check=check,
                          precision=precision)
        self._cell = cell
        self._lock = process.Lock()  # fork-safe: a child never inherits it held
        self.function: Any = None  # the twin (an rnnc.Function), once built

    @classmethod
    def of(cls, backend: str | None, optimize: bool, cell: Any, reverse: bool,
           parallel_scan: bool | None, check: bool | str | None, precision: str = "fp32"
           ) -> DeviceTwin | None:
        """The twin of a function compiled with these arguments: only the default backend
        (``backend=None``) has one; the oracle (``optimize=False``) does not."""
        if backend is None and optimize:
            return cls(cell, reverse, parallel_scan, check, precision)
        return None

    def get(self) -> Any:
        """The twin, built now if it is not yet; raises BackendUnavailable where CUDA cannot
        run (not remembered: a later call tries again)."""
        with self._lock:  # one build, even when threads make their first device calls at once
            if self.function is None:
                from rnnc.api import Function

                self.function = Function(self._cell, "cuda", **self._spec,
                                         **settings.device_backend_options())
            return self.function


def twin_for_data(fn: Any, x: Any) -> Any:
    """The function a call of ``fn`` on input sequence(s) ``x`` runs on: its device twin when
    ``x`` is device data and ``fn`` has one, else None (``fn`` itself runs). Raises the host
    backend's RnncTypeError, with the reason, where the twin cannot be built here."""
    holder: DeviceTwin | None = getattr(fn, "_device_twin", None)
    values = x.values() if isinstance(x, Mapping) else (x,)
    if holder is None or not any(is_device(v) for v in values):
        return None
    try:
        return holder.get()
    except BackendUnavailable as why:
        try:
            device_of(fn.backend, x)  # the host backend's own message: how to convert
        except RnncTypeError as err:
            raise RnncTypeError(f"{err}; the default backend runs device arrays on backend "
                                f"'cuda', which cannot run here: {why}") from None
        raise


def twin_of_tape(fn: Any, tape: Any) -> Any:
    """``fn``'s device twin when it recorded ``tape``, else None."""
    holder: DeviceTwin | None = getattr(fn, "_device_twin", None)
    twin = None if holder is None else holder.function
    return twin if twin is not None and getattr(tape, "owner", None) is twin else None


def _first(args: tuple[Any, ...], kwargs: Mapping[str, Any], name: str) -> Any:
    return args[0] if args else kwargs.get(name)


def routes_data(method: Method) -> Method:
    """``method(fn, x, ...)`` runs on ``fn``'s device twin when ``x`` is device data."""
    @functools.wraps(method)
    def routed(fn: Any, *args: Any, **kwargs: Any) -> Any:
        twin = twin_for_data(fn, _first(args, kwargs, "x"))
        return method(fn if twin is None else twin, *args, **kwargs)
    return routed  # type: ignore[return-value]


def routes_tapes(method: Method) -> Method:
    """``method(fn, tape, ...)`` runs on ``fn``'s device twin when the twin recorded ``tape``."""
    @functools.wraps(method)
    def routed(fn: Any, *args: Any, **kwargs: Any) -> Any:
        twin = twin_of_tape(fn, _first(args, kwargs, "tape"))
        return method(fn if twin is None else twin, *args, **kwargs)
    return routed  # type: ignore[return-value]
