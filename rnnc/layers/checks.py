"""Checks of what a caller gives ``rnnc.RNN``: constructor arguments, cells, arrays, states.

Each check raises an ``RnncError`` subclass whose message names the argument and, where a
common mistake explains the value, the fix. The arrays of a call are checked on its side
(``rnnc.layers.arrays.Arrays``): in a device call, device arrays are adopted in place and the
host states and gradients a device call also takes are uploaded.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rnnc import backends, validate
from rnnc.device import Device, is_device
from rnnc.device_twin import twin_for_data
from rnnc.dsl import Cell
from rnnc.errors import CellError, RnncPicklingError, RnncTypeError, RnncValueError
from rnnc.layers.arrays import Arrays
from rnnc.layers.stack import LayerStack

CellFactory = Callable[[int, int], Cell]
Params = dict[str, np.ndarray]
Grid = list[list[Params]]

MODES: tuple[str, ...] = ("rnn_tanh", "rnn_relu", "lstm", "gru")
"""The standard modes: PyTorch's RNN (tanh and relu), LSTM and GRU."""


def check_int(value: Any, name: str, low: int) -> int:
    """Return ``value`` as an int, raising unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise RnncValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_mode(mode: Any) -> str | CellFactory:
    """Return ``mode``: one of ``MODES`` or a callable cell factory."""
    if isinstance(mode, str):
        if mode not in MODES:
            raise RnncValueError(f"mode must be one of {', '.join(map(repr, MODES))} or a "
                                 f"cell factory, got {mode!r}")
    elif isinstance(mode, Cell):
        raise RnncTypeError(f"mode is a Cell ({mode.name!r}), but a layer needs a cell factory, "
                            f"a function (input_size, hidden_size) -> Cell that it calls once "
                            f"per layer and direction: pass the function itself, e.g. "
                            f"rnnc.RNN({mode.name}, 16, 64), not rnnc.RNN({mode.name}(16, 64), "
                            f"16, 64)")
    elif not callable(mode):
        raise RnncTypeError(f"mode must be a string or a cell factory, got "
                            f"{type(mode).__name__}")
    return mode


def check_proj_size(proj_size: Any, mode: str | CellFactory, hidden_size: int) -> int:
    """Return ``proj_size``: 0, or smaller than ``hidden_size`` for mode ``"lstm"``."""
    proj_size = check_int(proj_size, "proj_size", 0)
    if proj_size and mode != "lstm":
        raise RnncValueError(f"proj_size needs mode 'lstm' (torch's LSTM with projections), "
                             f"got mode {mode!r}")
    if proj_size >= hidden_size:
        raise RnncValueError(f"proj_size must be smaller than hidden_size "
                             f"({hidden_size}), got {proj_size}")
    return proj_size


def check_dtype(dtype: Any) -> np.dtype:
    """Return ``dtype`` as a NumPy dtype, float32 or float64."""
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise RnncTypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def check_backend(backend: Any) -> str:
    """Return ``backend`` when it names one of rnnc's backends."""
    if backend not in backends.names():
        raise RnncValueError(f"unknown backend {backend!r}; expected one of "
                             f"{', '.join(backends.names())} or None")
    return backend


def check_picklable(mode: str | CellFactory) -> None:
    """Raise ``RnncPicklingError`` unless pickle can store the cell factory ``mode``.

    A pickled layer keeps its factory and rebuilds its compiled functions from it, so the
    factory must be importable: a module-level function (or a mode string), not a lambda or a
    function defined inside another one.
    """
    if isinstance(mode, str):
        return
    try:
        pickle.dumps(mode)
    except Exception as err:  # noqa: BLE001 - pickle raises several kinds for the same cause
        name = getattr(mode, "__qualname__", type(mode).__name__)
        raise RnncPicklingError(
            f"cannot pickle the cell factory {name!r} ({err}); a pickled layer rebuilds its "
            f"compiled functions from the factory, so define it as a module-level function "
            f"(def factory(input_size, hidden_size) in an importable module) or use a mode "
            f"string") from err


def check_dropout(value: Any) -> float:
    """Return ``value`` as a float probability in [0, 1] (1 zeroes everything, as in torch)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(value) <= 1.0:
        raise RnncValueError(f"dropout must be a probability in [0, 1], got {value!r}")
    return float(value)


# torch.nn.RNNBase's words, so that a ported model warns as it did.
SINGLE_LAYER_DROPOUT = ("dropout option adds dropout after all but last recurrent layer, so "
                        "non-zero dropout expects num_layers greater than 1, but got "
                        "dropout={dropout} and num_layers={num_layers}")


def warn_single_layer_dropout(dropout: float, num_layers: int, stacklevel: int) -> None:
    """Warn, as ``torch.nn.LSTM`` does, where dropout is set but no layer has a successor to
    drop into (it applies between layers only)."""
    if dropout > 0 and num_layers == 1:
        warnings.warn(SINGLE_LAYER_DROPOUT.format(dropout=dropout, num_layers=num_layers),
                      UserWarning, stacklevel=stacklevel + 1)


def check_factory_cell(cell: Any, in_size: int) -> Cell:
    """Return what a cell factory made for input width ``in_size``: a valid Cell whose first
    input (the layer input) has ``in_size`` features; any further inputs are extra inputs."""
    if not isinstance(cell, Cell):
        raise RnncTypeError(f"the cell factory must return an rnnc.Cell, got "
                            f"{type(cell).__name__}")
    cell.check()
    inputs = cell.sizes("input")
    first, shape = next(iter(inputs.items()))
    if shape[-1] != in_size:
        raise CellError(f"the cell factory was asked for input size {in_size}, its cell's "
                        f"first input {first!r} (the layer input) has {shape[-1]} features")
    return cell


def output_name(cell: Cell) -> str:
    """Return the name of the output a layer stacks: the only one, or ``"y"`` among several."""
    names = list(cell.outputs)
    if not names:
        raise CellError(f"a layer needs a cell with an output, cell {cell.name!r} has none")
    name = names[0] if len(names) == 1 else "y"
    if name not in cell.outputs:
        raise CellError(f"cell {cell.name!r} has several outputs {names}; a layer uses the "
                        f"one named 'y'")
    return name


def signature(cell: Cell) -> tuple[dict[str, int], int, dict[str, tuple[int, ...]]]:
    """What every layer's cell must share: extra inputs' widths (every input after the
    first), the width of the output a layer stacks, and the states' feature shapes (``(n,)``
    for a ``(B, n)`` state, ``(D, N)`` for a ``(B, D, N)`` one)."""
    extra = {n: s[-1] for n, s in list(cell.sizes("input").items())[1:]}
    width = cell.graph.node(cell.outputs[output_name(cell)]).shape[-1]
    return extra, width, {n: tuple(s[1:]) for n, s in cell.sizes("state").items()}


def check_same_signature(cell: Cell, first: Cell, in_size: int, input_size: int) -> Cell:
    """Return ``cell`` (made for input width ``in_size``) if it has the extra inputs, output
    width and states of ``first`` (made for ``input_size``): layers stack only then."""
    got, want = signature(cell), signature(first)
    for (what, a, b) in zip(("extra inputs", "output width", "states"), got, want,
                            strict=True):
        if a != b:
            raise CellError(f"the cell factory's cells differ between layers: for input size "
                            f"{in_size} its {what} are {a}, for input size {input_size} {b}")
    return cell


EXTRA_INPUTS = ("all", "first")


def check_extra_inputs(value: Any) -> str:
    """Return ``value``: ``"all"`` (extra inputs reach every layer) or ``"first"``."""
    if value not in EXTRA_INPUTS:
        raise RnncValueError(f"extra_inputs must be 'all' (every layer reads the extra inputs) "
                             f"or 'first' (only layer 0), got {value!r}")
    return value


# ---------------------------------------------------------------- arguments of a call


def check_params(layer: LayerStack, params: Any) -> Grid:
    """Return ``params`` as a ``[layer][direction]`` grid (``None``: the layer's own)."""
    if params is None:
        return layer.params
    L, D = layer.num_layers, layer.num_directions
    if not isinstance(params, (list, tuple)) or len(params) != L or any(
            not isinstance(row, (list, tuple)) or len(row) != D for row in params):
        raise RnncValueError(f"params must be a list of {L} layers, each a list of {D} "
                             f"parameter dicts")
    return [list(row) for row in params]


def call_device(layer: LayerStack, x: Any, extra: Any) -> Device | None:
    """The device of a call whose input sequences are ``x`` and ``extra``: the backend's when
    they are device arrays, None for a host call (a host backend's own checks refuse device
    arrays, naming the conversion). Refuses input sequences on both sides."""
    fn = layer.function(0)
    device = getattr(fn.backend, "device", None)
    if device is None and is_device(x):  # the default backend runs device data on CUDA twins
        twin = twin_for_data(fn, x)  # (raises the host error, with why, where CUDA cannot run)
        device = None if twin is None else twin.backend.device
    if device is None or not is_device(x):
        if device is not None and isinstance(extra, Mapping):
            on_device = [n for n, v in extra.items() if is_device(v)]
            if on_device:
                raise RnncTypeError(
                    f"extra input {on_device[0]!r} is a device array "
                    f"({type(extra[on_device[0]]).__name__}) but x is a host array "
                    f"({type(x).__name__}): put every input sequence on the same side, x on "
                    f"the device too (cupy.asarray(x)) or the extra inputs on the host")
        return None
    host = [n for n, v in (extra.items() if isinstance(extra, Mapping) else ())
            if not is_device(v)]
    if host:
        raise RnncTypeError(f"x is a device array ({type(x).__name__}) but extra input "
                            f"{host[0]!r} is a host array ({type(extra[host[0]]).__name__}): "
                            f"put every input sequence on the same side, the extra inputs on "
                            f"the device too (cupy.asarray) or x on the host (x.get())")
    return device


def on_side(ops: Arrays, arr: Any) -> Any:
    """A checked array on the call's side: a host array given to a device call uploaded."""
    if ops.device is not None and not ops.device.holds(arr):
        return ops.upload(arr)
    return arr


def check_x(layer: LayerStack, x: Any, dtype: np.dtype, ops: Arrays | None = None) -> np.ndarray:
    """Return the input as a time-major ``(T, B, input_size)`` array of ``dtype`` (on the
    device of a device call, ``ops``)."""
    given = x
    x = validate.as_array(x, "x", None if ops is None else ops.device)
    layout = "(B, T, input_size)" if layer.batch_first else "(T, B, input_size)"
    if x.ndim != 3:
        raise RnncValueError(f"x must have shape {layout} = 3 dimensions, got shape "
                             f"{x.shape}")
    if x.shape[2] != layer.input_size:
        raise RnncValueError(f"x must have {layer.input_size} features (shape {layout}), "
                             f"got shape {x.shape}")
    if x.dtype != dtype:
        if x.dtype.kind != "f":
            validate.float_dtype(x, "x")
        raise RnncTypeError(validate.dtype_mismatch(
            "x", given, x.dtype.name, dtype.name, "the layer's parameters are",
            f"a {x.dtype.name} layer (rnnc.RNN(..., dtype=np.{x.dtype.name}))"))
    return x.transpose(1, 0, 2) if layer.batch_first else x


def check_lengths(layer: LayerStack, lengths: Any, T: int, B: int) -> np.ndarray | None:
    """Return the sequence lengths as an int array of shape ``(B,)`` in ``1..T``, or None."""
    if lengths is None:
        return None
    if is_device(lengths) and not isinstance(lengths, np.ndarray) \
            and not hasattr(lengths, "detach"):
        raise RnncTypeError(f"lengths are a device array ({type(lengths).__name__}); rnnc.RNN "
                            f"reads lengths on the host, as pack_padded_sequence does: pass a "
                            f"NumPy array (lengths.get() for CuPy)")
    arr = np.asarray(lengths.detach().cpu().numpy() if hasattr(lengths, "detach")
                     else lengths)
    if arr.ndim != 1 or arr.shape[0] != B:
        hint = (" (with batch_first=True, x is (B, T, features))" if layer.batch_first
                else " (with batch_first=False, x is (T, B, features))")
        raise RnncValueError(f"lengths must have one entry per sequence: shape ({B},), got "
                             f"{arr.shape}{hint}")
    return validate.lengths(arr, T, B)


def _batch_axis_hint(layer: LayerStack, T: int | None, B: int, LD: int,
                     shape: tuple[int, ...], given: tuple[int, ...]) -> str:
    """A hint for a state shaped as if x's time axis were its batch axis (``shape`` is the
    state's feature shape)."""
    if T is None or T == B or given != (LD, T, *shape):
        return ""
    return (f"; {T} is the size of x's time axis, not of its batch axis (B={B}): "
            + ("with batch_first=True x is (B, T, features)" if layer.batch_first else
               "x looks batch-first, so create the layer with batch_first=True (or pass "
               "x.transpose(1, 0, 2))"))


def check_states(layer: LayerStack, states: Any, B: int, dtype: np.dtype, what: str = "state",
                 T: int | None = None, ops: Arrays | None = None) -> dict[str, np.ndarray]:
    """Return every state as a ``(L*D, B, *shape)`` array of ``dtype`` (a missing one: zeros),
    ``shape`` its feature shape in the cell (``(size,)`` for a ``(B, size)`` state).

    ``what`` names the states in messages ("state", "state gradient"); ``T``, when given,
    lets a message spot a batch-first ``x`` given to a time-major layer. In a device call
    (``ops``) every state is a device array: host ones are uploaded.
    """
    ops = Arrays() if ops is None else ops
    LD = layer.num_layers * layer.num_directions
    if states is None:
        states = {}
    if not isinstance(states, Mapping):
        raise RnncTypeError(f"{what}s must be a dict by state name "
                            f"({sorted(layer.state_shapes)}), got {type(states).__name__}")
    unknown = sorted(set(states) - set(layer.state_shapes))
    if unknown:
        raise RnncValueError(f"unknown {what} {unknown[0]!r}; the states are "
                             f"{sorted(layer.state_shapes)}")
    out = {}
    for name, shape in layer.state_shapes.items():
        value = states.get(name)
        if value is None:
            out[name] = ops.zeros((LD, B, *shape), dtype)
            continue
        arr = validate.as_array(value, f"{what} {name!r}", ops.device)
        want = (LD, B, *shape)
        if arr.shape != want:
            hint = _batch_axis_hint(layer, T, B, LD, shape, arr.shape)
            # a state with feature axes (rnnc.cells.slstm's (heads, d)) keeps them
            axes = "size" if len(shape) == 1 else "*feature shape"
            raise RnncValueError(f"{what} {name!r} must have shape (num_layers * "
                                 f"directions, B, {axes}) = {want}, got "
                                 f"{arr.shape}{hint}")
        if arr.dtype != dtype:
            raise RnncTypeError(f"{what} {name!r} is {arr.dtype}, expected {dtype}: convert "
                                f"it with .astype(np.{dtype.name})")
        out[name] = on_side(ops, arr)
    return out


def check_d_y(layer: LayerStack, d_y: Any, T: int, B: int, dtype: np.dtype,
              ops: Arrays | None = None) -> np.ndarray:
    """Return the gradient of ``y`` time-major, ``(T, B, D*H)`` (``None``: zeros); in a
    device call (``ops``) on the device, a host one uploaded."""
    ops = Arrays() if ops is None else ops
    width = layer.num_directions * layer.output_size
    if d_y is None:
        return ops.zeros((T, B, width), dtype)
    y_shape = (B, T, width) if layer.batch_first else (T, B, width)
    d_y = np.asarray(d_y) if ops.device is None else validate.as_array(d_y, "d_y", ops.device)
    if d_y.shape != y_shape:
        raise RnncValueError(f"d_y must have the shape of y {y_shape}, got {d_y.shape}")
    if d_y.dtype != dtype:
        raise RnncTypeError(f"d_y is {d_y.dtype}, expected {dtype}")
    d_y = on_side(ops, d_y)
    return d_y.transpose(1, 0, 2) if layer.batch_first else d_y


def check_extra(layer: LayerStack, extra: Any, T: int, B: int, dtype: np.dtype,
                device: Device | None = None) -> dict[str, np.ndarray]:
    """Return the extra inputs time-major, ``(T, B, size)`` each, all of them given (device
    arrays of ``device`` in a device call)."""
    sizes = layer.extra_sizes
    if extra is None:
        extra = {}
    if not isinstance(extra, Mapping):
        raise RnncTypeError(f"extra must be a dict by input name ({sorted(sizes)}), got "
                            f"{type(extra).__name__}")
    unknown = sorted(set(extra) - set(sizes))
    if unknown:
        known = f"the cell's extra inputs are {sorted(sizes)}" if sizes else \
            f"cell {layer.cell_name!r} has no extra inputs (its only input is the layer input)"
        raise RnncValueError(f"unknown extra input {unknown[0]!r}; {known}")
    missing = [n for n in sizes if n not in extra]
    if missing:
        raise RnncValueError(f"missing extra input {missing[0]!r}: the cell reads "
                             f"{sorted(sizes)} besides x; pass extra={{{missing[0]!r}: ...}}")
    out = {}
    for name, n in sizes.items():
        arr = validate.as_array(extra[name], f"extra input {name!r}", device)
        want = (B, T, n) if layer.batch_first else (T, B, n)
        layout = "(B, T, size)" if layer.batch_first else "(T, B, size)"
        if arr.shape != want:
            raise RnncValueError(f"extra input {name!r} must have shape {layout} = {want} "
                                 f"like x, got {arr.shape}")
        if arr.dtype != dtype:
            raise RnncTypeError(f"extra input {name!r} is {arr.dtype}, expected {dtype} (the "
                                f"dtype of x): convert it with .astype(np.{dtype.name})")
        out[name] = arr.transpose(1, 0, 2) if layer.batch_first else arr
    return out
