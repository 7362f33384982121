"""fuse-elementwise: each convex region of elementwise and layout ops in the loop becomes one node.

Matmuls and reductions are boundaries. A region holds the fusible nodes that lie after the same
number of boundaries on their longest path from the loop's inputs; no path can leave such a
region and re-enter it, because passing a boundary raises that number. Constants are copied
into every region that reads them::

    before                                  after
    %0 = matmul(h, U)                       %0 = matmul(h, U)
    %1 = add(hoist.0, %0)                   %1 = fused(hoist.0, %0) {
    %2 = tanh(%1)                             %0 = add($0, $1)
    yield h=%2, y=%2                          %1 = tanh(%0)
                                              yield out0=%1
                                            }
                                            %2 = %1[0]
                                            yield h=%2, y=%2
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, Graph, Program
from rnnc.passes import register
from rnnc.passes._rewrite import copy_node

ORIGIN = "fuse-elementwise"


def _fusible(node) -> bool:
    return node.op in ops.ELEMENTWISE or node.op.kind is ops.OpKind.LAYOUT


def _regions(body: Graph) -> list[list[int]]:
    """Fusible nodes grouped by the number of boundaries before them, in topological order.

    The number is taken as late as the users allow (a slice of a loop input joins the region of
    the gate math that reads it); every edge still satisfies level(user) >= level(node) + 1
    after a boundary and >= level(node) otherwise, which is what makes each level convex.
    """
    order = body.nodes()

    def boundary(node) -> bool:
        return not _fusible(node) and node.op not in (ARG, ops.constant)

    earliest: dict[int, int] = {}
    for node in order:
        earliest[node.id] = max((earliest[i] + boundary(body.node(i)) for i in node.inputs),
                                default=0)
    level: dict[int, int] = {}
    for node in reversed(order):
        users = body.users(node.id)
        if not users:
            level[node.id] = earliest[node.id]
        else:
            level[node.id] = min(level[u] for u in users) - boundary(node)
    regions: dict[int, list[int]] = {}
    for node in order:
        if _fusible(node):
            regions.setdefault(level[node.id], []).append(node.id)
    return [regions[d] for d in sorted(regions)]


def _fuse(body: Graph, members: list[int]) -> None:
    inside = set(members)
    region = Graph(body.dtype)
    local: dict[int, int] = {}
    inputs: list[int] = []
    for nid in members:
        node = body.node(nid)
        ins = []
        for i in node.inputs:
            if i not in local:
                inner = body.node(i)
                if inner.op is ops.constant:
                    local[i] = region.add(ops.constant, (), dict(inner.attrs), origin=ORIGIN)
                else:
                    local[i] = region.arg(f"in{len(inputs)}", inner.shape, "fused", ORIGIN)
                    inputs.append(i)
            ins.append(local[i])
        local[nid] = copy_node(region, body, nid, ins, ORIGIN)
    outs = set(body.outputs.values())
    results = [n for n in members if n in outs or any(u not in inside for u in body.users(n))]
    region.outputs = {f"out{k}": local[n] for k, n in enumerate(results)}
    fused = body.add_fused(region, inputs, ORIGIN)
    for k, n in enumerate(results):
        body.replace_all_uses(n, body.get(fused, k, ORIGIN))
    for n in reversed(members):
        body.remove(n)


@register("fuse-elementwise")
def fuse_elementwise(program: Program) -> Program:
    """Fuse the loop body's elementwise work into as few regions as convexity allows."""
    body = program.scan.body.copy()
    regions = _regions(body)
    if not regions:
        return program
    for members in regions:
        _fuse(body, members)
    for n in sorted(body.dead_code(keep_args=True)):
        body.remove(n)
    return replace(program, scan=replace(program.scan, body=body))
