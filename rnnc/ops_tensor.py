"""The tensor op family: ops over several feature axes of a value ``(B, *features)``.

A value of a cell may carry feature axes, ``(B, D, N)`` for a state of ``(D, N)`` per sequence.
Elementwise ops broadcast over them like NumPy, and reductions (``sum``, ``mean``, ...) reduce
the last one. The ops here do what needs several axes at once, each with its shape rule, NumPy
reference and VJP:

- ``reshape[rank, shape]``: the last ``rank`` axes become ``shape`` (row-major, no data moves);
- ``sum_axis[axis]``: a sum over one axis (a negative number), kept as an axis of 1;
- ``sum_lead[rank]``: a sum over every axis but the last ``rank`` (the gradient of a parameter
  that a value broadcast over its rows; ``sum_rows`` is ``rank=1``);
- ``einsum[spec]``: a contraction over feature axes. ``spec`` names each operand's feature
  axes by letters; ``...`` marks the leading (row) axes of a per-step value, which every
  batched operand shares: ``"...hd,hde->...he"`` is a head-wise (block-diagonal) product of a
  ``(B, H, d)`` value with an ``(H, d, e)`` parameter. An output without ``...`` sums over the
  rows (``"...he,...hd->hde"``, the gradient of that parameter), so autodiff makes einsums.

Every op leaves the leading axes as rows, so a node keeps its meaning when hoisting moves it
out of the loop onto ``(T, B, ...)``. The ops are of kind ``TENSOR``: each runs as its own loop
nest (LLVM, CUDA) and fusion leaves it alone. Rules name the ops they emit through
:func:`_op`, looked up when the rule runs, so this module imports no other family.
"""

from __future__ import annotations

import math
import string
from typing import Any

import numpy as np

from rnnc.errors import ShapeError
from rnnc.op_types import REGISTRY, Op, OpKind, Shape, fmt_shape, register

LEAD = "..."  # the leading (row) axes of a batched einsum operand


def _op(name: str) -> Op:
    return REGISTRY[name]


def _ones_like(e, g, x):
    """``g`` broadcast to the shape of ``x`` (``where`` broadcasts without reading ``x``)."""
    return e(_op("where"), e(_op("constant"), value=1.0), g, x)


# ---------------------------------------------------------------- reshape


def _tail(a: Shape, rank: int, what: str) -> Shape:
    if not isinstance(rank, int) or not 0 <= rank <= len(a):
        raise ShapeError(f"{what} of the last {rank!r} axes of {fmt_shape(a)}: a value keeps "
                         f"its leading (row) axis")
    tail = a[len(a) - rank:]
    if any(isinstance(d, str) for d in tail):
        raise ShapeError(f"{what} over the row axes {fmt_shape(tail)} of {fmt_shape(a)}")
    return tail


def reshape_shape(a: Shape, rank: int, shape: tuple[int, ...]) -> Shape:
    tail = _tail(a, rank, "reshape")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise ShapeError(f"reshape needs positive int sizes, got {shape!r}")
    if math.prod(tail) != math.prod(shape):
        raise ShapeError(f"cannot reshape features {fmt_shape(tail)} ({math.prod(tail)} "
                         f"elements) to {fmt_shape(shape)} ({math.prod(shape)} elements)")
    return a[:len(a) - rank] + tuple(shape)


def _reshape_ref(x: np.ndarray, rank: int, shape: tuple[int, ...]) -> np.ndarray:
    return x.reshape(x.shape[:x.ndim - rank] + tuple(shape))


def _vjp_reshape(e, g, xs, y, rank, shape):
    old = e.shape(xs[0])
    return (e(_op("reshape"), g, rank=len(shape), shape=tuple(old[len(old) - rank:])),)


# ---------------------------------------------------------------- sums over several axes


def sum_axis_shape(a: Shape, axis: int) -> Shape:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -len(a) < axis < 0:
        raise ShapeError(f"sum_axis needs a negative feature axis of {fmt_shape(a)}, got {axis!r}")
    _tail(a, -axis, "sum_axis")
    return a[:len(a) + axis] + (1,) + a[len(a) + axis + 1:]


def _sum_axis_ref(x: np.ndarray, axis: int) -> np.ndarray:
    return x.sum(axis=axis, keepdims=True)


def sum_lead_shape(a: Shape, rank: int) -> Shape:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ShapeError(f"sum_lead keeps at least one axis, got rank {rank!r}")
    if rank >= len(a):
        raise ShapeError(f"sum_lead over no leading axis of {fmt_shape(a)} (rank {rank})")
    return _tail(a, rank, "sum_lead")


def _sum_lead_ref(x: np.ndarray, rank: int) -> np.ndarray:
    return x.reshape((-1,) + x.shape[x.ndim - rank:]).sum(axis=0)


def _vjp_broadcast_back(e, g, xs, y, **_: Any):
    return (_ones_like(e, g, xs[0]),)


# ---------------------------------------------------------------- einsum

Term = tuple[bool, str]  # (batched: has the leading axes, letters of the feature axes)


def parse(spec: str) -> tuple[list[Term], Term]:
    """The operand terms and the output term of a canonical spec ``"...hd,hde->...he"``."""
    if not isinstance(spec, str) or spec.count("->") != 1:
        raise ShapeError(f"einsum spec must read 'inputs->output', got {spec!r}")
    left, right = spec.split("->")

    def term(text: str) -> Term:
        batched = text.startswith(LEAD)
        letters = text[len(LEAD):] if batched else text
        if not all(c in string.ascii_letters for c in letters) or len(set(letters)) < len(
                letters):
            raise ShapeError(f"einsum term {text!r} of {spec!r}: letters a-z/A-Z, each once "
                             f"per operand (no diagonals)")
        return batched, letters

    return [term(t) for t in left.split(",")], term(right)


def unparse(inputs: list[Term], output: Term) -> str:
    def text(t: Term) -> str:
        return (LEAD if t[0] else "") + t[1]

    return ",".join(map(text, inputs)) + "->" + text(output)


def einsum_shape(*shapes: Shape, spec: str) -> Shape:
    inputs, (out_batched, out_letters) = parse(spec)
    if len(inputs) != len(shapes):
        raise ShapeError(f"einsum {spec!r} names {len(inputs)} operands, got {len(shapes)}")
    sizes: dict[str, int] = {}
    leads = []
    for (batched, letters), shape in zip(inputs, shapes, strict=True):
        lead = tuple(shape[:len(shape) - len(letters)]) if batched else ()
        if len(shape) != len(lead) + len(letters) or (batched and not lead):
            kind = "a per-step value (B, ...)" if batched else "a parameter"
            raise ShapeError(f"einsum {spec!r}: operand {letters!r} should be {kind} with "
                             f"{len(letters)} feature axes, got {fmt_shape(shape)}")
        for letter, d in zip(letters, shape[len(lead):], strict=True):
            if isinstance(d, str) or sizes.setdefault(letter, d) != d:
                raise ShapeError(f"einsum {spec!r}: axis {letter!r} has sizes "
                                 f"{sizes[letter]} and {d}")
        if batched:
            leads.append(lead)
    if any(lead != leads[0] for lead in leads):
        raise ShapeError(f"einsum {spec!r}: batched operands have different rows {leads}")
    for k, (_, letters) in enumerate(inputs):
        others = out_letters + "".join(t[1] for j, t in enumerate(inputs) if j != k)
        if set(letters) - set(others):
            raise ShapeError(f"einsum {spec!r}: axis {sorted(set(letters) - set(others))[0]!r} "
                             f"appears in one operand only; sum it first (v.sum(-1))")
    if set(out_letters) - set(sizes) or len(set(out_letters)) < len(out_letters):
        raise ShapeError(f"einsum {spec!r}: each output axis must be an operand's, once")
    if out_batched and not leads:
        raise ShapeError(f"einsum {spec!r}: the output has rows but no operand has")
    if leads and not out_batched and len(leads) < 2:
        raise ShapeError(f"einsum {spec!r}: a sum over the rows needs two batched operands")
    return (leads[0] if out_batched else ()) + tuple(sizes[c] for c in out_letters)


def explicit(spec: str, shapes: list[Shape]) -> tuple[list[str], str, str]:
    """The spec with ``...`` spelled as letters of its own: (operand terms, output term,
    the lead letters)."""
    inputs, output = parse(spec)
    free = [c for c in string.ascii_letters if c not in spec]
    rank = max((len(s) - len(t[1]) for t, s in zip(inputs, shapes, strict=True) if t[0]),
               default=0)
    lead = "".join(free[:rank])
    return ([(lead if b else "") + t for b, t in inputs], (lead if output[0] else "") + output[1],
            lead)


def _einsum_ref(*xs: np.ndarray, spec: str) -> np.ndarray:
    terms, out, _ = explicit(spec, [x.shape for x in xs])
    return np.einsum(",".join(terms) + "->" + out, *xs)


def _vjp_einsum(e, g, xs, y, spec):
    """The cotangent of each operand: the output's cotangent contracted with the others."""
    inputs, output = parse(spec)
    grads = []
    for k, term in enumerate(inputs):
        others = [t for j, t in enumerate(inputs) if j != k]
        operands = [xs[j] for j in range(len(xs)) if j != k]
        grads.append(e(_op("einsum"), g, *operands, spec=unparse([output, *others], term)))
    return tuple(grads)


_K = OpKind.TENSOR
# The DSL writes these with their own signatures (a shape, an axis, a spec: rnnc.dsl_tensor),
# or only passes make them, so no op here has a generated DSL function.
reshape = register(Op("reshape", _K, 1, reshape_shape, _reshape_ref, _vjp_reshape,
                      doc="``x`` with its last ``rank`` axes read as ``shape``.",
                      dsl_function=False))
sum_axis = register(Op("sum_axis", _K, 1, sum_axis_shape, _sum_axis_ref, _vjp_broadcast_back,
                       doc="The sum of ``x`` over one feature axis, kept as an axis of 1.",
                       dsl_function=False))
sum_lead = register(Op("sum_lead", _K, 1, sum_lead_shape, _sum_lead_ref, _vjp_broadcast_back,
                       doc="The sum of ``x`` over every axis but its last ``rank``.",
                       dsl_function=False))
einsum = register(Op("einsum", _K, None, einsum_shape, _einsum_ref, _vjp_einsum,
                     doc="A contraction over feature axes named by ``spec``.",
                     dsl_function=False))

FAMILY: tuple[Op, ...] = (reshape, sum_axis, sum_lead, einsum)
