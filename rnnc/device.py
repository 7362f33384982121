"""Which arrays live on a GPU, and the interface a backend with a device gives the API.

A *device array* is any object that is not a NumPy array and exposes CUDA memory through a
standard protocol: ``__cuda_array_interface__`` (CuPy, Numba, PyTorch CUDA tensors) or
``__dlpack__`` with a CUDA ``__dlpack_device__`` (JAX, PyTorch). A call whose input sequence is
a device array is a *device call* (``docs/device-calls.md``): the backend must have a device
(``backend.device``, a :class:`Device`), every array of the call is validated through it, and
results, tapes and gradients stay on the device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from rnnc.errors import RnncTypeError

# DLPack device types of CUDA memory: kDLCUDA, kDLCUDAHost (pinned), kDLCUDAManaged.
DLPACK_CUDA = (2, 3, 13)


def is_device(value: Any) -> bool:
    """Whether ``value`` is a device array (see the module docstring)."""
    if hasattr(value, "__cuda_array_interface__"):
        return True
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        try:
            return int(value.__dlpack_device__()[0]) in DLPACK_CUDA
        except Exception:  # a foreign object whose method misbehaves: not ours to judge
            return False
    return False


class Device(Protocol):
    """What a backend with a device gives the API (``backend.device``)."""

    xp: Any  # the array module of its arrays (CuPy; NumPy in emulation)
    emulate: bool  # whether its memory is host memory (the CPU emulation of a GPU)

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is a device array this device can read."""
        ...

    def adopt(self, value: Any, what: str) -> Any:
        """``value`` as one of this device's arrays, C-contiguous, without a host copy."""
        ...

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zeroed device array."""
        ...

    def own(self, value: Any) -> Any:
        """``value``, an array ``xp`` computed from this device's arrays, as one of them."""
        ...

    def upload(self, value: np.ndarray) -> Any:
        """A new device array holding the host array ``value`` (a host-to-device copy)."""
        ...


def device_of(backend: Any, x: Any) -> Device | None:
    """The device of a call whose input sequence(s) are ``x``: the backend's when ``x`` is a
    device array (every input of a multi-input cell alike), None for a host call."""
    values = list(x.values()) if isinstance(x, Mapping) else [x]
    on_device = [is_device(v) for v in values]
    if not any(on_device):
        return None
    device = getattr(backend, "device", None)
    if device is None:
        raise RnncTypeError(
            f"the input is a device array ({type(values[on_device.index(True)]).__name__}), "
            f"but backend {backend.name!r} runs on the host: pass a NumPy array (x.get() for "
            f"CuPy, x.cpu().numpy() for torch), or pass backend='cuda' "
            f"(rnnc.compile(cell, backend='cuda'), rnnc.RNN(..., backend='cuda')) to run on "
            f"the GPU")
    if not all(on_device):
        raise RnncTypeError("the inputs mix device arrays and host arrays: put every input "
                            "sequence on the same side")
    return device

