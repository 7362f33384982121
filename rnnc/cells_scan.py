"""Published cells whose every carry is linear in itself: rnnc runs them with no loop at all.

In each cell the carried value's update is ``c' = a * c + b`` elementwise, with ``a`` and ``b``
computed from the step's input only, so the ``parallel-scan`` pass (docs/passes.md) computes
``a`` and ``b`` for all steps at once and runs the recurrence as one ``linear_scan``; the rest
of the step (the output) is whole-sequence elementwise work after it. Matrices are stored for
``x @ W`` (``(in, out)``) and initialized like PyTorch's (uniform in ±1/sqrt(H)), like every
cell in ``rnnc.cells``.
"""

from __future__ import annotations

import numpy as np

from rnnc.dsl import Cell, sigmoid, tanh


def sru(input_size: int, hidden_size: int) -> Cell:
    """Simple Recurrent Unit (SRU).

    Lei, Zhang, Wang, Dai, Artzi, "Simple Recurrent Units for Highly Parallelizable
    Recurrence" (EMNLP 2018; first as "Training RNNs as Fast as CNNs", 2017)::

        x~ = x W
        f  = sigmoid(x W_f + b_f)
        r  = sigmoid(x W_r + b_r)
        c' = f * c + (1 - f) * x~
        y  = r * tanh(c') + (1 - r) * x

    The highway term reads ``x`` itself, so it needs ``input_size == hidden_size``; with other
    sizes it reads ``x W_s`` (a fourth ``(input_size, H)`` matrix, as the paper's reference
    implementation does), which is what lets SRU layers stack in ``rnnc.RNN``. The carried
    state is ``c``; the output ``y`` is not carried.
    """
    c = Cell("sru")
    x = c.input("x", input_size)
    cs = c.state("c", hidden_size)
    W = {g: c.param(f"W{g}", (input_size, hidden_size)) for g in ("", "_f", "_r")}
    f = sigmoid(x @ W["_f"] + c.param("b_f", (hidden_size,)))
    r = sigmoid(x @ W["_r"] + c.param("b_r", (hidden_size,)))
    c_new = f * cs + (1 - f) * (x @ W[""])
    highway = x if input_size == hidden_size else x @ c.param("W_s", (input_size, hidden_size))
    c.update(c=c_new)
    c.output("y", r * tanh(c_new) + (1 - r) * highway)
    return c


def min_gru(input_size: int, hidden_size: int) -> Cell:
    """minGRU.

    Feng, Tung, Ahmed, Bengio, Hajimirsadeghi, "Were RNNs All We Needed?" (2024)::

        z  = sigmoid(x W_z + b_z)
        h~ = x W_h + b_h
        h' = (1 - z) * h + z * h~

    The GRU without its reset gate and without ``h`` in the gate or the candidate (each
    ``Linear`` of the paper is a matrix and a bias).
    """
    c = Cell("min_gru")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    z = sigmoid(x @ c.param("W_z", (input_size, hidden_size)) + c.param("b_z", (hidden_size,)))
    cand = x @ c.param("W_h", (input_size, hidden_size)) + c.param("b_h", (hidden_size,))
    h_new = (1 - z) * h + z * cand
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def min_lstm(input_size: int, hidden_size: int) -> Cell:
    """minLSTM, with the paper's normalized (time-independent) gates.

    Feng et al., "Were RNNs All We Needed?" (2024)::

        f  = sigmoid(x W_f + b_f)
        i  = sigmoid(x W_i + b_i)
        h~ = x W_h + b_h
        h' = f / (f + i) * h + i / (f + i) * h~
    """
    c = Cell("min_lstm")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    pre = {g: x @ c.param(f"W_{g}", (input_size, hidden_size)) + c.param(f"b_{g}", (hidden_size,))
           for g in "fih"}
    f, i = sigmoid(pre["f"]), sigmoid(pre["i"])
    total = f + i
    h_new = f / total * h + i / total * pre["h"]
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def qrnn(input_size: int, hidden_size: int) -> Cell:
    """Quasi-Recurrent Neural Network (QRNN) with f-pooling and a convolution of width 2.

    Bradbury, Merity, Xiong, Socher, "Quasi-Recurrent Neural Networks" (ICLR 2017)::

        z  = tanh(x_prev V_z + x W_z + b_z)
        f  = sigmoid(x_prev V_f + x W_f + b_f)
        h' = f * h + (1 - f) * z

    The convolution's earlier tap reads a second input, ``x_prev``: the caller passes the
    input one step earlier in the scan's direction (zeros before the first step), as
    ``fn({"x": x, "x_prev": x_prev}, params)``.
    """
    c = Cell("qrnn")
    x = c.input("x", input_size)
    x_prev = c.input("x_prev", input_size)
    h = c.state("h", hidden_size)
    pre = {g: x_prev @ c.param(f"V_{g}", (input_size, hidden_size))
           + x @ c.param(f"W_{g}", (input_size, hidden_size)) + c.param(f"b_{g}", (hidden_size,))
           for g in "zf"}
    z, f = tanh(pre["z"]), sigmoid(pre["f"])
    h_new = f * h + (1 - f) * z
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def _decays(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.5, 1.0, size=shape)


def diag_linear(input_size: int, hidden_size: int) -> Cell:
    """A real diagonal linear recurrence (the core of linear recurrent units and diagonal
    state-space layers)::

        h' = lam * h + x W

    ``lam`` is a vector of ``hidden_size`` decays, initialized uniform in [0.5, 1) so that
    the recurrence is stable; ``W`` is ``(input_size, H)``.
    """
    c = Cell("diag_linear")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    h_new = c.param("lam", (hidden_size,), _decays) * h + x @ c.param(
        "W", (input_size, hidden_size))
    c.update(h=h_new)
    c.output("y", h_new)
    return c
