"""mask-lengths: variable-length sequences as a rewrite of the loop body.

A program arg ``len.mask`` (f[T,B,1], 1.0 while t < length else 0.0; the name has a dot, so no
user name can take it) becomes a sequence of the scan; past a sequence's end an input reads as
zero, a carry keeps its old value and a stacked output is zero. Every one is a selection
(``where``), never a product with the mask: 0 * NaN is NaN. The pass runs first, and only for
calls with lengths, so autodiff differentiates the masked step and backward is masked for free.

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("short")
    x, h = c.input("x", 2), c.state("h", 2)
    W = c.param("W", (2, 2))
    new = rnnc.tanh(x @ W + h)
    c.update(h=new)
    c.output("y", new)

As traced::

    program short inference: traced (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2]
      scan forward seqs(x) consts(W) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(x, W)
        %1: f32[B,2] = add(%0, h)
        %2: f32[B,2] = tanh(%1)
        yield h=%2, y=%2
      }
      results: y, h.final
    }

After: the step reads ``x`` as zero past the end (padding may hold NaN or Inf, and must reach
no result, gradients included), the carry ``h`` keeps its value there, and ``y`` is zero::

    program short inference: after mask-lengths (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2]
      mask: len.mask: f32[T,B,1]
      scan forward seqs(x, len.mask) consts(W) carries(h=h->h.final) stacked(y) {
        %0: f32[] = constant[value=0.0]()  # mask-lengths
        %1: f32[B,2] = where(len.mask, x, %0)  # mask-lengths
        %2: f32[B,2] = matmul(%1, W)
        %3: f32[B,2] = add(%2, h)
        %4: f32[B,2] = tanh(%3)
        %5: f32[B,2] = where(len.mask, %4, h)  # mask-lengths
        %6: f32[B,2] = where(len.mask, %4, %0)  # mask-lengths
        yield h=%5, y=%6
      }
      results: y, h.final
    }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import Graph, Program, Type
from rnnc.names import MASK, Role
from rnnc.passes import register
from rnnc.passes._graphs import arg_of

ORIGIN = "mask-lengths"


@register("mask-lengths")
def mask_lengths(program: Program) -> Program:
    """Add the ``len.mask`` sequence; hold carries and zero stacked outputs past each length."""
    if MASK in program.args:  # already masked: rerunning the pass changes nothing
        return program
    s = program.scan
    inputs = [n for n in s.seqs if program.args.get(n, (None,))[0] is Role.INPUT]
    body, zero = _inputs_selected(s.body, inputs)
    mask = body.args()[MASK]
    env = program.env_types("pre")
    # A reverse scan meets a sequence's padding (t >= length) first: holding the carry there
    # keeps it at its initial value, so each sequence starts at its own last step.
    for c in s.carries:
        old = arg_of(body, c.name, env[c.init].shape, ORIGIN)
        held = _mask_for(body, mask, len(env[c.init].shape))
        new = body.add(ops.where, (held, body.outputs[c.name], old), origin=ORIGIN)
        body.outputs[c.name] = new
    for name in s.stacked:
        body.outputs[name] = body.add(ops.where, (mask, body.outputs[name], zero),
                                      origin=ORIGIN)
    if not body.users(zero):  # no input and no stacked output: nothing reads it
        body.remove(zero)
    args = {**program.args, MASK: (Role.MASK, Type(program.dtype, ("T", "B", 1)))}
    scan = replace(s, body=body, seqs=s.seqs + (MASK,))
    return replace(program, args=args, scan=scan)


def _mask_for(body: Graph, mask: int, rank: int) -> int:
    """The (B, 1) mask as (B, 1, ..., 1) for a carry of ``rank`` axes with feature shapes."""
    if rank <= 2:
        return mask
    return body.add(ops.reshape, (mask,), {"rank": 1, "shape": (1,) * (rank - 1)},
                    origin=ORIGIN)


def _inputs_selected(old: Graph, inputs: list[str]) -> tuple[Graph, int]:
    """A copy of the step ``old`` with ``len.mask`` among its args, reading each of ``inputs``
    through ``where(len.mask, x, 0)``; returns it and its constant zero.

    Padding (an input at t >= length) may hold NaN or Inf. A selection, not a product, keeps
    it out of every result: 0 * NaN is NaN, in the step's values that the mask drops and in
    the backward's partials and weight-gradient products (x^T dG) alike. The copy numbers its
    nodes args, selections, then the step in its own order, so every later pass meets the
    step's nodes in the order it would without lengths (fuse-gate-matmuls packs a parameter
    two matmuls share into the first one's block: the masked program's parameter blocks must
    be the unmasked one's, the layout of every call)."""
    g = Graph(old.dtype)
    new: dict[int, int] = {}
    for nid in old.args().values():
        node = old.node(nid)
        new[nid] = g.arg(node.attrs["name"], node.shape, node.origin)
    mask = arg_of(g, MASK, ("B", 1), ORIGIN)
    zero = g.add(ops.constant, (), {"value": 0.0}, origin=ORIGIN)
    for name, nid in old.args().items():
        if name in inputs:
            new[nid] = g.add(ops.where, (mask, new[nid], zero), origin=ORIGIN)
    for nid in old.topo():
        node = old.node(nid)
        if nid not in new:
            new[nid] = g.add(node.op, [new[i] for i in node.inputs], dict(node.attrs),
                             origin=node.origin, loc=node.loc)
    g.outputs = {name: new[nid] for name, nid in old.outputs.items()}
    return g, zero
