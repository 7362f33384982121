"""The types every op family shares: ``Op``, ``OpKind``, ``Piece``, the registry, the
broadcasting shape rule of elementwise ops, and ``Member``, the table row of an elementwise op.

The op families (``rnnc.ops_elementwise``, ``rnnc.ops_reduce``, ...) and ``rnnc.ops`` import
this module; it imports no family, so declaring an op never needs a mid-module import. A rule
names the ops it emits by :func:`op_named`, looked up when it runs, so no family imports another
to write its VJPs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from rnnc.errors import ShapeError

Shape = tuple[Any, ...]


class OpKind(str, Enum):
    """What an op does to the feature axis; passes and backends dispatch on it."""

    ELEMENTWISE = "elementwise"  # element j of the result reads element j of each operand
    MATMUL = "matmul"
    REDUCE = "reduce"  # over the feature axis (sum, mean, amax, amin) or the rows (sum_rows)
    LAYOUT = "layout"  # moves columns: its ``pieces`` rule says which column it reads
    SOURCE = "source"  # no operands (constant)
    SCAN = "scan"  # over the time axis of [T,...] sequences (linear_scan): outside the loop
    # over several feature axes at once (reshape, einsum, sums over an inner axis): one node's
    # own loop nest, never fused (rnnc/ops_tensor.py)
    TENSOR = "tensor"
    STRUCTURAL = "structural"  # arg, get, fused: the IR's own plumbing


@dataclass(frozen=True)
class Piece:
    """One column range of a layout op's result: for ``start <= j < stop``, column ``j`` reads
    column ``(scale * j + offset) // div`` of operand ``operand`` when ``scale * j + offset``
    is a multiple of ``div``, and is 0.0 when it is not or when ``operand`` is None.

    ``div`` > 1 spreads the operand's columns ``div`` apart with zeros between them (``pad``
    with a ``step``, the gradient of a strided ``slice``); ``scale`` > 1 skips columns (a
    strided slice); ``scale`` 0 repeats one column (``expand``). A layout op's ``pieces`` rule
    returns its pieces in column order, covering every column of the result once; the LLVM
    region emitter and the CUDA kernel writer both read layout ops through it (select the piece
    holding ``j``, clamp the read into the operand, select 0.0 off the ``div`` grid)."""

    start: int
    stop: int
    operand: int | None
    scale: int = 1
    offset: int = 0
    div: int = 1

    def column(self, j: int) -> int:  # the operand column output column j reads
        return (self.scale * j + self.offset) // self.div

    def reads(self, j: int) -> bool:  # whether column j reads its operand (or is 0.0)
        return self.operand is not None and (self.scale * j + self.offset) % self.div == 0


@dataclass(frozen=True, eq=False)
class Op:
    """A primitive: a name plus one rule per job, and the docstring of its DSL function."""

    name: str
    kind: OpKind
    arity: int | None  # None: any number of inputs
    shape: Callable[..., Any]
    ref: Callable[..., Any]
    vjp: Callable[..., Any] | None = None
    # Layout ops only: (operand widths, **attrs) -> tuple[Piece, ...]
    pieces: Callable[..., tuple[Piece, ...]] | None = None
    # Draws random bits from the loop's counter (bernoulli): passes keep it in the loop body,
    # and autodiff recomputes it in backward instead of saving it.
    random: bool = False
    # The docstring of the DSL function rnnc.<name>; dsl_function: whether rnnc has one (not
    # for ops written as operators, indexing or numbers, nor for ops only passes make).
    doc: str = ""
    dsl_function: bool = True

    def __repr__(self) -> str:
        return f"Op({self.name})"

    def __reduce__(self) -> tuple[Callable[[str], Op], tuple[str]]:
        # An op is one object per name whose rules are functions and lambdas: pickle the name,
        # so that cells and programs pickle and load with the process's own op.
        return op_named, (self.name,)


REGISTRY: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add ``op`` to the registry (each name once)."""
    assert op.name not in REGISTRY, op.name
    REGISTRY[op.name] = op
    return op


def op_named(name: str) -> Op:
    """The op called ``name``: a primitive, or one of the IR's structural ops (arg, get, fused)."""
    if name in REGISTRY:
        return REGISTRY[name]
    from rnnc import ir

    return ir.STRUCTURAL[name]


def const(e, value: float):
    """A VJP rule's constant: the ``constant`` op, broadcast by the ops that read it."""
    return e(op_named("constant"), value=value)


def fmt_shape(shape: Shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def broadcast_shapes(*shapes: Shape) -> Shape:
    """NumPy broadcasting over symbolic dims; a symbol only matches itself or 1."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(-rank, 0):
        dims = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(dims) > 1:
            raise ShapeError(
                "cannot broadcast shapes " + ", ".join(fmt_shape(s) for s in shapes)
                + f": axis {axis} has sizes {sorted(map(str, dims))}"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def elementwise_shape(*shapes: Shape, **_: Any) -> Shape:
    return broadcast_shapes(*shapes)


# ---------------------------------------------------------------- the elementwise family's rows

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class Member:
    """One op of the elementwise family and what its DSL function and its tests need.

    ``attributes``: the names of the constant attributes the DSL function takes after its
    operands (``clip``'s ``lo`` and ``hi``). ``draws``: one operand sampler per operand, drawing
    where the op is differentiable (away from ``floor``'s jumps) so central differences hold,
    and ``test_attrs`` the attributes the tests use; the tests iterate over the members with
    draws. An op without draws (those the compiler's own rules are written in: the arithmetic,
    ``exp`` to ``stop_gradient``, ``where``, ``relu``) is tested by its rows in
    ``tests/backends/test_every_op_every_backend.py`` and ``tests/rnnc/test_vjp.py``."""

    op: Op
    draws: tuple[Draw, ...] = ()
    attributes: tuple[str, ...] = ()
    test_attrs: dict[str, Any] = field(default_factory=dict)


def declare_elementwise(table: list[Member], name: str, arity: int, ref: Callable[..., Any],
                        vjp: Callable[..., Any], doc: str, draws: tuple[Draw, ...] = (),
                        shape: Callable[..., Any] = elementwise_shape, dsl_function: bool = True,
                        **member: Any) -> Op:
    """Register an elementwise op and append its row to ``table``: ``shape`` when it is not
    broadcasting, ``dsl_function=False`` for an op written as an operator, ``member`` the
    :class:`Member` fields (``attributes``, ``test_attrs``)."""
    op = register(Op(name, OpKind.ELEMENTWISE, arity, shape, ref, vjp, doc=doc,
                     dsl_function=dsl_function))
    table.append(Member(op, draws, **member))
    return op


def normal(scale: float) -> Draw:
    """Normal operands of standard deviation ``scale``."""
    return lambda rng, shape: rng.standard_normal(shape) * scale


def off_integers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values whose fraction lies in [0.1, 0.4] or [0.6, 0.9]: away from floor's and round's
    jumps (at integers and at halves)."""
    fraction = rng.uniform(0.1, 0.4, shape) + rng.choice([0.0, 0.5], shape)
    return rng.integers(-4, 4, shape) + fraction


def away_from_zero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Magnitudes in [0.5, 2] of either sign."""
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
