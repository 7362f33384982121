"""Einsums that are batched matrix products, run as one strided-batched GEMM.

``rnnc.einsum("hd,hde->he", h, R)`` multiplies each head's ``(B, d)`` rows by its own
``(d, e)`` block: ``H`` matrix products of one shape, each ``H`` a fixed stride apart in every
operand. :func:`batched_gemm` recognizes such a spec. Its letters (the rows ``...`` spelled as
letters of their own, :func:`rnnc.ops_tensor.explicit`) fall in four groups:

- batch: in both operands and the result (the heads ``h``);
- rows and columns: in one operand and the result (``...`` and ``e``);
- contraction: in both operands, not the result (``d``).

Where each group's letters are consecutive, in the same order, in every term that has them,
each operand (a row-major array) reshapes to one axis per group without moving data, and a
transpose makes it ``(batch, rows, k)``, ``(batch, k, cols)`` and ``(batch, rows, cols)``
views. So the forward product, the input's gradient (``"...he,hde->...hd"``, the weight read
transposed) and the weight's gradient (``"...he,...hd->hde"``, a sum over the rows: the
rows are the contraction) are each one call: ``cublasGemmStridedBatchedEx`` on a GPU
(:class:`~.blas.DeviceBatchedGemm`), one ``matmul`` over the batch in emulation, never one
call per head. A spec of another form (three operands, no contraction, a term ending in a
batch letter: no matrix with contiguous rows or columns) keeps its kernel (:mod:`.tensor`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rnnc.backends.cuda.plan import PerStep, View, at_step
from rnnc.backends.steps import resolve
from rnnc.ir import Shape
from rnnc.ops_tensor import explicit

Dim = int | str
Group = tuple[Dim, ...]  # the sizes of a group's letters, merged into one axis


@dataclass(frozen=True)
class Layout:
    """How an operand of a batched product becomes a 3-D view: reshaped to one axis per
    group (``groups``, in the order of its term; a group it lacks is an axis of 1), then
    transposed by ``order`` to (batch, rows, columns)."""

    groups: tuple[Group, ...]
    order: tuple[int, int, int]

    def shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        """The grouped shape for sizes ``dims``."""
        return tuple(math.prod(resolve(group, dims)) for group in self.groups)


@dataclass(frozen=True)
class BatchedGemm:
    """``node = einsum(a, b)`` as the batched product ``out[i] = a[i] @ b[i]`` of the 3-D
    views ``layouts`` (a, b, result) make."""

    node: int
    a: int
    b: int
    layouts: tuple[Layout, Layout, Layout]
    shape: Shape  # the node's result


def _consecutive(term: str, group: str) -> bool:
    """Whether ``group``'s letters stand side by side in ``term``, in ``group``'s order."""
    if not group:
        return True
    start = term.find(group[0])
    return term[start:start + len(group)] == group


def _layout(term: str, roles: tuple[str, str, str], sizes: Mapping[str, Dim]) -> Layout:
    """The :class:`Layout` of a term whose groups, in (batch, rows, columns) order, are
    ``roles`` (letter strings; an empty one is an axis of 1 after the term's own)."""
    present = sorted((r for r in roles if r), key=lambda r: term.index(r[0]))
    order, extra = [], len(present)
    for role in roles:
        if role:
            order.append(present.index(role))
        else:  # each empty group its own axis of 1, after the term's axes
            order.append(extra)
            extra += 1
    groups = tuple(tuple(sizes[c] for c in r) for r in present) + ((),) * (extra - len(present))
    return Layout(groups, tuple(order))


def batched_form(spec: str, shapes: Sequence[Shape]
                 ) -> tuple[bool, tuple[Layout, Layout, Layout]] | None:
    """(whether the operands swap places, the layouts of the first and second factor and
    the result) where ``spec`` on operands of ``shapes`` is a batched matrix product whose
    groups keep their order; None where it is not (the module doc)."""
    if len(shapes) != 2:
        return None
    (ta, tb), out, _ = explicit(spec, list(shapes))
    sizes: dict[str, Dim] = {}
    for term, shape in zip((ta, tb), shapes, strict=True):
        sizes.update(zip(term, shape, strict=True))
    batch = "".join(c for c in out if c in ta and c in tb)
    rows_a = "".join(c for c in out if c in ta and c not in tb)
    rows_b = "".join(c for c in out if c in tb and c not in ta)
    k = "".join(c for c in ta if c in tb and c not in out)
    if not out or not k or out[-1] in batch:
        return None
    swap = out[-1] in rows_a  # the result's columns come from the first operand
    if swap:
        ta, tb, rows_a, rows_b = tb, ta, rows_b, rows_a
        k = "".join(c for c in ta if c in k)  # the contraction in the first factor's order
    if ta[-1] in batch or tb[-1] in batch:
        return None  # a matrix with neither its rows nor its columns contiguous
    groups = {"a": (batch, rows_a, k), "b": (batch, k, rows_b), "out": (batch, rows_a, rows_b)}
    for (term, roles) in ((ta, groups["a"]), (tb, groups["b"]), (out, groups["out"])):
        if not all(_consecutive(term, r) for r in roles):
            return None
    return swap, (_layout(ta, groups["a"], sizes), _layout(tb, groups["b"], sizes),
                  _layout(out, groups["out"], sizes))


def batched_gemm(node: int, spec: str, inputs: Sequence[int], shapes: Sequence[Shape],
                 shape: Shape) -> BatchedGemm | None:
    """The :class:`BatchedGemm` of einsum ``node`` (``inputs``, their ``shapes``, its own
    ``shape``), or None where its spec is not a batched product (it keeps its kernel)."""
    form = batched_form(spec, shapes)
    if form is None:
        return None
    swap, layouts = form
    a, b = reversed(inputs) if swap else inputs
    return BatchedGemm(node, a, b, layouts, tuple(shape))


def view(value: Any, layout: Layout, dims: Mapping[str, int], written: bool = False) -> Any:
    """The 3-D view of ``value`` (an array of the operand's shape, row-major, or a
    :class:`~.plan.PerStep` of such arrays) that ``layout`` makes. A result (``written``)
    must be contiguous, so the view writes into it rather than into a copy."""
    grouped = layout.shape(dims)
    if written and not at_step(value, 0).flags.c_contiguous:
        raise RuntimeError("a batched product's result must be a contiguous array")

    def make(array: Any) -> Any:
        return array.reshape(grouped).transpose(layout.order)

    return View(value, make) if isinstance(value, PerStep) else make(value)
