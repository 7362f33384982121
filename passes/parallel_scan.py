"""parallel-scan: run each carry whose update is linear in itself as a scan over the whole sequence.

A carry whose next value is ``A * c + Bv`` elementwise, with ``A`` and ``Bv`` reading no carried
value (``passes/_affine.py`` finds the form: ``(1-z)*c + z*g``, ``c*f + x``, ``c + x``, ``c*a``,
mask-lengths' ``where(len.mask, new, c)``, backward's carried cotangents), needs no loop: ``pre``
computes ``A`` and ``Bv`` for every step (they are carry-free, so they lift to ``[T,B,n]``) and
one ``linear_scan`` gives the carry's value at every step. The loop body then reads that value
as a sequence, ``c_{t-1}`` from an exclusive scan and ``c_t`` from an inclusive one (only the
ones it reads; with ``c_{t-1}``, ``c_t`` is ``A * c_{t-1} + Bv`` elementwise), and the final
value is the scan's last step. A carry whose coefficients read another carry that became a scan
is found in the next round.

Where the pass changed the program, the pipeline runs its follow-ups after it
(``FOLLOW_UPS`` in ``passes/__init__.py``): hoist-sequence moves what no carry needs any longer
out of the loop, drop-empty-loop removes a loop left with nothing to do (and merges ``post``
into ``pre``), cse merges the copies made on the way, and prune-outputs drops what nobody reads.

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("mingru")
    x, h = c.input("x", 2), c.state("h", 2)
    W, U = c.param("W", (2, 2)), c.param("U", (2, 2))
    z = rnnc.sigmoid(x @ W)
    new = (1 - z) * h + z * (x @ U)
    c.update(h=new)
    c.output("y", new)

Before (after hoist-sequence): the loop carries ``h``; its update is ``A * h + Bv`` with
``A = 1 - z`` and ``Bv = z * (x @ U)``, neither reading ``h``::

    program mingru inference: after hoist-sequence (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W|U: f32[2,4]
      pre {
        %0: f32[T,B,4] = matmul(x, W|U)  # hoist-sequence
        yield hoist.0=%0
      }
      scan forward seqs(hoist.0) carries(h=h->h.final) stacked(y) {
        %0: f32[] = constant[value=1.0]()
        %1: f32[B,2] = slice[start=0, stop=2](hoist.0)  # fuse-gate-matmuls
        %2: f32[B,2] = sigmoid(%1)
        %3: f32[B,2] = sub(%0, %2)
        %4: f32[B,2] = mul(%3, h)
        %5: f32[B,2] = slice[start=2, stop=4](hoist.0)  # fuse-gate-matmuls
        %6: f32[B,2] = mul(%2, %5)
        %7: f32[B,2] = add(%4, %6)
        yield h=%7, y=%7
      }
      results: y, h.final
    }

After: ``A`` and ``Bv`` over all steps, one ``linear_scan`` for ``h`` after every step (the
loop reads it as ``hoist.1`` and stacks it as ``y``), its last step for ``h.final``; no carry is
left (drop-empty-loop then makes ``y`` the scan itself and drops the loop)::

    program mingru inference: after parallel-scan (f32) {
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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rnnc import ops
from rnnc.errors import ShapeError
from rnnc.ir import ARG, FUSED, GET, Carry, Graph, Program
from rnnc.names import fresh, hoisted
from rnnc.passes import register
from rnnc.passes._affine import Apply, Const, Expr, Leaf, leaves, linear_coefficients
from rnnc.passes._graphs import (
    copy_node,
    env_names,
    is_row_contraction,
    per_step,
    remove_dead,
)

ORIGIN = "parallel-scan"


class Lifter:
    """Copies carry-free body nodes into ``pre``, where they compute every step at once."""

    def __init__(self, program: Program, pre: Graph) -> None:
        self.program, self.body, self.pre = program, program.scan.body, pre
        self.env = program.env_types("pre")
        self.nodes: dict[int, int] = {}
        self.exprs: dict[Expr, int] = {}

    def liftable(self, expr: Expr) -> bool:
        """Whether every node ``expr`` reads computes per step (no sum over the batch rows,
        which over all steps would also sum over time)."""
        cone = set(leaves(expr))
        for nid in list(cone):
            cone |= self.body.ancestors(nid)
        return not any(self.body.node(n).op in (FUSED, GET) or is_row_contraction(self.body, n)
                       for n in cone)

    def node(self, nid: int) -> int:
        """The pre node of body node ``nid``, copying what it reads first (in order, without
        recursion: a chain of thousands of ops is as deep as it is long)."""
        if nid not in self.nodes:
            cone = (self.body.ancestors(nid) | {nid}) - set(self.nodes)
            for n in self.body.topo():
                if n in cone:
                    self.nodes[n] = self._copy(n)
        return self.nodes[nid]

    def _copy(self, nid: int) -> int:
        node = self.body.node(nid)
        if node.op is ops.constant:
            return self.expr(Const(float(node.attrs["value"])))
        if node.op is ARG:
            return self.value_of(node.attrs["name"])
        inputs = [self.nodes[i] for i in node.inputs]
        return copy_node(self.pre, self.body, nid, inputs, ORIGIN)

    def value_of(self, name: str) -> int:
        """The pre node holding the environment's ``name``: an output of pre, or an arg."""
        if name in self.pre.outputs:
            return self.pre.outputs[name]
        have = self.pre.input_node(name)
        if have is not None:
            return have
        return self.pre.arg(name, self.env[name].shape, ORIGIN)

    def expr(self, e: Expr) -> int:
        if e not in self.exprs:
            if isinstance(e, Const):
                self.exprs[e] = self.pre.add(ops.constant, (), {"value": e.value}, ORIGIN)
            elif isinstance(e, Leaf):
                self.exprs[e] = self.node(e.node)
            else:
                assert isinstance(e, Apply)
                self.exprs[e] = self.pre.add(e.op, [self.expr(a) for a in e.args], origin=ORIGIN)
        return self.exprs[e]


@dataclass(frozen=True)
class Linear:
    """A carry found linear: its coefficients' pre nodes and its initial value's."""

    carry: Carry
    a: int
    b: int
    init: int


def _find(p: Program, lifter: Lifter) -> list[Linear]:
    """The carries of ``p`` whose next value is linear in them, with ``A`` and ``Bv`` in pre."""
    s, body = p.scan, p.scan.body
    args = body.args()
    carried = {args[c.name] for c in s.carries if c.name in args}
    env = p.env_types("pre")
    found = []
    for c in s.carries:
        shape = env[c.init].shape
        coefficients = linear_coefficients(body, args.get(c.name), carried, body.outputs[c.name])
        if coefficients is None or not per_step(shape) \
                or not all(lifter.liftable(e) for e in coefficients):
            continue
        a, b = (lifter.expr(e) for e in coefficients)
        init = lifter.value_of(c.init)
        try:
            ops.linear_scan.shape(*(lifter.pre.node(n).shape for n in (a, b, init)))
        except ShapeError:  # neither reads a sequence: the step count is unknown before the loop
            continue
        found.append(Linear(c, a, b, init))
    return found


def _substitute(body: Graph, found: list[Linear]) -> dict[str, tuple[int | None, int | None]]:
    """Read each linear carry from sequences instead: its value before the step and after it;
    return each one's (before, after) args, None where the body no longer reads it."""
    temporary: dict[str, tuple[int, int]] = {}
    for lin in found:
        name = lin.carry.name
        nxt = body.outputs.pop(name)
        carry = body.input_node(name)
        shape = body.node(nxt).shape
        before = body.arg(f"{name}@before", shape, ORIGIN)
        after = body.arg(f"{name}@after", shape, ORIGIN)
        if nxt != carry:
            body.replace_all_uses(nxt, after)
        if carry is not None:
            body.replace_all_uses(carry, before)
            body.remove(carry)
        temporary[name] = (before, after)
    remove_dead(body)
    return {name: tuple(n if n in body.nx else None for n in pair)
            for name, pair in temporary.items()}


def _at_last(pre: Graph, nid: int, reverse: bool) -> int:
    if pre.node(nid).shape[:1] == ("T",):
        return pre.add(ops.last_step, (nid,), {"reverse": reverse}, ORIGIN)
    return nid


def _scans(pre: Graph, lin: Linear, reverse: bool, before: bool, after: bool
           ) -> tuple[int | None, int | None, int]:
    """The pre nodes of the carry's values before and after each step (where asked for) and
    of its final value."""
    attrs = {"reverse": reverse, "exclusive": True}
    prev = pre.add(ops.linear_scan, (lin.a, lin.b, lin.init), attrs, ORIGIN) if before else None
    if prev is None:
        attrs["exclusive"] = False
        new = pre.add(ops.linear_scan, (lin.a, lin.b, lin.init), attrs, ORIGIN)
        return None, new, pre.add(ops.last_step, (new,), {"reverse": reverse}, ORIGIN)
    if after:
        new = pre.add(ops.add, (pre.add(ops.mul, (lin.a, prev), origin=ORIGIN), lin.b),
                      origin=ORIGIN)
        return prev, new, pre.add(ops.last_step, (new,), {"reverse": reverse}, ORIGIN)
    last = pre.add(ops.mul, (_at_last(pre, lin.a, reverse), _at_last(pre, prev, reverse)),
                   origin=ORIGIN)
    return prev, None, pre.add(ops.add, (last, _at_last(pre, lin.b, reverse)), origin=ORIGIN)


def _round(p: Program) -> Program | None:
    """One round: every carry linear in itself becomes a scan; None if there is none."""
    s = p.scan
    pre = p.pre.copy()
    found = _find(p, Lifter(p, pre))
    if not found:
        return None
    body = s.body.copy()
    reads = _substitute(body, found)
    hoisted_names = fresh(env_names(p), hoisted)
    seqs = list(s.seqs)
    for lin in found:
        before, after = reads[lin.carry.name]
        prev, new, final = _scans(pre, lin, s.reverse, before is not None, after is not None)
        for arg, value in ((before, prev), (after, new)):
            if arg is None:
                continue
            name = next(hoisted_names)
            pre.outputs[name] = value
            named = body.arg(name, body.node(arg).shape, ORIGIN)
            body.replace_all_uses(arg, named)
            body.remove(arg)
            seqs.append(name)
        if lin.carry.final is not None:
            pre.outputs[lin.carry.final] = final
    remove_dead(pre)
    read = body.args()
    linear = {lin.carry.name for lin in found}
    scan = replace(s, body=body, seqs=tuple(n for n in seqs if n in read),
                   consts=tuple(n for n in s.consts if n in read),
                   carries=tuple(c for c in s.carries if c.name not in linear))
    return replace(p, pre=pre, scan=scan)


@register("parallel-scan")
def parallel_scan(program: Program) -> Program:
    """Replace every carry that is linear in itself by a ``linear_scan`` before the loop."""
    p = program
    while (after := _round(p)) is not None:
        p = after
    return p
