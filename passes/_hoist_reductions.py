"""hoist-sequence's rule (c): carry-free groups holding a feature reduction move before the loop.

A reduction over the features (``mean``, ``sum``, ``amax``, ``amin``) of a pure function of the
inputs is work the sequential loop does every step although no carried value changes it, and
a reduction ends a fused region where the backend does not fuse it; before the loop it runs
once over all ``T*B`` rows. Elementwise work alone is left in the loop (rule (a)): there it
costs nothing extra, fused with the step's other work. The rule, on the loop-invariant nodes
that rules (a) and (b) of hoist-sequence leave in the loop (all per-step; random ops and what
reads them are never loop-invariant; what (b) moves after the loop reads nothing in it):

- a *group* is a connected set of them (joined by the edges between them), in body order;
- the loop's *reads* are the elements of sequence data one step reads per batch row: the
  sequences the loop's nodes and carry outputs read (inputs, hoisted values), counted once
  each, by width (a hoisted value that is only stacked becomes the stacked sequence itself and
  costs nothing);
- each group moves its longest prefix (in body order; a prefix reads nothing of the group
  beyond it) that holds a reduction and leaves the loop's reads no higher than they are; then
  the groups that moved nothing are tried together as one, since two groups that read the same
  sequence may free it only together; layout ops at the end of a moved prefix that only the
  loop reads (its layout tail) stay there when that raises no reads (fused in the loop they are
  free);
- the rounds repeat over the groups of what is left until one moves nothing, so a second run
  of the pass moves nothing more.

In a layer-norm LSTM, ``layer_norm(x @ W, g, b)`` is one group: moved, the loop reads the
normalized sequence instead of the hoisted ``x @ W`` of the same width.
"""

from __future__ import annotations

import math
from collections.abc import Set

from rnnc import ops
from rnnc.ir import Graph, Scan
from rnnc.passes._graphs import per_step

FEATURE_REDUCTIONS = (ops.sum_, ops.mean, ops.amax, ops.amin)


def _width(shape: tuple) -> int:
    """Elements per batch row of a per-step value."""
    return math.prod(int(d) for d in shape[1:])


class _Reads:
    """The loop's per-step reads of sequence data, for sets of hoisted nodes."""

    def __init__(self, body: Graph, s: Scan, leaving: Set[int]) -> None:
        self.body = body
        self.leaving = leaving  # nodes that move after the loop: they read nothing in it
        args = body.args()
        self.seqs = {args[n] for n in s.seqs if n in args}
        # Values the loop yields other than as a stacked output alone (a carry's next value).
        self.yielded = {o for name, o in body.outputs.items() if o not in leaving
                        and (name not in s.stacked or o in self.seqs)}

    def __call__(self, hoisted: Set[int]) -> int:
        return self.along(hoisted, [])[0]

    def along(self, hoisted: Set[int], order: list[int]) -> list[int]:
        """The reads with ``hoisted`` moved, then with each longer prefix of ``order`` (nodes
        the loop keeps, in body order) moved too, updated one node at a time."""
        body = self.body
        moved = set(hoisted)
        readers: dict[int, int] = {}  # value -> how many of the loop's nodes read it
        for node in body.nodes():
            if node.id not in moved and node.id not in self.leaving:
                for i in set(node.inputs):
                    readers[i] = readers.get(i, 0) + 1

        def cost(v: int) -> int:
            shape = body.node(v).shape
            sequence = v in self.seqs or v in moved and per_step(shape)
            read = readers.get(v, 0) > 0 or v in self.yielded
            return _width(shape) if sequence and read else 0

        total = sum(cost(v) for v in set(readers) | self.yielded)
        out = [total]
        for nid in order:
            for i in set(body.node(nid).inputs):  # the loop no longer reads them for nid
                total -= cost(i)
                readers[i] -= 1
                total += cost(i)
            moved.add(nid)  # a value the loop reads as a hoisted sequence from now on
            total += cost(nid)
            out.append(total)
        return out


def _groups(body: Graph, rest: list[int]) -> list[list[int]]:
    """The connected groups of the nodes ``rest`` (in body order), each in body order."""
    order = {n: k for k, n in enumerate(rest)}
    group_of: dict[int, int] = {}
    groups: list[list[int]] = []
    for start in rest:
        if start in group_of:
            continue
        group_of[start] = len(groups)
        found, stack = [start], [start]
        while stack:
            nid = stack.pop()
            for other in (*body.node(nid).inputs, *body.users(nid)):
                if other in order and other not in group_of:
                    group_of[other] = len(groups)
                    found.append(other)
                    stack.append(other)
        groups.append(sorted(found, key=order.__getitem__))
    return groups


def _prefix(body: Graph, group: list[int], hoisted: set[int], reads: _Reads) -> list[int]:
    """The longest prefix of ``group`` holding a reduction that, hoisted with ``hoisted``,
    raises no reads, less its layout tail (the layout ops that only the loop and that tail
    read) when leaving the tail in the loop raises no reads either. Empty if there is none."""
    totals = reads.along(hoisted, group)
    best: list[int] = []
    seen_reduction = False
    for k, nid in enumerate(group):
        seen_reduction |= body.node(nid).op in FEATURE_REDUCTIONS
        if seen_reduction and totals[k + 1] <= totals[0]:
            best = group[:k + 1]
    moved = set(best)
    tail: set[int] = set()  # layout ops whose users in the prefix are all in the tail
    for nid in reversed(best):
        if body.node(nid).op.kind is ops.OpKind.LAYOUT and nid not in body.outputs.values() \
                and all(u in tail for u in body.users(nid) if u in moved):
            tail.add(nid)
    if tail and reads(hoisted | (moved - tail)) <= reads(hoisted | moved):
        moved -= tail
    return [n for n in best if n in moved]


def _round(body: Graph, rest: list[int], chosen: set[int], reads: _Reads) -> set[int]:
    """One round of the rule over the groups of ``rest``: what moves besides ``chosen``."""
    pending = [g for g in _groups(body, rest)
               if any(body.node(n).op in FEATURE_REDUCTIONS for n in g)]
    extra: set[int] = set()
    progress = True
    while progress:  # a group that moves may free a sequence another group reads
        progress = False
        for group in pending[:]:
            moved = _prefix(body, group, chosen | extra, reads)
            if moved:
                extra.update(moved)
                pending.remove(group)
                progress = True
    if len(pending) > 1:
        waiting = {n for g in pending for n in g}
        together = [n for n in rest if n in waiting]
        extra.update(_prefix(body, together, chosen | extra, reads))
    return extra


def reduction_groups(body: Graph, s: Scan, movable: list[int], hoisted: list[int],
                     leaving: Set[int]) -> list[int]:
    """The nodes of ``movable`` (loop-invariant, in body order) that rule (c) moves in
    addition to ``hoisted``, in body order. ``leaving`` is what rule (b) moves after the loop:
    it reads nothing in the loop and is left to (b).

    The rounds repeat on what is left (in new groups) until one moves nothing, so that running
    the pass again finds nothing more to move."""
    chosen = set(hoisted)
    reads = _Reads(body, s, leaving)
    while True:
        rest = [n for n in movable if n not in chosen and n not in leaving]
        extra = _round(body, rest, chosen, reads)
        if not extra:
            return [n for n in movable if n in chosen and n not in hoisted]
        chosen |= extra
