"""Custom cells in rnnc's DSL: peephole LSTM, layer-norm LSTM, MGU, IndRNN, GRU v3 vs v1.

(The peephole LSTM and the MGU ship as ``rnnc.cells.peephole_lstm`` and ``rnnc.cells.mgu``:
read them in rnnc/cells.py; the other two are written out below.)

Each is compiled, checked against a float64 NumPy loop written independently, trained for a few
steps, and its loop's op counts printed (what the optimizer made of it).

    python examples/custom_cells.py [--steps 20] [--backend llvm]
"""

from __future__ import annotations

import argparse

import numpy as np

import rnnc


def layer_norm_lstm(I: int, H: int) -> rnnc.Cell:
    """LSTM with layer normalization of the gate pre-activations and the cell (Ba et al. 2016)."""
    c = rnnc.Cell("layer_norm_lstm")
    x, h, s = c.input("x", I), c.state("h", H), c.state("c", H)
    W = c.param("W", (I, 4 * H))
    U = c.param("U", (H, 4 * H))
    b = c.param("b", (4 * H,), init=0.0)
    gx, gh = c.param("g_x", (4 * H,), init=1.0), c.param("g_h", (4 * H,), init=1.0)
    gc, bc = c.param("g_c", (H,), init=1.0), c.param("b_c", (H,), init=0.0)
    z = rnnc.layer_norm(x @ W, gx) + rnnc.layer_norm(h @ U, gh) + b
    i, f = rnnc.sigmoid(z[:, 0:H]), rnnc.sigmoid(z[:, H:2 * H])
    g, o = rnnc.tanh(z[:, 2 * H:3 * H]), rnnc.sigmoid(z[:, 3 * H:4 * H])
    s_new = f * s + i * g
    h_new = o * rnnc.tanh(rnnc.layer_norm(s_new, gc, bc))
    c.update(h=h_new, c=s_new)
    c.output("y", h_new)
    return c


def indrnn(I: int, H: int) -> rnnc.Cell:
    """Independently recurrent network (Li et al. 2018): a diagonal recurrence, no h @ U."""
    c = rnnc.Cell("indrnn")
    x, h = c.input("x", I), c.state("h", H)
    W = c.param("W", (I, H))
    u = c.param("u", (H,), init=lambda rng, shape: rng.uniform(0, 1, shape))
    b = c.param("b", (H,), init=0.0)
    h_new = rnnc.relu(x @ W + u * h + b)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def ln(v, gain, bias=0.0, eps=1e-5):
    mu = v.mean(-1, keepdims=True)
    return (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + eps) * gain + bias


def reference(name: str, x: np.ndarray, p: dict, H: int) -> np.ndarray:
    """Each cell once more as a plain float64 NumPy loop."""
    B = x.shape[1]
    h, s, ys = np.zeros((B, H)), np.zeros((B, H)), []
    for x_t in x:
        if name == "peephole_lstm":
            i = sigmoid(x_t @ p["W_i"] + h @ p["U_i"] + p["p_i"] * s + p["b_i"])
            f = sigmoid(x_t @ p["W_f"] + h @ p["U_f"] + p["p_f"] * s + p["b_f"])
            s = f * s + i * np.tanh(x_t @ p["W_c"] + h @ p["U_c"] + p["b_c"])
            o = sigmoid(x_t @ p["W_o"] + h @ p["U_o"] + p["p_o"] * s + p["b_o"])
            h = o * np.tanh(s)
        elif name == "layer_norm_lstm":
            z = ln(x_t @ p["W"], p["g_x"]) + ln(h @ p["U"], p["g_h"]) + p["b"]
            i, f, g, o = (z[:, k * H:(k + 1) * H] for k in range(4))
            s = sigmoid(f) * s + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(ln(s, p["g_c"], p["b_c"]))
        elif name == "mgu":
            f = sigmoid(x_t @ p["W_f"] + h @ p["U_f"] + p["b_f"])
            n = np.tanh(x_t @ p["W_n"] + (f * h) @ p["U_n"] + p["b_n"])
            h = (1 - f) * h + f * n
        elif name == "indrnn":
            h = np.maximum(x_t @ p["W"] + p["u"] * h + p["b"], 0)
        elif name in ("gru", "gru_v3"):
            r = sigmoid(x_t @ p["W_ir"] + p["b_ir"] + h @ p["W_hr"] + p["b_hr"])
            z = sigmoid(x_t @ p["W_iz"] + p["b_iz"] + h @ p["W_hz"] + p["b_hz"])
            if name == "gru":
                n = np.tanh(x_t @ p["W_in"] + p["b_in"] + r * (h @ p["W_hn"] + p["b_hn"]))
            else:
                n = np.tanh(x_t @ p["W_in"] + p["b_in"] + (r * h) @ p["W_hn"] + p["b_hn"])
            h = (1 - z) * n + z * h
        ys.append(h)
    return np.stack(ys)


CELLS = {
    "peephole_lstm": rnnc.cells.peephole_lstm,
    "layer_norm_lstm": layer_norm_lstm,
    "mgu": rnnc.cells.mgu,
    "indrnn": indrnn,
    "gru": lambda i, h: rnnc.cells.gru(i, h, reset_after=True),
    "gru_v3": lambda i, h: rnnc.cells.gru(i, h, reset_after=False),
}


def train(fn, params: dict, steps: int, rng: np.random.Generator, I: int, T: int, B: int
          ) -> tuple[float, float]:
    """Fit the mean of the outputs to a running sum of the first input feature (plain SGD on
    one fixed batch, so the first and last losses are comparable)."""
    first = last = 0.0
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    target = np.tanh(np.cumsum(x[:, :, :1], axis=0) / 3)
    for step in range(steps):
        ys, _, tape = fn.forward(x, params)
        pred = ys["y"].mean(-1, keepdims=True)
        diff = pred - target
        loss = float((diff**2).mean())
        first, last = (loss, loss) if step == 0 else (first, loss)
        d_y = np.broadcast_to(2 * diff / diff.size / ys["y"].shape[-1], ys["y"].shape)
        grads = fn.backward(tape, {"y": np.ascontiguousarray(d_y)}).params
        for k in params:
            params[k] = params[k] - 0.5 * grads[k]
    return first, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--hidden", type=int, default=16)
    args = ap.parse_args()
    I, H, T, B = 6, args.hidden, 12, 4
    rng = np.random.default_rng(0)
    ok = True
    for name, factory in CELLS.items():
        cell = factory(I, H)
        fn = rnnc.compile(cell, backend=args.backend)
        params = cell.init_params(seed=0)
        x = rng.standard_normal((T, B, I)).astype(np.float32)
        ys, _ = fn(x, params)
        ref = reference(name, x.astype(np.float64),
                        {k: v.astype(np.float64) for k, v in params.items()}, H)
        err = float(np.abs(ys["y"] - ref).max())
        first, last = train(fn, params, args.steps, rng, I, T, B)
        ok &= err < 1e-4 and last < first
        print(f"{name:16s} max|rnnc - numpy| = {err:.1e}  loss {first:.3f} -> {last:.3f}  "
              f"loop ops {fn.op_counts()['loop']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
