"""NumPy rules: each primitive runs its own reference implementation."""

from __future__ import annotations

from collections.abc import Callable

from rnnc import ops

RULES: dict[ops.Op, Callable] = {op: op.ref for op in ops.PRIMITIVES}
