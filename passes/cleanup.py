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
    c.output("y", new * z)

Before (after drop-empty-loop): ``y = new * z`` was computed in ``post`` from its own copy of
``z``, and joined ``pre``, which already had one::

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
        %9: f32[T,B,2] = slice[start=0, stop=2](%0)  # hoist-sequence
        %10: f32[T,B,2] = sigmoid(%9)  # hoist-sequence
        %11: f32[T,B,2] = mul(%7, %10)  # hoist-sequence
        yield hoist.0=%0, hoist.1=%7, h.final=%8, sink.0=%7, y=%11, sink.1=%10
      }
      scan forward {
      }
      results: y, h.final
    }

After cse: one ``z``; the products hoist-sequence and parallel-scan passed to the loop are
still yielded::

    program mingru inference: after cse (f32) {
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
        %9: f32[T,B,2] = mul(%7, %3)  # hoist-sequence
        yield hoist.0=%0, hoist.1=%7, h.final=%8, sink.0=%7, y=%9, sink.1=%3
      }
      scan forward {
      }
      results: y, h.final
    }

After prune-outputs: only the results are yielded::

    program mingru inference: after prune-outputs (f32) {
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
        %9: f32[T,B,2] = mul(%7, %3)  # hoist-sequence
        yield h.final=%8, y=%9
      }
      scan forward {
      }
      results: y, h.final
    }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc.ir import Program
from rnnc.passes import register
from rnnc.passes._graphs import prune_outputs, remove_dead
from rnnc.passes.rewrite import cse_graph


@register("cse")
def cse(program: Program) -> Program:
    """Merge equal nodes and delete dead ones in every graph."""
    keep = set(program.args)
    pre, body, post = (cse_graph(g, keep) for g in (program.pre, program.scan.body,
                                                      program.post))
    if pre is program.pre and body is program.scan.body and post is program.post:
        return program
    return replace(program, pre=pre, post=post, scan=replace(program.scan, body=body))


@register("prune-outputs")
def prune_outputs_pass(program: Program) -> Program:
    """Drop the outputs no later stage reads and no result is, and what only they computed."""
    p = prune_outputs(program)
    keep = set(program.args)
    for g, old in ((p.pre, program.pre), (p.scan.body, program.scan.body),
                   (p.post, program.post)):
        if g is not old:  # a copy prune_outputs made: its own to edit
            remove_dead(g, keep)
    return p
