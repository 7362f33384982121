"""Checks of ``rnnc.torch.RNN``'s arguments: the constructor's, as ``torch.nn.RNNBase`` checks
them, and the dtypes rnnc computes in."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.interop.cell_params import TORCH_MODES
from rnnc.layers import CellFactory, check_dropout
from rnnc.layers.checks import warn_single_layer_dropout

DTYPES = (torch.float32, torch.float64)  # what rnnc computes in (bfloat16: torch_precision)


def check_arguments(mode: Any, nonlinearity: str | None, input_size: Any, hidden_size: Any,
                     num_layers: Any, bias: Any, batch_first: Any, dropout: Any, proj_size: Any
                     ) -> str | CellFactory:
    """Check the constructor's arguments as ``torch.nn.RNNBase`` does, with its error kinds;
    return rnnc's mode (``"RNN"`` plus ``nonlinearity`` becomes ``"rnn_tanh"``/``"rnn_relu"``).
    """
    if isinstance(mode, str):
        mode = TORCH_MODES.get(mode, mode)
        if mode in ("rnn", "RNN"):
            nonlinearity = "tanh" if nonlinearity is None else nonlinearity
            if nonlinearity not in ("tanh", "relu"):
                raise RnncValueError(f"Unknown nonlinearity {nonlinearity!r}. Select from 'tanh' "
                                     f"or 'relu'.")
            mode = f"rnn_{nonlinearity}"
    if nonlinearity is not None and mode != f"rnn_{nonlinearity}":
        raise RnncValueError(f"nonlinearity={nonlinearity!r} needs mode 'RNN', got {mode!r}")
    try:
        check_dropout(dropout)
    except RnncValueError:
        raise RnncValueError(f"dropout should be a number in range [0, 1] representing the "
                             f"probability of an element being zeroed, got {dropout!r}") from None
    warn_single_layer_dropout(dropout, num_layers, stacklevel=3)
    for name, value in (("bias", bias), ("batch_first", batch_first)):
        if not isinstance(value, bool):
            raise RnncTypeError(f"{name} should be of type bool, got: {type(value).__name__}")
    for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                        ("num_layers", num_layers), ("proj_size", proj_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RnncTypeError(f"{name} should be of type int, got: {type(value).__name__}")
        if value < (0 if name == "proj_size" else 1):
            raise RnncValueError(f"{name} must be greater than zero, got {value}" if
                                 name != "proj_size" else
                                 f"proj_size should be a positive integer or zero to disable "
                                 f"projections, got {value}")
    if proj_size and mode != "lstm":
        raise RnncValueError(f"proj_size argument is only supported for LSTM, not {mode!r}")
    if proj_size >= hidden_size:
        raise RnncValueError(f"proj_size has to be smaller than hidden_size ({hidden_size}), "
                             f"got {proj_size}")
    return mode


def check_dtypes(name: str, params: torch.dtype, x: torch.dtype) -> None:
    """Raise unless the parameters' dtype ``params`` and the input's ``x`` are ones rnnc computes
    in, naming the conversion in torch's terms (``name``: the module's kind, as torch names it).
    """
    if params not in DTYPES:
        raise RnncTypeError(f"{name}: the module's parameters are {params}, but rnnc.torch.RNN "
                            f"computes in torch.float32 or torch.float64: convert the module "
                            f"with module.float() (or module.double()) and its input with "
                            f"input.float()")
    if x not in DTYPES:
        raise RnncTypeError(f"{name}: the input is {x}, but rnnc.torch.RNN computes in "
                            f"torch.float32 or torch.float64: pass input.to({params}), the "
                            f"dtype of the module's parameters")


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of NumPy's ``dtype`` (one rnnc computes in)."""
    return torch.float64 if np.dtype(dtype) == np.float64 else torch.float32


def check_input_dtype(name: str, module: torch.dtype, x: torch.dtype, has_params: bool
                      ) -> None:
    """Raise unless the input's dtype ``x`` is the module's, ``module`` (its parameters'; that
    of its construction for a cell without parameters), naming the conversion in torch's
    terms, as ``torch.nn.RNNBase`` does."""
    if x == module:
        return
    if has_params:
        raise RnncValueError(f"{name}: input dtype ({x}) does not match weight dtype ({module}). "
                             f"Convert input: input.to({module}), or convert model: "
                             f"model.to({x})")
    raise RnncValueError(f"{name}: input dtype ({x}) does not match the module's dtype "
                         f"({module}): its cell has no parameters, so it computes in the dtype "
                         f"it was built with. Convert the input: input.to({module}), or build "
                         f"the module with dtype={x}")
