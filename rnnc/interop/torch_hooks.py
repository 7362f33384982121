"""What the autograd functions and the tensor bridge read of an ``rnnc.torch.RNN``.

``rnnc.interop.torch`` holds the module and calls them; they take it as this protocol, so none
of them imports the module that uses it. The parameter hooks keep the private names that
``torch.nn.RNN``'s own (``_flat_weights_names``, ...) sit beside.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from rnnc.layers import RNN as Layer
from rnnc.layers import Grid


class TorchRNN(Protocol):
    """An ``rnnc.torch.RNN``: the rnnc layer it runs and its names for states and tensors."""

    layer: Layer
    mode: str | Callable[..., Any]
    batch_first: bool
    training: bool
    state_names: tuple[str, ...]
    extra_names: tuple[str, ...]
    _param_names: list[list[list[str]]]  # [layer][direction]: the parameters' torch names

    def _rnnc_params(self, tensors: tuple[torch.Tensor, ...]) -> Grid: ...
    def _torch_grads(self, grads: Grid) -> list[np.ndarray]: ...
