"""The primitive ops: the table that collects the op families, each op declared once there with
its shape rule, NumPy reference, VJP and DSL docstring.

The families: ``rnnc.ops_elementwise`` (arithmetic and functions, with the comparing and
selecting ops of ``rnnc.ops_compare``; ``FAMILY`` is its table), ``rnnc.ops_matmul``,
``rnnc.ops_reduce`` (over the feature axis, and over the rows), ``rnnc.ops_layout`` (moving
columns), ``rnnc.ops_random`` (``bernoulli``), ``rnnc.ops_scan`` (over the time axis) and
``rnnc.ops_tensor`` (values with feature shapes: ``einsum``, ``reshape``, sums over an axis). The
types they share are in ``rnnc.op_types``. Importing a family registers its ops; code names them
here: ``rnnc.ops.add``, ``rnnc.ops.slice_``, ...

A shape is a tuple of dims; a dim is an int or a symbol ("T" steps, "B" batch). Per-step values
are ``(B, n)``, parameters ``(n,)`` or ``(k, n)``, sequences outside the loop ``(T, B, n)`` and
Python scalars ``()``. Every op works on the last (feature) axis and treats the leading axes as
rows, so the same op is valid inside the loop on ``(B, n)`` and, once hoisted, on ``(T, B, n)``.

All values of a program share one floating dtype, so the dtype rule of every op is the same:
the result has the dtype of its operands.
"""

from __future__ import annotations

from rnnc import (
    ops_compare,
    ops_elementwise,
    ops_layout,
    ops_matmul,
    ops_random,
    ops_reduce,
    ops_scan,
    ops_tensor,
)
from rnnc.op_types import (  # noqa: F401 - the shared types, as code names them: rnnc.ops.Op
    REGISTRY,
    Op,
    OpKind,
    Piece,
    Shape,
    fmt_shape,
    op_named,
    register,
)

FAMILIES = (ops_compare, ops_elementwise, ops_matmul, ops_reduce, ops_layout, ops_random,
            ops_scan, ops_tensor)

# Every op of every family under the name its family gives it (rnnc.ops.add, rnnc.ops.slice_,
# rnnc.ops.round_): a new op needs no line here.
globals().update({name: value for family in FAMILIES for name, value in vars(family).items()
                  if isinstance(value, Op)})

PRIMITIVES: tuple[Op, ...] = tuple(REGISTRY.values())

# Ops whose output at one element depends only on the same element of the inputs (after
# broadcasting); the unit a backend emits as one loop or one kernel.
ELEMENTWISE: frozenset[Op] = frozenset(op for op in PRIMITIVES if op.kind is OpKind.ELEMENTWISE)
