"""The rule-table rewrite engine: local rules and CSE applied to a graph until none applies.

A pass that rewrites local patterns declares them as a table of :class:`Rule` (an op to match
and a function that returns the node replacing the matched one, or None) and hands the table
and a graph to :func:`apply_rules`. The engine owns the walk: a worklist seeded in topological
order, equal nodes merged (CSE: :func:`cse_key`), what a rewrite leaves unused deleted at once
(so use counts stay true for rules that ask for them), the users and operands of each replaced
node queued again, and a budget that turns a table that never settles into an error rather
than a hang. :func:`cse_graph` is CSE and dead-code removal alone (the ``cse`` pass).

canonicalize's ``RULES`` is the main table; a new local rewrite is a new rule there or a new
table in its own pass (docs/architecture.md, "How to add a pass").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Any, Protocol

from rnnc.ir import ARG, FUSED, Graph, Node
from rnnc.ops import Op
from rnnc.passes._graphs import remove_dead


@dataclass(frozen=True)
class Rule:
    """``op(...)`` matching ``rewrite``: ``rewrite(g, node)`` returns the node that replaces it
    (made from its operands, possibly new), or None where the pattern does not match."""

    name: str
    op: Op | None  # None: any op
    rewrite: Callable[..., int | None]
    # True: ``rewrite(g, node, context)`` also gets the context the table was run with (for
    # canonicalize: which nodes are the same on every step).
    takes_context: bool = False


class Context(Protocol):
    """What a table's rules know besides the graph, kept true as nodes are replaced."""

    def replaced(self, old: int, new: int) -> None:
        """Node ``old`` is about to be replaced by ``new`` everywhere."""


def cse_key(node: Node) -> tuple | None:
    """Equal keys compute equal values (attributes compared exactly: repr of a float
    round-trips)."""
    if node.op in (ARG, FUSED):
        return None
    if node.op.name == "matmul" and node.attrs.get("precision") == "bf16":
        # Two equal bfloat16 products have equal values but not equal gradients: each rounds
        # its own cotangent to bfloat16 (round(g1) + round(g2) is not round(g1 + g2)).
        return None
    return (node.op.name, node.inputs, tuple(sorted((k, repr(v)) for k, v in
                                                    node.attrs.items())), node.type)


def apply_rules(g: Graph, rules: Sequence[Rule], keep_args: Set[str] = frozenset(),
                context: Context | None = None, what: str = "rewrite") -> None:
    """Rewrite ``g`` in place by ``rules`` and CSE until none applies, then delete what no
    output needs (except the inputs named in ``keep_args``); ``what`` names the caller in
    errors. ``context`` is handed to the rules that take one; it must describe ``g``."""
    _Worklist(g, rules, keep_args, context, what).run()
    remove_dead(g, keep_args)


def cse_graph(g: Graph, keep_args: Set[str] = frozenset()) -> Graph:
    """``g`` with equal nodes merged and dead ones deleted (except the inputs named in
    ``keep_args``): a rewritten copy, or ``g`` itself where there is nothing to do."""
    keys = [key for node in g.nodes() if (key := cse_key(node)) is not None]
    dead = [n for n in g.dead_code(keep_args=False)
            if g.node(n).op is not ARG or g.node(n).attrs["name"] not in keep_args]
    if len(set(keys)) == len(keys) and not dead:
        return g
    g = g.copy()
    apply_rules(g, (), keep_args, what="cse")
    return g


class _Worklist:
    """The driver: rewrite until no rule applies and no two nodes are equal."""

    def __init__(self, g: Graph, rules: Sequence[Rule], keep_args: Set[str],
                 context: Context | None, what: str) -> None:
        self.g = g
        self.keep = keep_args
        self.context = context
        self.what = what
        self.rules = tuple(rules)
        # Each op's rules in table order, the any-op rules in their places among them.
        self.by_op: dict[Any, list[Rule]] = {}
        self.seen: dict[tuple, int] = {}
        self.work: list[int] = []
        self.queued: set[int] = set()
        self.top = max(g.nx.nodes, default=-1)  # the largest node id so far

    def rules_for(self, op: Any) -> list[Rule]:
        """The rules that may match a node of ``op`` (``ARG`` and ``FUSED`` are not ``Op``s)."""
        if op not in self.by_op:
            self.by_op[op] = [r for r in self.rules if r.op is None or r.op is op]
        return self.by_op[op]

    def push(self, nid: int) -> None:
        if nid not in self.queued:
            self.queued.add(nid)
            self.work.append(nid)

    def run(self) -> None:
        g = self.g
        for nid in reversed(g.topo()):  # the stack pops in topological order
            self.push(nid)
        budget = 64 * (len(g) + 16)
        while self.work:
            nid = self.work.pop()
            self.queued.discard(nid)
            if nid not in g.nx:
                continue
            new = self.rewrite(g.node(nid))
            if new is None:
                continue
            budget -= 1
            if budget < 0:  # every rule must shrink or canonicalize: this is a bug, say so
                raise RuntimeError(f"{self.what} did not reach a fixed point")
            self.replace(nid, new)

    def rewrite(self, node: Node) -> int | None:
        g = self.g
        key = cse_key(node)
        if key is not None:
            other = self.seen.get(key)
            if other is not None and other != node.id and other in g.nx \
                    and cse_key(g.node(other)) == key:
                return other
            self.seen[key] = node.id
        for rule in self.rules_for(node.op):
            size, top = len(g), self.top
            new = rule.rewrite(g, node, self.context) if rule.takes_context \
                else rule.rewrite(g, node)
            made = self._made(size, top)
            if new is not None and new != node.id:
                for nid in made:
                    self.push(nid)
                return new
            self._drop_dead(made)
        return None

    def _made(self, size: int, top: int) -> list[int]:
        """The nodes a rule added: node ids only grow, so those above the old largest."""
        g = self.g
        if len(g) == size:  # nothing added (rules never delete)
            return []
        made = sorted(n for n in g.nx.nodes if n > top)
        self.top = max(self.top, made[-1]) if made else self.top
        return made

    def replace(self, old: int, new: int) -> None:
        g = self.g
        users = g.users(old)
        operands = g.node(old).inputs
        if self.context is not None:
            self.context.replaced(old, new)
        g.replace_all_uses(old, new)
        for u in users:
            self.push(u)
        self.push(new)
        for i in g.node(new).inputs:  # an operand's use count changed: absorbed or not
            self.push(i)
        self._drop_dead([old])
        for i in operands:
            if i in g.nx:
                self.push(i)

    def _drop_dead(self, candidates: Iterable[int]) -> None:
        """Delete nodes nothing uses (and what only they used), so use counts stay true."""
        g = self.g
        outputs = set(g.outputs.values())
        stack = list(candidates)
        while stack:
            nid = stack.pop()
            if nid not in g.nx or nid in outputs or g.users(nid):
                continue
            node = g.node(nid)
            if node.op is ARG and node.attrs["name"] in self.keep:
                continue
            g.remove(nid)
            stack.extend(node.inputs)
            for i in node.inputs:
                self.push(i)
