"""What a compile option means when the caller leaves it out: the default backend, ``check=``.

Both read the process (the environment, a trial run of LLVM) once, here, at the API's edge;
:mod:`rnnc.api` and the layers ask this module rather than reading it themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc import process
from rnnc.errors import RnncValueError

SECOND_ORDER_CHECK = process.SECOND_ORDER_CHECK  # check= that adds double backward


def check_option(check: Any) -> bool | str:
    """``check=`` checked: False, True or "second-order"; None reads ``RNNC_CHECK`` (unset,
    empty or "0" is False, "second-order" adds second order, anything else is True)."""
    if check is None:
        return process.CHECK.value(False)
    if isinstance(check, bool) or check == SECOND_ORDER_CHECK:
        return check
    raise RnncValueError(f"check must be True, False or {SECOND_ORDER_CHECK!r} (which also "
                         f"checks double backward), got {check!r}")


_FASTEST: str | None = None


def fastest_backend() -> str:
    """The default backend on a CPU: "llvm" when it imports and runs a tiny cell correctly
    here, else "numpy" (checked once per process)."""
    global _FASTEST
    if _FASTEST is None:
        from rnnc import cells
        from rnnc.api import Function

        cell = cells.rnn(2, 2)
        params = cell.init_params(seed=0)
        x = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 1, 2)
        try:
            got, _ = Function(cell, "llvm")(x, params)
            want, _ = Function(cell, "numpy")(x, params)
            ok = np.allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
        except Exception:  # noqa: BLE001 - any failure (import, JIT, BLAS) means "not usable"
            ok = False
        _FASTEST = "llvm" if ok else "numpy"
    return _FASTEST


# The options of the CUDA twin that runs device data given to a default-backend function
# (rnnc.device_twin): {} is a GPU through CuPy; {"emulate": True} runs the twin in the CPU
# emulation of the CUDA backend (how the tests run device calls without a GPU).
DEVICE_BACKEND_OPTIONS: dict[str, Any] = {}


def device_backend_options() -> dict[str, Any]:
    """The options ``backend="cuda"`` gets where the default backend runs device data."""
    return dict(DEVICE_BACKEND_OPTIONS)


def resolve_backend(backend: str | None, optimize: bool) -> str:
    """The backend a compile runs on: ``backend``, or the default (the NumPy oracle where
    ``optimize=False``, which runs on NumPy only). The default runs host data; device data
    goes to a CUDA twin of the function (:mod:`rnnc.device_twin`)."""
    if backend is None:  # the oracle is the NumPy interpreter; anything else runs fastest
        backend = fastest_backend() if optimize else "numpy"
    if not optimize and backend != "numpy":
        raise RnncValueError(f"optimize=False is the NumPy oracle: it needs backend='numpy', "
                             f"got backend={backend!r}")
    return backend
