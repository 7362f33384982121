"""The weights of an ``rnnc.RNN`` in other libraries' layouts: PyTorch modules, cuDNN's flat
buffer, Keras arrays.

``rnnc.RNN``'s methods ``load_torch``, ``to_torch``, ``flat_weights``, ``load_flat``,
``load_keras`` and ``to_keras`` call these functions; those that read weights return a new
``[layer][direction]`` grid, which the layer casts to its dtype and keeps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.errors import RnncValueError
from rnnc.interop import keras, weights
from rnnc.interop.cell_params import TORCH_MODES, as_float_numpy
from rnnc.layers import MODES, RNN, Grid


def _standard(layer: RNN, what: str) -> str:
    """The layer's mode, which must be a standard one: a custom cell has no such layout."""
    if not isinstance(layer.mode, str):
        raise RnncValueError(f"{what} needs a standard mode ({', '.join(MODES)}); this layer "
                             f"uses a custom cell")
    return layer.mode


def _single(layer: RNN, what: str) -> str:
    """The mode of a single-layer, unidirectional layer without projections (Keras's kind)."""
    mode = _standard(layer, what)
    if layer.num_layers != 1 or layer.bidirectional:
        raise RnncValueError(f"{what} needs a single-layer, unidirectional layer; this one "
                             f"has num_layers={layer.num_layers}, "
                             f"bidirectional={layer.bidirectional}")
    if layer.proj_size:
        raise RnncValueError(f"{what}: Keras has no LSTM with projections (proj_size="
                             f"{layer.proj_size})")
    return mode


def params_from_torch(layer: RNN, module: Any) -> Grid:
    """The weights of a ``torch.nn.RNN/LSTM/GRU`` configured as ``layer`` (``load_torch``)."""
    mode = _standard(layer, "load_torch")
    torch_mode = next(k for k, v in TORCH_MODES.items() if v == mode)
    got = getattr(module, "mode", None)
    if got != torch_mode:
        raise RnncValueError(f"load_torch: expected a torch module of mode {torch_mode!r} "
                             f"(this layer is {mode!r}), got "
                             f"{type(module).__name__} with mode {got!r}")
    for attr, want in (("input_size", layer.input_size), ("hidden_size", layer.hidden_size),
                       ("num_layers", layer.num_layers), ("bidirectional", layer.bidirectional),
                       ("proj_size", layer.proj_size)):
        value = getattr(module, attr, want)
        if value != want:
            raise RnncValueError(f"load_torch: the module has {attr}={value!r}, this layer "
                                 f"has {want!r}")
    sd = {n: t.detach().cpu().numpy() for n, t in module.state_dict().items()}
    return weights.torch_state_dict_to_layers(mode, sd, layer.num_layers, layer.bidirectional)


def to_torch(layer: RNN, **kwargs: Any) -> Any:
    """A new ``torch.nn.RNN/LSTM/GRU`` holding the layer's weights (``to_torch``)."""
    mode = _standard(layer, "to_torch")
    import torch

    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode, torch.nn.RNN)
    if mode.startswith("rnn_"):
        kwargs.setdefault("nonlinearity", mode[4:])
    if layer.proj_size:
        kwargs.setdefault("proj_size", layer.proj_size)
    dtype = torch.float64 if layer.dtype == np.float64 else torch.float32
    module = cls(layer.input_size, layer.hidden_size, num_layers=layer.num_layers,
                 bidirectional=layer.bidirectional, batch_first=layer.batch_first,
                 dropout=layer.dropout, dtype=dtype, **kwargs)
    sd = weights.layers_to_torch_state_dict(mode, layer.params)
    with torch.no_grad():
        module.load_state_dict({n: torch.from_numpy(a) for n, a in sd.items()})
    return module


def flat_weights(layer: RNN) -> np.ndarray:
    """Every parameter of the layer in one new 1-D array, cuDNN's order (``flat_weights``)."""
    if isinstance(layer.mode, str):
        return weights.to_flat(layer.mode, layer.params)
    return np.concatenate([p[n].reshape(-1) for row in layer.params for p in row for n in p])


def params_from_flat(layer: RNN, flat: Any) -> Grid:
    """The parameters a buffer in the order of ``flat_weights`` holds (``load_flat``)."""
    arr = as_float_numpy(flat, "load_flat: flat")
    if layer.proj_size:
        raise RnncValueError("load_flat does not read LSTM projections (proj_size > 0) yet")
    if isinstance(layer.mode, str):
        return weights.from_flat(layer.mode, arr, layer.input_size, layer.hidden_size,
                                 layer.num_layers, layer.bidirectional)
    want = sum(p[n].size for row in layer.params for p in row for n in p)
    if arr.ndim != 1 or arr.shape[0] != want:
        raise RnncValueError(f"flat must be a 1-D array of length {want}, got shape "
                             f"{arr.shape}")
    grid, pos = [], 0
    for row in layer.params:
        new_row = []
        for p in row:
            new = {}
            for n, a in p.items():
                new[n] = arr[pos:pos + a.size].reshape(a.shape)
                pos += a.size
            new_row.append(new)
        grid.append(new_row)
    return grid


def params_from_keras(layer: RNN, kernel: Any, recurrent_kernel: Any, bias: Any,
                      reset_after: bool) -> Grid:
    """The parameters Keras ``SimpleRNN/LSTM/GRU`` weights hold (``load_keras``)."""
    mode = _single(layer, "load_keras")
    if mode == "gru" and not reset_after:
        raise RnncValueError("load_keras: a reset_after=False Keras GRU is not the cell of "
                             "mode 'gru'; use the cell factory rnnc.cells.STANDARD['gru_v3']")
    params = keras.from_keras(mode, kernel, recurrent_kernel, bias, reset_after)
    first = params[weights.input_weight_names(mode)[0]]
    if first.shape != (layer.input_size, layer.hidden_size):
        raise RnncValueError(f"load_keras: kernel is for input_size={first.shape[0]}, "
                             f"hidden_size={first.shape[1]}; this layer has "
                             f"{layer.input_size}, {layer.hidden_size}")
    return [[params]]


def to_keras(layer: RNN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keras ``(kernel, recurrent_kernel, bias)`` of the layer (``to_keras``)."""
    return keras.to_keras(_single(layer, "to_keras"), layer.params[0][0], reset_after=True)
