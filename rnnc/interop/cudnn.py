"""cuDNN's canonical flat buffer of the standard cells (``to_flat`` / ``from_flat``).

One 1-D array, pseudo-layers in the order layer 0 forward, layer 0 reverse (if
bidirectional), layer 1 forward, ...; each pseudo-layer is, back to back::

    weight_ih  G*H*in  row-major (G*H, in), gate blocks in PyTorch order
    weight_hh  G*H*H   row-major (G*H, H)
    bias_ih    G*H     (left out when bias=False)
    bias_hh    G*H     (left out when bias=False)

where ``in`` is ``input_size`` for layer 0 and ``D*H`` above it (``D`` = 2 when
bidirectional). This is the order of PyTorch's ``module._flat_weights`` and so of the
single cuDNN buffer those tensors view after ``flatten_parameters()``: per pseudo-layer
cuDNN's ``linLayerID`` 0..G-1 (input matrices), G..2G-1 (recurrent matrices), then the
biases with the same IDs, where cuDNN's LSTM IDs are input, forget, new-memory, output
gate and its GRU IDs reset, update, new-memory gate, i.e. PyTorch's i,f,g,o and r,z,n.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.interop.cell_params import (
    Layers,
    WeightError,
    as_float_numpy,
    layer_input_size,
    num_gates,
)
from rnnc.interop.torch_layout import layers_to_torch_state_dict, split_torch, torch_names


def flat_size(mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
              bidirectional: bool = False, bias: bool = True) -> int:
    """Return the length of the cuDNN canonical flat buffer for this configuration."""
    g = num_gates(mode)
    total = 0
    for k in range(num_layers):
        i_k = layer_input_size(k, input_size, hidden_size, bidirectional)
        per = g * hidden_size * (i_k + hidden_size) + (2 * g * hidden_size if bias else 0)
        total += per * (2 if bidirectional else 1)
    return total


def to_flat(mode: str, layers: Any, bias: bool = True) -> np.ndarray:
    """Pack rnnc params [layer][direction] into the cuDNN canonical flat buffer (module doc).

    With ``bias=False`` the biases are left out, as in a ``bias=False`` PyTorch module's
    ``_flat_weights``; that requires every bias to be zero.
    """
    sd = layers_to_torch_state_dict(mode, layers, bias=bias)
    # The state dict is already in pseudo-layer order with w_ih, w_hh, b_ih, b_hh each.
    return np.concatenate([a.reshape(-1) for a in sd.values()])


def from_flat(mode: str, flat: Any, input_size: int, hidden_size: int, num_layers: int = 1,
              bidirectional: bool = False, bias: bool = True) -> Layers:
    """Unpack a cuDNN canonical flat buffer (module doc) into rnnc params [layer][direction].

    Raises ``WeightError`` when the length differs from ``flat_size(...)``.
    """
    arr = as_float_numpy(flat, "flat")
    for name, v in (("input_size", input_size), ("hidden_size", hidden_size),
                    ("num_layers", num_layers)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise WeightError(f"{name}: expected an integer >= 1, got {v!r}")
    if arr.ndim != 1:
        raise WeightError(f"flat: expected a 1-D array, got shape {arr.shape}")
    n = flat_size(mode, input_size, hidden_size, num_layers, bidirectional, bias)
    if arr.shape[0] != n:
        raise WeightError(
            f"flat: expected length {n} for mode {mode!r}, input_size={input_size}, "
            f"hidden_size={hidden_size}, num_layers={num_layers}, "
            f"bidirectional={bidirectional}, bias={bias}; got {arr.shape[0]}"
        )
    g, h = num_gates(mode), hidden_size
    pos = 0

    def take(shape: tuple[int, ...]) -> np.ndarray:
        """Return the next ``prod(shape)`` entries of the buffer reshaped to ``shape``."""
        nonlocal pos
        size = int(np.prod(shape))
        out = arr[pos : pos + size].reshape(shape)
        pos += size
        return out

    layers: Layers = []
    for k in range(num_layers):
        i_k = layer_input_size(k, input_size, hidden_size, bidirectional)
        row = []
        for r in (False, True) if bidirectional else (False,):
            names = torch_names(k, r)
            w_ih, w_hh = take((g * h, i_k)), take((g * h, h))
            b_ih, b_hh = (take((g * h,)), take((g * h,))) if bias else (None, None)
            row.append(split_torch(mode, w_ih, w_hh, b_ih, b_hh, names, i_k, h))
        layers.append(row)
    assert pos == n
    return layers
