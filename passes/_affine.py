"""Affine forms of a loop body's values in one carried value: ``v = a * c + b``.

``linear_coefficients(body, carry, carried)`` finds ``A`` and ``Bv`` with ``next(c) = A * c +
Bv`` elementwise, where ``A`` and ``Bv`` read no carried value at all, or None. The form is
built bottom-up over the nodes between the carry and its next value: ``c`` is ``(1, 0)``, a
carry-free value ``v`` is ``(0, v)``, and

    add, sub, neg      add, subtract or negate both parts
    mul(v, x)          (v * a_x, v * b_x) for a carry-free v (either side)
    div(x, v)          (a_x / v, b_x / v) for a carry-free v
    where(m, x, y)     (where(m, a_x, a_y), where(m, b_x, b_y)) for a carry-free m

so ``(1-z)*c + z*g``, ``c*f + x``, ``c + x``, mask-lengths' ``where(len.mask, new, c)`` (a = 1,
b = 0 past a length) and backward's carried cotangents all have one; anything else that reads
``c`` (a matmul, a nonlinearity, a reduction, a comparison) has none. Coefficients are small
expression trees (:class:`Const`, :class:`Leaf`, :class:`Apply`) simplified as they are built,
so ``(1-z)*c`` gives ``A = 1-z`` itself rather than ``(1-z)*1 + 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph
from rnnc.passes._graphs import constant_value


@dataclass(frozen=True)
class Const:
    """A scalar constant."""

    value: float


@dataclass(frozen=True)
class Leaf:
    """A carry-free node of the loop body."""

    node: int


@dataclass(frozen=True)
class Apply:
    """An op over coefficient expressions; ``depth``: the longest path to a leaf."""

    op: ops.Op
    args: tuple[Expr, ...]
    depth: int = 1


Expr = Const | Leaf | Apply
ZERO, ONE = Const(0.0), Const(1.0)
# Expressions are walked and hashed recursively: a deeper one (an update summing hundreds of
# terms) is left to the loop rather than risk Python's recursion limit.
MAX_DEPTH = 100


def _apply(op: ops.Op, *args: Expr) -> Apply:
    return Apply(op, args, 1 + max((a.depth for a in args if isinstance(a, Apply)), default=0))


def _add(x: Expr, y: Expr) -> Expr:
    if x == ZERO:
        return y
    if y == ZERO:
        return x
    if isinstance(x, Const) and isinstance(y, Const):
        return Const(x.value + y.value)
    return _apply(ops.add, x, y)


def _neg(x: Expr) -> Expr:
    return Const(-x.value) if isinstance(x, Const) else _apply(ops.neg, x)


def _sub(x: Expr, y: Expr) -> Expr:
    if y == ZERO:
        return x
    if x == ZERO:
        return _neg(y)
    if isinstance(x, Const) and isinstance(y, Const):
        return Const(x.value - y.value)
    return _apply(ops.sub, x, y)


def _mul(x: Expr, y: Expr) -> Expr:
    # A zero part is a term the program never computes, so dropping it is exact.
    if ZERO in (x, y):
        return ZERO
    if x == ONE:
        return y
    if y == ONE:
        return x
    if isinstance(x, Const) and isinstance(y, Const):
        return Const(x.value * y.value)
    return _apply(ops.mul, x, y)


def _div(x: Expr, y: Expr) -> Expr:
    if x == ZERO:
        return ZERO
    return x if y == ONE else _apply(ops.div, x, y)


def _where(m: Expr, x: Expr, y: Expr) -> Expr:
    return x if x == y else _apply(ops.where, m, x, y)


Form = tuple[Expr, Expr]  # (a, b): the value is a * c + b


def _rule(op: ops.Op, forms: list[Form]) -> Form | None:
    """The form of ``op`` over operands of forms ``forms``; None if it is not affine in c."""
    if op is ops.add:
        (a1, b1), (a2, b2) = forms
        return _add(a1, a2), _add(b1, b2)
    if op is ops.sub:
        (a1, b1), (a2, b2) = forms
        return _sub(a1, a2), _sub(b1, b2)
    if op is ops.neg:
        return _neg(forms[0][0]), _neg(forms[0][1])
    if op is ops.stop_gradient:
        return forms[0]
    if op is ops.mul:
        (a1, b1), (a2, b2) = forms
        if a1 == ZERO:
            return _mul(b1, a2), _mul(b1, b2)
        if a2 == ZERO:
            return _mul(a1, b2), _mul(b1, b2)
        return None
    if op is ops.div:
        (a1, b1), (a2, b2) = forms
        return (_div(a1, b2), _div(b1, b2)) if a2 == ZERO else None
    if op is ops.where:
        (am, m), (a1, b1), (a2, b2) = forms
        return (_where(m, a1, a2), _where(m, b1, b2)) if am == ZERO else None
    return None


def leaf(body: Graph, nid: int) -> Expr:
    """A carry-free body node as an expression (a constant as its value)."""
    value = constant_value(body, nid)
    return Leaf(nid) if value is None else Const(value)


def linear_coefficients(body: Graph, carry: int | None, carried: set[int], out: int
                        ) -> Form | None:
    """``(A, Bv)`` with ``out = A * carry + Bv`` and neither reading a node of ``carried``
    (the args of every carry), or None. ``carry`` is None when the body does not read it."""
    touches_c = body.depends_on({carry}) if carry is not None else set()
    touches_any = body.depends_on(carried)
    if out not in touches_c:
        return None if out in touches_any else (ZERO, leaf(body, out))
    needed = body.ancestors(out) | {out}
    forms: dict[int, Form | None] = {}
    for node in body.nodes():
        if node.id not in needed or node.id not in touches_c:
            continue
        if node.id == carry:
            forms[node.id] = (ONE, ZERO)
            continue
        operands: list[Form | None] = []
        for i in node.inputs:
            if i in touches_c:
                operands.append(forms[i])
            else:
                operands.append(None if i in touches_any else (ZERO, leaf(body, i)))
        blocked = node.op in (ARG, FUSED, GET) or any(f is None for f in operands)
        form = None if blocked else _rule(node.op, operands)
        too_deep = form is not None and any(isinstance(e, Apply) and e.depth > MAX_DEPTH
                                            for e in form)
        forms[node.id] = None if too_deep else form
    return forms[out]


def leaves(expr: Expr) -> set[int]:
    """The body nodes an expression reads."""
    if isinstance(expr, Leaf):
        return {expr.node}
    if isinstance(expr, Apply):
        return set().union(*(leaves(a) for a in expr.args))
    return set()
