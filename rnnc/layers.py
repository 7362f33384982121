"""Multi-layer, bidirectional recurrent layers over compiled cells, with PyTorch's shapes.

``rnnc.RNN`` stacks ``num_layers`` layers of one cell, each run forward and (when
``bidirectional``) reversed, with dropout between layers. Shapes follow ``torch.nn.LSTM``:
``x`` is ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first``), ``y`` is
``(T, B, D*H)`` with the forward direction in ``y[..., :H]`` and the reverse one in
``y[..., H:]``, and every state is ``(L*D, B, H)`` indexed ``layer*D + direction``.

One compiled ``Function`` serves every layer and direction with the same input width:
layer 0 reads ``input_size`` features, layers above read ``D*H``. The reverse direction
runs the same forward program on each sequence reversed within its own length (as cuDNN
and PyTorch do with packed sequences), and its outputs are put back in time order.
Outputs are zero past each sequence's length.
"""

from __future__ import annotations

import copy
import pickle
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc import backends, cells, validate
from rnnc import weights as W
from rnnc.api import Function, Tape
from rnnc.api import compile as compile_cell
from rnnc.dsl import Cell
from rnnc.errors import CellError, RnncPicklingError, RnncTypeError, RnncValueError

CellFactory = Callable[[int, int], Cell]
Params = dict[str, np.ndarray]
Grid = list[list[Params]]

MODES: tuple[str, ...] = W.MODES

_AUTO_BACKEND: str | None = None
_CACHE: dict[tuple, Function] = {}
_CACHE_LOCK = threading.Lock()


def fastest_backend() -> str:
    """Return "llvm" when it imports and runs a tiny cell correctly here, else "numpy"."""
    global _AUTO_BACKEND
    if _AUTO_BACKEND is None:
        cell = cells.rnn(2, 2)
        params = cell.init_params(seed=0)
        x = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 1, 2)
        try:
            got, _ = compile_cell(cell, backend="llvm")(x, params)
            want, _ = compile_cell(cell, backend="numpy")(x, params)
            ok = np.allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
        except Exception:  # noqa: BLE001 - any failure (import, JIT, BLAS) means "not usable"
            ok = False
        _AUTO_BACKEND = "llvm" if ok else "numpy"
    return _AUTO_BACKEND


def _compiled(mode: str | CellFactory, cell: Cell, in_size: int, hidden: int, backend: str,
              options: Mapping[str, Any], proj_size: int = 0) -> Function:
    """Compile ``cell``; standard cells are shared process-wide since their programs are fixed."""
    if not isinstance(mode, str):
        return compile_cell(cell, backend=backend, **options)
    try:
        key = (mode, in_size, hidden, proj_size, backend, tuple(sorted(options.items())))
        hash(key)
    except TypeError:
        return compile_cell(cell, backend=backend, **options)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = compile_cell(cell, backend=backend, **options)
        return _CACHE[key]


@dataclass
class LayerTape:
    """What ``RNN.forward(train=True)`` saved for ``RNN.backward``."""

    owner: RNN
    T: int
    B: int
    dtype: np.dtype
    lengths: np.ndarray | None
    reverse_index: np.ndarray | None  # (T, B): time index of each step in the reverse run
    tapes: list[list[Tape]]  # [layer][direction]
    dropout_masks: list[np.ndarray | None]  # after layer k, for k < num_layers - 1


@dataclass
class LayerGrads:
    """Gradients: ``x`` shaped like the input, ``params[layer][direction]`` and ``states``."""

    x: np.ndarray
    params: Grid
    states: dict[str, np.ndarray]


def _check_int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise RnncValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


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


def _reverse_index(T: int, B: int, lens: np.ndarray | None) -> np.ndarray | None:
    """Return ``idx`` with ``idx[t, b] = len_b - 1 - t`` inside each length, ``t`` past it
    (None without lengths: the whole sequence is reversed).

    The map is its own inverse, so the same gather reverses inputs, restores outputs and
    carries gradients back in both directions.
    """
    if lens is None:
        return None
    t = np.arange(T)[:, None]
    return np.where(t < lens[None, :], lens[None, :] - 1 - t, t)


def _gather(a: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
    """Return ``a[idx[t, b], b]`` for every ``(t, b)``; ``idx`` None reverses time."""
    if idx is None:
        return np.ascontiguousarray(a[::-1])
    return np.take_along_axis(a, idx[:, :, None], axis=0)


class RNN:
    """A stack of recurrent layers of one cell: ``y, states = layer(x, lengths, states)``.

    ``mode`` is ``"rnn_tanh"``, ``"rnn_relu"``, ``"lstm"``, ``"gru"`` or a cell factory
    ``(input_size, hidden_size) -> Cell`` whose cell has one input, one output of width
    ``hidden_size`` (named ``"y"`` when there are several) and any states. ``backend`` is
    ``"numpy"``, ``"llvm"``, ``"cuda"`` or ``None`` for the fastest available (llvm if it
    works here, else numpy); ``backend_options`` go to ``rnnc.compile`` (e.g.
    ``emulate=True``). ``seed`` makes the parameter initialization and the dropout masks
    reproducible.

    States are a dict by state name, each ``(num_layers * D, B, size)`` with ``D = 2`` when
    bidirectional and row ``layer * D + direction``. For the standard cells this is
    PyTorch's ``h_n = states["h"]`` and, for LSTM, ``c_n = states["c"]``; initial states
    ``(h_0, c_0)`` are passed as ``states={"h": h_0, "c": c_0}`` (a missing name is zeros).

    Parameters are ``layer.params[layer][direction]``, a dict of arrays with rnnc's names
    (``W_ii, ..., b_ho`` for LSTM; see ``rnnc.weights``).
    """

    def __init__(self, mode: str | CellFactory, input_size: int, hidden_size: int,
                 num_layers: int = 1, bidirectional: bool = False, dropout: float = 0.0,
                 batch_first: bool = False, backend: str | None = "numpy",
                 seed: int | None = None, dtype: Any = np.float32, proj_size: int = 0,
                 **backend_options: Any) -> None:
        if isinstance(mode, str):
            if mode not in MODES:
                raise RnncValueError(f"mode must be one of {', '.join(map(repr, MODES))} or a "
                                     f"cell factory, got {mode!r}")
        elif not callable(mode):
            raise RnncTypeError(f"mode must be a string or a cell factory, got "
                                f"{type(mode).__name__}")
        self.mode = mode
        self.input_size = _check_int(input_size, "input_size", 1)
        self.hidden_size = _check_int(hidden_size, "hidden_size", 1)
        self.num_layers = _check_int(num_layers, "num_layers", 1)
        self.proj_size = _check_int(proj_size, "proj_size", 0)
        if self.proj_size and mode != "lstm":
            raise RnncValueError(f"proj_size needs mode 'lstm' (torch's LSTM with projections), "
                                 f"got mode {mode!r}")
        if self.proj_size >= self.hidden_size:
            raise RnncValueError(f"proj_size must be smaller than hidden_size "
                                 f"({self.hidden_size}), got {self.proj_size}")
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if self.bidirectional else 1
        self.dropout = check_dropout(dropout)
        self.batch_first = bool(batch_first)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise RnncTypeError(f"dtype must be float32 or float64, got {self.dtype}")
        if backend is None:
            backend = fastest_backend()
        if backend not in backends.NAMES:
            raise RnncValueError(f"unknown backend {backend!r}; expected one of "
                                 f"{', '.join(backends.NAMES)} or None")
        self.backend = backend
        self.backend_options = dict(backend_options)
        self._rng = np.random.default_rng(seed)
        self._cells: dict[int, Cell] = {}
        self._functions: dict[int, Function] = {}
        first = self._cell(self.input_size)
        self.output_name = self._output_name(first)
        self.output_size = first.graph.node(first.outputs[self.output_name]).shape[-1]
        for k in range(self.num_layers):
            self._function(self.layer_input_size(k))
        self.state_sizes = {n: s[-1] for n, s in first.sizes("state").items()}
        self.params: Grid = self.init_params(int(self._rng.integers(2**31)))

    # -- cells and compiled functions
    def layer_input_size(self, layer: int) -> int:
        """Return the input width of ``layer``: ``input_size``, then ``D * output_size``
        (``output_size`` is ``proj_size`` for an LSTM with projections, else ``hidden_size``)."""
        return self.input_size if layer == 0 else self.num_directions * self.output_size

    def _build_cell(self, in_size: int) -> Cell:
        if self.proj_size:
            return cells.lstm(in_size, self.hidden_size, proj_size=self.proj_size)
        if isinstance(self.mode, str):
            return cells.STANDARD[self.mode](in_size, self.hidden_size)
        cell = self.mode(in_size, self.hidden_size)
        if not isinstance(cell, Cell):
            raise RnncTypeError(f"the cell factory must return an rnnc.Cell, got "
                                f"{type(cell).__name__}")
        cell.check()
        inputs = cell.sizes("input")
        if len(inputs) != 1:
            raise CellError(f"a layer needs a cell with one input, cell {cell.name!r} has "
                            f"{sorted(inputs)}")
        got = next(iter(inputs.values()))[-1]
        if got != in_size:
            raise CellError(f"the cell factory was asked for input size {in_size}, its cell's "
                            f"input has {got} features")
        return cell

    def _output_name(self, cell: Cell) -> str:
        names = list(cell.outputs)
        if not names:
            raise CellError(f"a layer needs a cell with an output, cell {cell.name!r} has none")
        name = names[0] if len(names) == 1 else "y"
        if name not in cell.outputs:
            raise CellError(f"cell {cell.name!r} has several outputs {names}; a layer uses the "
                            f"one named 'y'")
        width = cell.graph.node(cell.outputs[name]).shape[-1]
        if width != (self.proj_size or self.hidden_size):
            raise CellError(f"output {name!r} of cell {cell.name!r} has {width} features, the "
                            f"layer's hidden_size is {self.hidden_size}")
        return name

    def _cell(self, in_size: int) -> Cell:
        if in_size not in self._cells:
            self._cells[in_size] = self._build_cell(in_size)
        return self._cells[in_size]

    def _function(self, in_size: int) -> Function:
        """Compile on first use: after unpickling, functions are rebuilt here from the cell."""
        if in_size not in self._functions:
            self._functions[in_size] = _compiled(self.mode, self._cell(in_size), in_size,
                                                 self.hidden_size, self.backend,
                                                 self.backend_options, self.proj_size)
        return self._functions[in_size]

    def function(self, layer: int) -> Function:
        """Return the compiled function that runs ``layer`` (shared by equal input widths)."""
        return self._function(self.layer_input_size(layer))

    def init_params(self, seed: int = 0) -> Grid:
        """Return fresh parameters ``[layer][direction]`` (PyTorch's init), from ``seed``."""
        seeds = np.random.SeedSequence(seed).generate_state(self.num_layers * self.num_directions)
        return [[self._cell(self.layer_input_size(k)).init_params(
                    int(seeds[k * self.num_directions + d]), self.dtype)
                 for d in range(self.num_directions)] for k in range(self.num_layers)]

    def reseed(self, seed: int | None) -> None:
        """Restart the dropout random stream from ``seed``."""
        self._rng = np.random.default_rng(seed)

    # -- pickling: compiled functions hold native code, so they are rebuilt from the cell
    def __getstate__(self) -> dict[str, Any]:
        check_picklable(self.mode)
        return {**self.__dict__, "_cells": {}, "_functions": {}}

    def __deepcopy__(self, memo: dict[int, Any]) -> RNN:
        """Copy everything but the cells and compiled functions, which are immutable: share."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        shared = {"mode": self.mode, "_cells": dict(self._cells),
                  "_functions": dict(self._functions)}
        new.__dict__.update({k: shared[k] if k in shared else copy.deepcopy(v, memo)
                             for k, v in self.__dict__.items()})
        return new

    # -- checks
    def _check_params(self, params: Any) -> Grid:
        if params is None:
            return self.params
        L, D = self.num_layers, self.num_directions
        if not isinstance(params, (list, tuple)) or len(params) != L or any(
                not isinstance(row, (list, tuple)) or len(row) != D for row in params):
            raise RnncValueError(f"params must be a list of {L} layers, each a list of {D} "
                                 f"parameter dicts")
        return [list(row) for row in params]

    def _check_x(self, x: Any, dtype: np.dtype) -> np.ndarray:
        given = x
        x = validate.as_array(x, "x")
        layout = "(B, T, input_size)" if self.batch_first else "(T, B, input_size)"
        if x.ndim != 3:
            raise RnncValueError(f"x must have shape {layout} = 3 dimensions, got shape "
                                 f"{x.shape}")
        if x.shape[2] != self.input_size:
            raise RnncValueError(f"x must have {self.input_size} features (shape {layout}), "
                                 f"got shape {x.shape}")
        if x.dtype != dtype:
            if x.dtype.kind != "f":
                validate.float_dtype(x, "x")
            raise RnncTypeError(validate.dtype_mismatch(
                "x", given, x.dtype.name, dtype.name, "the layer's parameters are",
                f"a {x.dtype.name} layer (rnnc.RNN(..., dtype=np.{x.dtype.name}))"))
        return x.transpose(1, 0, 2) if self.batch_first else x

    def _check_lengths(self, lengths: Any, T: int, B: int) -> np.ndarray | None:
        if lengths is None:
            return None
        arr = np.asarray(lengths.detach().cpu().numpy() if hasattr(lengths, "detach")
                         else lengths)
        if arr.ndim != 1 or arr.shape[0] != B:
            hint = (" (with batch_first=True, x is (B, T, features))" if self.batch_first
                    else " (with batch_first=False, x is (T, B, features))")
            raise RnncValueError(f"lengths must have one entry per sequence: shape ({B},), got "
                                 f"{arr.shape}{hint}")
        return validate.lengths(arr, T, B)

    def _check_states(self, states: Any, B: int, dtype: np.dtype, what: str = "state",
                      T: int | None = None) -> dict[str, np.ndarray]:
        LD = self.num_layers * self.num_directions
        if states is None:
            states = {}
        if not isinstance(states, Mapping):
            raise RnncTypeError(f"{what}s must be a dict by state name "
                                f"({sorted(self.state_sizes)}), got {type(states).__name__}")
        unknown = sorted(set(states) - set(self.state_sizes))
        if unknown:
            raise RnncValueError(f"unknown {what} {unknown[0]!r}; the states are "
                                 f"{sorted(self.state_sizes)}")
        out = {}
        for name, size in self.state_sizes.items():
            value = states.get(name)
            if value is None:
                out[name] = np.zeros((LD, B, size), dtype)
                continue
            arr = validate.as_array(value, f"{what} {name!r}")
            if arr.shape != (LD, B, size):
                hint = ""
                if T is not None and T != B and arr.shape == (LD, T, size):
                    hint = (f"; {T} is the size of x's time axis, not of its batch axis "
                            f"(B={B}): " + ("with batch_first=True x is (B, T, features)"
                                            if self.batch_first else
                                            "x looks batch-first, so create the layer with "
                                            "batch_first=True (or pass x.transpose(1, 0, 2))"))
                raise RnncValueError(f"{what} {name!r} must have shape (num_layers * "
                                     f"directions, B, size) = {(LD, B, size)}, got "
                                     f"{arr.shape}{hint}")
            if arr.dtype != dtype:
                raise RnncTypeError(f"{what} {name!r} is {arr.dtype}, expected {dtype}: convert "
                                    f"it with .astype(np.{dtype.name})")
            out[name] = arr
        return out

    # -- running
    def __call__(self, x: Any, lengths: Any = None, states: Any = None
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Inference: ``(y, final_states)``; no dropout, nothing saved."""
        y, final, _ = self._run(x, lengths, states, None, train=False, rng=None)
        return y, final

    def forward(self, x: Any, lengths: Any = None, states: Any = None, train: bool = True,
                params: Grid | None = None, rng: np.random.Generator | None = None,
                apply_dropout: bool | None = None
                ) -> tuple[np.ndarray, dict[str, np.ndarray], LayerTape | None]:
        """Training forward: ``(y, final_states, tape)``; ``train=False`` gives no tape.

        ``params`` replaces ``layer.params`` for this call (same ``[layer][direction]``
        structure); ``rng`` replaces the layer's dropout random stream. Dropout applies when
        ``apply_dropout`` is true, which defaults to ``train``.
        """
        return self._run(x, lengths, states, params, train, rng, apply_dropout)

    def _run(self, x: Any, lengths: Any, states: Any, params: Any, train: bool,
             rng: np.random.Generator | None, apply_dropout: bool | None = None):
        params = self._check_params(params)
        dtype = np.dtype(next(iter(params[0][0].values())).dtype) if params[0][0] \
            else self.dtype
        x = self._check_x(x, dtype)
        T, B = x.shape[:2]
        lens = self._check_lengths(lengths, T, B)
        init = self._check_states(states, B, dtype, T=T)
        if B == 0:  # nothing to compute; compiled functions refuse an empty batch
            return self._run_empty(T, dtype, train)
        L, D = self.num_layers, self.num_directions
        rev = _reverse_index(T, B, lens) if D == 2 else None
        valid = None if lens is None else (np.arange(T)[:, None] < lens[None, :])[:, :, None]
        final = {n: np.empty((L * D, B, s), dtype) for n, s in self.state_sizes.items()}
        tapes: list[list[Tape]] = []
        masks: list[np.ndarray | None] = []
        rng = rng if rng is not None else self._rng
        inp = x
        for k in range(L):
            fn = self.function(k)
            outs, row = [], []
            for d in range(D):
                xin = inp if d == 0 else _gather(inp, rev)
                st0 = {n: init[n][k * D + d] for n in self.state_sizes}
                if train:
                    ys, st, tape = fn.forward(xin, params[k][d], st0, lens)
                    row.append(tape)
                else:
                    ys, st = fn(xin, params[k][d], st0, lens)
                y = ys[self.output_name]
                if d == 1:
                    y = _gather(y, rev)
                if valid is not None:
                    y = np.where(valid, y, 0).astype(dtype, copy=False)
                outs.append(y)
                for n in self.state_sizes:
                    final[n][k * D + d] = st[n]
            out = outs[0] if D == 1 else np.concatenate(outs, axis=2)
            tapes.append(row)
            if k < L - 1:
                mask = None
                if (train if apply_dropout is None else apply_dropout) and self.dropout > 0:
                    keep = rng.random(out.shape) >= self.dropout
                    if self.dropout < 1.0:
                        mask = keep.astype(dtype) / dtype.type(1.0 - self.dropout)
                    else:  # torch's dropout=1 zeroes everything
                        mask = np.zeros(out.shape, dtype)
                    out = out * mask
                masks.append(mask)
            inp = out
        y = inp.transpose(1, 0, 2) if self.batch_first else inp
        tape = LayerTape(self, T, B, dtype, lens, rev, tapes, masks) if train else None
        return np.ascontiguousarray(y), final, tape

    def _run_empty(self, T: int, dtype: np.dtype, train: bool
                   ) -> tuple[np.ndarray, dict[str, np.ndarray], LayerTape | None]:
        """The result of an empty batch (B = 0): empty outputs and states, as torch returns."""
        LD, width = self.num_layers * self.num_directions, self.num_directions * self.output_size
        y = np.zeros((0, T, width) if self.batch_first else (T, 0, width), dtype)
        final = {n: np.zeros((LD, 0, s), dtype) for n, s in self.state_sizes.items()}
        tape = LayerTape(self, T, 0, dtype, None, None, [], []) if train else None
        return y, final, tape

    def _backward_empty(self, tape: LayerTape) -> LayerGrads:
        """Zero gradients for an empty batch: every parameter's gradient is a sum over none."""
        LD, dtype = self.num_layers * self.num_directions, tape.dtype
        x_shape = (0, tape.T, self.input_size) if self.batch_first else \
            (tape.T, 0, self.input_size)
        params = [[{n: np.zeros(a.shape, dtype) for n, a in p.items()} for p in row]
                  for row in self.params]
        states = {n: np.zeros((LD, 0, s), dtype) for n, s in self.state_sizes.items()}
        return LayerGrads(np.zeros(x_shape, dtype), params, states)

    def backward(self, tape: LayerTape, d_y: Any = None, d_states: Any = None) -> LayerGrads:
        """Gradients given the loss's gradients w.r.t. ``y`` and the final states.

        ``d_y`` is shaped like ``y`` (``None`` is zeros); ``d_states`` is a dict like the
        final states (a missing name is zeros). Returns ``LayerGrads`` with ``x`` shaped like
        the input, ``params[layer][direction]`` and ``states`` (the initial states').
        """
        if not isinstance(tape, LayerTape):
            raise RnncTypeError(f"backward() takes the tape from forward(train=True), got "
                                f"{type(tape).__name__}")
        if tape.owner is not self:
            raise RnncValueError("this tape was recorded by another layer")
        L, D, H = self.num_layers, self.num_directions, self.output_size
        T, B, dtype = tape.T, tape.B, tape.dtype
        y_shape = (B, T, D * H) if self.batch_first else (T, B, D * H)
        if d_y is None:
            g_in = np.zeros((T, B, D * H), dtype)
        else:
            d_y = np.asarray(d_y)
            if d_y.shape != y_shape:
                raise RnncValueError(f"d_y must have the shape of y {y_shape}, got {d_y.shape}")
            if d_y.dtype != dtype:
                raise RnncTypeError(f"d_y is {d_y.dtype}, expected {dtype}")
            g_in = d_y.transpose(1, 0, 2) if self.batch_first else d_y
        d_st = self._check_states(d_states, B, dtype, "state gradient")
        if B == 0:
            return self._backward_empty(tape)
        valid = None if tape.lengths is None else \
            (np.arange(T)[:, None] < tape.lengths[None, :])[:, :, None]
        g_params: Grid = [[{} for _ in range(D)] for _ in range(L)]
        g_states = {n: np.empty((L * D, B, s), dtype) for n, s in self.state_sizes.items()}
        for k in range(L - 1, -1, -1):
            if k < L - 1 and tape.dropout_masks[k] is not None:
                g_in = g_in * tape.dropout_masks[k]
            fn = self.function(k)
            gx = np.zeros((T, B, self.layer_input_size(k)), dtype)
            for d in range(D):
                dy = g_in[:, :, d * H:(d + 1) * H]
                if valid is not None:
                    dy = np.where(valid, dy, 0).astype(dtype, copy=False)
                if d == 1:
                    dy = _gather(dy, tape.reverse_index)
                g = fn.backward(tape.tapes[k][d], {self.output_name: np.ascontiguousarray(dy)},
                                {n: d_st[n][k * D + d] for n in self.state_sizes})
                gx += g.x if d == 0 else _gather(g.x, tape.reverse_index)
                g_params[k][d] = g.params
                for n in self.state_sizes:
                    g_states[n][k * D + d] = g.states[n]
            g_in = gx
        if valid is not None:
            g_in = np.where(valid, g_in, 0).astype(dtype, copy=False)
        gx = g_in.transpose(1, 0, 2) if self.batch_first else g_in
        return LayerGrads(np.ascontiguousarray(gx), g_params, g_states)

    def double_backward(self, tape: LayerTape, d_y: np.ndarray,
                        d_states: Mapping[str, np.ndarray], g_x: np.ndarray, g_params: Grid,
                        g_states: Mapping[str, np.ndarray]
                        ) -> tuple[np.ndarray, dict[str, np.ndarray], LayerGrads]:
        """The derivative of ``backward(tape, d_y, d_states)``.

        ``g_x``, ``g_params`` and ``g_states`` are cotangents of the ``LayerGrads`` that
        backward returns (same shapes, all given). Returns the cotangents of ``d_y``, of
        ``d_states`` and, as ``LayerGrads``, of the forward's x, params and initial states.
        Each cell's part is ``Function.double_backward``; this method composes them as
        ``backward`` composes the cells' backward, in reverse: up the layers for what flows
        through the first backward's chain of ``d_y``, then down the layers for what reaches
        a layer's input, which the layer below computed.
        """
        L, D, H = self.num_layers, self.num_directions, self.output_size
        T, B, dtype, rev = tape.T, tape.B, tape.dtype, tape.reverse_index
        if B == 0:
            grads = self._backward_empty(tape)
            return np.zeros_like(d_y), {n: np.zeros_like(v) for n, v in d_states.items()}, grads

        def time_major(a: np.ndarray) -> np.ndarray:
            return a.transpose(1, 0, 2) if self.batch_first else a

        def valid(a: np.ndarray) -> np.ndarray:  # zero past each length, as backward does
            if tape.lengths is None:
                return a
            keep = (np.arange(T)[:, None] < tape.lengths[None, :])[:, :, None]
            return np.where(keep, a, 0).astype(dtype, copy=False)

        def to_cell(a: np.ndarray, d: int) -> np.ndarray:  # its own transpose: an involution
            return np.ascontiguousarray(a if d == 0 else _gather(a, rev))

        def output_cotangent(g: np.ndarray, d: int) -> np.ndarray:
            return to_cell(valid(g[:, :, d * H:(d + 1) * H]), d)

        def dropout(k: int, g: np.ndarray) -> np.ndarray:
            mask = tape.dropout_masks[k] if k < L - 1 else None
            return g if mask is None else g * mask

        out, names = self.output_name, self.state_sizes
        # Replay the first backward down the layers for the cotangents each cell received.
        d_in: list[np.ndarray] = [np.empty(0)] * L
        d_in[L - 1] = time_major(np.asarray(d_y))
        for k in range(L - 1, 0, -1):
            gx = np.zeros((T, B, self.layer_input_size(k)), dtype)
            for d in range(D):
                g = self.function(k).backward(
                    tape.tapes[k][d], {out: output_cotangent(dropout(k, d_in[k]), d)},
                    {n: d_states[n][k * D + d] for n in names})
                gx += to_cell(g.x, d)
            d_in[k - 1] = gx
        # Up the layers: a cell's double backward, given what flows into its gradients.
        u = valid(time_major(np.asarray(g_x)))  # the cotangent of layer k's input gradient
        c_params: Grid = [[{} for _ in range(D)] for _ in range(L)]
        c_states = {n: np.zeros((L * D, B, s), dtype) for n, s in names.items()}
        c_d_states = {n: np.zeros((L * D, B, s), dtype) for n, s in names.items()}
        c_inputs: list[np.ndarray] = []  # the cotangent of each layer's input
        for k in range(L):
            c_d_in = np.zeros((T, B, D * H), dtype)
            c_inputs.append(np.zeros((T, B, self.layer_input_size(k)), dtype))
            for d in range(D):
                row = k * D + d
                dd_out, dd_st, g = self.function(k).double_backward(
                    tape.tapes[k][d], {out: output_cotangent(dropout(k, d_in[k]), d)},
                    {n: d_states[n][row] for n in names},
                    {next(iter(self.function(k).inputs)): to_cell(u, d)},
                    g_params[k][d], {n: g_states[n][row] for n in names})
                c_d_in[:, :, d * H:(d + 1) * H] = valid(to_cell(dd_out[out], d))
                c_inputs[k] += to_cell(g.x, d)
                c_params[k][d] = {n: a.copy() for n, a in g.params.items()}
                for n in names:
                    c_states[n][row] = g.states[n]
                    c_d_states[n][row] = dd_st[n]
            u = dropout(k, c_d_in)
        c_d_y = u
        # Down the layers: a layer's input is the layer below's output.
        for k in range(L - 1, 0, -1):
            ct = dropout(k - 1, c_inputs[k])
            for d in range(D):
                row = (k - 1) * D + d
                g = self.function(k - 1).backward(
                    tape.tapes[k - 1][d], {out: output_cotangent(ct, d)},
                    {n: np.zeros((B, s), dtype) for n, s in names.items()})
                c_inputs[k - 1] += to_cell(g.x, d)
                for n, a in g.params.items():
                    c_params[k - 1][d][n] += a
                for n in names:
                    c_states[n][row] += g.states[n]
        c_x = valid(c_inputs[0])
        return (np.ascontiguousarray(time_major(c_d_y)), c_d_states,
                LayerGrads(np.ascontiguousarray(time_major(c_x)), c_params, c_states))

    # -- weights
    def _standard(self, what: str) -> str:
        if not isinstance(self.mode, str):
            raise RnncValueError(f"{what} needs a standard mode ({', '.join(MODES)}); this layer "
                                 f"uses a custom cell")
        return self.mode

    def _set_params(self, grid: Grid) -> None:
        self.params = [[{n: np.array(a, dtype=self.dtype, order="C") for n, a in p.items()}
                        for p in row] for row in grid]

    def load_torch(self, module: Any) -> None:
        """Copy the weights of a ``torch.nn.RNN/LSTM/GRU`` with the same configuration.

        The module's mode, sizes, ``num_layers`` and ``bidirectional`` must match
        (``batch_first`` and ``dropout`` do not affect weights); a ``bias=False`` module
        gives zero biases. Values are cast to the layer's dtype.
        """
        mode = self._standard("load_torch")
        torch_mode = {"rnn_tanh": "RNN_TANH", "rnn_relu": "RNN_RELU", "lstm": "LSTM",
                      "gru": "GRU"}[mode]
        got = getattr(module, "mode", None)
        if got != torch_mode:
            raise RnncValueError(f"load_torch: expected a torch module of mode {torch_mode!r} "
                                 f"(this layer is {mode!r}), got "
                                 f"{type(module).__name__} with mode {got!r}")
        for attr, want in (("input_size", self.input_size), ("hidden_size", self.hidden_size),
                           ("num_layers", self.num_layers),
                           ("bidirectional", self.bidirectional),
                           ("proj_size", self.proj_size)):
            value = getattr(module, attr, want)
            if value != want:
                raise RnncValueError(f"load_torch: the module has {attr}={value!r}, this layer "
                                     f"has {want!r}")
        sd = {n: t.detach().cpu().numpy() for n, t in module.state_dict().items()}
        self._set_params(W.torch_state_dict_to_layers(mode, sd, self.num_layers,
                                                      self.bidirectional))

    def to_torch(self, **kwargs: Any) -> Any:
        """Return a new ``torch.nn.RNN/LSTM/GRU`` holding this layer's weights (bit-exact).

        The module has this layer's sizes, ``batch_first``, ``dropout`` and dtype;
        ``kwargs`` go to its constructor (e.g. ``device``).
        """
        mode = self._standard("to_torch")
        import torch

        cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode, torch.nn.RNN)
        if mode.startswith("rnn_"):
            kwargs.setdefault("nonlinearity", mode[4:])
        if self.proj_size:
            kwargs.setdefault("proj_size", self.proj_size)
        dtype = torch.float64 if self.dtype == np.float64 else torch.float32
        module = cls(self.input_size, self.hidden_size, num_layers=self.num_layers,
                     bidirectional=self.bidirectional, batch_first=self.batch_first,
                     dropout=self.dropout, dtype=dtype, **kwargs)
        sd = W.layers_to_torch_state_dict(mode, self.params)
        with torch.no_grad():
            module.load_state_dict({n: torch.from_numpy(a) for n, a in sd.items()})
        return module

    @property
    def flat_weights(self) -> np.ndarray:
        """Every parameter in one new 1-D array, in cuDNN's canonical order.

        Pseudo-layers in the order layer 0 forward, layer 0 reverse, layer 1 forward, ...;
        for the standard modes each is ``weight_ih (G*H, in)``, ``weight_hh (G*H, H)``,
        ``bias_ih``, ``bias_hh`` row-major with PyTorch's gate order (``rnnc.weights``
        documents it; it is ``torch.cat([w.reshape(-1) for w in module._flat_weights])``).
        For a custom cell each pseudo-layer is its parameters in declaration order, raveled.
        """
        if isinstance(self.mode, str):
            return W.to_flat(self.mode, self.params)
        return np.concatenate([p[n].reshape(-1) for row in self.params for p in row for n in p])

    def load_flat(self, flat: Any) -> None:
        """Load parameters from a buffer in the order of ``flat_weights``."""
        arr = np.asarray(flat)
        if self.proj_size:
            raise RnncValueError("load_flat does not read LSTM projections (proj_size > 0) yet")
        if isinstance(self.mode, str):
            self._set_params(W.from_flat(self.mode, arr, self.input_size, self.hidden_size,
                                         self.num_layers, self.bidirectional))
            return
        want = sum(p[n].size for row in self.params for p in row for n in p)
        if arr.ndim != 1 or arr.shape[0] != want:
            raise RnncValueError(f"flat must be a 1-D array of length {want}, got shape "
                                 f"{arr.shape}")
        grid, pos = [], 0
        for row in self.params:
            new_row = []
            for p in row:
                new = {}
                for n, a in p.items():
                    new[n] = arr[pos:pos + a.size].reshape(a.shape)
                    pos += a.size
                new_row.append(new)
            grid.append(new_row)
        self._set_params(grid)

    def _single(self, what: str) -> str:
        mode = self._standard(what)
        if self.num_layers != 1 or self.bidirectional:
            raise RnncValueError(f"{what} needs a single-layer, unidirectional layer; this one "
                                 f"has num_layers={self.num_layers}, "
                                 f"bidirectional={self.bidirectional}")
        if self.proj_size:
            raise RnncValueError(f"{what}: Keras has no LSTM with projections (proj_size="
                                 f"{self.proj_size})")
        return mode

    def load_keras(self, kernel: Any, recurrent_kernel: Any, bias: Any = None,
                   reset_after: bool = True) -> None:
        """Load Keras ``SimpleRNN/LSTM/GRU`` weights (``layer.get_weights()``).

        Keras gates are reordered as ``rnnc.weights`` documents; ``reset_after`` must be
        True for GRU, the variant this layer's GRU cell (PyTorch's) computes.
        """
        mode = self._single("load_keras")
        if mode == "gru" and not reset_after:
            raise RnncValueError("load_keras: a reset_after=False Keras GRU is not the cell of "
                                 "mode 'gru'; use the cell factory rnnc.cells.STANDARD['gru_v3']")
        params = W.from_keras(mode, kernel, recurrent_kernel, bias, reset_after)
        self._check_keras_sizes(params)
        self._set_params([[params]])

    def _check_keras_sizes(self, params: Params) -> None:
        first = params[W.input_weight_names(self._standard("load_keras"))[0]]
        if first.shape != (self.input_size, self.hidden_size):
            raise RnncValueError(f"load_keras: kernel is for input_size={first.shape[0]}, "
                                 f"hidden_size={first.shape[1]}; this layer has "
                                 f"{self.input_size}, {self.hidden_size}")

    def to_keras(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return Keras ``(kernel, recurrent_kernel, bias)`` (GRU: ``reset_after=True``)."""
        mode = self._single("to_keras")
        return W.to_keras(mode, self.params[0][0], reset_after=True)

    def __repr__(self) -> str:
        mode = self.mode if isinstance(self.mode, str) else getattr(self.mode, "__name__", "cell")
        return (f"rnnc.RNN({mode!r}, {self.input_size}, {self.hidden_size}, "
                f"num_layers={self.num_layers}, bidirectional={self.bidirectional}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}, "
                f"backend={self.backend!r})")


__all__ = ["RNN", "LayerGrads", "LayerTape", "fastest_backend"]
