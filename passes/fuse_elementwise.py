"""fuse-elementwise: each convex region of elementwise, layout and feature-reduction ops becomes
one node, in the loop and in the graphs before and after it.

Fusible are the elementwise ops, the layout ops and the reductions over the feature axis
(``sum``, ``mean``, ``amax``, ``amin``: ``(..., n) -> (..., 1)``), whose results broadcast back
into the elementwise ops of the same region (layer norm's mean, centring, variance, ``rsqrt``
and scale are one region). Matmuls, ``sum_rows`` (a sum over the rows) and other non-fusible
ops are boundaries. A region holds the fusible nodes at the same level, the number of
boundaries before them, taken as late as their users allow (a slice of a loop input joins the
gate math that reads it); no path can leave a region and re-enter it, because passing a
boundary raises the level. Constants are copied into every region that reads them. A region's
operands print as ``in0, in1, ...`` and its results as ``out0, ...``; a graph reads result
``k`` of the fused node ``%N`` as ``%N[k]``.

The loop body, the pre-loop graph and the post-loop graph are fused alike: outside the loop a
region maps whole sequences (``[T,B,n]``), such as the weight-gradient products a backward
program finishes after its loop. The backends compute a region as one loop nest or kernel
(one pass per row where it reduces: ``rnnc.backends.llvm.fused``, ``rnnc.backends.cuda.rows``).

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("gated")
    x, h = c.input("x", 2), c.state("h", 2)
    W, U, V = c.param("W", (2, 2)), c.param("U", (2, 2)), c.param("V", (2, 2))
    f = rnnc.sigmoid(x @ W + h @ U)
    z = (f * h) @ V
    new = rnnc.tanh(z - rnnc.mean(z))
    c.update(h=new)
    c.output("y", new)

Before (after hoist-sequence)::

    program gated inference: after hoist-sequence (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], U: f32[2,2], V: f32[2,2]
      pre {
        %0: f32[T,B,2] = matmul(x, W)  # hoist-sequence
        yield hoist.0=%0
      }
      scan forward seqs(hoist.0) consts(U, V) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(h, U)
        %1: f32[B,2] = add(hoist.0, %0)
        %2: f32[B,2] = sigmoid(%1)
        %3: f32[B,2] = mul(%2, h)
        %4: f32[B,2] = matmul(%3, V)
        %5: f32[B,1] = mean(%4)
        %6: f32[B,2] = sub(%4, %5)
        %7: f32[B,2] = tanh(%6)
        yield h=%7, y=%7
      }
      results: y, h.final
    }

After: two regions, one on each side of the matmul by ``V``; the second holds the ``mean``
whose result, one value per row, the ``sub`` broadcasts back over the row::

    program gated inference: after fuse-elementwise (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], U: f32[2,2], V: f32[2,2]
      pre {
        %0: f32[T,B,2] = matmul(x, W)  # hoist-sequence
        yield hoist.0=%0
      }
      scan forward seqs(hoist.0) consts(U, V) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(h, U)
        %1: (f32[B,2]) = fused(hoist.0, %0, h) {  # fuse-elementwise
          %0: f32[B,2] = add(in0, in1)  # fuse-elementwise
          %1: f32[B,2] = sigmoid(%0)  # fuse-elementwise
          %2: f32[B,2] = mul(%1, in2)  # fuse-elementwise
          yield out0=%2
        }
        %2: f32[B,2] = %1[0]  # fuse-elementwise
        %3: f32[B,2] = matmul(%2, V)
        %4: (f32[B,2]) = fused(%3) {  # fuse-elementwise
          %0: f32[B,1] = mean(in0)  # fuse-elementwise
          %1: f32[B,2] = sub(in0, %0)  # fuse-elementwise
          %2: f32[B,2] = tanh(%1)  # fuse-elementwise
          yield out0=%2
        }
        %5: f32[B,2] = %4[0]  # fuse-elementwise
        yield h=%5, y=%5
      }
      results: y, h.final
    }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, Graph, Program
from rnnc.names import region_input, region_output
from rnnc.passes import register
from rnnc.passes._graphs import copy_node

ORIGIN = "fuse-elementwise"
# Reductions over the feature axis, (..., n) -> (..., 1): they join regions. ``sum_rows``, a
# sum over the rows, stays a boundary.
FEATURE_REDUCTIONS = frozenset({ops.sum_, ops.mean, ops.amax, ops.amin})


def _fusible(node) -> bool:
    return node.op in ops.ELEMENTWISE or node.op.kind is ops.OpKind.LAYOUT \
        or node.op in FEATURE_REDUCTIONS


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
                    local[i] = region.arg(region_input(len(inputs)), inner.shape, ORIGIN)
                    inputs.append(i)
            ins.append(local[i])
        local[nid] = copy_node(region, body, nid, ins, ORIGIN)
    outs = set(body.outputs.values())
    results = [n for n in members if n in outs or any(u not in inside for u in body.users(n))]
    region.outputs = {region_output(k): local[n] for k, n in enumerate(results)}
    fused = body.add_fused(region, inputs, ORIGIN)
    for k, n in enumerate(results):
        body.replace_all_uses(n, body.get(fused, k, ORIGIN))
    for n in reversed(members):
        body.remove(n)


def fuse_graph(graph: Graph) -> Graph:
    """``graph`` with each of its regions one ``fused`` node (``graph`` itself if it has none)."""
    regions = _regions(graph)
    if not regions:
        return graph
    graph = graph.copy()
    for members in regions:
        _fuse(graph, members)
    for n in sorted(graph.dead_code(keep_args=True)):
        graph.remove(n)
    return graph


@register("fuse-elementwise")
def fuse_elementwise(program: Program) -> Program:
    """Fuse the elementwise work of the loop body and of the graphs before and after it into
    as few regions as convexity allows."""
    pre, body, post = (fuse_graph(g) for g in program.graphs())
    if all(new is old for new, old in zip((pre, body, post), program.graphs(), strict=True)):
        return program
    return replace(program, pre=pre, scan=replace(program.scan, body=body), post=post)
