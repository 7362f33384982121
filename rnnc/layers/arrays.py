"""The array operations of ``rnnc.RNN``'s glue, on the host or on a device, with its copies.

The glue between a layer's compiled cells (stacking the directions, zeroing the steps past
each sequence's length, dropout between layers, batch-first transposes, gradient sums) is
written once against :class:`Arrays`. For a host call its array module is NumPy; for a device
call (``docs/device-calls.md``) it is the device's (``device.xp``: CuPy on a GPU, NumPy over
``EmulatedArray`` in emulation), and every array it makes is one of the device's, so a layer's
intermediates, outputs, tape and gradients never leave the device.

What the glue itself copies from the host to the device is counted in ``transfers`` (the
compiled cells count their own copies in their runners): host states or cotangents given to a
device call, the lengths (``B`` integers, for the mask of the steps past each length), each
dropout mask's keep/drop bits, and host parameters the first time they are seen (see
``rnnc.layers.run``). Nothing is ever copied back to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.device import Device


class Arrays:
    """Array operations on the host (``device`` None) or on ``device``, counting uploads."""

    def __init__(self, device: Device | None = None) -> None:
        self.device = device
        self.xp = np if device is None else device.xp
        self.transfers = {"to_device": 0, "to_host": 0}

    def own(self, value: Any) -> Any:
        """``value``, made by ``xp`` from this side's arrays, as one of this side's arrays."""
        return value if self.device is None else self.device.own(value)

    def upload(self, value: np.ndarray) -> Any:
        """The host array ``value`` on this side: itself on the host, else a counted copy."""
        if self.device is None:
            return value
        self.transfers["to_device"] += value.nbytes
        return self.device.upload(np.ascontiguousarray(value))

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zeroed array of this side."""
        return np.zeros(shape, dtype) if self.device is None else self.device.zeros(shape, dtype)

    def zeros_like(self, value: Any) -> Any:
        """A zeroed array of this side shaped like ``value``."""
        return self.zeros(tuple(value.shape), value.dtype)

    def concatenate(self, parts: list[Any], axis: int) -> Any:
        """``parts`` joined along ``axis``, a new array of this side."""
        return self.own(self.xp.concatenate(parts, axis=axis))

    def contiguous(self, value: Any) -> Any:
        """``value`` in C order (itself when it already is)."""
        return self.own(self.xp.ascontiguousarray(value))

    def valid_steps(self, T: int, lens: np.ndarray | None) -> Any:
        """A ``(T, B, 1)`` mask, true inside each sequence's length (None: all valid); on a
        device, made there from the uploaded lengths."""
        if lens is None:
            return None
        steps = self.xp.arange(T)[:, None] < self.upload(lens)[None, :]
        return self.own(steps[:, :, None])

    def zero_past_lengths(self, value: Any, valid: Any) -> Any:
        """``value`` with the steps past each sequence's length set to zero."""
        if valid is None:
            return value
        return self.own(self.xp.where(valid, value, 0).astype(value.dtype, copy=False))

    def dropout_mask(self, shape: tuple[int, ...], p: float, dtype: np.dtype,
                     rng: np.random.Generator) -> Any:
        """Inverted dropout: zero with probability ``p``, else ``1 / (1 - p)``.

        The keep/drop draw is made on the host from ``rng`` on either side, so a seed gives the
        same mask to a host call and a device call; a device call uploads the draw as one byte
        per element and scales it on the device (the same division, so the same values)."""
        keep = rng.random(shape) >= p
        if p >= 1.0:
            return self.zeros(shape, dtype)  # torch's dropout=1 zeroes everything
        return self.own(self.upload(keep).astype(dtype) / dtype.type(1.0 - p))
