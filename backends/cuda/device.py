"""The CUDA backend's device, as the API sees it (:class:`rnnc.device.Device`).

On a GPU, device arrays are adopted as CuPy arrays without a copy: through
``__cuda_array_interface__`` (``cupy.asarray``) or DLPack (``cupy.from_dlpack``). In emulation
the "device" is host memory: an object exposing ``__cuda_array_interface__`` there points at
host memory, and is adopted as an :class:`EmulatedArray`, a NumPy array that itself exposes the
interface, so results, tapes and gradients of an emulated device call are device arrays too.
An array that is not C-contiguous is copied on the device; nothing goes through the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.device import is_device
from rnnc.errors import RnncTypeError, RnncValueError


class EmulatedArray(np.ndarray):
    """Device memory in emulation: a NumPy array exposing ``__cuda_array_interface__``."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.ctypes.data, not self.flags.writeable),
                "strides": None if self.flags.c_contiguous else self.strides}


class _Interface:
    """A CUDA array interface read as NumPy's array interface (emulation: host pointers); it
    keeps ``owner``, the object whose memory it describes, alive as the array's base."""

    def __init__(self, cai: dict[str, Any], owner: Any) -> None:
        self.owner = owner
        self.__array_interface__ = {k: cai[k] for k in ("shape", "typestr", "data", "strides")
                                    if k in cai} | {"version": 3}


class CudaDevice:
    """Adopts device arrays for one CUDA backend (``emulate``: host memory)."""

    def __init__(self, xp: Any, emulate: bool) -> None:
        self.xp, self.emulate = xp, emulate

    def holds(self, value: Any) -> bool:
        return is_device(value)

    def adopt(self, value: Any, what: str) -> Any:
        """``value`` as this device's array, C-contiguous; RnncError if it cannot be read."""
        if hasattr(value, "requires_grad") and getattr(value, "requires_grad", False):
            raise RnncTypeError(f"{what} is a torch tensor that requires grad; rnnc's array API "
                                f"does not record gradients for autograd: pass tensor.detach(), "
                                f"or use rnnc.torch.RNN inside autograd")
        arr = self._emulated(value, what) if self.emulate else self._cupy(value, what)
        if not arr.flags.c_contiguous:
            arr = self.xp.ascontiguousarray(arr)
            if self.emulate:
                arr = arr.view(EmulatedArray)
        return arr

    def _emulated(self, value: Any, what: str) -> np.ndarray:
        if isinstance(value, EmulatedArray):
            return value
        cai = getattr(value, "__cuda_array_interface__", None)
        if cai is None:
            raise RnncTypeError(f"{what} ({type(value).__name__}) has no "
                                f"__cuda_array_interface__; emulation reads device arrays "
                                f"through it only")
        try:
            return np.asarray(_Interface(cai, value)).view(EmulatedArray)
        except (TypeError, ValueError, KeyError) as err:
            raise RnncTypeError(f"{what} has a malformed __cuda_array_interface__: {err}") \
                from None

    def _cupy(self, value: Any, what: str) -> Any:
        cupy = self.xp
        if isinstance(value, cupy.ndarray):
            arr = value
        else:
            try:
                arr = cupy.asarray(value) if hasattr(value, "__cuda_array_interface__") \
                    else cupy.from_dlpack(value)
            except Exception as err:  # CuPy's own error types vary by version
                raise RnncTypeError(f"{what} ({type(value).__name__}) cannot be read as a "
                                    f"CuPy array: {err}") from None
        here = cupy.cuda.runtime.getDevice()
        if arr.device.id != here:
            raise RnncValueError(f"{what} is on GPU {arr.device.id}, but this call runs on GPU "
                                 f"{here}: move it with cupy.asarray under "
                                 f"cupy.cuda.Device({here}), or run the call under "
                                 f"cupy.cuda.Device({arr.device.id})")
        return arr

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zeroed device array."""
        out = self.xp.zeros(shape, dtype)
        return out.view(EmulatedArray) if self.emulate else out

    def own(self, value: Any) -> Any:
        """``value``, an array ``xp`` computed from this device's arrays, as one of them:
        NumPy functions such as ``concatenate`` return plain arrays, which emulation views as
        device arrays again (CuPy's results already are)."""
        return value.view(EmulatedArray) if self.emulate else value

    def upload(self, value: np.ndarray) -> Any:
        """A new device array holding the host array ``value``: a host-to-device copy."""
        return np.array(value).view(EmulatedArray) if self.emulate else self.xp.asarray(value)

    def copy(self, value: Any) -> Any:
        """A new device array holding the device array ``value``."""
        out = self.xp.array(value, copy=True)
        return out.view(EmulatedArray) if self.emulate else out
