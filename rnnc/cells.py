"""The standard cells, with PyTorch's equations and parameter names (matrices for ``x @ W``)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from rnnc.cells_published import (  # noqa: F401 (re-exported)
    indrnn,
    layer_norm_gru,
    ligru,
    mlstm,
    mogrifier_lstm,
    variational_lstm,
    zoneout_lstm,
)
from rnnc.cells_scan import diag_linear, min_gru, min_lstm, qrnn, sru  # noqa: F401
from rnnc.cells_tensor import rg_lru, selective_ssm, slstm  # noqa: F401
from rnnc.dsl import Cell, relu, sigmoid, tanh
from rnnc.errors import CellError


def rnn(input_size: int, hidden_size: int, nonlinearity: str = "tanh") -> Cell:
    """Elman RNN: h' = act(x W_ih + b_ih + h W_hh + b_hh)."""
    acts = {"tanh": tanh, "relu": relu}
    if nonlinearity not in acts:
        from rnnc.errors import CellError

        raise CellError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    c = Cell(f"rnn_{nonlinearity}")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W_ih = c.param("W_ih", (input_size, hidden_size))
    W_hh = c.param("W_hh", (hidden_size, hidden_size))
    b_ih = c.param("b_ih", (hidden_size,))
    b_hh = c.param("b_hh", (hidden_size,))
    h_new = acts[nonlinearity](x @ W_ih + b_ih + h @ W_hh + b_hh)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def _uniform(bound: float, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-bound, bound, size=shape)


def lstm(input_size: int, hidden_size: int, proj_size: int = 0) -> Cell:
    """LSTM with gates i, f, g, o (PyTorch's nn.LSTM).

    ``proj_size > 0`` is torch's LSTM with projections: ``h' = (o * tanh(c')) W_hr`` with
    ``W_hr`` of shape ``(hidden_size, proj_size)``, so ``h`` and the output have
    ``proj_size`` features, ``c`` keeps ``hidden_size``, and ``W_h*`` are ``(proj_size, H)``.
    """
    if isinstance(proj_size, bool) or not isinstance(proj_size, (int, np.integer)) \
            or not 0 <= proj_size < hidden_size:
        raise CellError(f"proj_size must be an integer in [0, hidden_size={hidden_size}), got "
                        f"{proj_size!r}")
    out = proj_size or hidden_size
    # torch draws every LSTM parameter from +-1/sqrt(hidden_size), also with projections
    init = partial(_uniform, 1.0 / math.sqrt(hidden_size)) if proj_size else None
    c = Cell("lstm")
    x = c.input("x", input_size)
    h = c.state("h", out)
    cs = c.state("c", hidden_size)
    W = {g: c.param(f"W_i{g}", (input_size, hidden_size), init) for g in "ifgo"}
    U = {g: c.param(f"W_h{g}", (out, hidden_size), init) for g in "ifgo"}
    bi = {g: c.param(f"b_i{g}", (hidden_size,), init) for g in "ifgo"}
    bh = {g: c.param(f"b_h{g}", (hidden_size,), init) for g in "ifgo"}
    pre = {g: x @ W[g] + bi[g] + h @ U[g] + bh[g] for g in "ifgo"}
    i, f, o = sigmoid(pre["i"]), sigmoid(pre["f"]), sigmoid(pre["o"])
    g = tanh(pre["g"])
    c_new = f * cs + i * g
    h_new = o * tanh(c_new)
    if proj_size:
        h_new = h_new @ c.param("W_hr", (hidden_size, proj_size), init)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


def lstmp(input_size: int, hidden_size: int, proj_size: int | None = None) -> Cell:
    """LSTM with a recurrent projection (LSTMP): ``lstm(input_size, hidden_size, proj_size)``.

    Sak, Senior, Beaufays, "Long Short-Term Memory Based Recurrent Neural Network
    Architectures for Large Vocabulary Speech Recognition" (2014); torch's ``proj_size``::

        i, f, o = sigmoid(x W_i* + b_i* + h W_h* + b_h*),  g = tanh(x W_ig + b_ig + h W_hg + b_hg)
        c' = f * c + i * g,  h' = (o * tanh(c')) W_hr

    ``proj_size`` defaults to ``hidden_size // 2`` (``h`` and the output have that many
    features); it must be in ``[1, hidden_size)``.
    """
    if proj_size is None:
        proj_size = hidden_size // 2
    if isinstance(proj_size, (int, np.integer)) and not isinstance(proj_size, bool) \
            and proj_size == 0:
        raise CellError("lstmp needs proj_size >= 1 (lstm(..., proj_size=0) has no projection)")
    return lstm(input_size, hidden_size, proj_size)


def gru(input_size: int, hidden_size: int, reset_after: bool = True) -> Cell:
    """GRU with gates r, z, n; reset_after=True is PyTorch/cuDNN, False is v3 (Keras, Flux)."""
    c = Cell("gru" if reset_after else "gru_v3")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W = {g: c.param(f"W_i{g}", (input_size, hidden_size)) for g in "rzn"}
    U = {g: c.param(f"W_h{g}", (hidden_size, hidden_size)) for g in "rzn"}
    bi = {g: c.param(f"b_i{g}", (hidden_size,)) for g in "rzn"}
    bh = {g: c.param(f"b_h{g}", (hidden_size,)) for g in "rzn"}
    r = sigmoid(x @ W["r"] + bi["r"] + h @ U["r"] + bh["r"])
    z = sigmoid(x @ W["z"] + bi["z"] + h @ U["z"] + bh["z"])
    if reset_after:
        n = tanh(x @ W["n"] + bi["n"] + r * (h @ U["n"] + bh["n"]))
    else:
        n = tanh(x @ W["n"] + bi["n"] + (r * h) @ U["n"] + bh["n"])
    h_new = (1 - z) * n + z * h
    c.update(h=h_new)
    c.output("y", h_new)
    return c


# ---------------------------------------------------------------- cells no vendor library ships


def mgu(input_size: int, hidden_size: int) -> Cell:
    """Minimal gated unit (the README's example of a custom cell)."""
    c = Cell("mgu")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W_f = c.param("W_f", (input_size, hidden_size))
    U_f = c.param("U_f", (hidden_size, hidden_size))
    W_n = c.param("W_n", (input_size, hidden_size))
    U_n = c.param("U_n", (hidden_size, hidden_size))
    b_f = c.param("b_f", (hidden_size,))
    b_n = c.param("b_n", (hidden_size,))
    f = sigmoid(x @ W_f + h @ U_f + b_f)
    n = tanh(x @ W_n + (f * h) @ U_n + b_n)
    h_new = (1 - f) * h + f * n
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def peephole_lstm(input_size: int, hidden_size: int) -> Cell:
    """LSTM whose gates also see the cell state (Gers and Schmidhuber)."""
    c = Cell("peephole_lstm")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    cs = c.state("c", hidden_size)
    W = {g: c.param(f"W_{g}", (input_size, hidden_size)) for g in "ifco"}
    U = {g: c.param(f"U_{g}", (hidden_size, hidden_size)) for g in "ifco"}
    P = {g: c.param(f"p_{g}", (hidden_size,)) for g in "ifo"}
    b = {g: c.param(f"b_{g}", (hidden_size,)) for g in "ifco"}
    i = sigmoid(x @ W["i"] + h @ U["i"] + cs * P["i"] + b["i"])
    f = sigmoid(x @ W["f"] + h @ U["f"] + cs * P["f"] + b["f"])
    c_new = f * cs + i * tanh(x @ W["c"] + h @ U["c"] + b["c"])
    o = sigmoid(x @ W["o"] + h @ U["o"] + c_new * P["o"] + b["o"])
    h_new = o * tanh(c_new)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


def rnn_relu(input_size: int, hidden_size: int) -> Cell:
    """Elman RNN with relu (a module-level factory, so layers using it can be pickled)."""
    return rnn(input_size, hidden_size, "relu")


def gru_v3(input_size: int, hidden_size: int) -> Cell:
    """GRU v3 (``reset_after=False``) as a picklable two-argument factory."""
    return gru(input_size, hidden_size, reset_after=False)


STANDARD = {
    "rnn": rnn,
    "rnn_tanh": rnn,
    "rnn_relu": rnn_relu,
    "lstm": lstm,
    "gru": gru,
    "gru_v3": gru_v3,
}

# Cells from papers, each with its equations in its docstring (kept out of NAMED, which the
# per-cell compiler tests iterate over).
PUBLISHED = {
    "indrnn": indrnn,
    "ligru": ligru,
    "mlstm": mlstm,
    "layer_norm_gru": layer_norm_gru,
    "mogrifier_lstm": mogrifier_lstm,
    "lstmp": lstmp,
    "zoneout_lstm": zoneout_lstm,
    "variational_lstm": variational_lstm,
    # Linear in their carries: parallel-scan runs them with no loop (rnnc/cells_scan.py).
    "sru": sru,
    "min_gru": min_gru,
    "min_lstm": min_lstm,
    "qrnn": qrnn,
    "diag_linear": diag_linear,
}

# Cells whose values have feature shapes (heads, a (D, N) state) or that take one size:
# rnnc/cells_tensor.py. Their factories differ from (input_size, hidden_size).
TENSOR = {"slstm": slstm, "selective_ssm": selective_ssm, "rg_lru": rg_lru}

# Every cell `rnnc dump NAME` knows by name.
NAMED = {**STANDARD, "mgu": mgu, "peephole_lstm": peephole_lstm}
