"""hoist-sequence: move work that needs no carried value out of the loop, before or after it.

(a) A value that needs no carried value moves into ``pre`` (with what it reads) when it is a
matmul or feeds one that moves, or when it depends on parameters only: a per-step product
becomes a sequence computed once over all steps (a hoisted ``matmul(x, W)`` is one
``(T*B, I) x (I, N)`` GEMM, which the loop reads one step at a time as ``hoist.N``), a
parameter-only value a loop constant. Other per-step elementwise work, layout ops only the loop
reads and sums over the batch rows stay: in the loop the first two fuse with the step's other
elementwise work instead of writing whole sequences and reading them back.
(b) Work that no carry's next value needs, and whose results only reach stacked or summed
outputs, moves into ``post`` over the stacked sequences (the loop stacks what it reads as
``sink.N``); a summed row contraction ``matmul[transpose_a](a_t, g_t)`` becomes one
``matmul[transpose_a](A, G)`` over all steps, and a head-wise weight's gradient
``einsum[spec=...he,...hd->hde](g_t, a_t)`` one einsum over ``(T, B)`` rows.
(c) A pure function of the per-step inputs that holds a reduction over the features (``mean``,
``sum``, ``amax``, ``amin``) moves into ``pre`` when the loop then reads no more sequence data
per step: such a reduction is work every step repeats for nothing. Precisely: the nodes that
need no carried value and that neither (a) nor (b) moves form connected groups; each group
moves its longest prefix (in body order) that holds a reduction and after which the loop reads
no more elements per step and batch row from sequences (inputs and hoisted values, each counted
once by its width; a value only stacked costs nothing: it becomes the stacked sequence); groups
that can move nothing alone are then tried together; trailing layout ops of a prefix that only
the loop reads stay when that reads no more; and the rounds repeat on what is left until one
moves nothing (``passes/_hoist_reductions.py``). So ``layer_norm(x @ W, g, b)`` moves whole:
the loop reads it instead of ``x @ W``, of the same width, and does no reduction for it. In a
training forward the values autodiff saves from such a group become sequences computed before
the loop.
(d) A summed output ``f(sum_lead(v))`` or ``f(sum_rows(v))``, ``f`` linear with loop constants
(a parameter's gradient through parameter-only values), is summed per row: the loop accumulates
``v`` and ``post`` runs the row sum and ``f`` once (``passes/_row_sums.py``).

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("proj")
    x, h = c.input("x", 2), c.state("h", 2)
    W, U, V = c.param("W", (2, 2)), c.param("U", (2, 2)), c.param("V", (2, 2))
    a = x @ W
    new = rnnc.tanh(a - rnnc.mean(a) + h @ U)
    c.update(h=new)
    c.output("y", new @ V)

Before (after fuse-gate-matmuls)::

    program proj inference: after fuse-gate-matmuls (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], U: f32[2,2], V: f32[2,2]
      scan forward seqs(x) consts(W, U, V) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(x, W)
        %1: f32[B,1] = mean(%0)
        %2: f32[B,2] = sub(%0, %1)
        %3: f32[B,2] = matmul(h, U)
        %4: f32[B,2] = add(%2, %3)
        %5: f32[B,2] = tanh(%4)
        %6: f32[B,2] = matmul(%5, V)
        yield h=%5, y=%6
      }
      results: y, h.final
    }

After: ``x @ W`` runs before the loop for all steps (a), and so does its centring (c): the loop
reads ``hoist.0``, as wide as ``x @ W``; ``y = new @ V`` runs after the loop over the stacked
``new`` (b); one matmul per step is left::

    program proj inference: after hoist-sequence (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], U: f32[2,2], V: f32[2,2]
      pre {
        %0: f32[T,B,2] = matmul(x, W)  # hoist-sequence
        %1: f32[T,B,1] = mean(%0)  # hoist-sequence
        %2: f32[T,B,2] = sub(%0, %1)  # hoist-sequence
        yield hoist.0=%2
      }
      scan forward seqs(hoist.0) consts(U, V) carries(h=h->h.final) stacked(sink.0) {
        %0: f32[B,2] = matmul(h, U)
        %1: f32[B,2] = add(hoist.0, %0)
        %2: f32[B,2] = tanh(%1)
        yield h=%2, sink.0=%2
      }
      post {
        %0: f32[T,B,2] = matmul(sink.0, V)  # hoist-sequence
        yield y=%0
      }
      results: y, h.final
    }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph, Program, Scan
from rnnc.names import fresh, hoisted, sunk
from rnnc.passes import register
from rnnc.passes._graphs import copy_node, downstream, env_names, is_row_contraction, per_step
from rnnc.passes._hoist_reductions import reduction_groups
from rnnc.passes._row_sums import accumulate_rows
from rnnc.passes._sink_costs import carried_sums, remade_layouts

ORIGIN = "hoist-sequence"


def _reads_unbatched_steps(body: Graph, s: Scan) -> set[int]:
    """Body nodes that read, directly or not, a sequence whose steps have no batch rows (a
    second-order program reads per-step sums over the rows, saved as ``[T, n]``).

    They stay in the loop: their shape has no leading ``B``, yet they change every step, and
    before or after the loop their ``[T, n]`` values would not broadcast against ``[T, B, n]``
    ones."""
    args = body.args()
    return downstream(body, {args[n] for n in s.seqs
                             if n in args and not per_step(body.node(args[n]).shape)})


def _loop_invariant(body: Graph, s: Scan) -> list[int]:
    """Body nodes that read no carried value and no unbatched sequence, in topological order,
    each reading only inputs, constants and nodes before it in the list (a row contraction
    stays in the loop)."""
    args = body.args()
    carried = {args[c.name] for c in s.carries if c.name in args}
    variant = body.depends_on(carried) | _reads_unbatched_steps(body, s)
    # What reads an input or a loop constant (no ancestors walk per node: chains may be long).
    reached = downstream(body, {args[n] for n in s.seqs + s.consts if n in args})
    movable: list[int] = []
    moving: set[int] = set()
    for node in body.nodes():
        # A random op (bernoulli) draws from the step's counter: it stays in the loop.
        if node.id in variant or node.op in (ARG, FUSED, GET, ops.constant) or node.op.random:
            continue
        if is_row_contraction(body, node.id) or node.id not in reached:
            continue
        # Everything it reads must move too (a row contraction it reads stays in the loop).
        if all(i in moving or body.node(i).op in (ARG, ops.constant) for i in node.inputs):
            movable.append(node.id)
            moving.add(node.id)
    return movable


# The products hoisting turns into one GEMM over all steps: matmul, and einsum (a head-wise
# product of an input is one batched GEMM over T*B rows, rnnc/ops_tensor.py).
_PRODUCTS = (ops.matmul, ops.einsum)


def _worth_hoisting(body: Graph, movable: list[int]) -> list[int]:
    """The loop-invariant nodes ``movable`` that cost less before the loop than in it."""
    # Per-step elementwise work is hoisted only when a hoisted GEMM needs it. Elsewhere it
    # costs less in the loop, fused with the step's other elementwise work: hoisted, a bias
    # add after the input projection (`x@W + b`) or backward's `y*(1-y)` on saved values would
    # write whole (T, B, n) sequences and read them back.
    candidates = set(movable)
    feeds_gemm: set[int] = set()
    for nid in reversed(movable):
        if body.node(nid).op in _PRODUCTS or any(u in feeds_gemm for u in body.users(nid)
                                                 if u in candidates):
            feeds_gemm.add(nid)
    moved: set[int] = set()
    for nid in movable:
        node = body.node(nid)
        if not per_step(node.shape) or nid in feeds_gemm:
            if all(i in moved or body.node(i).op in (ARG, ops.constant) for i in node.inputs):
                moved.add(nid)
    movable = [n for n in movable if n in moved]
    # A layout op (slice, concat, ...) feeding only the loop stays there: fused with its users
    # it costs nothing, hoisted it would copy a whole sequence.
    for nid in reversed(movable):
        if body.node(nid).op.kind is ops.OpKind.LAYOUT and nid not in body.outputs.values() \
                and all(u not in moved for u in body.users(nid)):
            moved.discard(nid)
    return [n for n in movable if n in moved]


def _copy_into_pre(p: Program, body: Graph, pre: Graph, movable: list[int]) -> dict[int, int]:
    """Copy the body nodes ``movable`` (in body order; each reads only inputs, constants and
    nodes before it in the list) into ``pre``, with the inputs and constants they read, without
    recursion (a hoisted chain may be long); return body node -> pre node."""
    env = p.env_types("pre")
    mapping: dict[int, int] = {}

    def leaf(nid: int) -> int:
        if nid in mapping:
            return mapping[nid]
        node = body.node(nid)
        if node.op is ops.constant:
            mapping[nid] = pre.add(ops.constant, (), dict(node.attrs), origin=ORIGIN)
            return mapping[nid]
        assert node.op is ARG, node  # movable is closed under the nodes it reads
        name = node.attrs["name"]
        have = pre.input_node(name)
        if have is None and name in p.pre.outputs:
            mapping[nid] = p.pre.outputs[name]
            return mapping[nid]
        mapping[nid] = have if have is not None else pre.arg(name, env[name].shape, ORIGIN)
        return mapping[nid]

    for nid in movable:
        mapping[nid] = copy_node(pre, body, nid, [leaf(i) for i in body.node(nid).inputs],
                                 ORIGIN)
    return mapping


def _hoist(p: Program) -> Program:
    """Parts (a) and (c): loop-invariant body nodes move into ``pre``."""
    s = p.scan
    body = s.body.copy()
    invariant = _loop_invariant(body, s)
    base = _worth_hoisting(body, invariant)
    leaving, _ = _sinkable(body, s)
    moving = set(base) | set(reduction_groups(body, s, invariant, base, leaving))
    movable = [n for n in invariant if n in moving]
    if not movable:
        return p
    pre = p.pre.copy()
    mapping = _copy_into_pre(p, body, pre, movable)
    moved = set(movable)
    hoisted_names = fresh(env_names(p), hoisted)
    seqs, consts, stacked = list(s.seqs), list(s.consts), list(s.stacked)
    outputs = dict(body.outputs)
    for nid in movable:
        users_left = [u for u in body.users(nid) if u not in moved]
        out_names = [n for n, o in outputs.items() if o == nid]
        if not users_left and not out_names:
            continue
        is_seq = per_step(body.node(nid).shape)
        # A stacked output that is loop-invariant is the hoisted sequence itself.
        direct = [n for n in out_names if is_seq and n in stacked]
        for n in direct:
            pre.outputs[n] = mapping[nid]
            stacked.remove(n)
            del body.outputs[n]
        if not users_left and len(direct) == len(out_names):
            continue
        name = next(hoisted_names)
        pre.outputs[name] = mapping[nid]
        (seqs if is_seq else consts).append(name)
        arg = body.arg(name, body.node(nid).shape, ORIGIN)
        body.replace_all_uses(nid, arg)
    for n in sorted(body.dead_code(keep_args=False)):
        body.remove(n)
    reads = body.args()
    scan = replace(s, body=body, seqs=tuple(n for n in seqs if n in reads),
                   consts=tuple(n for n in consts if n in reads), stacked=tuple(stacked))
    return replace(p, pre=pre, scan=scan)


def _sinkable(body: Graph, s) -> tuple[set[int], dict[int, str]]:
    """Nodes to compute in ``post``, and each one's mode: "map" (per step) or "rows" (summed)."""
    carry_outs = {body.outputs[c.name] for c in s.carries}
    # What reads an unbatched sequence stays in the loop, as what a carry needs does.
    needed = set(carry_outs) | _reads_unbatched_steps(body, s) | carried_sums(body, s)
    for o in carry_outs:
        needed |= body.ancestors(o)
    mode: dict[int, str] = {}
    for node in body.nodes():
        if node.id in needed or node.op in (ARG, FUSED, GET) or node.op.random:
            continue
        if is_row_contraction(body, node.id):
            mode[node.id] = "rows"
        elif node.op is ops.add and all(mode.get(i) == "rows" for i in node.inputs):
            mode[node.id] = "rows"
        else:
            mode[node.id] = "map"
    sink = set(mode)
    stacked, summed = set(s.stacked), set(s.summed)
    changed = True
    while changed:
        changed = False
        for nid in sorted(sink):
            node = body.node(nid)
            bad = any(u not in sink for u in body.users(nid))
            for name, o in body.outputs.items():
                if o != nid:
                    continue
                if name in stacked:
                    bad |= mode[nid] != "map" or not per_step(node.shape)
                elif name in summed:
                    bad |= mode[nid] != "rows"
                else:
                    bad = True
            if mode[nid] == "map":
                for i in node.inputs:
                    bad |= mode.get(i) == "rows" and i in sink
                    inner = body.node(i)
                    # Values kept in the loop reach post stacked, so they must be per-step.
                    bad |= i not in sink and inner.op not in (ARG, ops.constant) \
                        and not per_step(inner.shape)
            else:
                for i in node.inputs:
                    if i in sink and mode[i] != "rows":
                        continue
                    inner = body.node(i)
                    bad |= i not in sink and inner.op not in (ARG, ops.constant) \
                        and not per_step(inner.shape)
            if bad:
                sink.discard(nid)
                changed = True
    # Constants alone are not worth moving.
    return {n for n in sink if body.node(n).op is not ops.constant}, mode


class _ToPost:
    """Copies of body values in ``post``: what moves, computed there; what stays in the loop (or
    a carry's value at the step), stacked by the loop and read in ``post``."""

    def __init__(self, p: Program, body: Graph, sink: set[int], post: Graph,
                 stacked: list[str]) -> None:
        self.body, self.sink, self.post, self.stacked = body, sink, post, stacked
        self.remade = remade_layouts(body, p.scan)  # made again in post, never stacked
        self.sunk_names = fresh(env_names(p), sunk)
        self.env = p.env_types("pre")
        self.carries = {c.name for c in p.scan.carries}
        self.stacked_name = {o: n for n, o in body.outputs.items() if n in stacked}
        self.mapping: dict[int, int] = {}

    def _arg(self, name: str, shape: tuple) -> int:
        have = self.post.input_node(name)
        return have if have is not None else self.post.arg(name, shape, ORIGIN)

    def _leaf(self, nid: int) -> int:
        node = self.body.node(nid)
        if node.op is ops.constant:
            return self.post.add(ops.constant, (), dict(node.attrs), origin=ORIGIN)
        if node.op is ARG and node.attrs["name"] not in self.carries:
            return self._arg(node.attrs["name"], self.env[node.attrs["name"]].shape)
        if nid not in self.stacked_name:
            self.stacked_name[nid] = next(self.sunk_names)
            self.stacked.append(self.stacked_name[nid])
            self.body.outputs[self.stacked_name[nid]] = nid
        return self._arg(self.stacked_name[nid], ("T",) + node.shape)

    def value(self, root: int) -> int:
        """The post node of body node ``root``: depth first without recursion (a chain may be
        long), each node made after its operands, left to right."""
        mapping, stack = self.mapping, [root]
        while stack:
            nid = stack[-1]
            if nid in mapping:
                stack.pop()
                continue
            inputs = self.body.node(nid).inputs
            # A layout op the loop keeps is made again here, unless the loop stacks it anyway.
            made = nid in self.sink or nid in self.remade and nid not in self.stacked_name
            pending = [i for i in inputs if i not in mapping] if made else []
            if pending:
                stack.append(pending[0])
                continue
            stack.pop()
            mapping[nid] = copy_node(self.post, self.body, nid, [mapping[i] for i in inputs],
                                     ORIGIN) if made else self._leaf(nid)
        return mapping[root]


def _sink(p: Program) -> Program:
    """Part (b): computations that only feed stacked/summed outputs move into ``post``."""
    s = p.scan
    body = s.body.copy()
    sink, _ = _sinkable(body, s)
    if not sink:
        return p
    post = p.post.copy()
    stacked, summed = list(s.stacked), list(s.summed)
    to_post = _ToPost(p, body, sink, post, stacked)
    for name, o in list(body.outputs.items()):
        if o in sink and (name in stacked or name in summed):
            new = to_post.value(o)
            old = post.input_node(name)
            if old is not None:
                post.replace_all_uses(old, new)
                post.remove(old)
            post.outputs[name] = new
            del body.outputs[name]
            (stacked if name in stacked else summed).remove(name)
    for n in sorted(body.dead_code(keep_args=True)):
        body.remove(n)
    scan = replace(s, body=body, stacked=tuple(stacked), summed=tuple(summed))
    return replace(p, post=post, scan=scan)


@register("hoist-sequence")
def hoist_sequence(program: Program) -> Program:
    """Hoist loop-invariant work into ``pre`` and sink output-only work into ``post``; summed
    row sums become sums per row, finished in ``post``."""
    return accumulate_rows(_sink(_hoist(program)))
