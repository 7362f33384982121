"""Cells whose values have feature shapes: xLSTM's sLSTM with heads, a Mamba-style selective
SSM with a ``(D, N)`` state, and Griffin's RG-LRU.

Each docstring gives the paper and the equations the cell computes. Matrices are stored for
``x @ W`` like every cell in ``rnnc.cells``.
"""

from __future__ import annotations

import numpy as np

from rnnc.dsl import Cell, einsum, exp, log_sigmoid, maximum, sigmoid, softplus, sqrt, tanh
from rnnc.errors import CellError

FORGET_GATES = ("sigmoid", "exp")


def slstm(input_size: int, hidden_size: int, heads: int = 4, forget: str = "sigmoid") -> Cell:
    """sLSTM, the scalar-memory LSTM of xLSTM, with block-diagonal recurrence per head.

    Beck, Pöppel, Spanring, Auer, Prudnikova, Kopp, Klambauer, Brandstetter, Hochreiter,
    "xLSTM: Extended Long Short-Term Memory" (NeurIPS 2024). Each of the ``heads`` heads has
    ``d = hidden_size / heads`` units and its own recurrent block ``R[k]`` of ``(d, 4d)``; the
    states ``h, c, n, m`` are ``(heads, d)``. With gate pre-activations
    ``[z~, i~, f~, o~] = x W + einsum("hd,hde->he", h, R) + b`` (each ``(heads, d)``)::

        log f = log_sigmoid(f~)  (forget="sigmoid")  or  f~  (forget="exp")
        m' = max(log f + m, i~)                      the stabilizer
        i = exp(i~ - m'),  f = exp(log f + m - m')   the exponential gates, stabilized
        c' = f * c + i * tanh(z~)
        n' = f * n + i                               the normalizer
        h' = sigmoid(o~) * c' / n'

    ``W`` is ``(input_size, heads * 4d)``, read per head as ``(heads, 4d)``; ``R`` is
    ``(heads, d, 4d)``, ``b`` is ``(heads, 4d)``. The output ``y`` is ``h'`` flattened to
    ``(B, hidden_size)``. The step's one recurrent product is a single einsum: one batched
    GEMM per step whatever the number of heads.
    """
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 \
            or hidden_size % heads:
        raise CellError(f"slstm: heads must be a positive int dividing hidden_size "
                        f"{hidden_size}, got {heads!r}")
    if forget not in FORGET_GATES:
        raise CellError(f"slstm: forget must be one of {FORGET_GATES}, got {forget!r}")
    d = hidden_size // heads
    c = Cell("slstm")
    x = c.input("x", input_size)
    h, cs, n, m = (c.state(name, (heads, d)) for name in ("h", "c", "n", "m"))
    W = c.param("W", (input_size, heads * 4 * d))
    R = c.param("R", (heads, d, 4 * d))
    b = c.param("b", (heads, 4 * d), init=_slstm_bias(d))
    pre = (x @ W).reshape(heads, 4 * d) + einsum("hd,hde->he", h, R) + b
    z, i, f, o = (pre[..., k * d:(k + 1) * d] for k in range(4))
    log_f = log_sigmoid(f) if forget == "sigmoid" else f
    m_new = maximum(log_f + m, i)
    i_gate = exp(i - m_new)
    f_gate = exp(log_f + m - m_new)
    c_new = f_gate * cs + i_gate * tanh(z)
    n_new = f_gate * n + i_gate
    h_new = sigmoid(o) * c_new / n_new
    c.update(h=h_new, c=c_new, n=n_new, m=m_new)
    c.output("y", h_new.reshape(hidden_size))
    return c


def _slstm_bias(d: int):
    """Forget-gate biases spread over [3, 6] (the xLSTM paper's power-law init), the rest 0."""
    def init(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        out = np.zeros(shape)
        out[:, 2 * d:3 * d] = np.linspace(3.0, 6.0, d)
        return out
    return init


def selective_ssm(d_model: int, state_size: int = 16) -> Cell:
    """A Mamba-style selective state-space layer (the S6 scan, without the convolution and
    the gate branch), ``D = d_model`` channels of ``N = state_size`` states each.

    Gu, Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces" (2023). The
    step size ``dt`` and the projections ``B``, ``C`` depend on the input; ``A`` is diagonal::

        dt = softplus(x W_dt + b_dt)                 (B, D)
        Bt = x W_B,  Ct = x W_C                      (B, N)
        A  = -exp(A_log)                             (D, N)
        h' = exp(dt[:, :, None] * A) * h + (dt * x)[:, :, None] * Bt[:, None, :]
        y  = (h' * Ct[:, None, :]).sum(-1) + D_skip * x

    ``h`` is ``(D, N)`` per sequence. ``h'`` is linear in ``h`` with coefficients that depend
    only on the input, so the loop runs as a parallel scan over the steps (parallel-scan).
    ``A_log`` starts at ``log(1..N)`` per channel (S4D-real), ``b_dt`` so that ``dt`` starts
    log-uniform in [0.001, 0.1], ``D_skip`` at 1.
    """
    D, N = d_model, state_size
    c = Cell("selective_ssm")
    x = c.input("x", D)
    h = c.state("h", (D, N))
    W_dt = c.param("W_dt", (D, D))
    b_dt = c.param("b_dt", (D,), init=_dt_bias)
    W_B = c.param("W_B", (D, N))
    W_C = c.param("W_C", (D, N))
    A_log = c.param("A_log", (D, N),
                    init=lambda rng, shape: np.log(np.broadcast_to(np.arange(1, N + 1), shape)))
    D_skip = c.param("D_skip", (D,), init=1.0)
    dt = softplus(x @ W_dt + b_dt)
    Bt, Ct = x @ W_B, x @ W_C
    h_new = exp(dt[:, :, None] * -exp(A_log)) * h + (dt * x)[:, :, None] * Bt[:, None, :]
    c.update(h=h_new)
    c.output("y", (h_new * Ct[:, None, :]).sum(-1) + D_skip * x)
    return c


def _dt_bias(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
    return dt + np.log(-np.expm1(-dt))  # softplus's inverse


def rg_lru(width: int, c_exponent: float = 8.0) -> Cell:
    """The Real-Gated Linear Recurrent Unit (RG-LRU) of Griffin and Hawk.

    De, Smith, Fernando, Botev, Cristian-Muraru, Gu, Haroun, Berrada, Chen, Srinivasan,
    Desjardins, Doucet, Budden, Teh, Pascanu, De Freitas, Gulcehre, "Griffin: Mixing Gated
    Linear Recurrences with Local Attention for Efficient Language Models" (2024)::

        r = sigmoid(x W_a + b_a)                     recurrence gate
        i = sigmoid(x W_x + b_x)                     input gate
        log a = -c * softplus(-Lambda) * r           a = sigmoid(Lambda) ** (c r)
        h' = a * h + sqrt(1 - a**2) * (i * x)

    with ``c = 8``; ``y = h'``. ``Lambda`` starts so that ``a ** c`` is uniform in
    [0.9, 0.999]. Linear in ``h``: the loop runs as a parallel scan (parallel-scan).
    """
    c = Cell("rg_lru")
    x = c.input("x", width)
    h = c.state("h", width)
    W_a, W_x = c.param("W_a", (width, width)), c.param("W_x", (width, width))
    b_a, b_x = c.param("b_a", (width,), init=0.0), c.param("b_x", (width,), init=0.0)
    Lam = c.param("Lambda", (width,), init=_lambda_init(c_exponent))
    r = sigmoid(x @ W_a + b_a)
    i = sigmoid(x @ W_x + b_x)
    a = exp(-c_exponent * softplus(-Lam) * r)
    h_new = a * h + sqrt(1.0 - a * a) * (i * x)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def _lambda_init(c_exponent: float):
    def init(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        a = rng.uniform(0.9, 0.999, shape) ** (1.0 / c_exponent)
        return np.log(a / (1 - a))  # sigmoid's inverse
    return init
