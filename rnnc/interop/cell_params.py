"""Names and shapes of the standard cells' parameters, and the checks every weight layout shares.

The gates of each standard cell come from the cell itself (``rnnc.cells``): they are the
suffixes of its input matrices ``W_i{g}``, in the order the cell declares them, which is
PyTorch's (and cuDNN's) order inside the fused blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc import cells
from rnnc.errors import RnncValueError
from rnnc.layers import MODES


class WeightError(RnncValueError):
    """A weight with a missing name, a wrong shape or dtype, or an unknown mode."""


Params = dict[str, np.ndarray]
Layers = list[list[Params]]

TORCH_MODES: dict[str, str] = {mode.upper(): mode for mode in MODES}
"""rnnc's standard modes by PyTorch's names for them (``torch.nn.RNNBase.mode``)."""


def _declared_gates(mode: str) -> tuple[str, ...]:
    """The gates of the standard cell ``mode``, read from the parameters it declares."""
    cell = cells.STANDARD[mode](1, 1)
    return tuple(name.removeprefix("W_i") for name in cell.params if name.startswith("W_i"))


GATES: dict[str, tuple[str, ...]] = {mode: _declared_gates(mode) for mode in MODES}
"""Gates of each standard cell, in PyTorch's (and cuDNN's) order inside the fused blocks."""


def gates(mode: str) -> tuple[str, ...]:
    """Return the gates of ``mode`` in PyTorch order; raise ``WeightError`` if unknown."""
    try:
        return GATES[mode]
    except (KeyError, TypeError):
        raise WeightError(
            f"mode: expected one of {', '.join(repr(m) for m in MODES)}, got {mode!r}"
        ) from None


def num_gates(mode: str) -> int:
    """Return the number of gate blocks ``G`` in the fused PyTorch matrices of ``mode``."""
    return len(gates(mode))


def input_weight_names(mode: str) -> tuple[str, ...]:
    """Return the names of the input matrices ``W_i{g}`` in gate order."""
    return tuple(f"W_i{g}" for g in gates(mode))


def hidden_weight_names(mode: str) -> tuple[str, ...]:
    """Return the names of the recurrent matrices ``W_h{g}`` in gate order."""
    return tuple(f"W_h{g}" for g in gates(mode))


def input_bias_names(mode: str) -> tuple[str, ...]:
    """Return the names of the input biases ``b_i{g}`` in gate order."""
    return tuple(f"b_i{g}" for g in gates(mode))


def hidden_bias_names(mode: str) -> tuple[str, ...]:
    """Return the names of the recurrent biases ``b_h{g}`` in gate order."""
    return tuple(f"b_h{g}" for g in gates(mode))


def param_names(mode: str, proj: bool = False) -> tuple[str, ...]:
    """Return every parameter name of ``mode``: W_i*, W_h*, b_i*, b_h*, each in gate order,
    then ``W_hr`` for an LSTM with projections (``proj``)."""
    return (
        input_weight_names(mode)
        + hidden_weight_names(mode)
        + input_bias_names(mode)
        + hidden_bias_names(mode)
        + (("W_hr",) if proj else ())
    )


def param_shapes(
    mode: str, input_size: int, hidden_size: int, proj_size: int = 0
) -> dict[str, tuple[int, ...]]:
    """Return the shape of every parameter of one ``mode`` cell, keyed by name.

    With ``proj_size`` (LSTM only) the recurrent matrices read ``h`` of ``proj_size``
    features and ``W_hr`` ``(hidden_size, proj_size)`` projects ``o * tanh(c)`` to it.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for name in input_weight_names(mode):
        shapes[name] = (input_size, hidden_size)
    for name in hidden_weight_names(mode):
        shapes[name] = (proj_size or hidden_size, hidden_size)
    for name in input_bias_names(mode) + hidden_bias_names(mode):
        shapes[name] = (hidden_size,)
    if proj_size:
        check_proj_mode(mode)
        shapes["W_hr"] = (hidden_size, proj_size)
    return shapes


def check_proj_mode(mode: str) -> None:
    """Raise ``WeightError`` unless ``mode`` can have projections (only the LSTM has them)."""
    if mode != "lstm":
        raise WeightError(f"projections (weight_hr) exist only for mode 'lstm', got {mode!r}")


def layer_input_size(layer: int, input_size: int, hidden_size: int, bidirectional: bool) -> int:
    """Return the input width of ``layer``: ``input_size`` first, then ``D*H``."""
    return input_size if layer == 0 else (2 if bidirectional else 1) * hidden_size


# --------------------------------------------------------------------------- checks


def as_numpy(value: Any, where: str) -> np.ndarray:
    """Return ``value`` as a NumPy array without copying; torch tensors go through .numpy()."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        # A torch tensor: detach drops autograd, cpu() is a no-op on the CPU, and numpy()
        # shares memory; callers copy, so the module's tensors are never aliased.
        t = value.detach()
        if getattr(t, "device", None) is not None and t.device.type != "cpu":
            t = t.cpu()
        try:
            return t.numpy()
        except TypeError as e:  # bfloat16 and friends have no NumPy dtype
            raise WeightError(
                f"{where}: dtype {t.dtype} has no NumPy equivalent; convert with .float() first"
            ) from e
    arr = np.asarray(value)
    if arr.dtype == object:
        raise WeightError(f"{where}: expected an array, got {type(value).__name__}")
    return arr


def as_float_numpy(value: Any, where: str) -> np.ndarray:
    """``as_numpy(value)``, which must hold floats: a buffer of integers or strings is a
    mistake (a weight is never either), not a value to convert."""
    arr = as_numpy(value, where)
    if not np.issubdtype(arr.dtype, np.floating):
        raise WeightError(f"{where}: expected a float buffer (float32 or float64 weights), got "
                          f"dtype {arr.dtype}")
    return arr


def check_shape(arr: np.ndarray, expected: tuple[int, ...], where: str) -> None:
    """Raise ``WeightError`` naming ``where`` unless ``arr`` has exactly ``expected`` shape."""
    if arr.shape != tuple(expected):
        raise WeightError(f"{where}: expected shape {tuple(expected)}, got {arr.shape}")


def check_dtype(arr: np.ndarray, dtype: np.dtype, where: str) -> None:
    """Raise unless ``arr`` has ``dtype``: mixing dtypes would silently promote on packing."""
    if arr.dtype != dtype:
        raise WeightError(f"{where}: expected dtype {dtype}, got {arr.dtype}")


def fresh_copy(arr: np.ndarray) -> np.ndarray:
    """Return a fresh C-contiguous copy (ascontiguousarray alone may return a view)."""
    return np.array(arr, order="C", copy=True)


def check_layer_params(
    mode: str,
    params: Mapping[str, Any],
    where: str,
    input_size: int | None = None,
    hidden_size: int | None = None,
) -> tuple[Params, int, int]:
    """Validate one rnnc parameter dict; return it as arrays with its (input, hidden) sizes.

    A dict with ``W_hr`` is an LSTM with projections (its shape gives ``proj_size``).
    """
    if not isinstance(params, Mapping):
        raise WeightError(f"{where}: expected a dict of parameters, got {type(params).__name__}")
    # GRU's reset gate has a W_hr too; only in an LSTM is it the projection
    proj = mode == "lstm" and "W_hr" in params
    names = param_names(mode, proj)
    for name in names:
        if name not in params:
            raise WeightError(f"{where}: missing parameter {name!r} (mode {mode!r} needs {names})")
    extra = sorted(set(params) - set(names))
    if extra:
        raise WeightError(
            f"{where}: unexpected parameter {extra[0]!r} for mode {mode!r} (expected {names})"
        )
    arrays = {n: as_numpy(params[n], f"{where}[{n!r}]") for n in names}
    first = arrays[names[0]]
    if first.ndim != 2:
        raise WeightError(f"{where}[{names[0]!r}]: expected a 2-D array, got shape {first.shape}")
    i_size = first.shape[0] if input_size is None else input_size
    h_size = first.shape[1] if hidden_size is None else hidden_size
    p_size = 0
    if proj:
        w_hr = arrays["W_hr"]
        if w_hr.ndim != 2:
            raise WeightError(f"{where}['W_hr']: expected shape ({h_size}, proj_size), got "
                              f"{w_hr.shape}")
        p_size = w_hr.shape[1]
    for name, shape in param_shapes(mode, i_size, h_size, p_size).items():
        check_shape(arrays[name], shape, f"{where}[{name!r}]")
        check_dtype(arrays[name], first.dtype, f"{where}[{name!r}]")
    return arrays, i_size, h_size
