"""canonicalize: CSE, DCE, constant folding, algebraic identities and bias reassociation.

Sums of several terms are rebuilt so that each matmul gets its own bias add, which is what
lets gate fusion fold the biases per side and hoisting move ``x@W + b`` out of the loop::

    before                                  after
    %0 = matmul(x, W_i)                     %0 = matmul(x, W_i)
    %1 = add(%0, b_i)                       %1 = add(%0, b_i)
    %2 = matmul(h, U_i)                     %2 = matmul(h, U_i)
    %3 = add(%1, %2)                        %3 = add(%2, b_h)
    %4 = add(%3, b_h)                       %4 = add(%1, %3)
    %5 = constant[value=1.0]()              %5 = tanh(%4)
    %6 = mul(%4, %5)
    %7 = tanh(%6)

The pass repeats its rewrites until nothing changes, so running it twice changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph, Program
from rnnc.passes import register
from rnnc.passes._rewrite import constant_value, remove_dead

ORIGIN = "canonicalize"


def _fold_constants(g: Graph) -> bool:
    """Replace ops on constants only by a constant."""
    changed = False
    for node in g.nodes():
        if node.op in (ARG, FUSED, GET, ops.constant) or not node.inputs:
            continue
        values = [constant_value(g, i) for i in node.inputs]
        if any(v is None for v in values) or node.shape != ():
            continue
        with np.errstate(all="ignore"):
            out = node.op.ref(*(np.float64(v) for v in values), **node.attrs)
        value = float(np.asarray(out))
        if not np.isfinite(value):
            continue
        new = g.add(ops.constant, (), {"value": value}, origin=ORIGIN)
        g.replace_all_uses(node.id, new)
        changed = True
    return changed


def _identity(g: Graph, nid: int) -> int | None:
    """The node ``nid`` equals, by an algebraic identity, or None."""
    node = g.node(nid)
    if node.op not in (ops.add, ops.sub, ops.mul, ops.div, ops.neg):
        return None
    ins = node.inputs
    c = [constant_value(g, i) for i in ins]

    def same_type(other: int) -> int | None:
        # Dropping an operand must not drop a broadcast.
        return other if g.node(other).type == node.type else None

    if node.op is ops.neg:
        inner = g.node(ins[0])
        return same_type(inner.inputs[0]) if inner.op is ops.neg else None
    if node.op is ops.mul:
        if c[1] == 1.0:
            return same_type(ins[0])
        if c[0] == 1.0:
            return same_type(ins[1])
    if node.op is ops.add:
        if c[1] == 0.0:
            return same_type(ins[0])
        if c[0] == 0.0:
            return same_type(ins[1])
    if node.op is ops.sub:
        if c[1] == 0.0:
            return same_type(ins[0])
        inner = g.node(ins[1])
        if c[0] == 1.0 and inner.op is ops.sub and constant_value(g, inner.inputs[0]) == 1.0:
            return same_type(inner.inputs[1])
    if node.op is ops.div and c[1] == 1.0:
        return same_type(ins[0])
    return None


def _identities(g: Graph) -> bool:
    changed = False
    for nid in g.topo():
        if nid in g.nx:
            target = _identity(g, nid)
            if target is not None and target != nid:
                g.replace_all_uses(nid, target)
                changed = True
    return changed


def _key(node) -> tuple | None:
    if node.op in (ARG, FUSED):
        return None
    return (node.op.name, node.inputs, tuple(sorted((k, repr(v)) for k, v in
                                                    node.attrs.items())), node.type)


def _cse(g: Graph) -> bool:
    seen: dict[tuple, int] = {}
    changed = False
    for nid in g.topo():
        key = _key(g.node(nid))
        if key is None:
            continue
        if key in seen:
            g.replace_all_uses(nid, seen[key])
            changed = True
        else:
            seen[key] = nid
    return changed


def _is_bias(g: Graph, nid: int) -> bool:
    node = g.node(nid)
    return node.op is ARG and len(node.shape) == 1 and not isinstance(node.shape[0], str)


def _is_projection(g: Graph, nid: int) -> bool:
    node = g.node(nid)
    return node.op is ops.matmul and not node.attrs.get("transpose_a")


def _reassociate(g: Graph) -> bool:
    """Rebuild add trees holding matmuls and biases as sums of (matmul + bias) pairs."""
    outputs = set(g.outputs.values())

    def absorbed(nid: int) -> bool:
        users = g.users(nid)
        return (g.node(nid).op is ops.add and nid not in outputs and len(users) == 1
                and g.node(users[0]).op is ops.add
                and g.node(users[0]).inputs.count(nid) == 1)

    def shape_of(nid: int):
        if g.node(nid).op is ops.add and absorbed(nid):
            a, b = g.node(nid).inputs
            return (shape_of(a), shape_of(b))
        return nid

    def leaves(tree) -> list[int]:
        return leaves(tree[0]) + leaves(tree[1]) if isinstance(tree, tuple) else [tree]

    changed = False
    for root in g.topo():
        if root not in g.nx or g.node(root).op is not ops.add or absorbed(root):
            continue
        a, b = g.node(root).inputs
        current = (shape_of(a), shape_of(b))
        terms = leaves(current)
        mms = [t for t in terms if _is_projection(g, t)]
        biases = [t for t in terms if _is_bias(g, t)]
        if not mms or not biases:
            continue
        pairs = dict(zip(mms, biases, strict=False))  # each matmul takes the next unused bias
        used = set(pairs) | set(pairs.values())
        items = [(t, pairs[t]) if t in pairs else t for t in terms
                 if t in pairs or t not in used]
        target = items[0]
        for item in items[1:]:
            target = (target, item)
        if target == current:
            continue

        def build(tree) -> int:
            if not isinstance(tree, tuple):
                return tree
            return g.add(ops.add, (build(tree[0]), build(tree[1])), origin=ORIGIN)

        new = build(target)
        if g.node(new).type != g.node(root).type:
            continue
        g.replace_all_uses(root, new)
        changed = True
    return changed


def canonicalize_graph(g: Graph, keep_args: set[str]) -> Graph:
    """Run the rewrites on a copy of ``g`` until none applies."""
    g = g.copy()
    for _ in range(50):
        changed = _fold_constants(g)
        changed |= _identities(g)
        changed |= _cse(g)
        remove_dead(g, keep_args)
        changed |= _reassociate(g)
        remove_dead(g, keep_args)
        if not changed:
            break
    return g


def _prune_outputs(p: Program) -> Program:
    """Drop outputs nobody reads: post outputs not in results, unused stacked/summed/pre."""
    post = p.post.copy()
    post.outputs = {n: o for n, o in post.outputs.items() if n in p.results}
    post_reads = set(post.args())
    s = p.scan
    body = s.body.copy()
    needed = set(p.results) | post_reads
    stacked = tuple(n for n in s.stacked if n in needed)
    summed = tuple(n for n in s.summed if n in needed)
    carries = {c.name for c in s.carries}
    body.outputs = {n: o for n, o in body.outputs.items()
                    if n in carries or n in stacked or n in summed}
    reads = set(body.args())
    seqs = tuple(n for n in s.seqs if n in reads or n in p.args)
    consts = tuple(n for n in s.consts if n in reads or n in p.args)
    pre = p.pre.copy()
    pre_needed = set(seqs) | set(consts) | {c.init for c in s.carries} | post_reads
    pre_needed |= set(p.results)
    pre.outputs = {n: o for n, o in pre.outputs.items() if n in pre_needed}
    scan = replace(s, body=body, seqs=seqs, consts=consts, stacked=stacked, summed=summed)
    return replace(p, pre=pre, scan=scan, post=post)


@register("canonicalize")
def canonicalize(program: Program) -> Program:
    """CSE, DCE, constant folding, identities and bias reassociation in every graph."""
    keep = set(program.args)
    p = _prune_outputs(program)
    body = canonicalize_graph(p.scan.body, keep)
    p = replace(p, pre=canonicalize_graph(p.pre, keep), post=canonicalize_graph(p.post, keep),
                scan=replace(p.scan, body=body))
    p = _prune_outputs(p)
    # Pruning the scan may leave pre-loop values nobody reads.
    remove_dead(p.pre, keep)
    return p
