"""Checks of everything a caller passes in, done before any backend runs.

Every bad input becomes an :class:`~rnnc.errors.RnncError` that names the input and the fix.
Inputs that are merely awkward are converted instead, so that no backend ever sees them: a
non-native byte order (``'>f4'``) becomes native, and a non-contiguous or misaligned array is
copied (inputs are never written, so a copy is safe). ``docs/inputs.md`` lists the rules.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc.device import Device, is_device
from rnnc.errors import RnncTypeError, RnncValueError

FLOAT_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "requires_grad")


def _from_torch(t: Any, what: str) -> np.ndarray:
    """A CPU float tensor without autograd history as a NumPy view; anything else refused
    with the conversion that fixes it."""
    if t.requires_grad:
        raise RnncTypeError(f"{what} is a torch tensor that requires grad; rnnc's NumPy API does "
                            f"not record gradients for autograd: pass tensor.detach().numpy(), or "
                            f"use rnnc.torch.RNN inside autograd")
    if str(t.dtype) not in ("torch.float32", "torch.float64"):
        raise RnncTypeError(f"{what} is a {t.dtype} tensor; rnnc computes in float32 or float64 "
                            f"(a bfloat16 tensor: compile with precision='bf16'): pass "
                            f"tensor.float().numpy()")
    if t.device.type != "cpu":
        raise RnncTypeError(f"{what} is a torch tensor on {t.device}; rnnc's NumPy API takes "
                            f"host arrays: pass tensor.cpu().numpy(), or use rnnc.torch.RNN")
    return t.numpy()


def as_array(value: Any, what: str, device: Device | None = None) -> Any:
    """``value`` as a native-byte-order NumPy array, or an RnncError naming ``what`` and the
    conversion that fixes it (a ragged list, a torch tensor that requires grad, ...). In a
    device call (``device``), a device array becomes one of ``device``'s arrays."""
    if device is not None and device.holds(value):
        return device.adopt(value, what)
    if isinstance(value, np.ndarray):
        return native(value)
    if is_device(value) and not _is_torch_tensor(value):
        raise RnncTypeError(f"{what} is a device array ({type(value).__name__}), but this call "
                            f"runs on the host: pass a host array (.get() for CuPy), or pass "
                            f"the input sequence on the device too, with backend='cuda'")
    if _is_torch_tensor(value):
        return native(_from_torch(value, what))
    if isinstance(value, (list, tuple)):
        try:
            return native(np.asarray(value))
        except ValueError:
            raise RnncValueError(f"{what} is a ragged nested list (rows of different lengths); "
                                 f"pass a rectangular array: pad shorter sequences to T steps "
                                 f"and give their lengths with lengths=") from None
    if hasattr(value, "__array_interface__") or hasattr(value, "__array__"):
        try:
            return native(np.asarray(value))
        except (TypeError, ValueError, RuntimeError) as err:
            raise RnncTypeError(f"{what} ({type(value).__name__}) cannot become a NumPy array: "
                                f"{err}; pass a NumPy array") from None
    raise RnncTypeError(f"{what} must be a NumPy array, got {type(value).__name__}")


def native(arr: np.ndarray) -> np.ndarray:
    """``arr`` in the machine's byte order (a converted copy of a ``'>f4'`` array)."""
    if not arr.dtype.isnative:
        return arr.astype(arr.dtype.newbyteorder("="))
    return arr


def float_dtype(arr: np.ndarray, what: str) -> str:
    """'f32' or 'f64' for a float array; RnncTypeError for anything else."""
    dt = FLOAT_DTYPES.get(arr.dtype)
    if dt is None:
        hint = " (or compile with precision='bf16')" if arr.dtype.name == "bfloat16" else ""
        raise RnncTypeError(f"{what} must be float32 or float64, got {arr.dtype}: convert it "
                            f"with .astype(np.float32){hint}")
    return dt


def contiguous(arr: np.ndarray, what: str) -> np.ndarray:
    """Inputs are copied to C order when they are not, or when misaligned (never written, so a
    copy is safe; a fresh array is aligned)."""
    if isinstance(arr, np.ndarray) and (not arr.flags.c_contiguous or not arr.flags.aligned):
        arr = np.array(arr, order="C", copy=True)
    return arr


def sequences(sizes: Mapping[str, tuple], x: Any, device: Device | None = None
              ) -> tuple[dict[str, np.ndarray], str, int, int]:
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
        arr = as_array(value, f"input {name!r}", device)
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
                                f"{np.dtype(_np(dtype))}: convert it with "
                                f".astype(np.{np.dtype(_np(dtype))})")
        elif arr.shape[:2] != (T, B):
            raise RnncValueError(f"input {name!r} has (T, B) = {arr.shape[:2]}, other inputs "
                                 f"have {(T, B)}")
        if B == 0:
            raise RnncValueError(f"input {name!r} has batch size 0")
        out[name] = contiguous(arr, f"input {name!r}")
    return out, dtype, T, B


def _np(dtype: str):
    return np.float32 if dtype == "f32" else np.float64


def params_dtype(x: Any, params: Any, dtype: str) -> None:
    """Raise, naming the likely cause and both fixes, when the parameters' dtype is not the
    input's (the input's dtype is the program's)."""
    if isinstance(params, Mapping):
        pname, first = next(iter(params.items()), (None, None))
        other = f"parameter {pname!r} is"
    else:
        first, other = params, "the flat parameter buffer is"
    have = FLOAT_DTYPES.get(getattr(first, "dtype", None))
    if have is None or have == dtype:
        return  # no parameters or not float arrays: the per-parameter checks say what is wrong
    name, value = next(iter(x.items())) if isinstance(x, Mapping) else ("x", x)
    got = np.dtype(_np(dtype)).name
    raise RnncTypeError(dtype_mismatch(
        name, value, got, np.dtype(_np(have)).name, other,
        f"{got} parameters (cell.init_params(dtype=np.{got}), or p.astype(np.{got}) for each "
        f"parameter p)"))


def dtype_mismatch(name: str, value: Any, got: str, want: str, other: str, other_fix: str
                   ) -> str:
    """The message for input ``name`` of dtype ``got`` meeting ``other`` ("parameter 'W' is")
    of dtype ``want``: the cause (a Python list becomes float64) and the two fixes."""
    if isinstance(value, (list, tuple)):
        cause = f"{name} is a Python list, converted to {got}"
        fix = f"pass np.asarray({name}, np.{want})"
    else:
        cause = f"{name} is {got}"
        fix = f"pass {name}.astype(np.{want})"
    return f"{cause}, but {other} {want}: {fix}, or use {other_fix}"


def named_arrays(kind: str, sizes: Mapping[str, tuple], given: Any, dtype: str,
                 B: int | None, required: bool, T: int | None = None,
                 device: Device | None = None) -> dict[str, np.ndarray]:
    """Check a dict of parameters, states or gradients against the expected shapes.

    ``T``, when given, is the input's first axis: a state whose batch is ``T`` rather than
    ``B`` points at a batch-first input, and the message says so."""
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
        arr = as_array(given[name], f"{kind} {name!r}", device)
        want = _concrete(shape, B)
        if arr.shape != want:
            hint = ""
            if T is not None and T != B and arr.shape == _concrete(shape, T):
                hint = batch_first_hint(T, B)
            raise RnncValueError(f"{kind} {name!r} must have shape {want}, got {arr.shape}{hint}")
        if float_dtype(arr, f"{kind} {name!r}") != dtype:
            want_dtype = np.dtype(_np(dtype)).name
            raise RnncTypeError(f"{kind} {name!r} is {arr.dtype}, but the input is {want_dtype}; "
                                f"mixing dtypes is an error: convert it with "
                                f".astype(np.{want_dtype})")
        out[name] = contiguous(arr, f"{kind} {name!r}")
    return out


def batch_first_hint(T: int, B: int) -> str:
    """The sentence added when a size matches x's first axis where its batch was expected."""
    return (f"; {T} is the size of x's first axis, not of its batch axis (B={B}): x looks "
            f"batch-first (B, T, features), but rnnc takes (T, B, features): pass "
            f"x.transpose(1, 0, 2) (rnnc.RNN layers take batch_first=True)")


def _concrete(shape: tuple, B: int | None) -> tuple:
    return tuple(B if d == "B" else d for d in shape)


def lengths(value: Any, T: int, B: int) -> np.ndarray | None:
    """Check per-sequence lengths: integers in 1..T, one per batch entry."""
    if value is None:
        return None
    arr = as_array(value, "lengths")
    if arr.dtype.kind not in "iu":
        raise RnncTypeError(f"lengths must be an integer array, got dtype {arr.dtype}: convert "
                            f"it with .astype(np.int64)")
    if arr.shape != (B,):
        hint = batch_first_hint(T, B) if arr.shape == (T,) and T != B else ""
        raise RnncValueError(f"lengths must have shape ({B},) (one per sequence), got "
                             f"{arr.shape}{hint}")
    if B and (arr.min() < 1 or arr.max() > T):
        bad = int(arr[(arr < 1) | (arr > T)][0])
        raise RnncValueError(f"lengths must be in 1..{T} (T), got {bad}")
    return arr.astype(np.int64)


def mask(lens: np.ndarray, T: int, dtype: str) -> np.ndarray:
    """(T, B, 1) with 1 where step t < length, else 0."""
    return (np.arange(T)[:, None] < lens[None, :]).astype(_np(dtype))[:, :, None]


@functools.cache
def physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the platform does not say (asked once:
    every call checks its new arrays against it)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def call_memory(arrays: Mapping[str, tuple[tuple[int, ...], str]], dtype: str,
                limit: int | None) -> None:
    """Refuse a call whose new arrays (name -> (shape, what sizes it)) alone need more bytes
    than ``limit``, naming the biggest one, its size and the bytes, before anything runs."""
    if limit is None:
        return
    itemsize = np.dtype(_np(dtype)).itemsize
    sizes = {name: math.prod(shape) * itemsize for name, (shape, _) in arrays.items()}
    total = sum(sizes.values())
    if total <= limit:
        return
    name = max(sizes, key=sizes.__getitem__)
    shape, why = arrays[name]
    raise RnncValueError(f"this call needs at least {total:,} bytes of new arrays, more than "
                         f"this machine's {limit:,} bytes of memory: {name} alone is "
                         f"{shape} {np.dtype(_np(dtype)).name} = {sizes[name]:,} bytes ({why}); "
                         f"use a smaller batch or hidden size, or shorter sequences")



def new_arrays(output_sizes: Mapping[str, int], states: Mapping[str, tuple], draws_masks: bool,
               T: int, B: int, given: Mapping[str, Any]
               ) -> dict[str, tuple[tuple[int, ...], str]]:
    """The arrays any call allocates, at least: outputs, final states, omitted states, and
    the random counter of a cell that draws masks; each with the sizes that make it."""
    out = {}
    for name, width in output_sizes.items():
        out[f"output {name!r}"] = ((T, B, width), f"T={T}, B={B}, output size {width}")
    for name, shape in states.items():
        why = f"B={B}, state {name!r} of shape {tuple(shape[1:])}"
        out[f"final state {name!r}"] = ((B, *shape[1:]), why)
        if name not in given:
            out[f"initial state {name!r}"] = ((B, *shape[1:]), why)
    if draws_masks:
        out["random counter"] = ((T, B, 4), f"T={T}, B={B}: a step and row index per row")
    return out
