"""The benchmarked cells' step functions, written once for every peer of ``rnnc bench``.

Each step is written against a small namespace ``m`` (PyTorch or jax.numpy) with the gate
matrices concatenated as a careful user of either would; each ``..._params`` maps rnnc's
parameters to the step's.
"""

from __future__ import annotations

import numpy as np


def _cat(p: dict, names: list[str]) -> np.ndarray:
    return np.concatenate([p[n] for n in names], axis=-1)


def _ln(m, v, gamma, beta, eps: float = 1e-5):
    centred = v - m.mean(v)
    return centred * m.rsqrt(m.mean(centred * centred) + eps) * gamma + beta


def lstm_params(p: dict) -> dict:
    return {"W": _cat(p, [f"W_i{g}" for g in "ifgo"]), "U": _cat(p, [f"W_h{g}" for g in "ifgo"]),
            "b": _cat(p, [f"b_i{g}" for g in "ifgo"]) + _cat(p, [f"b_h{g}" for g in "ifgo"])}


def lstm_step(m, x, state, q):
    h, c = state
    H = h.shape[-1]
    a = x @ q["W"] + h @ q["U"] + q["b"]
    i, f = m.sigmoid(a[:, :H]), m.sigmoid(a[:, H:2 * H])
    g, o = m.tanh(a[:, 2 * H:3 * H]), m.sigmoid(a[:, 3 * H:])
    c = f * c + i * g
    h = o * m.tanh(c)
    return h, (h, c)


def gru_params(p: dict) -> dict:
    return {"W": _cat(p, [f"W_i{g}" for g in "rzn"]), "U": _cat(p, [f"W_h{g}" for g in "rzn"]),
            "bi": _cat(p, [f"b_i{g}" for g in "rzn"]), "bh": _cat(p, [f"b_h{g}" for g in "rzn"])}


def gru_step(m, x, state, q):
    (h,) = state
    H = h.shape[-1]
    a = x @ q["W"] + q["bi"]
    b = h @ q["U"] + q["bh"]
    r = m.sigmoid(a[:, :H] + b[:, :H])
    z = m.sigmoid(a[:, H:2 * H] + b[:, H:2 * H])
    n = m.tanh(a[:, 2 * H:] + r * b[:, 2 * H:])
    h = (1 - z) * n + z * h
    return h, (h,)


def mgu_params(p: dict) -> dict:
    return {"W": _cat(p, ["W_f", "W_n"]), "U_f": p["U_f"], "U_n": p["U_n"],
            "b": _cat(p, ["b_f", "b_n"])}


def mgu_step(m, x, state, q):
    (h,) = state
    H = h.shape[-1]
    a = x @ q["W"] + q["b"]
    f = m.sigmoid(a[:, :H] + h @ q["U_f"])
    n = m.tanh(a[:, H:] + (f * h) @ q["U_n"])
    h = (1 - f) * h + f * n
    return h, (h,)


def peephole_params(p: dict) -> dict:
    return {"W": _cat(p, [f"W_{g}" for g in "ifco"]), "U": _cat(p, [f"U_{g}" for g in "ifco"]),
            "b": _cat(p, [f"b_{g}" for g in "ifco"]),
            "p_i": p["p_i"], "p_f": p["p_f"], "p_o": p["p_o"]}


def peephole_step(m, x, state, q):
    h, c = state
    H = h.shape[-1]
    a = x @ q["W"] + h @ q["U"] + q["b"]
    i = m.sigmoid(a[:, :H] + c * q["p_i"])
    f = m.sigmoid(a[:, H:2 * H] + c * q["p_f"])
    c = f * c + i * m.tanh(a[:, 2 * H:3 * H])
    o = m.sigmoid(a[:, 3 * H:] + c * q["p_o"])
    h = o * m.tanh(c)
    return h, (h, c)


def ln_lstm_step(m, x, state, q):
    h, c = state
    H = h.shape[-1]
    a = _ln(m, x @ q["W"], q["g_i"], q["b_i"]) + _ln(m, h @ q["U"], q["g_h"], q["b_h"])
    i, f = m.sigmoid(a[:, :H]), m.sigmoid(a[:, H:2 * H])
    g, o = m.tanh(a[:, 2 * H:3 * H]), m.sigmoid(a[:, 3 * H:])
    c = _ln(m, f * c + i * g, q["g_c"], q["b_c"])
    h = o * m.tanh(c)
    return h, (h, c)
