"""Weight layouts of the standard cells: rnnc names <-> PyTorch, cuDNN flat buffer, Keras.

rnnc's standard cells (``rnn_tanh``, ``rnn_relu``, ``lstm``, ``gru``) keep one array per
gate and store matrices for ``x @ W``: an input matrix has shape ``(in, H)``, a recurrent
matrix ``(H, H)``, a bias ``(H,)``. Names are ``W_i{g}``, ``W_h{g}``, ``b_i{g}``,
``b_h{g}`` for each gate ``g`` of ``GATES[mode]``; the plain RNN has the single "gate"
``h``, which gives PyTorch's ``W_ih, W_hh, b_ih, b_hh``.

PyTorch layout (one layer, one direction), ``G = len(GATES[mode])``::

    weight_ih (G*H, in)  row block j = W_i{GATES[mode][j]}.T
    weight_hh (G*H, H)   row block j = W_h{GATES[mode][j]}.T
    bias_ih   (G*H,)     block j     = b_i{GATES[mode][j]}
    bias_hh   (G*H,)     block j     = b_h{GATES[mode][j]}

with gate order LSTM ``i, f, g, o`` and GRU ``r, z, n`` (PyTorch's documentation).
State-dict keys are ``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
``bias_hh_l{k}``, with the suffix ``_reverse`` for the backward direction.

cuDNN canonical flat buffer (``to_flat`` / ``from_flat``). One 1-D array, pseudo-layers
in the order layer 0 forward, layer 0 reverse (if bidirectional), layer 1 forward, ...;
each pseudo-layer is, back to back::

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

Keras layout (``from_keras`` / ``to_keras``), already ``x @ W`` oriented::

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

Every function returns fresh C-contiguous NumPy arrays with the input dtype; none keeps
a reference to its inputs. Torch tensors are accepted wherever arrays are and converted
through ``.detach().cpu().numpy()``, so this module never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rnnc.errors import RnncValueError


class WeightError(RnncValueError):
    """A weight with a missing name, a wrong shape or dtype, or an unknown mode."""


GATES: dict[str, tuple[str, ...]] = {
    "rnn_tanh": ("h",),
    "rnn_relu": ("h",),
    "lstm": ("i", "f", "g", "o"),
    "gru": ("r", "z", "n"),
}
"""Gates of each standard cell, in PyTorch's (and cuDNN's) order inside the fused blocks."""

KERAS_GATES: dict[str, tuple[str, ...]] = {
    "rnn_tanh": ("h",),
    "rnn_relu": ("h",),
    "lstm": ("i", "f", "g", "o"),
    "gru": ("z", "r", "n"),
}
"""The same gates, named as in rnnc, in Keras's column order (LSTM i,f,c,o; GRU z,r,h)."""

MODES: tuple[str, ...] = tuple(GATES)

Params = dict[str, np.ndarray]
Layers = list[list[Params]]


# --------------------------------------------------------------------------- names


def gates(mode: str) -> tuple[str, ...]:
    """Return the gates of ``mode`` in PyTorch order; raise ``WeightError`` if unknown."""
    try:
        return GATES[mode]
    except (KeyError, TypeError):
        raise WeightError(
            f"mode: expected one of {', '.join(repr(m) for m in MODES)}, got {mode!r}"
        ) from None


def num_gates(mode: str) -> int:
    """Return the number of gate blocks ``G`` in the fused PyTorch matrices of ``mode``."""
    return len(gates(mode))


def input_weight_names(mode: str) -> tuple[str, ...]:
    """Return the names of the input matrices ``W_i{g}`` in gate order."""
    return tuple(f"W_i{g}" for g in gates(mode))


def hidden_weight_names(mode: str) -> tuple[str, ...]:
    """Return the names of the recurrent matrices ``W_h{g}`` in gate order."""
    return tuple(f"W_h{g}" for g in gates(mode))


def input_bias_names(mode: str) -> tuple[str, ...]:
    """Return the names of the input biases ``b_i{g}`` in gate order."""
    return tuple(f"b_i{g}" for g in gates(mode))


def hidden_bias_names(mode: str) -> tuple[str, ...]:
    """Return the names of the recurrent biases ``b_h{g}`` in gate order."""
    return tuple(f"b_h{g}" for g in gates(mode))


def param_names(mode: str, proj: bool = False) -> tuple[str, ...]:
    """Return every parameter name of ``mode``: W_i*, W_h*, b_i*, b_h*, each in gate order,
    then ``W_hr`` for an LSTM with projections (``proj``)."""
    return (
        input_weight_names(mode)
        + hidden_weight_names(mode)
        + input_bias_names(mode)
        + hidden_bias_names(mode)
        + (("W_hr",) if proj else ())
    )


def param_shapes(
    mode: str, input_size: int, hidden_size: int, proj_size: int = 0
) -> dict[str, tuple[int, ...]]:
    """Return the shape of every parameter of one ``mode`` cell, keyed by name.

    With ``proj_size`` (LSTM only) the recurrent matrices read ``h`` of ``proj_size``
    features and ``W_hr`` ``(hidden_size, proj_size)`` projects ``o * tanh(c)`` to it.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for name in input_weight_names(mode):
        shapes[name] = (input_size, hidden_size)
    for name in hidden_weight_names(mode):
        shapes[name] = (proj_size or hidden_size, hidden_size)
    for name in input_bias_names(mode) + hidden_bias_names(mode):
        shapes[name] = (hidden_size,)
    if proj_size:
        _check_proj_mode(mode)
        shapes["W_hr"] = (hidden_size, proj_size)
    return shapes


def _check_proj_mode(mode: str) -> None:
    if mode != "lstm":
        raise WeightError(f"projections (weight_hr) exist only for mode 'lstm', got {mode!r}")


def torch_names(layer: int, reverse: bool = False, proj: bool = False) -> tuple[str, ...]:
    """Return PyTorch's ``(weight_ih, weight_hh, bias_ih, bias_hh)`` keys of one pseudo-layer,
    and ``weight_hr`` last with projections (``proj``)."""
    sfx = f"_l{layer}" + ("_reverse" if reverse else "")
    names = (f"weight_ih{sfx}", f"weight_hh{sfx}", f"bias_ih{sfx}", f"bias_hh{sfx}")
    return names + ((f"weight_hr{sfx}",) if proj else ())


def layer_input_size(layer: int, input_size: int, hidden_size: int, bidirectional: bool) -> int:
    """Return the input width of ``layer``: ``input_size`` first, then ``D*H``."""
    return input_size if layer == 0 else (2 if bidirectional else 1) * hidden_size


def flat_size(
    mode: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    bias: bool = True,
) -> int:
    """Return the length of the cuDNN canonical flat buffer for this configuration."""
    g = num_gates(mode)
    total = 0
    for k in range(num_layers):
        i_k = layer_input_size(k, input_size, hidden_size, bidirectional)
        per = g * hidden_size * (i_k + hidden_size) + (2 * g * hidden_size if bias else 0)
        total += per * (2 if bidirectional else 1)
    return total


# --------------------------------------------------------------------------- checks


def _as_numpy(value: Any, where: str) -> np.ndarray:
    """Return ``value`` as a NumPy array without copying; torch tensors go through .numpy()."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        # A torch tensor: detach drops autograd, cpu() is a no-op on the CPU, and numpy()
        # shares memory; callers copy, so the module's tensors are never aliased.
        t = value.detach()
        if getattr(t, "device", None) is not None and t.device.type != "cpu":
            t = t.cpu()
        try:
            return t.numpy()
        except TypeError as e:  # bfloat16 and friends have no NumPy dtype
            raise WeightError(
                f"{where}: dtype {t.dtype} has no NumPy equivalent; convert with .float() first"
            ) from e
    arr = np.asarray(value)
    if arr.dtype == object:
        raise WeightError(f"{where}: expected an array, got {type(value).__name__}")
    return arr


def _check_shape(arr: np.ndarray, expected: tuple[int, ...], where: str) -> None:
    """Raise ``WeightError`` naming ``where`` unless ``arr`` has exactly ``expected`` shape."""
    if arr.shape != tuple(expected):
        raise WeightError(f"{where}: expected shape {tuple(expected)}, got {arr.shape}")


def _check_dtype(arr: np.ndarray, dtype: np.dtype, where: str) -> None:
    """Raise unless ``arr`` has ``dtype``: mixing dtypes would silently promote on packing."""
    if arr.dtype != dtype:
        raise WeightError(f"{where}: expected dtype {dtype}, got {arr.dtype}")


def _copy(arr: np.ndarray) -> np.ndarray:
    """Return a fresh C-contiguous copy (ascontiguousarray alone may return a view)."""
    return np.array(arr, order="C", copy=True)


def _check_layer_params(
    mode: str,
    params: Mapping[str, Any],
    where: str,
    input_size: int | None = None,
    hidden_size: int | None = None,
) -> tuple[Params, int, int]:
    """Validate one rnnc parameter dict; return it as arrays with its (input, hidden) sizes.

    A dict with ``W_hr`` is an LSTM with projections (its shape gives ``proj_size``).
    """
    if not isinstance(params, Mapping):
        raise WeightError(f"{where}: expected a dict of parameters, got {type(params).__name__}")
    # GRU's reset gate has a W_hr too; only in an LSTM is it the projection
    proj = mode == "lstm" and "W_hr" in params
    names = param_names(mode, proj)
    for name in names:
        if name not in params:
            raise WeightError(f"{where}: missing parameter {name!r} (mode {mode!r} needs {names})")
    extra = sorted(set(params) - set(names))
    if extra:
        raise WeightError(
            f"{where}: unexpected parameter {extra[0]!r} for mode {mode!r} (expected {names})"
        )
    arrays = {n: _as_numpy(params[n], f"{where}[{n!r}]") for n in names}
    first = arrays[names[0]]
    if first.ndim != 2:
        raise WeightError(f"{where}[{names[0]!r}]: expected a 2-D array, got shape {first.shape}")
    i_size = first.shape[0] if input_size is None else input_size
    h_size = first.shape[1] if hidden_size is None else hidden_size
    dtype = first.dtype
    p_size = 0
    if proj:
        w_hr = arrays["W_hr"]
        if w_hr.ndim != 2:
            raise WeightError(f"{where}['W_hr']: expected shape ({h_size}, proj_size), got "
                              f"{w_hr.shape}")
        p_size = w_hr.shape[1]
    for name, shape in param_shapes(mode, i_size, h_size, p_size).items():
        _check_shape(arrays[name], shape, f"{where}[{name!r}]")
        _check_dtype(arrays[name], dtype, f"{where}[{name!r}]")
    return arrays, i_size, h_size


# --------------------------------------------------------------------------- PyTorch


def _split_torch(
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
    w_ih = _as_numpy(weight_ih, names[0])
    w_hh = _as_numpy(weight_hh, names[1])
    w_hr = None
    if weight_hr is not None:
        _check_proj_mode(mode)
        w_hr = _as_numpy(weight_hr, names[4])
        if w_hr.ndim != 2 or (hidden_size is not None and w_hr.shape[1] != hidden_size):
            raise WeightError(f"{names[4]}: expected shape (proj_size, hidden_size), got "
                              f"{w_hr.shape}")
        h, p = w_hr.shape[1], w_hr.shape[0]
        _check_shape(w_hh, (g * h, p), names[1])
    elif w_hh.ndim != 2 or w_hh.shape[0] != g * w_hh.shape[1]:
        h = w_hh.shape[1] if w_hh.ndim == 2 else "H"
        gh = g * h if isinstance(h, int) else f"{g}*H"
        raise WeightError(
            f"{names[1]}: expected shape ({g}*H, H) = ({gh}, {h}) for mode {mode!r}, "
            f"got {w_hh.shape}"
        )
    if w_hr is None:
        h = w_hh.shape[1] if hidden_size is None else hidden_size
        _check_shape(w_hh, (g * h, h), names[1])
    if w_ih.ndim != 2:
        raise WeightError(f"{names[0]}: expected shape ({g * h}, in), got {w_ih.shape}")
    i = w_ih.shape[1] if input_size is None else input_size
    _check_shape(w_ih, (g * h, i), names[0])
    dtype = w_ih.dtype
    _check_dtype(w_hh, dtype, names[1])
    if w_hr is not None:
        _check_dtype(w_hr, dtype, names[4])
    biases = []
    for value, name in ((bias_ih, names[2]), (bias_hh, names[3])):
        if value is None:
            biases.append(np.zeros(g * h, dtype=dtype))
            continue
        b = _as_numpy(value, name)
        _check_shape(b, (g * h,), name)
        _check_dtype(b, dtype, name)
        biases.append(b)
    out: Params = {}
    for j, gate in enumerate(gates(mode)):
        rows = slice(j * h, (j + 1) * h)
        out[f"W_i{gate}"] = _copy(w_ih[rows].T)
    for j, gate in enumerate(gates(mode)):
        rows = slice(j * h, (j + 1) * h)
        out[f"W_h{gate}"] = _copy(w_hh[rows].T)
    for prefix, b in (("b_i", biases[0]), ("b_h", biases[1])):
        for j, gate in enumerate(gates(mode)):
            out[f"{prefix}{gate}"] = _copy(b[j * h : (j + 1) * h])
    if w_hr is not None:
        out["W_hr"] = _copy(w_hr.T)
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
    return _split_torch(
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
    arrays, _, _ = _check_layer_params(mode, params, "params")
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
                arrays, input_size, hidden_size = _check_layer_params(mode, params, where)
                dtype = arrays[input_weight_names(mode)[0]].dtype
                proj = mode == "lstm" and "W_hr" in arrays
                out_size = arrays["W_hr"].shape[1] if proj else hidden_size
            else:
                i_k = layer_input_size(k, input_size, out_size, d == 2)
                arrays, _, _ = _check_layer_params(mode, params, where, i_k, hidden_size)
                for name, a in arrays.items():
                    _check_dtype(a, dtype, f"{where}[{name!r}]")
            out_row.append(arrays)
        out.append(out_row)
    return out, d, input_size, hidden_size


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
    dirs = (False, True) if bidirectional else (False,)
    proj = mode == "lstm" and "weight_hr_l0" in state_dict
    expected = [n for k in range(num_layers) for r in dirs for n in torch_names(k, r, proj)]
    bias_keys = [n for n in expected if n.startswith("bias_")]
    present_bias = [n for n in bias_keys if n in state_dict]
    has_bias = bool(present_bias)
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
    w_hh0 = _as_numpy(state_dict["weight_hh_l0"], "weight_hh_l0")
    w_ih0 = _as_numpy(state_dict["weight_ih_l0"], "weight_ih_l0")
    g = num_gates(mode)
    w_hr0 = _as_numpy(state_dict["weight_hr_l0"], "weight_hr_l0") if proj else None
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
    input_size = w_ih0.shape[1]
    dtype = w_ih0.dtype
    layers: Layers = []
    for k in range(num_layers):
        i_k = layer_input_size(k, input_size, out_size, bidirectional)
        row = []
        for r in dirs:
            names = torch_names(k, r, proj=True)
            values = [state_dict[n] if n in state_dict else None for n in names]
            params = _split_torch(
                mode, *values[:4], names=names, input_size=i_k, hidden_size=hidden_size,
                weight_hr=values[4],
            )
            # _split_torch ties a pseudo-layer's arrays to its weight_ih; this ties layers.
            _check_dtype(params[input_weight_names(mode)[0]], dtype, names[0])
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
    arrays, d, _, _ = _check_layers(mode, layers)
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


# --------------------------------------------------------------------------- cuDNN flat buffer


def to_flat(mode: str, layers: Any, bias: bool = True) -> np.ndarray:
    """Pack rnnc params [layer][direction] into the cuDNN canonical flat buffer (module doc).

    With ``bias=False`` the biases are left out, as in a ``bias=False`` PyTorch module's
    ``_flat_weights``; that requires every bias to be zero.
    """
    sd = layers_to_torch_state_dict(mode, layers, bias=bias)
    # The state dict is already in pseudo-layer order with w_ih, w_hh, b_ih, b_hh each.
    return np.concatenate([a.reshape(-1) for a in sd.values()])


def from_flat(
    mode: str,
    flat: Any,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    bias: bool = True,
) -> Layers:
    """Unpack a cuDNN canonical flat buffer (module doc) into rnnc params [layer][direction].

    Raises ``WeightError`` when the length differs from ``flat_size(...)``.
    """
    arr = _as_numpy(flat, "flat")
    for name, v, low in (
        ("input_size", input_size, 1),
        ("hidden_size", hidden_size, 1),
        ("num_layers", num_layers, 1),
    ):
        if not isinstance(v, (int, np.integer)) or v < low:
            raise WeightError(f"{name}: expected an integer >= {low}, got {v!r}")
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
            row.append(_split_torch(mode, w_ih, w_hh, b_ih, b_hh, names, i_k, h))
        layers.append(row)
    assert pos == n
    return layers


# --------------------------------------------------------------------------- Keras


def _keras_bias_shape(mode: str, hidden_size: int, reset_after: bool) -> tuple[int, ...]:
    """Return the shape of the Keras bias of ``mode`` (two rows for a reset_after GRU)."""
    gh = num_gates(mode) * hidden_size
    return (2, gh) if mode == "gru" and reset_after else (gh,)


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
    k = _as_numpy(kernel, "kernel")
    rk = _as_numpy(recurrent_kernel, "recurrent_kernel")
    if rk.ndim != 2 or rk.shape[1] != g * rk.shape[0]:
        h = rk.shape[0] if rk.ndim >= 1 else 0
        raise WeightError(
            f"recurrent_kernel: expected shape (H, {g}*H) = ({h}, {g * h}) for mode {mode!r}, "
            f"got {rk.shape}"
        )
    h = rk.shape[0]
    if k.ndim != 2:
        raise WeightError(f"kernel: expected shape (in, {g * h}), got {k.shape}")
    _check_shape(k, (k.shape[0], g * h), "kernel")
    dtype = k.dtype
    _check_dtype(rk, dtype, "recurrent_kernel")
    b_shape = _keras_bias_shape(mode, h, reset_after)
    if bias is None:
        b = np.zeros(b_shape, dtype=dtype)
    else:
        b = _as_numpy(bias, "bias")
        _check_shape(b, b_shape, "bias")
        _check_dtype(b, dtype, "bias")
    if len(b_shape) == 2:
        b_in, b_rec = b[0], b[1]
    else:
        b_in, b_rec = b, np.zeros_like(b)
    blocks: dict[str, np.ndarray] = {}
    for j, gate in enumerate(KERAS_GATES[mode]):
        cols = slice(j * h, (j + 1) * h)
        blocks[f"W_i{gate}"] = k[:, cols]
        blocks[f"W_h{gate}"] = rk[:, cols]
        blocks[f"b_i{gate}"] = b_in[cols]
        blocks[f"b_h{gate}"] = b_rec[cols]
    return {name: _copy(blocks[name]) for name in param_names(mode)}


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
    arrays, _, _ = _check_layer_params(mode, params, "params")
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
