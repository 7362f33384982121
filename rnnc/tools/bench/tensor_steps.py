"""The step functions of the benchmarked cells with feature shapes (``rnnc bench --cells
slstm,slstm_slices,selective_ssm``), for every peer, and the per-head-slices sLSTM.

Each step is written as a careful PyTorch or JAX user would: the sLSTM's heads as one batched
``einsum`` per step, the SSM's ``(B, D, N)`` state with broadcasting. ``slstm_slices`` is the
sLSTM as rnnc cells had to write it before values had feature shapes: one matmul per head and a
``concat``, its states flat ``(B, H)``; rnnc times it against the einsum form.
"""

from __future__ import annotations

import rnnc

HEADS = 4
STATE_SIZE = 16


def slstm(input_size: int, hidden_size: int) -> rnnc.Cell:
    return rnnc.cells.slstm(input_size, hidden_size, heads=HEADS)


def selective_ssm(input_size: int, hidden_size: int) -> rnnc.Cell:
    return rnnc.cells.selective_ssm(hidden_size, STATE_SIZE)


def slstm_slices(input_size: int, hidden_size: int) -> rnnc.Cell:
    """sLSTM with per-head slices: each head's (d, 4d) block is its own matmul."""
    H, d = hidden_size, hidden_size // HEADS
    c = rnnc.Cell("slstm_slices")
    x = c.input("x", input_size)
    h, cs, n, m = (c.state(name, H) for name in ("h", "c", "n", "m"))
    W = c.param("W", (input_size, 4 * H))
    R = [c.param(f"R_{k}", (d, 4 * d)) for k in range(HEADS)]
    b = c.param("b", (4 * H,), init=0.0)
    xw = x @ W + b
    rec = [h[:, k * d:(k + 1) * d] @ R[k] for k in range(HEADS)]
    gates = []
    for g in range(4):  # gate g of every head, side by side
        gates.append(rnnc.concat([xw[:, k * 4 * d + g * d:k * 4 * d + (g + 1) * d]
                                  + rec[k][:, g * d:(g + 1) * d] for k in range(HEADS)]))
    z, i, f, o = gates
    log_f = rnnc.log_sigmoid(f)
    m_new = rnnc.maximum(log_f + m, i)
    i_gate, f_gate = rnnc.exp(i - m_new), rnnc.exp(log_f + m - m_new)
    c_new = f_gate * cs + i_gate * rnnc.tanh(z)
    n_new = f_gate * n + i_gate
    h_new = rnnc.sigmoid(o) * c_new / n_new
    c.update(h=h_new, c=c_new, n=n_new, m=m_new)
    c.output("y", h_new)
    return c


def slstm_states(config) -> tuple[tuple[int, ...], ...]:
    return ((HEADS, config.H // HEADS),) * 4


def ssm_states(config) -> tuple[tuple[int, ...], ...]:
    return ((config.H, STATE_SIZE),)


def slstm_step(m, x, state, q):
    h, c, n, mm = state
    heads, d = h.shape[1], h.shape[2]
    pre = (x @ q["W"]).reshape(x.shape[0], heads, 4 * d) + m.einsum(
        "bhd,hde->bhe", h, q["R"]) + q["b"]
    z, i, f, o = (pre[..., k * d:(k + 1) * d] for k in range(4))
    log_f = m.log_sigmoid(f)
    m_new = m.maximum(log_f + mm, i)
    i_gate, f_gate = m.exp(i - m_new), m.exp(log_f + mm - m_new)
    c = f_gate * c + i_gate * m.tanh(z)
    n = f_gate * n + i_gate
    h = m.sigmoid(o) * c / n
    return h.reshape(x.shape[0], heads * d), (h, c, n, m_new)


def ssm_step(m, x, state, q):
    (h,) = state
    dt = m.softplus(x @ q["W_dt"] + q["b_dt"])
    Bt, Ct = x @ q["W_B"], x @ q["W_C"]
    h = m.exp(dt[:, :, None] * -m.exp(q["A_log"])) * h + (dt * x)[:, :, None] * Bt[:, None, :]
    y = (h * Ct[:, None, :]).sum(-1) + q["D_skip"] * x
    return y, (h,)


def slices_params(p: dict) -> dict:
    """The per-head-slices cell's parameters in the einsum step's layout."""
    import numpy as np

    R = np.stack([p[f"R_{k}"] for k in range(HEADS)])
    return {"W": p["W"], "R": R, "b": p["b"].reshape(HEADS, -1)}
