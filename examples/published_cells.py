"""Train eight published cells on a tiny synthetic task: the Light GRU, the Mogrifier LSTM, the
LSTM with projection, IndRNN, the multiplicative LSTM, the layer-norm GRU, and two LSTMs that
draw random masks, with zoneout and with variational dropout.

``rnnc.cells.ligru``, ``mogrifier_lstm``, ``lstmp``, ``indrnn``, ``mlstm``,
``layer_norm_gru``, ``zoneout_lstm`` and ``variational_lstm`` (their equations are in their
docstrings, in rnnc/cells_published.py) each run as a one-layer ``rnnc.RNN``. The last two call
``rnnc.bernoulli``: every training step passes its own ``seed=``, from which the layer draws
the masks (backward draws the same ones again); the other cells ignore it.

The task: read a random sequence of 2 features and output, at every step, the running mean of
feature 0 minus feature 1 so far. A linear readout in NumPy maps the hidden state to that
number; the loss is the mean squared error; ``layer.forward`` / ``layer.backward``
give the recurrent gradients, the readout's are computed by hand, and Adam updates both.

    python examples/published_cells.py [--steps 60] [--hidden 16] [--backend numpy]
                                       [--cells ligru,lstmp,...]
"""

from __future__ import annotations

import argparse

import numpy as np

import rnnc


def batch(rng: np.random.Generator, T: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``(T, B, 2)`` and targets ``(T, B, 1)``: the running mean of x0 - x1."""
    x = rng.standard_normal((T, B, 2))
    diff = np.cumsum(x[:, :, 0] - x[:, :, 1], axis=0) / np.arange(1, T + 1)[:, None]
    return x, diff[:, :, None]


class Adam:
    """Adam over a list of arrays, updated in place."""

    def __init__(self, arrays: list[np.ndarray], lr: float) -> None:
        self.arrays, self.lr, self.t = arrays, lr, 0
        self.m = [np.zeros_like(a) for a in arrays]
        self.v = [np.zeros_like(a) for a in arrays]

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        for a, g, m, v in zip(self.arrays, grads, self.m, self.v, strict=True):
            m += 0.1 * (g - m)
            v += 0.001 * (g * g - v)
            m_hat, v_hat = m / (1 - 0.9 ** self.t), v / (1 - 0.999 ** self.t)
            a -= self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)


CELLS = ("ligru", "mogrifier_lstm", "lstmp", "indrnn", "mlstm", "layer_norm_gru",
         "zoneout_lstm", "variational_lstm")


def train(name: str, args: argparse.Namespace) -> list[float]:
    """Train cell ``name`` for ``args.steps`` steps; return the loss of every step."""
    rng = np.random.default_rng(args.seed)
    layer = rnnc.RNN(rnnc.cells.PUBLISHED[name], 2, args.hidden, backend=args.backend,
                     seed=args.seed, dtype=np.float64)
    width = layer.output_size  # the cell's output width: smaller than hidden for lstmp
    W = rng.uniform(-1, 1, (width, 1)) / np.sqrt(width)
    b = np.zeros(1)
    params = [p[k] for row in layer.params for p in row for k in sorted(p)]
    opt = Adam([*params, W, b], args.lr)
    losses = []
    for _ in range(args.steps):
        x, target = batch(rng, args.seq_len, args.batch)
        y, _, tape = layer.forward(x, seed=args.seed * 1_000_000 + len(losses))
        err = y @ W + b - target
        losses.append(float((err ** 2).mean()))
        d_pred = 2 * err / err.size
        g = layer.backward(tape, d_pred @ W.T)
        grads = [gp[k] for row, grow in zip(layer.params, g.params, strict=True)
                 for p, gp in zip(row, grow, strict=True) for k in sorted(p)]
        dW = np.einsum("tbh,tbo->ho", y, d_pred)
        opt.step([*grads, dW, d_pred.sum(axis=(0, 1))])
    return losses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cells", default=",".join(CELLS), help="comma-separated, from "
                    + ", ".join(CELLS))
    args = ap.parse_args()
    for name in args.cells.split(","):
        losses = train(name, args)
        every = max(1, args.steps // 5)
        for step in range(0, args.steps, every):
            print(f"{name:16s} step {step:4d}  loss {losses[step]:.4f}")
        k = max(1, args.steps // 5)  # average a few steps: single batches are noisy
        first, last = np.mean(losses[:k]), np.mean(losses[-k:])
        print(f"{name:16s} loss: first {first:.4f} last {last:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
