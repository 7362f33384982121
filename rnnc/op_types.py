"""The types every op family shares: ``Op``, ``OpKind``, ``Piece``, the registry and the
broadcasting shape rule of elementwise ops.

The op families (``rnnc.ops_elementwise``, ...) and ``rnnc.ops`` import this module; it imports
no family, so declaring an op never needs a mid-module import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

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
    """A primitive: a name plus one rule per job."""

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
