"""cse and prune-outputs: equal nodes merged, and outputs nobody reads dropped, as passes.

canonicalize does both as part of its rewriting; these two run them alone where a pass's
rewrite leaves copies and unread outputs behind: they are parallel-scan's last follow-ups
(``FOLLOW_UPS`` in ``passes/__init__.py``). ``cse`` is the rewrite engine with an empty rule
table (``passes/rewrite.py``: CSE and dead-code removal) in every graph; ``prune-outputs`` drops
what ``pre``, the loop and ``post`` yield that no later stage reads and is no result, and what
only that computed (``prune_outputs`` in ``passes/_graphs.py``, which canonicalize runs too).

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("mingru")
    x, h = c.input("x", 2), c.state("h", 2)
    W, U = c.param("W", (2, 2)), c.param("U", (2, 2))
    z = rnnc.sigmoid(x @ W)
    new = (1 - z) * h + z * (x @ U)
    c.update(h=new)
    c.output("y", new)

Before (after drop-empty-loop)::

    program mingru inference: after drop-empty-loop (f32) {
    }

After cse::

    program mingru inference: after cse (f32) {
    }

After prune-outputs::

    program mingru inference: after prune-outputs (f32) {
    }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc.ir import Graph, Program
from rnnc.passes import register
from rnnc.passes._graphs import prune_outputs, remove_dead
from rnnc.passes.rewrite import apply_rules


def _cse_graph(g: Graph, keep: set[str]) -> Graph:
    g = g.copy()
    apply_rules(g, (), keep, what="cse")
    return g


@register("cse")
def cse(program: Program) -> Program:
    """Merge equal nodes and delete dead ones in every graph."""
    keep = set(program.args)
    body = _cse_graph(program.scan.body, keep)
    return replace(program, pre=_cse_graph(program.pre, keep),
                   post=_cse_graph(program.post, keep),
                   scan=replace(program.scan, body=body))


@register("prune-outputs")
def prune_outputs_pass(program: Program) -> Program:
    """Drop the outputs no later stage reads and no result is, and what only they computed."""
    p = prune_outputs(program)
    keep = set(program.args)
    for g in (p.pre, p.scan.body, p.post):  # prune_outputs made each a copy
        remove_dead(g, keep)
    return p
