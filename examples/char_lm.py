"""A character-level language model on Shakespeare's Sonnets, trained with rnnc.RNN and NumPy.

    python examples/char_lm.py [--mode lstm|gru] [--hidden 128] [--steps 1000] [--out char_lm/]
        [--precision fp32|bf16]

The model is one-hot characters -> ``rnnc.RNN`` (LSTM or GRU, ``--layers`` deep) -> a linear
softmax readout written in NumPy. Each step takes ``--batch`` random windows of ``--seq-len``
characters, computes the mean cross-entropy of predicting every next character, gets the
recurrent layer's gradients from ``layer.forward`` / ``layer.backward`` and the readout's by
hand, clips them by global norm and applies Adam in NumPy, updating ``layer.params`` in place.

It prints the loss every ``--print-every`` steps, writes the loss curve to ``OUT/loss.csv``
(and ``OUT/loss.png`` when matplotlib, rnnc's ``plot`` extra, is installed), then samples
text one character at a time, carrying the layer's states between calls with T = 1. The
whole run is deterministic for a given ``--seed``. At the default size it takes one to two
minutes on two cores; on a busy machine ``RNNC_THREADS=1`` keeps the llvm backend's GEMMs
from waiting on a descheduled BLAS thread.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

import numpy as np

import rnnc

DATA = pathlib.Path(__file__).resolve().parent / "data" / "sonnets.txt"


class Adam:
    """Adam (Kingma & Ba 2015) over a list of arrays, updated in place."""

    def __init__(self, params: list[np.ndarray], lr: float, betas=(0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params, self.lr, self.eps = params, lr, eps
        self.b1, self.b2 = betas
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p -= (self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)).astype(p.dtype)


def one_hot(ids: np.ndarray, vocab: int) -> np.ndarray:
    """``(T, B)`` character ids -> ``(T, B, vocab)`` float32 one-hot vectors."""
    out = np.zeros(ids.shape + (vocab,), np.float32)
    np.put_along_axis(out, ids[..., None], 1.0, axis=-1)
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def layer_arrays(layer: rnnc.RNN) -> list[np.ndarray]:
    """Every parameter array of ``layer``, in ``params[layer][direction][name]`` order."""
    return [p[name] for row in layer.params for p in row for name in sorted(p)]


def grad_arrays(grads: rnnc.layers.LayerGrads, layer: rnnc.RNN) -> list[np.ndarray]:
    """The matching gradients, in the order of ``layer_arrays``."""
    return [g[name] for row, grow in zip(layer.params, grads.params, strict=True)
            for p, g in zip(row, grow, strict=True) for name in sorted(p)]


def sample(layer: rnnc.RNN, W: np.ndarray, b: np.ndarray, chars: list[str], prompt: str,
           length: int, temperature: float, rng: np.random.Generator) -> str:
    """Feed ``prompt`` then draw ``length`` characters, one ``layer(x, states=...)`` call each."""
    index = {c: i for i, c in enumerate(chars)}
    vocab = len(chars)
    states = None
    out = list(prompt)
    ids = [index[c] for c in prompt]
    for i in ids[:-1]:  # warm the states on the prompt, one character at a time
        _, states = layer(one_hot(np.array([[i]]), vocab), states=states)
    nxt = ids[-1]
    for _ in range(length):
        y, states = layer(one_hot(np.array([[nxt]]), vocab), states=states)
        logits = (y[0, 0] @ W + b).astype(np.float64) / max(temperature, 1e-6)
        nxt = int(rng.choice(vocab, p=softmax(logits)))
        out.append(chars[nxt])
    return "".join(out)


def write_curve(out: pathlib.Path, losses: list[float], log_vocab: float, title: str) -> None:
    """Write ``loss.csv`` always and ``loss.png`` when matplotlib is available."""
    csv = out / "loss.csv"
    csv.write_text("step,loss\n" + "".join(f"{i},{v:.6f}\n" for i, v in enumerate(losses)))
    print(f"wrote {csv}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'rnnc[plot]'): no loss.png, "
              "the curve is in loss.csv")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(losses, lw=0.8, label="training loss")
    ax.axhline(log_vocab, ls=":", c="gray", label="log(vocab): a uniform guess")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / character)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    png = out / "loss.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("lstm", "gru"), default="lstm")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=5.0, help="global gradient-norm clip")
    ap.add_argument("--backend", default=None, help="numpy, llvm or cuda (default: fastest)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: the RNN's GEMMs take bfloat16 operands and sum in float32 "
                         "(weights, gradients and the rest stay float32; docs/precision.md)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--print-every", type=int, default=100)
    ap.add_argument("--sample-len", type=int, default=300)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompt", default="Shall I ")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--out", default="char_lm")
    args = ap.parse_args()

    text = pathlib.Path(args.data).read_text(encoding="ascii")
    chars = sorted(set(text))
    vocab = len(chars)
    index = {c: i for i, c in enumerate(chars)}
    data = np.array([index[c] for c in text], np.int64)
    T, B, H = args.seq_len, args.batch, args.hidden
    if len(data) < T + 2:
        ap.error(f"--seq-len {T} is longer than the text ({len(data)} characters)")
    if any(c not in chars for c in args.prompt):
        ap.error("--prompt uses characters that are not in the text")

    rng = np.random.default_rng(args.seed)
    layer = rnnc.RNN(args.mode, vocab, H, num_layers=args.layers, backend=args.backend,
                     seed=args.seed, precision=args.precision)
    W = (rng.standard_normal((H, vocab)) / math.sqrt(H)).astype(np.float32)
    b = np.zeros(vocab, np.float32)
    params = layer_arrays(layer) + [W, b]
    adam = Adam(params, args.lr)
    print(f"{len(text)} characters, vocabulary {vocab} (log(vocab) = {math.log(vocab):.4f}); "
          f"{layer!r}")

    losses: list[float] = []
    start = time.perf_counter()
    for step in range(args.steps):
        offsets = rng.integers(0, len(data) - T - 1, size=B)
        window = data[offsets[None, :] + np.arange(T + 1)[:, None]]  # (T+1, B)
        x, target = one_hot(window[:-1], vocab), window[1:]
        y, _, tape = layer.forward(x)  # y: (T, B, H)
        p = softmax(y @ W + b)  # (T, B, vocab)
        picked = np.take_along_axis(p, target[..., None], axis=-1)[..., 0]
        loss = float(-np.log(np.maximum(picked, 1e-12)).mean())
        d_logits = p
        np.put_along_axis(d_logits, target[..., None],
                          np.take_along_axis(d_logits, target[..., None], axis=-1) - 1, axis=-1)
        d_logits /= T * B
        flat_y, flat_d = y.reshape(-1, H), d_logits.reshape(-1, vocab)
        g_W, g_b = flat_y.T @ flat_d, flat_d.sum(axis=0)
        d_y = np.ascontiguousarray(d_logits @ W.T, dtype=np.float32)
        grads = grad_arrays(layer.backward(tape, d_y), layer) + [g_W, g_b]
        norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
        if norm > args.clip:
            grads = [g * (args.clip / norm) for g in grads]
        adam.step(grads)
        losses.append(loss)
        if step % args.print_every == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss:.4f}  ({time.perf_counter() - start:.1f} s)",
                  flush=True)

    tail = max(1, min(20, len(losses) // 5))
    last = float(np.mean(losses[-tail:]))
    print(f"loss: first {losses[0]:.4f} last {last:.4f} (mean of the last {tail} steps; "
          f"log(vocab) = {math.log(vocab):.4f})")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_curve(out, losses, math.log(vocab),
                f"rnnc.RNN {args.mode}, hidden {H}, {args.layers} layer(s), {args.precision}")
    text_out = sample(layer, W, b, chars, args.prompt, args.sample_len, args.temperature,
                      np.random.default_rng(args.seed + 1))
    (out / "sample.txt").write_text(text_out + "\n")
    print(f"sample (temperature {args.temperature}):\n{text_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
