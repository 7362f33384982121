"""PyTorch's weight layout of the standard cells, per pseudo-layer and as state dicts.

One layer, one direction, ``G = len(GATES[mode])``::

    weight_ih (G*H, in)  row block j = W_i{GATES[mode][j]}.T
    weight_hh (G*H, H)   row block j = W_h{GATES[mode][j]}.T
    bias_ih   (G*H,)     block j     = b_i{GATES[mode][j]}
    bias_hh   (G*H,)     block j     = b_h{GATES[mode][j]}

with gate order LSTM ``i, f, g, o`` and GRU ``r, z, n`` (PyTorch's documentation).
State-dict keys are ``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
``bias_hh_l{k}``, with the suffix ``_reverse`` for the backward direction; an LSTM with
projections adds ``weight_hr_l{k}`` ``(P, H)``. This module never imports torch: tensors
are read through ``.detach().cpu().numpy()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rnnc.interop.cell_params import (
    Layers,
    Params,
    WeightError,
    as_numpy,
    check_dtype,
    check_layer_params,
    check_proj_mode,
    check_shape,
    fresh_copy,
    gates,
    hidden_bias_names,
    hidden_weight_names,
    input_bias_names,
    input_weight_names,
    layer_input_size,
    num_gates,
)


def torch_names(layer: int, reverse: bool = False, proj: bool = False) -> tuple[str, ...]:
    """Return PyTorch's ``(weight_ih, weight_hh, bias_ih, bias_hh)`` keys of one pseudo-layer,
    and ``weight_hr`` last with projections (``proj``)."""
    sfx = f"_l{layer}" + ("_reverse" if reverse else "")
    names = (f"weight_ih{sfx}", f"weight_hh{sfx}", f"bias_ih{sfx}", f"bias_hh{sfx}")
    return names + ((f"weight_hr{sfx}",) if proj else ())


# --------------------------------------------------------------------------- PyTorch


def _torch_hidden_size(mode: str, w_hh: np.ndarray, w_hr: np.ndarray | None,
                       names: Sequence[str], hidden_size: int | None) -> int:
    """Return ``H`` of one pseudo-layer, checking ``weight_hh`` (and ``weight_hr``)."""
    g = num_gates(mode)
    if w_hr is not None:
        if w_hr.ndim != 2 or (hidden_size is not None and w_hr.shape[1] != hidden_size):
            raise WeightError(f"{names[4]}: expected shape (proj_size, hidden_size), got "
                              f"{w_hr.shape}")
        check_shape(w_hh, (g * w_hr.shape[1], w_hr.shape[0]), names[1])
        return w_hr.shape[1]
    if w_hh.ndim != 2 or w_hh.shape[0] != g * w_hh.shape[1]:
        h = w_hh.shape[1] if w_hh.ndim == 2 else "H"
        gh = g * h if isinstance(h, int) else f"{g}*H"
        raise WeightError(
            f"{names[1]}: expected shape ({g}*H, H) = ({gh}, {h}) for mode {mode!r}, "
            f"got {w_hh.shape}"
        )
    h = w_hh.shape[1] if hidden_size is None else hidden_size
    check_shape(w_hh, (g * h, h), names[1])
    return h


def _torch_bias(value: Any | None, name: str, size: int, dtype: np.dtype) -> np.ndarray:
    """Return one fused PyTorch bias, checked; ``None`` (``bias=False``) is zeros."""
    if value is None:
        return np.zeros(size, dtype=dtype)
    b = as_numpy(value, name)
    check_shape(b, (size,), name)
    check_dtype(b, dtype, name)
    return b


def split_torch(
    mode: str,
    weight_ih: Any,
    weight_hh: Any,
    bias_ih: Any | None,
    bias_hh: Any | None,
    names: Sequence[str],
    input_size: int | None = None,
    hidden_size: int | None = None,
    weight_hr: Any | None = None,
) -> Params:
    """Cut PyTorch's fused blocks of one pseudo-layer into rnnc's per-gate parameters.

    With ``weight_hr`` (an LSTM with projections, ``(P, H)``, named ``names[4]``)
    ``weight_hh`` is ``(G*H, P)`` and the result gains ``W_hr = weight_hr.T``.
    """
    g = num_gates(mode)
    w_ih = as_numpy(weight_ih, names[0])
    w_hh = as_numpy(weight_hh, names[1])
    w_hr = None
    if weight_hr is not None:
        check_proj_mode(mode)
        w_hr = as_numpy(weight_hr, names[4])
    h = _torch_hidden_size(mode, w_hh, w_hr, names, hidden_size)
    if w_ih.ndim != 2:
        raise WeightError(f"{names[0]}: expected shape ({g * h}, in), got {w_ih.shape}")
    check_shape(w_ih, (g * h, w_ih.shape[1] if input_size is None else input_size), names[0])
    dtype = w_ih.dtype
    check_dtype(w_hh, dtype, names[1])
    if w_hr is not None:
        check_dtype(w_hr, dtype, names[4])
    b_ih, b_hh = (_torch_bias(b, n, g * h, dtype) for b, n in ((bias_ih, names[2]),
                                                                (bias_hh, names[3])))
    out: Params = {}
    for prefix, fused in (("W_i", w_ih), ("W_h", w_hh), ("b_i", b_ih), ("b_h", b_hh)):
        for j, gate in enumerate(gates(mode)):
            block = fused[j * h:(j + 1) * h]
            out[f"{prefix}{gate}"] = fresh_copy(block.T if fused.ndim == 2 else block)
    if w_hr is not None:
        out["W_hr"] = fresh_copy(w_hr.T)
    return out


def _join_torch(mode: str, params: Params) -> tuple[np.ndarray, ...]:
    """Stack validated per-gate parameters into PyTorch's four fused arrays (and
    ``weight_hr`` fifth for an LSTM with projections)."""
    w_ih = np.concatenate([params[n].T for n in input_weight_names(mode)], axis=0)
    w_hh = np.concatenate([params[n].T for n in hidden_weight_names(mode)], axis=0)
    b_ih = np.concatenate([params[n] for n in input_bias_names(mode)])
    b_hh = np.concatenate([params[n] for n in hidden_bias_names(mode)])
    c = np.ascontiguousarray
    w_hr = (c(params["W_hr"].T),) if mode == "lstm" and "W_hr" in params else ()
    return (c(w_ih), c(w_hh), c(b_ih), c(b_hh), *w_hr)


def from_torch_layer(
    mode: str,
    weight_ih: Any,
    weight_hh: Any,
    bias_ih: Any | None = None,
    bias_hh: Any | None = None,
    weight_hr: Any | None = None,
) -> Params:
    """Convert one PyTorch pseudo-layer ``(G*H, in), (G*H, H), (G*H,), (G*H,)`` to rnnc params.

    A ``None`` bias means zeros (PyTorch's ``bias=False``). ``weight_hr`` ``(P, H)`` is an
    LSTM's projection (then ``weight_hh`` is ``(G*H, P)``), giving ``W_hr`` ``(H, P)``.
    Returns fresh C-contiguous arrays of the input dtype, keyed in ``param_names`` order.
    """
    return split_torch(
        mode,
        weight_ih,
        weight_hh,
        bias_ih,
        bias_hh,
        ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"),
        weight_hr=weight_hr,
    )


def to_torch_layer(mode: str, params: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    """Convert rnnc params of one cell to PyTorch's ``(weight_ih, weight_hh, bias_ih, bias_hh)``,
    with ``weight_hr`` fifth when the params have ``W_hr`` (an LSTM with projections).

    The exact inverse of ``from_torch_layer``: a round trip is bit-exact.
    """
    arrays, _, _ = check_layer_params(mode, params, "params")
    return _join_torch(mode, arrays)


def _check_layers_grid(layers: Any) -> int:
    """Check that ``layers`` is a non-empty [layer][direction] grid; return directions D."""
    if not isinstance(layers, Sequence) or len(layers) == 0:
        raise WeightError("layers: expected a non-empty list of layers, each a list of directions")
    d = None
    for k, row in enumerate(layers):
        if not isinstance(row, Sequence) or isinstance(row, Mapping) or len(row) not in (1, 2):
            n = len(row) if isinstance(row, Sequence) else type(row).__name__
            raise WeightError(f"layers[{k}]: expected a list of 1 or 2 directions, got {n}")
        if d is None:
            d = len(row)
        elif len(row) != d:
            raise WeightError(
                f"layers[{k}]: expected {d} directions like layers[0], got {len(row)}"
            )
    assert d is not None
    return d


def _check_layers(mode: str, layers: Any) -> tuple[Layers, int, int, int]:
    """Validate a [layer][direction] grid of params; return arrays, D, input and hidden size."""
    d = _check_layers_grid(layers)
    out: Layers = []
    input_size = hidden_size = -1
    for k, row in enumerate(layers):
        out_row = []
        for j, params in enumerate(row):
            where = f"layers[{k}][{j}]"
            if k == 0 and j == 0:
                arrays, input_size, hidden_size = check_layer_params(mode, params, where)
                dtype = arrays[input_weight_names(mode)[0]].dtype
                proj = mode == "lstm" and "W_hr" in arrays
                out_size = arrays["W_hr"].shape[1] if proj else hidden_size
            else:
                i_k = layer_input_size(k, input_size, out_size, d == 2)
                arrays, _, _ = check_layer_params(mode, params, where, i_k, hidden_size)
                for name, a in arrays.items():
                    check_dtype(a, dtype, f"{where}[{name!r}]")
            out_row.append(arrays)
        out.append(out_row)
    return out, d, input_size, hidden_size


def _check_state_dict_keys(mode: str, state_dict: Mapping[str, Any], num_layers: int,
                           bidirectional: bool, proj: bool) -> None:
    """Every key the configuration expects is there (biases all or none) and no other."""
    dirs = (False, True) if bidirectional else (False,)
    expected = [n for k in range(num_layers) for r in dirs for n in torch_names(k, r, proj)]
    has_bias = any(n in state_dict for n in expected if n.startswith("bias_"))
    for name in expected:
        if name in state_dict or (not has_bias and name.startswith("bias_")):
            continue
        hint = " (a bias=False module has no bias_* keys at all)" if has_bias else ""
        raise WeightError(f"state_dict: missing key {name!r}{hint}")
    extra = sorted(set(state_dict) - set(expected))
    if extra:
        raise WeightError(
            f"state_dict: unexpected key {extra[0]!r} for mode {mode!r}, num_layers={num_layers}, "
            f"bidirectional={bidirectional}"
        )


def _state_dict_sizes(mode: str, state_dict: Mapping[str, Any], proj: bool
                      ) -> tuple[int, int, int, np.dtype]:
    """Input size, hidden size, output size (``proj_size`` or ``H``) and dtype of layer 0."""
    w_hh0 = as_numpy(state_dict["weight_hh_l0"], "weight_hh_l0")
    w_ih0 = as_numpy(state_dict["weight_ih_l0"], "weight_ih_l0")
    g = num_gates(mode)
    w_hr0 = as_numpy(state_dict["weight_hr_l0"], "weight_hr_l0") if proj else None
    if w_hr0 is not None:
        if w_hr0.ndim != 2:
            raise WeightError(f"weight_hr_l0: expected shape (proj_size, H), got {w_hr0.shape}")
    elif w_hh0.ndim != 2 or w_hh0.shape[0] != g * w_hh0.shape[1]:
        h = w_hh0.shape[1] if w_hh0.ndim == 2 else 0
        raise WeightError(
            f"weight_hh_l0: expected shape ({g}*H, H) = ({g * h}, {h}) for mode {mode!r}, "
            f"got {w_hh0.shape}"
        )
    hidden_size = w_hh0.shape[1] if w_hr0 is None else w_hr0.shape[1]
    out_size = hidden_size if w_hr0 is None else w_hr0.shape[0]
    if w_ih0.ndim != 2:
        raise WeightError(
            f"weight_ih_l0: expected shape ({g * hidden_size}, in), got {w_ih0.shape}"
        )
    return w_ih0.shape[1], hidden_size, out_size, w_ih0.dtype


def torch_state_dict_to_layers(
    mode: str, state_dict: Mapping[str, Any], num_layers: int, bidirectional: bool
) -> Layers:
    """Convert a ``torch.nn.RNN/LSTM/GRU`` state dict to rnnc params indexed [layer][direction].

    Values may be torch tensors or NumPy arrays. A dict without any ``bias_*`` key (a
    ``bias=False`` module) gives zero biases. Every key must be one the configuration
    expects, so a wrong ``num_layers`` or ``bidirectional`` cannot drop weights silently.
    An LSTM state dict with ``weight_hr_l0`` has projections: each params dict gets ``W_hr``.
    """
    gates(mode)
    if not isinstance(num_layers, int) or num_layers < 1:
        raise WeightError(f"num_layers: expected an integer >= 1, got {num_layers!r}")
    proj = mode == "lstm" and "weight_hr_l0" in state_dict
    _check_state_dict_keys(mode, state_dict, num_layers, bidirectional, proj)
    input_size, hidden_size, out_size, dtype = _state_dict_sizes(mode, state_dict, proj)
    layers: Layers = []
    for k in range(num_layers):
        i_k = layer_input_size(k, input_size, out_size, bidirectional)
        row = []
        for r in (False, True) if bidirectional else (False,):
            names = torch_names(k, r, proj=True)
            values = [state_dict[n] if n in state_dict else None for n in names]
            params = split_torch(
                mode, *values[:4], names=names, input_size=i_k, hidden_size=hidden_size,
                weight_hr=values[4],
            )
            # split_torch ties a pseudo-layer's arrays to its weight_ih; this ties layers.
            check_dtype(params[input_weight_names(mode)[0]], dtype, names[0])
            row.append(params)
        layers.append(row)
    return layers


def layers_to_torch_state_dict(mode: str, layers: Any, bias: bool = True) -> dict[str, np.ndarray]:
    """Convert rnnc params [layer][direction] to a PyTorch state dict of NumPy arrays.

    Keys and their order are those of ``torch.nn.RNN/LSTM/GRU.state_dict()``; load with
    ``module.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})``. With
    ``bias=False`` the bias keys are left out (for a ``bias=False`` module), which is only
    allowed when every bias is zero, since dropping a non-zero bias would change the cell.
    """
    arrays, _, _, _ = _check_layers(mode, layers)
    out: dict[str, np.ndarray] = {}
    for k, row in enumerate(arrays):
        for j, params in enumerate(row):
            fused = _join_torch(mode, params)
            names = torch_names(k, j == 1, proj=len(fused) == 5)
            for name, a in zip(names, fused, strict=True):
                if name.startswith("bias_") and not bias:
                    if np.any(a != 0):
                        raise WeightError(
                            f"{name}: bias=False needs zero biases, got a non-zero entry in "
                            f"layers[{k}][{j}]"
                        )
                    continue
                out[name] = a
    return out
