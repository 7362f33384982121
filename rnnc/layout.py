"""The flat parameter buffer: every parameter is a view into one 1-D array.

A layout is a list of blocks. A block is one program parameter (a row-major matrix or a
vector); after gate fusion a block may hold several user parameters side by side along its
last axis (``W_ii|W_if|W_ig|W_io`` is one ``(I, 4H)`` block), so the program reads the fused
matrix straight from the buffer and each user parameter is a strided view of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc.device import Device, is_device
from rnnc.errors import RnncTypeError, RnncValueError


@dataclass(frozen=True)
class Block:
    """One program parameter: its name, shape, and the user parameters it holds by column."""

    name: str
    shape: tuple[int, ...]
    members: tuple[tuple[str, int, int], ...]  # (user parameter, first column, end column)

    @property
    def size(self) -> int:
        # math.prod, not np.prod: block_views reads it per block on every call.
        return math.prod(self.shape)


class Layout:
    """Offsets of every block in the flat buffer, and the user parameters' views."""

    def __init__(self, blocks: list[Block], param_shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.blocks = tuple(blocks)
        self.param_shapes = dict(param_shapes)
        self.offsets: dict[str, int] = {}
        offset = 0
        for b in self.blocks:
            self.offsets[b.name] = offset
            offset += b.size
        self.size = offset
        covered = [m[0] for b in self.blocks for m in b.members]
        assert sorted(covered) == sorted(self.param_shapes), (covered, self.param_shapes)

    @classmethod
    def identity(cls, param_shapes: Mapping[str, tuple[int, ...]]) -> Layout:
        """One block per parameter, in declaration order."""
        return cls([Block(n, tuple(s), ((n, 0, s[-1]),)) for n, s in param_shapes.items()],
                   param_shapes)

    def block_views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """The program's parameters as contiguous views of ``flat``."""
        return {b.name: flat[self.offsets[b.name]:self.offsets[b.name] + b.size].reshape(b.shape)
                for b in self.blocks}

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Every user parameter as a view of ``flat`` (writes go through to the buffer)."""
        self.check_flat(flat)
        if flat.dtype not in (np.float32, np.float64):  # views of ints would be parameters
            raise RnncTypeError(f"a flat parameter buffer must be float32 or float64, got "
                                f"{flat.dtype}: make it with fn.pack(params), or convert it "
                                f"with .astype(np.float32)")
        views = self.block_views(flat)
        out = {}
        for b in self.blocks:
            for name, start, stop in b.members:
                out[name] = views[b.name][..., start:stop]
        return {n: out[n] for n in self.param_shapes}

    def pack(self, params: Mapping[str, np.ndarray], dtype=None) -> np.ndarray:
        """Copy user parameters into a new flat buffer."""
        if dtype is None:
            dtype = np.asarray(next(iter(params.values()))).dtype
        flat = np.empty(self.size, dtype=dtype)
        views = self.unpack(flat)
        for name, view in views.items():
            view[...] = params[name]
        return flat

    def check_flat(self, flat: object) -> None:
        if not isinstance(flat, np.ndarray) and not is_device(flat):
            raise RnncTypeError(f"a flat parameter buffer must be a NumPy array, got "
                                f"{type(flat).__name__}")
        if flat.ndim != 1 or flat.shape[0] != self.size:
            raise RnncValueError(f"flat parameter buffer must have shape ({self.size},), "
                                 f"got {flat.shape}")


def device_params(layout: Layout, sizes: Mapping[str, tuple], params: Any, dtype: str,
                  device: Device) -> dict[str, Any]:
    """The program's parameter blocks on ``device``: views of a flat device buffer (no copy),
    or named device arrays packed into a new flat buffer on the device."""
    from rnnc import validate

    want = np.float32 if dtype == "f32" else np.float64
    if not isinstance(params, Mapping):
        flat = device.adopt(params, "flat parameter buffer")
        layout.check_flat(flat)
        if validate.float_dtype(flat, "flat parameter buffer") != dtype:
            raise RnncTypeError(f"flat parameter buffer is {flat.dtype}, the input is "
                                f"{np.dtype(want)}: convert one of them with .astype")
        return layout.block_views(flat)
    host = [n for n, v in params.items() if v is not None and not device.holds(v)]
    if host:
        raise RnncTypeError(f"parameter {host[0]!r} is a host array but other parameters are "
                            f"device arrays: put every parameter on the device (or pass one "
                            f"flat device buffer, fn.pack on the host then uploaded)")
    named = validate.named_arrays("parameter", sizes, params, dtype, None, True, device=device)
    flat = device.zeros((layout.size,), want)
    for name, view in layout.unpack(flat).items():
        view[...] = named[name]
    return layout.block_views(flat)
