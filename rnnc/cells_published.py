"""Published recurrent cells beyond the vendor-library ones, each with its paper's equations.

Matrices are stored for ``x @ W`` (``(in, out)``), like every cell in ``rnnc.cells``.
Parameters default to PyTorch's uniform(-1/sqrt(H), 1/sqrt(H)); layer-normalization gains
start at 1 and their shifts at 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.composites import layer_norm
from rnnc.dsl import Cell, Value, bernoulli, relu, sigmoid, tanh, where
from rnnc.errors import CellError


def indrnn(input_size: int, hidden_size: int) -> Cell:
    """Independently recurrent neural network (IndRNN).

    Li, Li, Cook, Zhu, Gao, "Independently Recurrent Neural Network (IndRNN): Building a
    Longer and Deeper RNN" (CVPR 2018)::

        h' = relu(x W + u * h + b)

    ``u`` is a vector of ``hidden_size`` recurrent weights (each unit sees only its own past),
    ``W`` is ``(input_size, H)``, ``b`` is ``(H,)``.
    """
    c = Cell("indrnn")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W = c.param("W", (input_size, hidden_size))
    u = c.param("u", (hidden_size,))
    b = c.param("b", (hidden_size,))
    h_new = relu(x @ W + u * h + b)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def ligru(input_size: int, hidden_size: int) -> Cell:
    """Light GRU (Li-GRU) without batch normalization.

    Ravanelli, Brakel, Omologo, Bengio, "Light Gated Recurrent Units for Speech Recognition"
    (IEEE TETCI 2018). The paper batch-normalizes ``x W_z`` and ``x W_h``; this is the
    batch-norm-free form, with biases in their place::

        z  = sigmoid(x W_z + h U_z + b_z)
        h~ = relu(x W_h + h U_h + b_h)
        h' = z * h + (1 - z) * h~
    """
    c = Cell("ligru")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W = {g: c.param(f"W_{g}", (input_size, hidden_size)) for g in "zh"}
    U = {g: c.param(f"U_{g}", (hidden_size, hidden_size)) for g in "zh"}
    b = {g: c.param(f"b_{g}", (hidden_size,)) for g in "zh"}
    z = sigmoid(x @ W["z"] + h @ U["z"] + b["z"])
    cand = relu(x @ W["h"] + h @ U["h"] + b["h"])
    h_new = z * h + (1 - z) * cand
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def mlstm(input_size: int, hidden_size: int) -> Cell:
    """Multiplicative LSTM (mLSTM).

    Krause, Lu, Murray, Renals, "Multiplicative LSTM for sequence modelling" (2016), with the
    paper's biases-omitted equations given a bias per gate; ``m`` has ``hidden_size`` features::

        m  = (x W_mx) * (h W_mh)
        h^ = x W_hx + m W_hm + b_h
        i  = sigmoid(x W_ix + m W_im + b_i)
        f  = sigmoid(x W_fx + m W_fm + b_f)
        o  = sigmoid(x W_ox + m W_om + b_o)
        c' = f * c + i * h^
        h' = tanh(c') * o
    """
    c = Cell("mlstm")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    cs = c.state("c", hidden_size)
    W_mx = c.param("W_mx", (input_size, hidden_size))
    W_mh = c.param("W_mh", (hidden_size, hidden_size))
    Wx = {g: c.param(f"W_{g}x", (input_size, hidden_size)) for g in "hifo"}
    Wm = {g: c.param(f"W_{g}m", (hidden_size, hidden_size)) for g in "hifo"}
    b = {g: c.param(f"b_{g}", (hidden_size,)) for g in "hifo"}
    m = (x @ W_mx) * (h @ W_mh)
    pre = {g: x @ Wx[g] + m @ Wm[g] + b[g] for g in "hifo"}
    i, f, o = sigmoid(pre["i"]), sigmoid(pre["f"]), sigmoid(pre["o"])
    c_new = f * cs + i * pre["h"]
    h_new = tanh(c_new) * o
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


def layer_norm_gru(input_size: int, hidden_size: int, eps: float = 1e-5) -> Cell:
    """GRU with layer normalization of each gate's input and recurrent projections.

    Ba, Kiros, Hinton, "Layer Normalization" (2016), applied per gate to PyTorch's GRU
    (reset after the recurrent projection); ``LN(v; g, s) = (v - mean v) / sqrt(var v + eps)
    * g + s`` over the features, with gains ``g_*`` starting at 1 and shifts ``s_*`` at 0::

        r  = sigmoid(LN(x W_ir; g_ir, s_ir) + LN(h W_hr; g_hr, s_hr))
        z  = sigmoid(LN(x W_iz; g_iz, s_iz) + LN(h W_hz; g_hz, s_hz))
        n  = tanh(LN(x W_in; g_in, s_in) + r * LN(h W_hn; g_hn, s_hn))
        h' = (1 - z) * n + z * h
    """
    c = Cell("layer_norm_gru")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    ln = {}
    for src, v, rows in (("i", x, input_size), ("h", h, hidden_size)):
        for g in "rzn":
            W = c.param(f"W_{src}{g}", (rows, hidden_size))
            gain = c.param(f"g_{src}{g}", (hidden_size,), 1.0)
            shift = c.param(f"s_{src}{g}", (hidden_size,), 0.0)
            ln[src + g] = layer_norm(v @ W, gain, shift, eps)
    r = sigmoid(ln["ir"] + ln["hr"])
    z = sigmoid(ln["iz"] + ln["hz"])
    n = tanh(ln["in"] + r * ln["hn"])
    h_new = (1 - z) * n + z * h
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def mogrifier_lstm(input_size: int, hidden_size: int, rounds: int = 5) -> Cell:
    """Mogrifier LSTM: x and h gate each other for ``rounds`` rounds before an LSTM step.

    Melis, Kocisky, Blunsom, "Mogrifier LSTM" (ICLR 2020), full-rank ``Q`` and ``R``. Round
    ``k = 1..rounds`` updates, with ``Q_k`` ``(H, input_size)`` and ``R_k`` ``(input_size, H)``::

        odd k:  x <- 2 sigmoid(h Q_k) * x
        even k: h <- 2 sigmoid(x R_k) * h

    then, with the mogrified x and h, the LSTM step (one bias per gate)::

        i, f, o = sigmoid(x W_i* + h W_h* + b_*),  g = tanh(x W_ig + h W_hg + b_g)
        c' = f * c + i * g,  h' = o * tanh(c')

    ``rounds=0`` is a plain LSTM. The carried ``c`` is not mogrified.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise CellError(f"rounds must be a non-negative integer, got {rounds!r}")
    c = Cell("mogrifier_lstm")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    cs = c.state("c", hidden_size)
    for k in range(1, rounds + 1):
        if k % 2:
            x = 2 * sigmoid(h @ c.param(f"Q_{k}", (hidden_size, input_size))) * x
        else:
            h = 2 * sigmoid(x @ c.param(f"R_{k}", (input_size, hidden_size))) * h
    W = {g: c.param(f"W_i{g}", (input_size, hidden_size)) for g in "ifgo"}
    U = {g: c.param(f"W_h{g}", (hidden_size, hidden_size)) for g in "ifgo"}
    b = {g: c.param(f"b_{g}", (hidden_size,)) for g in "ifgo"}
    pre = {g: x @ W[g] + h @ U[g] + b[g] for g in "ifgo"}
    i, f, o = sigmoid(pre["i"]), sigmoid(pre["f"]), sigmoid(pre["o"])
    c_new = f * cs + i * tanh(pre["g"])
    h_new = o * tanh(c_new)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


def _probability(value: Any, name: str, below_one: bool = False) -> float:
    """A probability argument of a cell: a number in [0, 1] (or [0, 1))."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    if not ok or not (0.0 <= value < 1.0 if below_one else 0.0 <= value <= 1.0):
        expected = "[0, 1)" if below_one else "[0, 1]"
        raise CellError(f"{name} must be a probability in {expected}, got {value!r}")
    return float(value)


def _lstm_step(c: Cell, x: Value, h: Value, cs: Value, input_size: int, hidden_size: int
               ) -> tuple[Value, Value]:
    """``(h~, c~)`` of an LSTM step with PyTorch's parameter names (as ``rnnc.cells.lstm``)."""
    W = {g: c.param(f"W_i{g}", (input_size, hidden_size)) for g in "ifgo"}
    U = {g: c.param(f"W_h{g}", (hidden_size, hidden_size)) for g in "ifgo"}
    bi = {g: c.param(f"b_i{g}", (hidden_size,)) for g in "ifgo"}
    bh = {g: c.param(f"b_h{g}", (hidden_size,)) for g in "ifgo"}
    pre = {g: x @ W[g] + bi[g] + h @ U[g] + bh[g] for g in "ifgo"}
    c_new = sigmoid(pre["f"]) * cs + sigmoid(pre["i"]) * tanh(pre["g"])
    return sigmoid(pre["o"]) * tanh(c_new), c_new


def zoneout_lstm(input_size: int, hidden_size: int, zoneout_c: float = 0.15,
                 zoneout_h: float = 0.05, training: bool = True) -> Cell:
    """LSTM with zoneout: each unit keeps its previous value with probability z.

    Krueger, Maharaj, Kramar, Pezeshki, Ballas, Ke, Goyal, Bengio, Courville, Pal, "Zoneout:
    Regularizing RNNs by Randomly Preserving Hidden Activations" (ICLR 2017). With the LSTM
    step ``(h~, c~)`` of ``rnnc.cells.lstm`` (same parameters) and new masks every step::

        c' = m_c * c + (1 - m_c) * c~,   m_c ~ Bernoulli(zoneout_c)
        h' = m_h * h + (1 - m_h) * h~,   m_h ~ Bernoulli(zoneout_h)

    and output ``h'``. ``training=False`` is the expectation, ``c' = z_c c + (1 - z_c) c~``
    (and ``h'`` likewise), with no masks. A training cell's calls need ``seed=``.
    """
    zc, zh = _probability(zoneout_c, "zoneout_c"), _probability(zoneout_h, "zoneout_h")
    c = Cell("zoneout_lstm")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    cs = c.state("c", hidden_size)
    h_new, c_new = _lstm_step(c, x, h, cs, input_size, hidden_size)
    if training:
        c_next = where(bernoulli(zc, like=cs), cs, c_new)
        h_next = where(bernoulli(zh, like=h), h, h_new)
    else:
        c_next = zc * cs + (1.0 - zc) * c_new
        h_next = zh * h + (1.0 - zh) * h_new
    c.update(h=h_next, c=c_next)
    c.output("y", h_next)
    return c


def variational_lstm(input_size: int, hidden_size: int, dropout_x: float = 0.25,
                     dropout_h: float = 0.25, training: bool = True) -> Cell:
    """LSTM with variational dropout: one dropout mask per sequence on x and on h.

    Gal, Ghahramani, "A Theoretically Grounded Application of Dropout in Recurrent Neural
    Networks" (NeurIPS 2016), tied weights: every step of a sequence drops the same units::

        x~ = x * m_x / (1 - dropout_x),   m_x ~ Bernoulli(1 - dropout_x), once per sequence
        h~ = h * m_h / (1 - dropout_h),   m_h ~ Bernoulli(1 - dropout_h), once per sequence

    then the LSTM step of ``rnnc.cells.lstm`` (same parameters) on ``x~`` and ``h~``; ``c`` is
    not dropped. ``training=False`` uses ``x`` and ``h`` as they are (the expectation of the
    scaled masks is 1). A training cell's calls need ``seed=``.
    """
    px = _probability(dropout_x, "dropout_x", below_one=True)
    ph = _probability(dropout_h, "dropout_h", below_one=True)
    c = Cell("variational_lstm")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    cs = c.state("c", hidden_size)
    if training:
        x = x * bernoulli(1.0 - px, like=x, per="sequence") * (1.0 / (1.0 - px))
        h_in = h * bernoulli(1.0 - ph, like=h, per="sequence") * (1.0 / (1.0 - ph))
    else:
        h_in = h
    h_new, c_new = _lstm_step(c, x, h_in, cs, input_size, hidden_size)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c
