"""hoist-sequence: move work that needs no carried value out of the loop, before or after it.

(a) Every body node that does not depend on a carried value (and is not a sum over the batch
rows) moves into ``pre``: a per-step value becomes a sequence computed once over all steps (a
hoisted ``matmul(x, W)`` is one ``(T*B, I) x (I, N)`` GEMM), a parameter-only value a constant.
(b) Every body node that no carry's next value needs, and whose results only reach stacked or
summed outputs, moves into ``post`` over the stacked sequences; a summed row contraction
``matmul[transpose_a](a_t, g_t)`` becomes one ``matmul[transpose_a](A, G)`` over all steps::

    before                                      after
    scan seqs(x) consts(W, U) stacked(dx)       pre { %0 = matmul(x, W); yield hoist.0=%0 }
         summed(dU) {                           scan seqs(hoist.0) consts(U)
      %0 = matmul(x, W)                              stacked(sink.0) {
      %1 = add(%0, h) ...                         %0 = add(hoist.0, h) ...
      %5 = matmul[transpose_b](g, U)              yield ..., sink.0=g }
      %6 = matmul[transpose_a](h, g)            post { %0 = matmul[transpose_b](sink.0, U)
      yield dx=%5, dU=%6                               yield dx=%0, dU=... }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph, Program, Type
from rnnc.passes import register
from rnnc.passes._rewrite import copy_node, env_names, fresh, is_row_contraction, per_step

ORIGIN = "hoist-sequence"


def _env_types(p: Program) -> dict[str, Type]:
    env = {n: t for n, (_, t) in p.args.items()}
    env.update({n: p.pre.node(o).type for n, o in p.pre.outputs.items()})
    return env


def _hoist(p: Program) -> Program:
    """Part (a): loop-invariant body nodes move into ``pre``."""
    s = p.scan
    body = s.body.copy()
    args = body.args()
    carried = {args[c.name] for c in s.carries if c.name in args}
    variant = body.depends_on(carried)
    sources = {args[n] for n in s.seqs if n in args} | {args[n] for n in s.consts if n in args}
    movable: list[int] = []
    moving: set[int] = set()
    for node in body.nodes():
        if node.id in variant or node.op in (ARG, FUSED, GET, ops.constant):
            continue
        if is_row_contraction(body, node.id) or not (body.ancestors(node.id) & sources):
            continue
        # Everything it reads must move too (a row contraction it reads stays in the loop).
        if all(i in moving or body.node(i).op in (ARG, ops.constant) for i in node.inputs):
            movable.append(node.id)
            moving.add(node.id)
    # Per-step elementwise work is hoisted only when a hoisted GEMM needs it. Elsewhere it
    # costs less in the loop, fused with the step's other elementwise work: hoisted, a bias
    # add after the input projection (`x@W + b`) or backward's `y*(1-y)` on saved values would
    # write whole (T, B, n) sequences and read them back.
    candidates = set(movable)
    feeds_gemm: set[int] = set()
    for nid in reversed(movable):
        if body.node(nid).op is ops.matmul or any(u in feeds_gemm for u in body.users(nid)
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
    movable = [n for n in movable if n in moved]
    if not movable:
        return p
    pre = p.pre.copy()
    env = _env_types(p)
    taken = env_names(p)
    mapping: dict[int, int] = {}

    def pre_value(nid: int) -> int:
        if nid in mapping:
            return mapping[nid]
        node = body.node(nid)
        if node.op is ARG:
            name = node.attrs["name"]
            have = pre.args().get(name)
            if have is None and name in p.pre.outputs:
                mapping[nid] = p.pre.outputs[name]
                return mapping[nid]
            role = p.args[name][0] if name in p.args else "const"
            mapping[nid] = have if have is not None else pre.arg(name, env[name].shape, role,
                                                                 ORIGIN)
        elif node.op is ops.constant:
            mapping[nid] = pre.add(ops.constant, (), dict(node.attrs), origin=ORIGIN)
        else:
            mapping[nid] = copy_node(pre, body, nid, [pre_value(i) for i in node.inputs], ORIGIN)
        return mapping[nid]

    seqs, consts = list(s.seqs), list(s.consts)
    outputs = dict(body.outputs)
    stacked = list(s.stacked)
    for nid in movable:
        pre_value(nid)
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
        name = fresh(taken, "hoist")
        pre.outputs[name] = mapping[nid]
        (seqs if is_seq else consts).append(name)
        arg = body.arg(name, body.node(nid).shape, "seq" if is_seq else "const", ORIGIN)
        body.replace_all_uses(nid, arg)
    for n in sorted(body.dead_code(keep_args=False)):
        body.remove(n)
    reads = body.args()
    seqs = [n for n in seqs if n in reads]
    consts = [n for n in consts if n in reads]
    scan = replace(s, body=body, seqs=tuple(seqs), consts=tuple(consts), stacked=tuple(stacked))
    return replace(p, pre=pre, scan=scan)


def _sinkable(body: Graph, s) -> tuple[set[int], dict[int, str]]:
    """Nodes to compute in ``post``, and each one's mode: "map" (per step) or "rows" (summed)."""
    carry_outs = {body.outputs[c.name] for c in s.carries}
    needed = set(carry_outs)
    for o in carry_outs:
        needed |= body.ancestors(o)
    mode: dict[int, str] = {}
    for node in body.nodes():
        if node.id in needed or node.op in (ARG, FUSED, GET):
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


def _sink(p: Program) -> Program:
    """Part (b): computations that only feed stacked/summed outputs move into ``post``."""
    s = p.scan
    body = s.body.copy()
    sink, _ = _sinkable(body, s)
    if not sink:
        return p
    post = p.post.copy()
    taken = env_names(p)
    env = _env_types(p)
    carries = {c.name for c in s.carries}
    stacked = list(s.stacked)
    summed = list(s.summed)
    stacked_name = {o: n for n, o in body.outputs.items() if n in stacked}
    mapping: dict[int, int] = {}

    def post_arg(name: str, shape: tuple) -> int:
        have = post.args().get(name)
        return have if have is not None else post.arg(name, shape, "saved", ORIGIN)

    def post_value(nid: int) -> int:
        if nid in mapping:
            return mapping[nid]
        node = body.node(nid)
        if nid in sink:
            mapping[nid] = copy_node(post, body, nid, [post_value(i) for i in node.inputs],
                                     ORIGIN)
        elif node.op is ops.constant:
            mapping[nid] = post.add(ops.constant, (), dict(node.attrs), origin=ORIGIN)
        elif node.op is ARG and node.attrs["name"] not in carries:
            name = node.attrs["name"]
            mapping[nid] = post_arg(name, env[name].shape)
        else:
            # A value kept in the loop (or a carry's value at the step) is stacked for post.
            if nid not in stacked_name:
                stacked_name[nid] = fresh(taken, "sink")
                stacked.append(stacked_name[nid])
                body.outputs[stacked_name[nid]] = nid
            mapping[nid] = post_arg(stacked_name[nid], ("T",) + node.shape)
        return mapping[nid]

    for name, o in list(body.outputs.items()):
        if o in sink and (name in stacked or name in summed):
            new = post_value(o)
            old = post.args().get(name)
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
    """Hoist loop-invariant work into ``pre`` and sink output-only work into ``post``."""
    return _sink(_hoist(program))
