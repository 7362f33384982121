"""A float64 NumPy evaluation of a cell spec written without rnnc, and its tie margins.

Two uses. It checks the oracle itself: ``rnnc.compile(..., optimize=False)`` must agree with
this plain loop over the spec's expressions, so a broken oracle (say, one that still runs an
optimizing pass) cannot make every backend look right. And it measures how close the run comes
to a discontinuity: ``where`` switches at ``cond = 0`` and ``relu`` (inside ``softsign`` and
``hard_sigmoid`` too) changes slope at 0, so where a condition or a relu argument passes within
rounding of 0, a float32 run may take the other branch and differ by O(1) without any
miscompilation. The smallest such ``|value|`` over the run is the *margin*; float32
comparisons need one well above float32 rounding (arrays of a cell whose margin is below
``differential.MARGIN`` are not compared in float32).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from tests.fuzz.spec import CellSpec, Expr, prune


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


_UNARY = {
    "neg": np.negative, "tanh": np.tanh, "sigmoid": _sigmoid, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "rsqrt": lambda v: 1.0 / np.sqrt(v), "relu": lambda v: np.maximum(v, 0.0),
    "softsign": lambda v: v / (1.0 + np.abs(v)),
    "hard_sigmoid": lambda v: np.clip(0.2 * v + 0.5, 0.0, 1.0),
    "mean": lambda v: np.mean(v, axis=-1, keepdims=True),
    "sum": lambda v: np.sum(v, axis=-1, keepdims=True),
}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "matmul": np.matmul}


def group(name: str) -> str:
    """The bundled cell a name belongs to (``c3_`` for ``c3_t1``), or "" outside bundles."""
    found = re.match(r"c\d+_", name)
    return found.group(0) if found else ""


class _Step:
    """Evaluates expressions of one step, remembering the smallest tie margin per cell."""

    def __init__(self, env: dict[str, np.ndarray], margins: dict[str, float]) -> None:
        self.env = env
        self.margins = margins
        self.owner = ""

    def near_zero(self, v: np.ndarray) -> None:
        low = float(np.min(np.abs(v))) if np.size(v) else np.inf
        self.margins[self.owner] = min(self.margins.get(self.owner, np.inf), low)

    def root(self, name: str, e: Expr) -> np.ndarray:
        """The value of ``e``, computed for the temporary, update or output ``name``."""
        self.owner = group(name)
        return self(e)

    def __call__(self, e: Expr) -> np.ndarray:
        if e.op == "var":
            return self.env[e.attr[0]]
        if e.op == "const":
            return np.float64(e.attr[0])
        args = [self(a) for a in e.args]
        if e.op in ("relu", "softsign"):
            self.near_zero(args[0])
        if e.op == "hard_sigmoid":  # relu(z) - relu(z - 1) with z = 0.2 v + 0.5
            self.near_zero(0.2 * args[0] + 0.5)
            self.near_zero(0.2 * args[0] - 0.5)
        if e.op in _UNARY:
            return _UNARY[e.op](args[0])
        if e.op in _BINARY:
            return _BINARY[e.op](*args)
        if e.op == "where":
            self.near_zero(args[0])
            return np.where(args[0] > 0, args[1], args[2])
        if e.op == "concat":
            return np.concatenate(args, axis=-1)
        if e.op == "slice":
            return args[0][:, e.attr[0]:e.attr[1]]
        if e.op == "layer_norm":
            x, gamma, beta = args
            centred = x - x.mean(axis=-1, keepdims=True)
            var = (centred * centred).mean(axis=-1, keepdims=True)
            return centred / np.sqrt(var + e.attr[0]) * gamma + beta
        raise ValueError(f"unknown op {e.op!r}")


def evaluate(spec: CellSpec, xs: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray],
             states: Mapping[str, np.ndarray], lengths: np.ndarray | None = None
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, float]]:
    """Outputs ``(T, B, n)``, final states and the tie margins of running ``spec`` over ``xs``.

    With ``lengths``, a sequence's states stop changing after its length and its outputs are
    zero past it (PyTorch's packed sequences, which rnnc follows). The margins are by
    :func:`group`: cells compiled together as a bundle are independent, so a near tie in one
    says nothing about the others."""
    spec = prune(spec)
    T, B = next(iter(xs.values())).shape[:2]
    carry = {n: np.asarray(v, np.float64) for n, v in states.items()}
    outs: dict[str, list[np.ndarray]] = {n: [] for n, _ in spec.outputs}
    margins: dict[str, float] = {}
    for t in range(T):
        env = {**params, **carry, **{n: x[t] for n, x in xs.items()}}
        step = _Step(env, margins)
        for name, e in spec.lets:
            env[name] = step.root(name, e)
        new = {n: np.broadcast_to(step.root(n, e), carry[n].shape) for n, e in spec.updates}
        live = np.ones((B, 1)) if lengths is None else (t < lengths)[:, None].astype(float)
        for name, e in spec.outputs:
            value = step.root(name, e)
            outs[name].append(np.broadcast_to(value, (B, value.shape[-1])) * live)
        carry = {n: np.where(live > 0, new[n], carry[n]) for n in carry}
    ys = {n: np.stack(v) for n, v in outs.items()}
    return ys, carry, margins
