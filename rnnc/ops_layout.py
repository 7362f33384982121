"""The layout family: ``concat``, ``slice``, ``pad`` and ``expand``, each declared once with its
shape rule, index rule (``pieces``), NumPy reference, VJP and DSL docstring.

A layout op moves columns of the feature axis: its ``pieces`` rule says which operand column
each column of the result reads (``rnnc.op_types.Piece``). The LLVM region emitter and the CUDA
kernel writer both read layout ops through it, so a new layout op needs nothing in a backend.
A ``step`` attribute (omitted when 1) makes ``slice`` strided and spreads ``pad``'s columns
apart, each the other's gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.errors import ShapeError
from rnnc.op_types import (
    Op,
    OpKind,
    Piece,
    Shape,
    broadcast_shapes,
    fmt_shape,
    op_named,
    register,
)

# ---------------------------------------------------------------- shape rules


def concat_shape(*shapes: Shape) -> Shape:
    if not shapes:
        raise ShapeError("concat needs at least one operand")
    lead = broadcast_shapes(*(s[:-1] + (1,) for s in shapes))[:-1]
    for s in shapes:
        if len(s) < 1 or s[:-1] != lead:
            raise ShapeError("concat needs equal leading axes, got "
                             + ", ".join(fmt_shape(s) for s in shapes))
    return lead + (sum(s[-1] for s in shapes),)


def check_step(op: str, step: Any) -> int:
    """A layout op's ``step``: a positive int (1 is contiguous)."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ShapeError(f"{op} step must be a positive integer (1: contiguous), got {step!r}")
    return int(step)


def step_attrs(step: int) -> dict[str, int]:
    """The ``step`` attribute as it is stored: omitted when 1, so contiguous layout ops keep
    one form (and print as they always have)."""
    return {} if step == 1 else {"step": step}


def slice_width(start: int, stop: int, step: int = 1) -> int:
    """How many columns ``[start:stop:step]`` holds."""
    return len(range(start, stop, step))


def slice_shape(a: Shape, start: int, stop: int, step: int = 1) -> Shape:
    step = check_step("slice", step)
    if len(a) < 1 or not (0 <= start < stop <= a[-1]):
        where = f"{start}:{stop}" + (f":{step}" if step != 1 else "")
        raise ShapeError(f"slice [{where}] out of range for {fmt_shape(a)}")
    return a[:-1] + (slice_width(start, stop, step),)


def pad_shape(a: Shape, before: int, after: int, step: int = 1) -> Shape:
    step = check_step("pad", step)
    # ``step - 1`` zeros between neighbouring columns of the operand.
    return a[:-1] + (a[-1] + (a[-1] - 1) * (step - 1) + before + after,)


def expand_shape(a: Shape, size: int) -> Shape:
    if len(a) < 1 or a[-1] != 1:
        raise ShapeError(f"expand needs a last axis of 1, got {fmt_shape(a)}")
    return a[:-1] + (size,)


# ---------------------------------------------------------------- index rules


def concat_pieces(*widths: int) -> tuple[Piece, ...]:
    out, start = [], 0
    for k, n in enumerate(widths):
        out.append(Piece(start, start + n, k, 1, -start))
        start += n
    return tuple(out)


def slice_pieces(width: int, start: int, stop: int, step: int = 1) -> tuple[Piece, ...]:
    return (Piece(0, slice_width(start, stop, step), 0, scale=step, offset=start),)


def pad_pieces(width: int, before: int, after: int, step: int = 1) -> tuple[Piece, ...]:
    end = before + (width - 1) * step + 1  # one past the operand's last column
    middle = (Piece(before, end, 0, 1, -before, div=step),)
    head = (Piece(0, before, None),) if before else ()
    tail = (Piece(end, end + after, None),) if after else ()
    return head + middle + tail


def expand_pieces(width: int, size: int) -> tuple[Piece, ...]:
    return (Piece(0, size, 0, 0, 0),)


# ---------------------------------------------------------------- references


def concat_ref(*xs):
    # Broadcast the leading (row) axes only: the feature sizes differ by design.
    lead = np.broadcast_shapes(*(x.shape[:-1] for x in xs))
    return np.concatenate([np.broadcast_to(x, lead + x.shape[-1:]) for x in xs], axis=-1)


def slice_ref(x, start: int, stop: int, step: int = 1):
    return x[..., start:stop:step]


def pad_ref(x, before: int, after: int, step: int = 1):
    n = x.shape[-1]
    out = np.zeros(x.shape[:-1] + (before + (n - 1) * step + 1 + after,), x.dtype)
    out[..., before:before + (n - 1) * step + 1:step] = x
    return out


def expand_ref(x, size: int):
    return np.repeat(x, size, axis=-1)


# ---------------------------------------------------------------- vjp rules


def vjp_concat(e, g, xs, y):
    grads, start = [], 0
    for x in xs:
        n = e.shape(x)[-1]
        grads.append(e(slice_, g, start=start, stop=start + n))
        start += n
    return tuple(grads)


def vjp_slice(e, g, xs, y, start, stop, step=1):
    # Scatter g back to the sliced columns, zeros elsewhere (between them too, when strided).
    n = e.shape(xs[0])[-1]
    last = start + (slice_width(start, stop, step) - 1) * step
    return (e(pad, g, before=start, after=n - last - 1, **step_attrs(step)),)


def vjp_pad(e, g, xs, y, before, after, step=1):
    n = e.shape(xs[0])[-1]
    return (e(slice_, g, start=before, stop=before + (n - 1) * step + 1, **step_attrs(step)),)


def vjp_expand(e, g, xs, y, size):
    return (e(op_named("sum"), g),)


# ---------------------------------------------------------------- the declarations


def _declare(name: str, arity: int | None, shape, ref, vjp, pieces, doc: str = "",
             dsl_function: bool = False) -> Op:
    return register(Op(name, OpKind.LAYOUT, arity, shape, ref, vjp, pieces=pieces, doc=doc,
                       dsl_function=dsl_function))


concat = _declare("concat", None, concat_shape, concat_ref, vjp_concat, concat_pieces,
                  "Concatenate a list of values along the feature axis.", dsl_function=True)
# Written v[:, a:b] and v[:, a:b:s]; pad and expand only passes and VJPs make.
slice_ = _declare("slice", 1, slice_shape, slice_ref, vjp_slice, slice_pieces,
                  "``x[..., start:stop:step]``.")
pad = _declare("pad", 1, pad_shape, pad_ref, vjp_pad, pad_pieces,
               "``x`` with ``before`` and ``after`` zero columns, its own ``step`` apart.")
expand = _declare("expand", 1, expand_shape, expand_ref, vjp_expand, expand_pieces,
                  "A last axis of 1 repeated ``size`` times.")
