"""canonicalize: CSE, DCE, constant folding, algebraic identities and regrouped sums.

Equal nodes merge, dead ones go, ops on scalar constants fold, and ``a*1``, ``a+0``, ``a-0``,
``a/1``, ``--a`` and ``1-(1-a)`` simplify; ``x**p`` for p in 1, 2 and -1 becomes ``x``,
``x*x`` or ``1/x`` (``x**0.5`` does not become ``sqrt(x)``: at -0 and -inf, ``pow`` and
``sqrt`` differ; backends compute such powers by a square root themselves). A sum of several
terms (a chain of adds, each term counted as often as it occurs) is regrouped
(``passes/_sums.py``): the terms that are the same on every step (they read only parameters,
loop constants and constants) are added together first, as one subexpression, which
hoist-sequence makes one loop constant computed once per call, so ``x@W + b_ih + h@U + b_hh``
adds one bias per step, not two, and ``x@W + b + b`` is ``x@W + (b + b)``; that part pairs with
the sum's first matmul (``(x@W + b) + h@U``), which lets gate fusion fold a lone bias vector per
side into its packed matmul. Only plain sums are regrouped: GRU's ``r * (h@W_hn + b_hn)`` keeps
its bias inside. The rewrites repeat until none applies, so a second run changes nothing.
``stop_gradient`` is never removed, although it is the identity: this pass runs before
autodiff, which must see it (and backends compute it as a copy).

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("untidy")
    x, h = c.input("x", 2), c.state("h", 2)
    W, bx, bh = c.param("W", (2, 2)), c.param("bx", (2,)), c.param("bh", (2,))
    new = rnnc.tanh(x @ W + bx + h * 1.0 + bh)
    c.update(h=new)
    c.output("y", -(-new))

As traced::

    program untidy inference: traced (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], bx: f32[2], bh: f32[2]
      scan forward seqs(x) consts(W, bx, bh) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(x, W)
        %1: f32[B,2] = add(%0, bx)
        %2: f32[] = constant[value=1.0]()
        %3: f32[B,2] = mul(h, %2)
        %4: f32[B,2] = add(%1, %3)
        %5: f32[B,2] = add(%4, bh)
        %6: f32[B,2] = tanh(%5)
        %7: f32[B,2] = neg(%6)
        %8: f32[B,2] = neg(%7)
        yield h=%6, y=%8
      }
      results: y, h.final
    }

After: no ``* 1.0``, no negations, and the two biases added together (a loop constant once
hoisted), then to the matmul, before ``h`` is::

    program untidy inference: after canonicalize (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], bx: f32[2], bh: f32[2]
      scan forward seqs(x) consts(W, bx, bh) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(x, W)
        %1: f32[2] = add(bx, bh)  # canonicalize
        %2: f32[B,2] = add(%0, %1)  # canonicalize
        %3: f32[B,2] = add(%2, h)  # canonicalize
        %4: f32[B,2] = tanh(%3)
        yield h=%4, y=%4
      }
      results: y, h.final
    }
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import replace

import numpy as np

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph, Node, Program
from rnnc.passes import register
from rnnc.passes._graphs import constant_value, prune_outputs, remove_dead
from rnnc.passes._sums import Invariance, absorbed, build, grouped, is_bias, leaves, tree
from rnnc.passes.rewrite import Rule, apply_rules

_is_bias = is_bias  # tests/rnnc/test_check.py builds a faulty rule from it

ORIGIN = "canonicalize"


def _same_type(g: Graph, node: Node, other: int) -> int | None:
    # Dropping an operand must not drop a broadcast.
    return other if g.node(other).type == node.type else None


def _operand_is(value: float, pos: int) -> Callable[[Graph, Node], int | None]:
    """``op(a, c) -> a`` where the operand at ``pos`` is the constant ``value``."""
    def rewrite(g: Graph, node: Node) -> int | None:
        if constant_value(g, node.inputs[pos]) == value:
            return _same_type(g, node, node.inputs[1 - pos])
        return None
    return rewrite


def _fold(g: Graph, node: Node) -> int | None:
    """An op on scalar constants only is a constant."""
    if node.op in (ARG, FUSED, GET, ops.constant) or not node.inputs or node.shape != ():
        return None
    values = [constant_value(g, i) for i in node.inputs]
    if any(v is None for v in values):
        return None
    with np.errstate(all="ignore"):
        out = node.op.ref(*(np.float64(v) for v in values), **node.attrs)
    value = float(np.asarray(out))
    if not np.isfinite(value):
        return None
    return g.add(ops.constant, (), {"value": value}, origin=ORIGIN)


def _cheap_power(g: Graph, node: Node) -> int | None:
    """``x**1 -> x``, ``x**2 -> x*x``, ``x**-1 -> 1/x``: the same values (to rounding, and at
    every special value) without a general power."""
    x, p = node.inputs[0], node.attrs["exponent"]
    if p == 1.0:
        return _same_type(g, node, x)
    if p == 2.0:
        return g.add(ops.mul, (x, x), origin=ORIGIN)
    if p == -1.0:
        one = g.add(ops.constant, (), {"value": 1.0}, origin=ORIGIN)
        return g.add(ops.div, (one, x), origin=ORIGIN)
    return None


def _double_negation(g: Graph, node: Node) -> int | None:
    inner = g.node(node.inputs[0])
    return _same_type(g, node, inner.inputs[0]) if inner.op is ops.neg else None


def _one_minus_one_minus(g: Graph, node: Node) -> int | None:
    """``1 - (1 - a) -> a``."""
    inner = g.node(node.inputs[1])
    if (constant_value(g, node.inputs[0]) == 1.0 and inner.op is ops.sub
            and constant_value(g, inner.inputs[0]) == 1.0):
        return _same_type(g, node, inner.inputs[1])
    return None


def _reassociate(g: Graph, node: Node, invariant: Invariance) -> int | None:
    """A sum of several terms in its canonical grouping (``passes/_sums.py``): the terms that
    are the same on every step added first, as one subexpression, paired with the first
    matmul; every other term in its place.

    Terms are counted with multiplicity: ``x@W + b + b`` keeps both ``b``, ``x@W + x@W + b``
    gets one ``b``."""
    if absorbed(g, node.id):
        return None
    current = tree(g, node.id)
    target = grouped(g, leaves(current), invariant)
    if target is None or target == current:
        return None
    new = build(g, target, ORIGIN)
    return new if g.node(new).type == node.type else None


RULES: tuple[Rule, ...] = (
    Rule("fold-constants", None, _fold),
    Rule("a*1", ops.mul, _operand_is(1.0, 1)),
    Rule("1*a", ops.mul, _operand_is(1.0, 0)),
    Rule("a+0", ops.add, _operand_is(0.0, 1)),
    Rule("0+a", ops.add, _operand_is(0.0, 0)),
    Rule("a-0", ops.sub, _operand_is(0.0, 1)),
    Rule("a/1", ops.div, _operand_is(1.0, 1)),
    Rule("--a", ops.neg, _double_negation),
    Rule("cheap-power", ops.power, _cheap_power),
    Rule("1-(1-a)", ops.sub, _one_minus_one_minus),
    Rule("group-invariant-terms", ops.add, _reassociate, takes_context=True),
)


def canonicalize_graph(g: Graph, keep_args: set[str], invariant: Set[str] = frozenset()
                       ) -> Graph:
    """Apply the rules of ``RULES`` and CSE to a copy of ``g`` until none applies; ``invariant``
    names the inputs that are the same on every step (their sums are grouped)."""
    g = g.copy()
    apply_rules(g, RULES, keep_args, Invariance(g, invariant), ORIGIN)
    return g


def _fixed_shape_args(g: Graph) -> frozenset[str]:
    """The inputs of a graph outside the loop with neither a step nor a batch axis: parameters
    and loop constants."""
    return frozenset(name for name, nid in g.args().items()
                     if not any(isinstance(d, str) for d in g.node(nid).shape))


@register("canonicalize")
def canonicalize(program: Program) -> Program:
    """CSE, DCE, constant folding, identities and bias reassociation in every graph."""
    keep = set(program.args)
    p = prune_outputs(program)
    body = canonicalize_graph(p.scan.body, keep, frozenset(p.scan.consts))
    p = replace(p, pre=canonicalize_graph(p.pre, keep, _fixed_shape_args(p.pre)),
                post=canonicalize_graph(p.post, keep, _fixed_shape_args(p.post)),
                scan=replace(p.scan, body=body))
    p = prune_outputs(p)
    # Pruning the scan may leave pre-loop values nobody reads.
    remove_dead(p.pre, keep)
    return p
