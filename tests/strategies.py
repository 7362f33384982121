"""Hypothesis strategies shared by the tests: small random cells and data to run them on.

``random_cells()`` draws an ``rnnc.Cell`` whose step is a random DAG of primitives over one or
two inputs, one or two states and parameters made on demand. Values stay numerically tame so
outputs and gradients are smooth and comparable at tight tolerances: every value carries a rough
magnitude bound, anything that grows past it goes through ``tanh``; ``div`` divides by
``2 + tanh(.)``, ``log`` and ``sqrt`` take ``v*v + 1``, ``exp`` takes a bounded value. States
are updated through ``tanh`` (or a convex gate mix), so they stay in (-1, 1) over any number of
steps. The draws also produce the patterns the passes look for: several matmuls sharing a left
operand (gates), matmul + bias, a parameter reused in two places, param-only expressions.

``random_data(cell, T, B, seed, dtype)`` gives inputs, parameters and initial states of the
magnitudes the bounds assume (inputs ~ N(0, 1), parameters and states uniform in ±0.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import rnnc

LIMIT = 4.0  # magnitude beyond which a value is squashed by tanh


@dataclass
class _Builder:
    """The cell under construction and a pool of per-step values with magnitude bounds."""

    cell: rnnc.Cell
    draw: object
    pool: list[tuple[rnnc.Value, float]] = field(default_factory=list)
    params: dict[tuple[int, ...], list[rnnc.Value]] = field(default_factory=dict)
    count: int = 0

    def param(self, shape: tuple[int, ...]) -> rnnc.Value:
        """A parameter of ``shape``: usually new, sometimes one already used (shared weights)."""
        have = self.params.get(shape, [])
        if have and self.draw(st.integers(0, 4)) == 0:
            return have[self.draw(st.integers(0, len(have) - 1))]
        p = self.cell.param(f"p{self.count}", shape)
        self.count += 1
        self.params.setdefault(shape, []).append(p)
        return p

    def pick(self) -> tuple[rnnc.Value, float]:
        return self.pool[self.draw(st.integers(0, len(self.pool) - 1))]

    def push(self, v: rnnc.Value, bound: float) -> None:
        if bound > LIMIT:
            v, bound = rnnc.tanh(v), 1.0
        self.pool.append((v, bound))

    def width(self, v: rnnc.Value) -> int:
        return v.shape[-1]

    def partner(self, n: int) -> tuple[rnnc.Value, float]:
        """A pool value that broadcasts with a value of ``n`` features."""
        b, mb = self.pick()
        if self.width(b) not in (1, n) and n != 1:
            b, mb = self.to_width(b, mb, n)
        return b, mb

    def to_width(self, v: rnnc.Value, bound: float, n: int) -> tuple[rnnc.Value, float]:
        """``v`` brought to ``n`` features by slicing, repeating through concat, or a matmul."""
        w = self.width(v)
        if w == n:
            return v, bound
        how = self.draw(st.sampled_from(["matmul", "layout"]))
        if how == "matmul":
            return v @ self.param((w, n)), bound * w * 0.5
        if w > n:
            start = self.draw(st.integers(0, w - n))
            return v[:, start:start + n], bound
        parts, have = [], 0
        while have < n:
            take = min(w, n - have)
            parts.append(v if take == w else v[:, 0:take])
            have += take
        return (rnnc.concat(parts) if len(parts) > 1 else parts[0]), bound

    # -- one random operation on the pool
    def step(self) -> None:
        kind = self.draw(st.sampled_from(
            ["binary", "binary", "unary", "unary", "matmul", "matmul", "gates", "bias",
             "scalar", "where", "concat", "slice", "reduce", "div", "param_only"]))
        a, ma = self.pick()
        n = self.width(a)
        if kind == "binary":
            b, mb = self.partner(n)
            op = self.draw(st.sampled_from(["add", "sub", "mul"]))
            v = {"add": a + b, "sub": a - b, "mul": a * b}[op]
            self.push(v, ma * mb if op == "mul" else ma + mb)
        elif kind == "unary":
            op = self.draw(st.sampled_from(
                ["neg", "exp", "log", "tanh", "sigmoid", "relu", "sqrt"]))
            if op == "neg":
                self.push(-a, ma)
            elif op == "exp":
                arg, m = (a, ma) if ma <= 2.0 else (rnnc.tanh(a), 1.0)
                self.push(rnnc.exp(arg), float(np.exp(m)))
            elif op == "log":
                self.push(rnnc.log(a * a + 1.0), float(np.log(ma * ma + 1.0)))
            elif op == "sqrt":
                self.push(rnnc.sqrt(a * a + 1.0), float(np.sqrt(ma * ma + 1.0)))
            else:
                fn = {"tanh": rnnc.tanh, "sigmoid": rnnc.sigmoid, "relu": rnnc.relu}[op]
                self.push(fn(a), ma if op == "relu" else 1.0)
        elif kind == "matmul":
            m = self.draw(st.integers(1, 5))
            self.push(a @ self.param((n, m)), ma * n * 0.5)
        elif kind == "gates":
            # Several projections of one value: what gate fusion packs into one matmul.
            m = self.draw(st.integers(1, 4))
            bias = self.draw(st.booleans())
            for _ in range(self.draw(st.integers(2, 4))):
                v = a @ self.param((n, m))
                self.push(v + self.param((m,)) if bias else v, ma * n * 0.5 + 0.5)
        elif kind == "bias":
            self.push(a + self.param((n,)), ma + 0.5)
        elif kind == "scalar":
            c = self.draw(st.sampled_from([0.5, 1.0, 2.0, -1.0, 0.0]))
            op = self.draw(st.sampled_from(["add", "mul", "rsub"]))
            v = {"add": a + c, "mul": a * c, "rsub": c - a}[op]
            self.push(v, ma * abs(c) if op == "mul" else ma + abs(c))
        elif kind == "where":
            b, mb = self.pick()
            if self.width(b) != n:
                b, mb = self.to_width(b, mb, n)
            c, _ = self.partner(n)
            self.push(rnnc.where(c, a, b), max(ma, mb))
        elif kind == "concat":
            b, mb = self.pick()
            self.push(rnnc.concat([a, b]), max(ma, mb))
        elif kind == "slice" and n > 1:
            start = self.draw(st.integers(0, n - 1))
            stop = self.draw(st.integers(start + 1, n))
            self.push(a[:, start:stop], ma)
        elif kind == "reduce":
            if self.draw(st.booleans()):
                self.push(rnnc.sum(a), ma * n)
            else:
                self.push(rnnc.mean(a), ma)
        elif kind == "div":
            b, _ = self.partner(n)
            self.push(a / (2.0 + rnnc.tanh(b)), ma)
        elif kind == "param_only":
            # An expression of parameters alone, added to a per-step value.
            p = self.param((n,))
            q = rnnc.tanh(p) * 0.5 + 1.0 if self.draw(st.booleans()) else p * p
            self.push(a * q, ma * 1.5)


@st.composite
def random_cells(draw, max_ops: int = 8) -> rnnc.Cell:
    """A small random cell: 1-2 inputs, 1-2 states, up to ``max_ops`` random operations."""
    cell = rnnc.Cell("random")
    b = _Builder(cell, draw)
    for k in range(draw(st.integers(1, 2))):
        b.pool.append((cell.input(f"x{k}", draw(st.integers(1, 4))), 3.0))
    states = [cell.state(f"s{k}", draw(st.integers(1, 4))) for k in range(draw(st.integers(1, 2)))]
    b.pool.extend((s, 1.0) for s in states)
    for _ in range(draw(st.integers(1, max_ops))):
        b.step()
    # Prefer recent values so most of the DAG reaches an update or output.
    recent = b.pool[-3:]
    for s in states:
        v, m = recent[draw(st.integers(0, len(recent) - 1))]
        v, m = b.to_width(v, m, s.shape[-1])
        if draw(st.booleans()):
            cell.update(**{cell_state_name(cell, s): rnnc.tanh(v)})
        else:
            # A convex gate mix, as in GRU: z * s + (1 - z) * tanh(v).
            z = rnnc.sigmoid(v)
            cell.update(**{cell_state_name(cell, s): z * s + (1.0 - z) * rnnc.tanh(v)})
    for k in range(draw(st.integers(1, 2))):
        v, m = b.pick() if k else b.pool[-1]
        if v.shape[-1] == 1 and draw(st.booleans()):
            v = rnnc.concat([v, v])
        cell.output(f"y{k}", v)
    return cell


def cell_state_name(cell: rnnc.Cell, value: rnnc.Value) -> str:
    """The declared name of a state value."""
    return next(n for n, nid in cell.states.items() if nid == value.node)


def random_data(cell: rnnc.Cell, T: int = 3, B: int = 2, seed: int = 0,
                dtype: type = np.float64) -> tuple[dict[str, np.ndarray] | np.ndarray,
                                                   dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inputs (an array for a one-input cell, else a dict), parameters and initial states."""
    rng = np.random.default_rng(seed)
    xs = {n: rng.standard_normal((T, B, s[-1])).astype(dtype)
          for n, s in cell.sizes("input").items()}
    params = {n: rng.uniform(-0.5, 0.5, s).astype(dtype) for n, s in cell.sizes("param").items()}
    states = {n: rng.uniform(-0.5, 0.5, (B, *s[1:])).astype(dtype)
              for n, s in cell.sizes("state").items()}
    return (next(iter(xs.values())) if len(xs) == 1 else xs), params, states
