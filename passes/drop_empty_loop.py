"""drop-empty-loop: a loop left with nothing to do goes, and ``post`` joins ``pre``.

parallel-scan's follow-up (``FOLLOW_UPS`` in ``passes/__init__.py``), after hoist-sequence. A
stacked output that only copies a sequence the loop reads is that sequence itself, made before
the loop. Once no carry and no output is left, the loop reads and computes nothing and is
dropped, and ``post``'s nodes join ``pre``, so that fuse-elementwise puts a training forward's
saved values in the same pass over the hoisted products as the scan's coefficients (the nodes
``pre`` already has are copied again: the cse pass merges them).

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("mingru")
    x, h = c.input("x", 2), c.state("h", 2)
    W, U = c.param("W", (2, 2)), c.param("U", (2, 2))
    z = rnnc.sigmoid(x @ W)
    new = (1 - z) * h + z * (x @ U)
    c.update(h=new)
    c.output("y", new)

Before (after parallel-scan and hoist-sequence): the loop only stacks the scan's values as
``y``::

    program mingru inference: after hoist-sequence (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W|U: f32[2,4]
      pre {
        %0: f32[T,B,4] = matmul(x, W|U)  # hoist-sequence
        %1: f32[] = constant[value=1.0]()  # parallel-scan
        %2: f32[T,B,2] = slice[start=0, stop=2](%0)  # parallel-scan
        %3: f32[T,B,2] = sigmoid(%2)  # parallel-scan
        %4: f32[T,B,2] = sub(%1, %3)  # parallel-scan
        %5: f32[T,B,2] = slice[start=2, stop=4](%0)  # parallel-scan
        %6: f32[T,B,2] = mul(%3, %5)  # parallel-scan
        %7: f32[T,B,2] = linear_scan[exclusive=False, reverse=False](%4, %6, h)  # parallel-scan
        %8: f32[B,2] = last_step[reverse=False](%7)  # parallel-scan
        yield hoist.0=%0, hoist.1=%7, h.final=%8
      }
      scan forward seqs(hoist.1) stacked(y) {
        yield y=hoist.1
      }
      results: y, h.final
    }

After: ``y`` is the scan itself, and the loop is empty::

    program mingru inference: after drop-empty-loop (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W|U: f32[2,4]
      pre {
        %0: f32[T,B,4] = matmul(x, W|U)  # hoist-sequence
        %1: f32[] = constant[value=1.0]()  # parallel-scan
        %2: f32[T,B,2] = slice[start=0, stop=2](%0)  # parallel-scan
        %3: f32[T,B,2] = sigmoid(%2)  # parallel-scan
        %4: f32[T,B,2] = sub(%1, %3)  # parallel-scan
        %5: f32[T,B,2] = slice[start=2, stop=4](%0)  # parallel-scan
        %6: f32[T,B,2] = mul(%3, %5)  # parallel-scan
        %7: f32[T,B,2] = linear_scan[exclusive=False, reverse=False](%4, %6, h)  # parallel-scan
        %8: f32[B,2] = last_step[reverse=False](%7)  # parallel-scan
        yield hoist.0=%0, hoist.1=%7, h.final=%8, y=%7
      }
      scan forward {
      }
      results: y, h.final
    }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc.ir import ARG, FUSED, GET, Graph, Program, Scan
from rnnc.passes import register
from rnnc.passes._graphs import arg_of, copy_node, remove_dead

ORIGIN = "drop-empty-loop"


def _stacked_sequences(p: Program) -> Program:
    """A stacked output that copies a sequence the loop reads is that sequence, made before
    the loop (its pre node, or the program's input)."""
    s = p.scan
    copies = {}  # stacked output -> the sequence it copies
    for name in s.stacked:
        node = s.body.node(s.body.outputs[name])
        if node.op is ARG and node.attrs["name"] in s.seqs:
            copies[name] = node.attrs["name"]
    if not copies:
        return p
    body, pre = s.body.copy(), p.pre.copy()
    env = p.env_types("pre")
    for name, source in copies.items():
        if source in pre.outputs:
            pre.outputs[name] = pre.outputs[source]
        else:
            have = pre.input_node(source)
            pre.outputs[name] = have if have is not None else pre.arg(
                source, env[source].shape, ORIGIN)
        del body.outputs[name]
    remove_dead(body)
    stacked = tuple(n for n in s.stacked if n not in copies)
    return replace(p, pre=pre, scan=replace(s, body=body, stacked=stacked))


def _without_empty_loop(p: Program) -> Program:
    """A loop left with no carries and no outputs reads and computes nothing."""
    s = p.scan
    if s.carries or s.stacked or s.summed:
        return p
    if not s.seqs and not s.consts and not len(s.body):
        return p
    return replace(p, scan=Scan(Graph(p.dtype), (), (), (), (), (), s.reverse))


def _post_into_pre(p: Program) -> Program:
    """With no loop left, ``post`` runs right after ``pre``: its nodes join ``pre``, where
    fuse-elementwise can put them in the same regions as the nodes that read the same
    sequences (a training forward's saved values are computed from the hoisted products in
    ``post``: one pass over them instead of two). A node ``pre`` already has is copied all the
    same: the cse pass after this one merges it."""
    s = p.scan
    if s.carries or s.stacked or s.summed or s.seqs or s.consts or len(s.body) \
            or not len(p.post):
        return p
    if any(node.op in (FUSED, GET) for node in p.post.nodes()):
        return p
    pre, env = p.pre.copy(), p.env_types("pre")
    moved: dict[int, int] = {}
    for nid in p.post.topo():
        node = p.post.node(nid)
        if node.op is ARG:
            name = node.attrs["name"]
            moved[nid] = pre.outputs[name] if name in pre.outputs else \
                arg_of(pre, name, env[name].shape, ORIGIN)
            continue
        moved[nid] = copy_node(pre, p.post, nid, [moved[i] for i in node.inputs], node.origin)
    for name, nid in p.post.outputs.items():
        pre.outputs[name] = moved[nid]
    return replace(p, pre=pre, post=Graph(p.dtype))


@register("drop-empty-loop")
def drop_empty_loop(program: Program) -> Program:
    """Read stacked copies of sequences before the loop; drop an empty loop, merging post
    into pre."""
    return _post_into_pre(_without_empty_loop(_stacked_sequences(program)))
