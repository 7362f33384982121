"""The CUDA rule of every layout op, read from the op's index rule (``Op.pieces``).

A layout op's result column ``col`` reads the operand column its piece names
(:class:`rnnc.op_types.Piece`); the rule selects the piece holding ``col`` and reads there, so a
new layout op needs no CUDA rule of its own. ``rules.RULES`` gives every layout op this rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rnnc import ops


class Site(Protocol):
    """What the layout rule reads of ``rules.Site``, the place where a rule renders."""

    r: Any  # the renderer: its ``zero`` literal
    attrs: dict
    arity: int
    col: str

    def at(self, i: int, row: str | None = None, col: str | None = None) -> str: ...

    def width(self, i: int) -> int: ...


def _numerator(piece: ops.Piece, col: str) -> str:
    """``scale * col + offset`` as C: the operand column times ``div``."""
    if piece.scale == 0:
        return str(piece.offset)
    scaled = col if piece.scale == 1 else f"{piece.scale} * {col}"
    if piece.offset == 0:
        return scaled
    sign = "+" if piece.offset > 0 else "-"
    return f"({scaled} {sign} {abs(piece.offset)})"


def _column(piece: ops.Piece, col: str) -> str:
    """The operand column ``(scale * col + offset) / div`` that column ``col`` of a piece reads,
    as C (which rounds toward 0, not down: apart only below 0, where the read is clamped)."""
    if piece.scale == 0:
        return str(piece.column(0))
    numerator = _numerator(piece, col)
    return numerator if piece.div == 1 else f"({numerator} / {piece.div})"


def _in_bounds(piece: ops.Piece, columns: int, width: int) -> bool:
    """Whether the piece's read stays inside the operand at every column of the result."""
    reads = (piece.column(0), piece.column(columns - 1))
    return 0 <= min(reads) and max(reads) < width


def layout_rule(op: ops.Op) -> Callable[[Site], str]:
    """The rule of a layout op, read from its pieces: select the piece holding ``col``.

    Every piece's operand element is computed whichever piece is selected (as a temporary
    before the select), so a read that could leave its operand at some column is clamped."""

    def rule(s: Site) -> str:
        widths = [s.width(i) for i in range(s.arity)]
        pieces = op.pieces(*widths, **s.attrs)
        columns = pieces[-1].stop
        values = []
        for piece in pieces:
            if piece.operand is None:
                values.append(s.r.zero)
                continue
            width = widths[piece.operand]
            column = _column(piece, s.col)
            if not _in_bounds(piece, columns, width):
                column = f"rnnc_clamp({column}, 0LL, {width - 1}LL)"
            value = s.at(piece.operand, col=column)
            if piece.div != 1:  # off the div grid (between spread-out columns): 0.0
                value = f"({_numerator(piece, s.col)} % {piece.div} == 0 ? {value} : {s.r.zero})"
            values.append(value)
        expr = values[-1]
        # col < stop_0 ? v_0 : col < stop_1 ? v_1 : ... v_last
        for piece, value in zip(reversed(pieces[:-1]), reversed(values[:-1]), strict=True):
            expr = f"({s.col} < {piece.stop} ? {value} : {expr})"
        return expr

    return rule
