"""Keras weights of the standard cells (``from_keras`` / ``to_keras``).

Keras's layout, already ``x @ W`` oriented::

    kernel            (in, G*H)   column block j = gate KERAS_GATES[mode][j]
    recurrent_kernel  (H, G*H)
    bias              (G*H,), or (2, G*H) for GRU with reset_after=True

Keras gate order: LSTM ``i, f, c, o`` (rnnc ``g`` is Keras ``c``); GRU ``z, r, h``
(rnnc ``n`` is Keras ``h``); SimpleRNN has one block. Keras keeps one bias except the
reset_after GRU, whose bias row 0 is the input bias and row 1 the recurrent bias, which
is exactly rnnc's ``b_i*`` / ``b_h*`` of ``gru(reset_after=True)``. Elsewhere import
sets ``b_i* = bias`` and ``b_h* = 0``, and export writes ``b_i* + b_h*``. That sum is
exact in meaning, not only a convention: in the RNN, the LSTM and the reset_after=False
GRU (rnnc ``gru(..., reset_after=False)``: ``n = tanh(x W_in + b_in + (r*h) W_hn +
b_hn)``) every ``b_h{g}`` is added next to ``b_i{g}`` and never sits inside a product,
so only the sum matters. Export of a reset_after=True GRU to ``reset_after=False``
would not be exact (``b_hn`` is scaled by ``r`` there), which is why ``reset_after``
must match the cell that the parameters belong to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc.interop.cell_params import (
    GATES,
    Params,
    WeightError,
    as_numpy,
    check_dtype,
    check_layer_params,
    check_shape,
    fresh_copy,
    num_gates,
    param_names,
)

KERAS_GATES: dict[str, tuple[str, ...]] = {
    mode: ("z", "r", "n") if mode == "gru" else order for mode, order in GATES.items()
}
"""The same gates, named as in rnnc, in Keras's column order (LSTM i,f,c,o; GRU z,r,h)."""


def _keras_bias_shape(mode: str, hidden_size: int, reset_after: bool) -> tuple[int, ...]:
    """Return the shape of the Keras bias of ``mode`` (two rows for a reset_after GRU)."""
    gh = num_gates(mode) * hidden_size
    return (2, gh) if mode == "gru" and reset_after else (gh,)


def _keras_biases(mode: str, bias: Any | None, hidden_size: int, dtype: np.dtype,
                  reset_after: bool) -> tuple[np.ndarray, np.ndarray]:
    """Return the checked Keras bias as rnnc's fused ``(b_i*, b_h*)`` (zeros where absent)."""
    b_shape = _keras_bias_shape(mode, hidden_size, reset_after)
    if bias is None:
        b = np.zeros(b_shape, dtype=dtype)
    else:
        b = as_numpy(bias, "bias")
        check_shape(b, b_shape, "bias")
        check_dtype(b, dtype, "bias")
    if len(b_shape) == 2:
        return b[0], b[1]
    return b, np.zeros_like(b)


def from_keras(
    mode: str,
    kernel: Any,
    recurrent_kernel: Any,
    bias: Any | None,
    reset_after: bool = True,
) -> Params:
    """Convert Keras SimpleRNN/LSTM/GRU weights to rnnc params (layouts in the module doc).

    ``bias=None`` (Keras ``use_bias=False``) means zeros. ``reset_after`` only matters for
    GRU and must match the Keras layer; the result belongs to rnnc's
    ``gru(..., reset_after=reset_after)``.
    """
    g = num_gates(mode)
    k = as_numpy(kernel, "kernel")
    rk = as_numpy(recurrent_kernel, "recurrent_kernel")
    if rk.ndim != 2 or rk.shape[1] != g * rk.shape[0]:
        h = rk.shape[0] if rk.ndim >= 1 else 0
        raise WeightError(
            f"recurrent_kernel: expected shape (H, {g}*H) = ({h}, {g * h}) for mode {mode!r}, "
            f"got {rk.shape}"
        )
    h = rk.shape[0]
    if k.ndim != 2:
        raise WeightError(f"kernel: expected shape (in, {g * h}), got {k.shape}")
    check_shape(k, (k.shape[0], g * h), "kernel")
    check_dtype(rk, k.dtype, "recurrent_kernel")
    b_in, b_rec = _keras_biases(mode, bias, h, k.dtype, reset_after)
    blocks: dict[str, np.ndarray] = {}
    for j, gate in enumerate(KERAS_GATES[mode]):
        cols = slice(j * h, (j + 1) * h)
        blocks[f"W_i{gate}"] = k[:, cols]
        blocks[f"W_h{gate}"] = rk[:, cols]
        blocks[f"b_i{gate}"] = b_in[cols]
        blocks[f"b_h{gate}"] = b_rec[cols]
    return {name: fresh_copy(blocks[name]) for name in param_names(mode)}


def _sum_bias(b_i: np.ndarray, b_h: np.ndarray) -> np.ndarray:
    """Return ``b_i + b_h``, keeping ``b_i``'s bits where ``b_h`` is zero.

    Plain addition turns ``-0.0 + 0.0`` into ``+0.0``; keeping ``b_i`` there makes the
    Keras -> rnnc -> Keras round trip bit-exact.
    """
    return np.where(b_h == 0, b_i, b_i + b_h)


def to_keras(
    mode: str, params: Mapping[str, Any], reset_after: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Convert rnnc params to Keras ``(kernel, recurrent_kernel, bias)`` (module doc).

    Where Keras has one bias it gets ``b_i* + b_h*``, which is exact in meaning for
    SimpleRNN, LSTM and the reset_after=False GRU. The inverse of ``from_keras``.
    """
    arrays, _, _ = check_layer_params(mode, params, "params")
    order = KERAS_GATES[mode]
    kernel = np.concatenate([arrays[f"W_i{g}"] for g in order], axis=1)
    recurrent = np.concatenate([arrays[f"W_h{g}"] for g in order], axis=1)
    b_in = np.concatenate([arrays[f"b_i{g}"] for g in order])
    b_rec = np.concatenate([arrays[f"b_h{g}"] for g in order])
    if mode == "gru" and reset_after:
        bias = np.stack([b_in, b_rec])
    else:
        bias = _sum_bias(b_in, b_rec)
    return (
        np.ascontiguousarray(kernel),
        np.ascontiguousarray(recurrent),
        np.ascontiguousarray(bias),
    )
