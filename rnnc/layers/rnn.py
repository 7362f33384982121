"""``rnnc.RNN``: the layer object, its cells and compiled functions, and its public methods.

Running and differentiating are in ``rnnc.layers.run`` and ``rnnc.layers.backward``; the
checks of the caller's arguments in ``rnnc.layers.checks``; the weight methods
(``load_torch``, ``to_torch``, ``flat_weights``, ``load_flat``, ``load_keras``, ``to_keras``)
import ``rnnc.interop.layer_weights`` when called, so that ``import rnnc`` never loads it.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc import cells, process
from rnnc.api import Function
from rnnc.api import compile as compile_cell
from rnnc.dsl import Cell
from rnnc.layers import backward as backward_paths
from rnnc.layers import checks
from rnnc.layers.backward import LayerGrads, States
from rnnc.layers.checks import CellFactory, Grid, check_dropout
from rnnc.layers.run import LayerTape, Result, run
from rnnc.settings import fastest_backend

# Standard cells' compiled functions shared by layers, least recently used first out: a layer
# keeps its own references, so an evicted function lives on for as long as a layer uses it.
_CACHE: OrderedDict[tuple, Function] = OrderedDict()
_CACHE_LOCK = process.Lock()


def _compiled(mode: str | CellFactory, cell: Cell, in_size: int, hidden: int,
              backend: str | None, options: Mapping[str, Any], proj_size: int = 0,
              reverse: bool = False) -> Function:
    """Compile ``cell`` (scanning backwards in time if ``reverse``; ``backend=None`` is the
    default); standard cells are shared process-wide since their programs are fixed."""
    if not isinstance(mode, str):
        return compile_cell(cell, backend=backend, reverse=reverse, **options)
    try:
        key = (mode, in_size, hidden, proj_size, backend, reverse,
               tuple(sorted(options.items())))
        hash(key)
    except TypeError:
        return compile_cell(cell, backend=backend, reverse=reverse, **options)
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is None:
            found = _CACHE[key] = compile_cell(cell, backend=backend, reverse=reverse, **options)
        _CACHE.move_to_end(key)
        while len(_CACHE) > process.LAYER_CACHE_FUNCTIONS:
            _CACHE.popitem(last=False)
        return found


class RNN:
    """A stack of recurrent layers of one cell: ``y, states = layer(x, lengths, states)``.

    ``mode`` is ``"rnn_tanh"``, ``"rnn_relu"``, ``"lstm"``, ``"gru"`` or a cell factory
    ``(input_size, hidden_size) -> Cell``. A factory's cell reads the layer input (``x``, or
    the layer below's output) as its first input, which must have ``input_size`` features;
    its further inputs are *extra inputs*, sequences the caller passes by name to every call
    (``layer(x, extra={"u": u})``, each ``(T, B, size)`` like ``x``, batch-first with
    ``batch_first``). With ``extra_inputs="all"`` every layer reads them; with ``"first"``
    only layer 0 does and the layers above read zeros in their place. The layer's output is
    the cell's output (the one named ``"y"`` when there are several), of any width ``K``:
    ``y`` is ``(T, B, D*K)`` and the layers above read ``D*K`` features; states may have any
    sizes and feature shapes, the same in every layer. ``proj_size`` (mode ``"lstm"``) is the
    cell ``rnnc.cells.lstm(..., proj_size)``, whose output has ``proj_size`` features.
    ``backend`` is ``"numpy"``, ``"llvm"``, ``"cuda"`` or ``None`` (the default) for the
    fastest backend for the data, as in ``rnnc.compile``: llvm where it works here (else
    numpy) for host arrays, cuda for a call on device arrays (``layer.backend`` names the host
    one). ``backend_options`` go to ``rnnc.compile`` (e.g. ``emulate=True``). ``seed`` makes
    the parameter initialization and the dropout masks reproducible. A cell that draws its
    own masks (``rnnc.bernoulli``: zoneout, variational dropout) gets each call's ``seed=``,
    or one drawn from the layer's random stream, and every layer and direction draws its own
    masks from a seed derived from it.

    States are a dict by state name, each ``(num_layers * D, B, *shape)`` with ``D = 2`` when
    bidirectional and row ``layer * D + direction``, where ``shape`` is the state's feature
    shape in the cell (``layer.state_shapes``): ``(size,)`` for a ``(B, size)`` state, ``(D, N)``
    for a ``(B, D, N)`` one such as ``rnnc.cells.selective_ssm``'s (``layer.state_sizes``
    holds each state's number of features). For the standard cells this is
    PyTorch's ``h_n = states["h"]`` and, for LSTM, ``c_n = states["c"]``; initial states
    ``(h_0, c_0)`` are passed as ``states={"h": h_0, "c": c_0}`` (a missing name is zeros).

    Parameters are ``layer.params[layer][direction]``, a dict of arrays with rnnc's names
    (``W_ii, ..., b_ho`` for LSTM; see ``rnnc.interop.weights``).

    With ``backend="cuda"`` or the default, a call whose ``x`` is a device array (CuPy, a
    CUDA tensor, ...) is a device call (``docs/device-calls.md``): outputs, states, the tape
    and gradients stay on the device. ``layer.transfers`` holds the bytes the glue between
    the cells copied each way in the last call (each cell call's own copies are its
    runner's ``transfers``).
    """

    def __init__(self, mode: str | CellFactory, input_size: int, hidden_size: int,
                 num_layers: int = 1, bidirectional: bool = False, dropout: float = 0.0,
                 batch_first: bool = False, backend: str | None = None,
                 seed: int | None = None, dtype: Any = np.float32, proj_size: int = 0,
                 extra_inputs: str = "all", **backend_options: Any) -> None:
        self.mode = checks.check_mode(mode)
        self.input_size = checks.check_int(input_size, "input_size", 1)
        self.hidden_size = checks.check_int(hidden_size, "hidden_size", 1)
        self.num_layers = checks.check_int(num_layers, "num_layers", 1)
        self.proj_size = checks.check_proj_size(proj_size, mode, self.hidden_size)
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if self.bidirectional else 1
        self.dropout = check_dropout(dropout)
        checks.warn_single_layer_dropout(self.dropout, self.num_layers, stacklevel=2)
        self.extra_inputs = checks.check_extra_inputs(extra_inputs)
        self.batch_first = bool(batch_first)
        self.dtype = checks.check_dtype(dtype)
        self.backend = checks.check_backend(fastest_backend() if backend is None else backend)
        self.default_backend = backend is None  # its functions run device data on CUDA twins
        self.backend_options = dict(backend_options)
        self._rng = np.random.default_rng(seed)
        self.transfers = {"to_device": 0, "to_host": 0}
        # Host parameters uploaded for device calls, by (layer, direction): see layers.run.
        self._uploaded: dict[tuple[int, int], tuple[np.ndarray, Any]] = {}
        self._cells: dict[int, Cell] = {}
        self._functions: dict[tuple[int, bool, str], Function] = {}
        first = self._cell(self.input_size)
        self.cell_name, self.input_name = first.name, next(iter(first.inputs))
        self.output_name = checks.output_name(first)
        self.extra_sizes, self.output_size, self.state_shapes = checks.signature(first)
        self.state_sizes = {n: math.prod(s) for n, s in self.state_shapes.items()}
        for k in range(self.num_layers):
            for d in range(self.num_directions):
                self.function(k, d)
        self.params: Grid = self.init_params(int(self._rng.integers(2**31)))

    # -- cells and compiled functions
    def layer_input_size(self, layer: int) -> int:
        """Return the input width of ``layer``: ``input_size``, then ``D * output_size``
        (``output_size``, the cell's output width: ``proj_size`` for an LSTM with
        projections, ``hidden_size`` for the other standard cells)."""
        return self.input_size if layer == 0 else self.num_directions * self.output_size

    def _build_cell(self, in_size: int) -> Cell:
        if self.proj_size:
            return cells.lstm(in_size, self.hidden_size, proj_size=self.proj_size)
        if isinstance(self.mode, str):
            return cells.STANDARD[self.mode](in_size, self.hidden_size)
        return checks.check_factory_cell(self.mode(in_size, self.hidden_size), in_size)

    def _cell(self, in_size: int) -> Cell:
        if in_size not in self._cells:
            cell = self._build_cell(in_size)
            if in_size != self.input_size:  # every layer's cell must stack on layer 0's
                checks.check_same_signature(cell, self._cell(self.input_size), in_size,
                                            self.input_size)
            self._cells[in_size] = cell
        return self._cells[in_size]

    def _function(self, in_size: int, reverse: bool = False) -> Function:
        """Compile on first use: after unpickling, functions are rebuilt here from the cell."""
        # keyed by precision too: rnnc.torch.RNN switches it per call (autocast, bfloat16)
        key = (in_size, reverse, self.backend_options.get("precision", "fp32"))
        if key not in self._functions:
            backend = None if getattr(self, "default_backend", False) else self.backend
            self._functions[key] = _compiled(
                self.mode, self._cell(in_size), in_size, self.hidden_size, backend,
                self.backend_options, self.proj_size, reverse)
        return self._functions[key]

    @property
    def draws_masks(self) -> bool:
        """Whether the cell draws random masks (``rnnc.bernoulli``), keyed by a call's seed."""
        return self.function(0).draws_masks

    def program_identities(self) -> tuple[str, ...]:
        """The fingerprints of the traced programs of every layer and direction, in order:
        equal for layers that run the same code, whatever factory made their cells. Traces
        the cells only (compiles nothing)."""
        return tuple(self._cell(self.layer_input_size(k)).program(reverse=d == 1).fingerprint()
                     for k in range(self.num_layers) for d in range(self.num_directions))

    def function(self, layer: int, direction: int = 0) -> Function:
        """Return the compiled function that runs direction ``direction`` of ``layer``
        (direction 1 scans backwards in time; shared by layers of equal input widths)."""
        return self._function(self.layer_input_size(layer), direction == 1)

    def init_params(self, seed: int = 0, dtype: Any = None) -> Grid:
        """Return fresh parameters ``[layer][direction]`` (the cell's initializers; PyTorch's
        init where the cell names none), from ``seed``, in ``dtype`` (None: the layer's)."""
        seeds = np.random.SeedSequence(seed).generate_state(self.num_layers * self.num_directions)
        dtype = self.dtype if dtype is None else dtype
        return [[self._cell(self.layer_input_size(k)).init_params(
                    int(seeds[k * self.num_directions + d]), dtype)
                 for d in range(self.num_directions)] for k in range(self.num_layers)]

    def reseed(self, seed: int | None) -> None:
        """Restart the dropout random stream from ``seed``."""
        self._rng = np.random.default_rng(seed)

    # -- pickling: compiled functions hold native code, so they are rebuilt from the cell
    def __getstate__(self) -> dict[str, Any]:
        checks.check_picklable(self.mode)
        return {**self.__dict__, "_cells": {}, "_functions": {}, "_uploaded": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "state_shapes" not in state:  # pickled when every state was (B, size)
            state["state_shapes"] = {n: (s,) for n, s in state["state_sizes"].items()}
        self.__dict__.update(state)

    def __deepcopy__(self, memo: dict[int, Any]) -> RNN:
        """Copy everything but the cells and compiled functions, which are immutable: share."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        shared = {"mode": self.mode, "_cells": dict(self._cells),
                  "_functions": dict(self._functions), "_uploaded": {}}
        new.__dict__.update({k: shared[k] if k in shared else copy.deepcopy(v, memo)
                             for k, v in self.__dict__.items()})
        return new

    # -- running
    def __call__(self, x: Any, lengths: Any = None, states: Any = None, extra: Any = None,
                 seed: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Inference: ``(y, final_states)``; no dropout, nothing saved.

        ``extra`` is a dict of the cell's extra inputs by name (every input after the
        first), each shaped like ``x`` but with its own feature count; see the class.
        ``seed`` keys the masks of a cell that draws them (see the class)."""
        y, final, _ = run(self, x, lengths, states, None, False, self._rng, None, extra, seed)
        return y, final

    def forward(self, x: Any, lengths: Any = None, states: Any = None, train: bool = True,
                params: Grid | None = None, rng: np.random.Generator | None = None,
                apply_dropout: bool | None = None, extra: Any = None, seed: int | None = None
                ) -> Result:
        """Training forward: ``(y, final_states, tape)``; ``train=False`` gives no tape.

        ``params`` replaces ``layer.params`` for this call (same ``[layer][direction]``
        structure); ``rng`` replaces the layer's dropout random stream. Dropout applies when
        ``apply_dropout`` is true, which defaults to ``train``. ``extra`` holds the extra
        inputs, as in ``__call__``; ``seed`` keys the cell's own masks (the tape keeps it for
        backward).
        """
        return run(self, x, lengths, states, params, train,
                   self._rng if rng is None else rng, apply_dropout, extra, seed)

    def backward(self, tape: LayerTape, d_y: Any = None, d_states: Any = None) -> LayerGrads:
        """Gradients given the loss's gradients w.r.t. ``y`` and the final states.

        ``d_y`` is shaped like ``y`` (``None`` is zeros); ``d_states`` is a dict like the
        final states (a missing name is zeros). Returns ``LayerGrads`` with ``x`` shaped like
        the input, ``params[layer][direction]``, ``states`` (the initial states') and
        ``extra`` (each extra input's, shaped like it, summed over the layers that read it).
        """
        return backward_paths.backward(self, tape, d_y, d_states)

    def double_backward(self, tape: LayerTape, d_y: np.ndarray,
                        d_states: Mapping[str, np.ndarray], g_x: np.ndarray, g_params: Grid,
                        g_states: Mapping[str, np.ndarray],
                        g_extra: Mapping[str, np.ndarray] | None = None
                        ) -> tuple[np.ndarray, States, LayerGrads]:
        """The derivative of ``backward(tape, d_y, d_states)``.

        ``g_x``, ``g_params``, ``g_states`` and ``g_extra`` are cotangents of the
        ``LayerGrads`` that backward returns (same shapes, all given but ``g_extra``, whose
        missing entries are zeros). Returns the cotangents of ``d_y``, of ``d_states`` and,
        as ``LayerGrads``, of the forward's x, params, initial states and extra inputs.
        Each cell's part is ``Function.double_backward``; this method composes them as
        ``backward`` composes the cells' backward, in reverse: up the layers for what flows
        through the first backward's chain of ``d_y``, then down the layers for what reaches
        a layer's input, which the layer below computed.
        """
        return backward_paths.double_backward(self, tape, d_y, d_states, g_x, g_params,
                                              g_states, g_extra)

    # -- weights in other libraries' layouts (rnnc.interop.layer_weights)
    def _set_params(self, grid: Grid) -> None:
        self.params = [[{n: np.array(a, dtype=self.dtype, order="C") for n, a in p.items()}
                        for p in row] for row in grid]

    def load_torch(self, module: Any) -> None:
        """Copy the weights of a ``torch.nn.RNN/LSTM/GRU`` with the same configuration.

        The module's mode, sizes, ``num_layers`` and ``bidirectional`` must match
        (``batch_first`` and ``dropout`` do not affect weights); a ``bias=False`` module
        gives zero biases. Values are cast to the layer's dtype.
        """
        from rnnc.interop import layer_weights

        self._set_params(layer_weights.params_from_torch(self, module))

    def to_torch(self, **kwargs: Any) -> Any:
        """Return a new ``torch.nn.RNN/LSTM/GRU`` holding this layer's weights (bit-exact).

        The module has this layer's sizes, ``batch_first``, ``dropout`` and dtype;
        ``kwargs`` go to its constructor (e.g. ``device``).
        """
        from rnnc.interop import layer_weights

        return layer_weights.to_torch(self, **kwargs)

    @property
    def flat_weights(self) -> np.ndarray:
        """Every parameter in one new 1-D array, in cuDNN's canonical order.

        Pseudo-layers in the order layer 0 forward, layer 0 reverse, layer 1 forward, ...;
        for the standard modes each is ``weight_ih (G*H, in)``, ``weight_hh (G*H, H)``,
        ``bias_ih``, ``bias_hh`` row-major with PyTorch's gate order
        (``rnnc.interop.weights`` documents it; it is
        ``torch.cat([w.reshape(-1) for w in module._flat_weights])``). For a custom cell each
        pseudo-layer is its parameters in declaration order, raveled.
        """
        from rnnc.interop import layer_weights

        return layer_weights.flat_weights(self)

    def load_flat(self, flat: Any) -> None:
        """Load parameters from a buffer in the order of ``flat_weights``."""
        from rnnc.interop import layer_weights

        self._set_params(layer_weights.params_from_flat(self, flat))

    def load_keras(self, kernel: Any, recurrent_kernel: Any, bias: Any = None,
                   reset_after: bool = True) -> None:
        """Load Keras ``SimpleRNN/LSTM/GRU`` weights (``layer.get_weights()``).

        Keras gates are reordered as ``rnnc.interop.keras`` documents; ``reset_after`` must
        be True for GRU, the variant this layer's GRU cell (PyTorch's) computes.
        """
        from rnnc.interop import layer_weights

        self._set_params(layer_weights.params_from_keras(self, kernel, recurrent_kernel, bias,
                                                         reset_after))

    def to_keras(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return Keras ``(kernel, recurrent_kernel, bias)`` (GRU: ``reset_after=True``)."""
        from rnnc.interop import layer_weights

        return layer_weights.to_keras(self)

    def __repr__(self) -> str:
        mode = self.mode if isinstance(self.mode, str) else getattr(self.mode, "__name__", "cell")
        return (f"rnnc.RNN({mode!r}, {self.input_size}, {self.hidden_size}, "
                f"num_layers={self.num_layers}, bidirectional={self.bidirectional}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}, "
                f"backend={self.backend!r})")
