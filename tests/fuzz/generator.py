"""The state of the generator while it draws one cell.

:class:`Generator` holds the declarations and temporaries drawn so far and a pool of per-step
values (:class:`Pooled`: expression, feature count, magnitude bound) that motifs take operands
from. ``let`` names a value as a temporary and squashes it by ``tanh`` when its bound passes
``LIMIT``, which is what keeps every value of a random cell O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tests.fuzz.spec import Expr, fn, slice_, var

LIMIT = 3.0  # a temporary whose bound exceeds this is squashed by tanh


@dataclass
class Pooled:
    """A per-step value the motifs may use: its expression, feature count and magnitude
    bound."""

    expr: Expr
    width: int
    bound: float


@dataclass
class Generator:
    """Draws motifs into a growing cell; ``pool`` holds the per-step values made so far."""

    rng: np.random.Generator
    inputs: list[tuple[str, int]] = field(default_factory=list)
    states: list[tuple[str, int]] = field(default_factory=list)
    params: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    lets: list[tuple[str, Expr]] = field(default_factory=list)
    pool: list[Pooled] = field(default_factory=list)

    # -- draws
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def choice(self, items: list):
        return items[int(self.rng.integers(len(items)))]

    def pick(self, width: int | None = None, recent: bool = False) -> Pooled | None:
        items = [v for v in self.pool if width is None or v.width == width]
        if recent:
            items = items[-4:]
        return self.choice(items) if items else None

    @property
    def weight_bound(self) -> float:
        """The magnitude of a parameter under ``init_params`` (uniform +-1/sqrt(H))."""
        return 1.0 / np.sqrt(self.states[0][1])

    def param(self, shape: tuple[int, ...], reuse: float = 0.3) -> Expr:
        """A parameter of ``shape``: an existing one (shared weights) or a new one."""
        have = [n for n, s in self.params if s == shape]
        if have and self.chance(reuse):
            return var(self.choice(have))
        name = f"{'W' if len(shape) == 2 else 'b'}{len(self.params)}"
        self.params.append((name, shape))
        return var(name)

    def let(self, expr: Expr, width: int, bound: float) -> Pooled:
        """Name ``expr`` as a temporary (squashed by tanh past LIMIT) and pool it."""
        if bound > LIMIT:
            expr, bound = fn("tanh", expr), 1.0
        name = f"t{len(self.lets)}"
        self.lets.append((name, expr))
        value = Pooled(var(name), width, bound)
        self.pool.append(value)
        return value

    def width_of(self, v: Pooled, n: int) -> Pooled:
        """``v`` brought to ``n`` features: by a matmul, a slice, or a concat of itself."""
        if v.width == n:
            return v
        how = self.rng.integers(3)
        if how == 0 or (v.width < n and how == 1):
            return Pooled(v.expr @ self.param((v.width, n)), n,
                          v.bound * v.width * self.weight_bound)
        if v.width > n:
            start = int(self.rng.integers(v.width - n + 1))
            return Pooled(slice_(v.expr, start, start + n), n, v.bound)
        parts = [v.expr] * (n // v.width)
        if n % v.width:
            parts.append(slice_(v.expr, 0, n % v.width))
        return Pooled(fn("concat", *parts), n, v.bound)

    def operand(self, n: int, recent: bool = False) -> Pooled:
        """A pooled value of ``n`` features (adapted from another width if needed)."""
        v = self.pick(n, recent) if self.chance(0.7) else None
        return v or self.width_of(self.pick(recent=recent), n)

    def width(self) -> int:
        """A feature count, usually one a state already has."""
        if self.chance(0.6):
            return self.choice(self.states)[1]
        return int(self.rng.integers(1, 6))
