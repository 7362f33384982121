"""Checks of everything a caller passes in, done before any backend runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc.errors import RnncTypeError, RnncValueError

FLOAT_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__array_interface__") or hasattr(value, "__array__"):
        return np.asarray(value)
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    raise RnncTypeError(f"{what} must be a NumPy array, got {type(value).__name__}")


def float_dtype(arr: np.ndarray, what: str) -> str:
    """'f32' or 'f64' for a float array; RnncTypeError for anything else."""
    dt = FLOAT_DTYPES.get(arr.dtype)
    if dt is None:
        raise RnncTypeError(f"{what} must be float32 or float64, got {arr.dtype}")
    return dt


def contiguous(arr: np.ndarray, what: str) -> np.ndarray:
    """Inputs are copied to C order when they are not (never written, so a copy is safe)."""
    if not arr.flags.c_contiguous or not arr.flags.aligned:
        arr = np.ascontiguousarray(arr)
    return arr


def sequences(sizes: Mapping[str, tuple], x: Any) -> tuple[dict[str, np.ndarray], str, int, int]:
    """Check the input sequence(s); return them by name with dtype, T and B."""
    names = list(sizes)
    if isinstance(x, Mapping):
        unknown = sorted(set(x) - set(names))
        missing = [n for n in names if n not in x]
        if unknown:
            raise RnncValueError(f"unknown input {unknown[0]!r}; the cell's inputs are {names}")
        if missing:
            raise RnncValueError(f"missing input {missing[0]!r}; the cell's inputs are {names}")
        given = {n: x[n] for n in names}
    elif len(names) == 1:
        given = {names[0]: x}
    else:
        raise RnncTypeError(f"the cell has several inputs {names}: pass x as a dict")
    out: dict[str, np.ndarray] = {}
    dtype = T = B = None
    for name, value in given.items():
        arr = _array(value, f"input {name!r}")
        n = sizes[name][-1]
        if arr.ndim != 3:
            raise RnncValueError(f"input {name!r} must have shape (T, B, {n}), got {arr.shape}")
        if arr.shape[2] != n:
            raise RnncValueError(f"input {name!r} must have {n} features (shape (T, B, {n})), "
                                 f"got {arr.shape}")
        dt = float_dtype(arr, f"input {name!r}")
        if dtype is None:
            dtype, T, B = dt, arr.shape[0], arr.shape[1]
        elif dt != dtype:
            raise RnncTypeError(f"inputs mix dtypes: {name!r} is {arr.dtype}, expected "
                                f"{np.dtype(_np(dtype))}")
        elif arr.shape[:2] != (T, B):
            raise RnncValueError(f"input {name!r} has (T, B) = {arr.shape[:2]}, other inputs "
                                 f"have {(T, B)}")
        if B == 0:
            raise RnncValueError(f"input {name!r} has batch size 0")
        out[name] = contiguous(arr, f"input {name!r}")
    return out, dtype, T, B


def _np(dtype: str):
    return np.float32 if dtype == "f32" else np.float64


def named_arrays(kind: str, sizes: Mapping[str, tuple], given: Any, dtype: str,
                 B: int | None, required: bool) -> dict[str, np.ndarray]:
    """Check a dict of parameters, states or gradients against the expected shapes."""
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise RnncTypeError(f"{kind}s must be a dict of arrays, got {type(given).__name__}")
    unknown = sorted(set(given) - set(sizes))
    if unknown:
        raise RnncValueError(f"unknown {kind} {unknown[0]!r}; expected names {sorted(sizes)}")
    out = {}
    for name, shape in sizes.items():
        if name not in given or given[name] is None:
            if required:
                raise RnncValueError(f"missing {kind} {name!r} (shape {_concrete(shape, B)})")
            continue
        arr = _array(given[name], f"{kind} {name!r}")
        want = _concrete(shape, B)
        if arr.shape != want:
            raise RnncValueError(f"{kind} {name!r} must have shape {want}, got {arr.shape}")
        if float_dtype(arr, f"{kind} {name!r}") != dtype:
            raise RnncTypeError(f"{kind} {name!r} is {arr.dtype}, but the input is "
                                f"{np.dtype(_np(dtype))}; mixing dtypes is an error")
        out[name] = contiguous(arr, f"{kind} {name!r}")
    return out


def _concrete(shape: tuple, B: int | None) -> tuple:
    return tuple(B if d == "B" else d for d in shape)


def lengths(value: Any, T: int, B: int) -> np.ndarray | None:
    """Check per-sequence lengths: integers in 1..T, one per batch entry."""
    if value is None:
        return None
    arr = _array(value, "lengths")
    if arr.dtype.kind not in "iu":
        raise RnncTypeError(f"lengths must be an integer array, got dtype {arr.dtype}")
    if arr.shape != (B,):
        raise RnncValueError(f"lengths must have shape ({B},) (one per sequence), got "
                             f"{arr.shape}")
    if B and (arr.min() < 1 or arr.max() > T):
        bad = int(arr[(arr < 1) | (arr > T)][0])
        raise RnncValueError(f"lengths must be in 1..{T} (T), got {bad}")
    return arr.astype(np.int64)


def mask(lens: np.ndarray, T: int, dtype: str) -> np.ndarray:
    """(T, B, 1) with 1 where step t < length, else 0."""
    return (np.arange(T)[:, None] < lens[None, :]).astype(_np(dtype))[:, :, None]
