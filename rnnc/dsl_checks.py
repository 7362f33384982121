"""The checks of a cell's declarations: names, sizes, the memory a parameter's
initialization needs and what its initializer returns."""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rnnc.errors import CellError
from rnnc.validate import physical_memory


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise CellError(f"{what} name must be a Python identifier, got {name!r}")
    return name


# Sizes are below 2**31: BLAS and CUDA index with 32-bit integers (docs/inputs.md).
MAX_SIZE = 2**31 - 1


def check_size(size: Any, what: str) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise CellError(f"{what} size must be a positive int, got {size!r}")
    if size > MAX_SIZE:
        raise CellError(f"{what} size {size} is too large: sizes must be at most 2**31 - 1 = "
                        f"{MAX_SIZE} (BLAS and CUDA index with 32-bit integers); one float32 "
                        f"row of this size alone needs {4 * int(size):,} bytes")
    return int(size)


def check_allocatable(name: str, shape: tuple[int, ...], dtype: Any) -> None:
    """Raise CellError, naming the shape and the bytes, for a parameter too big to allocate."""
    need = math.prod(shape) * max(np.dtype(dtype).itemsize, 8)  # drawn as float64 first
    memory = physical_memory()
    if memory is not None and need > memory:
        raise CellError(f"parameter {name!r} of shape {shape} needs {need:,} bytes to "
                        f"initialize, more than this machine's {memory:,} bytes of memory: "
                        f"declare a smaller size")


def initial_values(name: str, init: Callable | float | None, rng: np.random.Generator,
                   shape: tuple[int, ...], bound: float) -> np.ndarray:
    """Parameter ``name``'s first values: uniform in ±``bound`` for ``init=None``, a number
    everywhere, or what ``init(rng, shape)`` returns: real numbers of ``shape`` (strings,
    objects, complex numbers, booleans and ragged lists are mistakes, not values)."""
    if init is None:
        return rng.uniform(-bound, bound, size=shape)
    if not callable(init):
        return np.full(shape, float(init))
    what = f"init of parameter {name!r}"
    try:
        values = init(rng, shape)
    except Exception as error:
        raise CellError(f"{what} failed: {type(error).__name__}: {error} (it is called as "
                        f"init(rng, shape), with a numpy Generator and the shape {shape}, "
                        f"and returns an array of that shape)") from error
    try:
        arr = np.asarray(values)
    except ValueError as error:  # ragged nested lists
        raise CellError(f"{what} returned {type(values).__name__} that is not an array "
                        f"({error}); expected a float array of shape {shape}") from None
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer)
                                     or np.issubdtype(arr.dtype, np.floating)):
        raise CellError(f"{what} returned {type(values).__name__} of dtype {arr.dtype}; "
                        f"expected real numbers: a float array of shape {shape}")
    if arr.shape != shape:
        raise CellError(f"{what} returned shape {arr.shape}, expected {shape}")
    return arr
