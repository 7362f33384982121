"""Sums of several terms for canonicalize: a chain of adds read as one sum, and its canonical
grouping.

A sum is the tree of adds under a root add whose inner adds each feed only that tree (they are
"absorbed"); its terms are the tree's leaves, counted with multiplicity (``b + b`` has two
terms). The canonical grouping of a sum, with every term kept as often as it occurs:

- the terms that read only loop-invariant inputs (parameters, loop constants) and constants are
  added together first, in their order, as one subexpression: hoist-sequence then computes it
  once per call, so that ``x@W + b_ih + h@U + b_hh`` adds one bias per step, not two
  (``x@W + b + b`` is ``x@W + (b + b)``);
- that invariant part pairs with the first matmul of the sum (``(x@W + b) + h@U``), which is
  what lets gate fusion fold a bias vector into its packed matmul;
- every other term keeps its order, the sum folded from the left.

A sum is regrouped only where this changes something: a single invariant term that is not a
bias vector, or a single bias vector with no matmul to pair with, leaves the sum as it is.
"""

from __future__ import annotations

from collections.abc import Set

from rnnc import ops
from rnnc.ir import ARG, Graph

Tree = tuple | int  # nested pairs of node ids: the shape of a sum


def is_bias(g: Graph, nid: int) -> bool:
    """An input vector of a fixed width."""
    node = g.node(nid)
    return node.op is ARG and len(node.shape) == 1 and not isinstance(node.shape[0], str)


def is_projection(g: Graph, nid: int) -> bool:
    """A matmul that is not a contraction over rows."""
    node = g.node(nid)
    return node.op is ops.matmul and not node.attrs.get("transpose_a")


def absorbed(g: Graph, nid: int) -> bool:
    """An add whose only use is one operand of another add: part of that add's sum."""
    if g.node(nid).op is not ops.add or nid in g.outputs.values():
        return False
    users = g.users(nid)
    return (len(users) == 1 and g.node(users[0]).op is ops.add
            and g.node(users[0]).inputs.count(nid) == 1)


def tree(g: Graph, root: int) -> Tree:
    """The nested pairs of a sum rooted at ``root``, its absorbed adds opened (iteratively)."""
    done: dict[int, Tree] = {}
    stack = [root]
    while stack:
        nid = stack[-1]
        a, b = g.node(nid).inputs
        todo = [i for i in (a, b) if i not in done and absorbed(g, i)]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        done[nid] = (done.get(a, a), done.get(b, b))
    return done[root]


def leaves(t: Tree) -> list[int]:
    """The terms of a sum tree from left to right, each as often as it occurs."""
    out, stack = [], [t]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


class Invariance:
    """Which nodes read no input outside ``invariant`` (constants are invariant): the same value
    on every step of the loop. Memoized per node, so that the terms of every sum along a chain of
    n steps take O(n) in all, not a walk to the chain's start each (O(n**2))."""

    def __init__(self, g: Graph, invariant: Set[str]) -> None:
        self.g = g
        self.invariant = invariant
        self.known: dict[int, bool] = {}

    def __call__(self, nid: int) -> bool:
        """Whether ``nid`` reads only invariant inputs (iterative: chains are deep)."""
        known, g = self.known, self.g
        stack = [nid]
        while stack:
            top = stack[-1]
            if top in known:
                stack.pop()
                continue
            node = g.node(top)
            todo = [i for i in node.inputs if i not in known]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if node.op is ARG:
                known[top] = node.attrs["name"] in self.invariant
            else:
                known[top] = all(known[i] for i in node.inputs)
        return known[nid]

    def replaced(self, old: int, new: int) -> None:
        """``new`` takes the place of ``old`` in its users. Rewrites keep values, so they keep
        invariance too, and the answers known for the users stay true; where a rewrite did
        change it, every answer known is forgotten (recomputed on demand)."""
        if old in self.known and self(new) != self.known[old]:
            self.known.clear()


def _fold_left(items: list[Tree]) -> Tree:
    out = items[0]
    for item in items[1:]:
        out = (out, item)
    return out


def grouped(g: Graph, terms: list[int], invariant: Invariance) -> Tree | None:
    """The canonical grouping of a sum of ``terms`` (see the module docstring), or None where
    it leaves the sum as it is."""
    fixed = [k for k, t in enumerate(terms) if invariant(t)]
    mms = [k for k, t in enumerate(terms) if k not in fixed and is_projection(g, t)]
    if not fixed or len(fixed) == 1 and not (mms and is_bias(g, terms[fixed[0]])):
        return None
    part = _fold_left([terms[k] for k in fixed])
    # The invariant part takes the place of the first matmul (paired with it) or else of its
    # own first term.
    at = mms[0] if mms else fixed[0]
    items: list[Tree] = []
    for k, t in enumerate(terms):
        if k == at:
            items.append((t, part) if mms else part)
        elif k not in fixed:
            items.append(t)
    return _fold_left(items)


def build(g: Graph, target: Tree, origin: str) -> int:
    """Add the adds of the sum tree ``target`` to ``g`` (bottom up, without recursion); return
    its root."""
    if not isinstance(target, tuple):
        return target
    built: dict[tuple, int] = {}
    stack = [target]
    while stack:
        t = stack[-1]
        pending = [s for s in t if isinstance(s, tuple) and s not in built]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        a, b = (built[s] if isinstance(s, tuple) else s for s in t)
        built[t] = g.add(ops.add, (a, b), origin=origin)
    return built[target]
