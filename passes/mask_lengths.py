"""mask-lengths: variable-length sequences as a rewrite of the loop body.

A program arg ``len.mask`` (f[T,B,1], 1.0 while t < length else 0.0; the name has a dot, so no
user name can take it) becomes a sequence of the scan; a carry keeps its old value and a
stacked output is zero once a sequence has ended::

    before                                  after
    scan seqs(x) carries(h) stacked(y) {    scan seqs(x, len.mask) carries(h) stacked(y) {
      %0 = tanh(...)                          %0 = tanh(...)
      yield h=%0, y=%0                        %1 = where(len.mask, %0, h)
    }                                         %2 = constant[value=0.0]()
                                              %3 = where(len.mask, %0, %2)
                                              yield h=%1, y=%3
                                            }

It runs first, so autodiff differentiates the masked step and backward is masked for free.
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import Program, Type
from rnnc.names import MASK
from rnnc.passes import register
from rnnc.passes._rewrite import arg_of

ORIGIN = "mask-lengths"


@register("mask-lengths")
def mask_lengths(program: Program) -> Program:
    """Add the ``len.mask`` sequence; hold carries and zero stacked outputs past each length."""
    if MASK in program.args:  # already masked: rerunning the pass changes nothing
        return program
    s = program.scan
    body = s.body.copy()
    mask = arg_of(body, MASK, ("B", 1), "seq", ORIGIN)
    env = {n: t for n, (_, t) in program.args.items()}
    env.update({n: program.pre.node(o).type for n, o in program.pre.outputs.items()})
    for c in s.carries:
        old = arg_of(body, c.name, env[c.init].shape, "carry", ORIGIN)
        new = body.add(ops.where, (mask, body.outputs[c.name], old), origin=ORIGIN)
        body.outputs[c.name] = new
    if s.stacked:
        zero = body.add(ops.constant, (), {"value": 0.0}, origin=ORIGIN)
        for name in s.stacked:
            body.outputs[name] = body.add(ops.where, (mask, body.outputs[name], zero),
                                          origin=ORIGIN)
    args = {**program.args, MASK: ("mask", Type(program.dtype, ("T", "B", 1)))}
    scan = replace(s, body=body, seqs=s.seqs + (MASK,))
    return replace(program, args=args, scan=scan)
