"""CUDA rules of the tensor ops (``rnnc/ops_tensor.py``): each element a contraction.

A rule renders one element (``row``, ``col``) of its node's result. The element's flat index
``row * width + col`` is split into one coordinate per letter of the result's view; a letter
the result lacks is summed in one loop over the product of those letters' sizes, split the
same way; an operand is read at the row and column of its own flat index (layouts are
row-major). ``reshape`` is a contraction with one letter per row axis and one for the flat
features, so it reads its operand at the same flat index.

An einsum that is a batched matrix product (a head-wise one, its gradients) never reaches this
rule: code generation makes it one strided-batched GEMM (:mod:`.batched`).
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from typing import Any

from rnnc import ops
from rnnc.ops_tensor import explicit

Shape = tuple
Site = Any  # rules.Site with the node's shapes: kernels.ElementSite (rules.py imports this)


def dim(d: int | str) -> str:
    return str(d)


def product(dims: Shape) -> str:
    """The product of ``dims`` as C, symbols (``T``, ``B``) as the kernel's size arguments."""
    literal = math.prod(d for d in dims if isinstance(d, int))
    parts = [d for d in dims if isinstance(d, str)] + ([str(literal)] if literal != 1 else [])
    return "(" + " * ".join(parts) + ")" if len(parts) > 1 else (parts[0] if parts else "1")


def _coordinates(flat: str, letters: str, view: Shape) -> dict[str, str]:
    """The coordinate of each letter of ``view`` at flat index ``flat``, as C."""
    out = {}
    for pos, letter in enumerate(letters):
        inner = product(view[pos + 1:])
        quotient = flat if inner == "1" else f"({flat} / {inner})"
        out[letter] = quotient if pos == 0 else f"({quotient} % {dim(view[pos])})"
    return out


def _contract(s: Site, out_letters: str, out_view: Shape,
              operands: list[tuple[int, str, Shape]], sizes: dict) -> str:
    width = s.node.shape[-1] if s.node.shape else 1
    at = _coordinates(f"({s.row} * {width} + {s.col})", out_letters, out_view)
    summed = "".join(dict.fromkeys(c for _, ls, _ in operands for c in ls if c not in at))

    def term(coords: dict[str, str]) -> str:
        reads = []
        for i, letters, view in operands:
            flat = " + ".join(f"{coords[c]} * {product(view[p + 1:])}"
                              for p, c in enumerate(letters)) or "0"
            w = s.width(i)
            reads.append(s.at(i, row=f"(({flat}) / {w})", col=f"(({flat}) % {w})"))
        return "(" + " * ".join(reads) + ")"

    if not summed:
        return term(at)
    view = tuple(sizes[c] for c in summed)
    return s.loop(product(view), lambda k: term({**at, **_coordinates(k, summed, view)}))


def _letters(n: int) -> str:
    return string.ascii_letters[:n]


def _shape(s: Site, i: int) -> Shape:
    return s.operand_shape(i)


def _reshape(s: Site) -> str:
    a = _shape(s, 0)
    flat = a[:len(a) - s.attrs["rank"]] + (math.prod(s.attrs["shape"]),)
    letters = _letters(len(flat))
    return _contract(s, letters, flat, [(0, letters, flat)], dict(zip(letters, flat, strict=True)))


def _sum_axis(s: Site) -> str:
    a = _shape(s, 0)
    letters = _letters(len(a))
    axis = len(a) + s.attrs["axis"]
    return _contract(s, letters[:axis] + letters[axis + 1:], a[:axis] + a[axis + 1:],
                     [(0, letters, a)], dict(zip(letters, a, strict=True)))


def _sum_lead(s: Site) -> str:
    a = _shape(s, 0)
    letters = _letters(len(a))
    rank = s.attrs["rank"]
    return _contract(s, letters[len(a) - rank:], a[len(a) - rank:], [(0, letters, a)],
                     dict(zip(letters, a, strict=True)))


def _einsum(s: Site) -> str:
    shapes = [_shape(s, i) for i in range(s.arity)]
    terms, out_term, _ = explicit(s.attrs["spec"], shapes)
    sizes: dict = {}
    for term, shape in zip(terms, shapes, strict=True):
        sizes.update(zip(term, shape, strict=True))
    operands = [(i, term, shape) for i, (term, shape) in enumerate(zip(terms, shapes, strict=True))]
    return _contract(s, out_term, tuple(s.node.shape), operands, sizes)


RULES: dict[ops.Op, Callable[[Site], str]] = {
    ops.reshape: _reshape,
    ops.sum_axis: _sum_axis,
    ops.sum_lead: _sum_lead,
    ops.einsum: _einsum,
}
