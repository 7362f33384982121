"""What the layer helpers (checks, run, backward) read and write of an ``rnnc.RNN``.

``rnnc.layers.rnn`` holds the class and calls the helpers; they take the layer as this
protocol, so none of them imports the class that uses it.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from rnnc.api import Function


class LayerStack(Protocol):
    """A stack of compiled cells, ``num_layers`` deep and ``num_directions`` wide."""

    input_size: int
    num_layers: int
    num_directions: int
    dropout: float
    extra_inputs: str
    batch_first: bool
    dtype: np.dtype
    transfers: dict[str, int]  # bytes the glue of the last call moved to and from the device
    cell_name: str
    input_name: str
    output_name: str
    extra_sizes: dict[str, int]
    output_size: int
    state_sizes: dict[str, int]  # each state's number of features
    state_shapes: dict[str, tuple[int, ...]]  # each state's feature shape, (size,) if flat
    params: list[list[dict[str, Any]]]

    @property
    def draws_masks(self) -> bool: ...
    def layer_input_size(self, layer: int) -> int: ...
    def function(self, layer: int, direction: int = 0) -> Function: ...
