"""hoist-sequence's rule (d): a summed output that sums over the batch rows every step sums
per row instead, and the sum over the rows runs once after the loop.

A parameter's gradient in a backward loop is often ``f(sum_lead(v))`` or ``f(sum_rows(v))``
summed over the steps: ``v`` the per-step contribution of each batch row, ``f`` a linear map
whose other operands are loop constants (the VJPs of the parameter-only values between the
parameter and its use: ``-exp(A_log)`` gives ``neg`` and ``mul`` by ``exp(A_log)``). Rule (b)
cannot move such a chain after the loop (a map after a row sum needs the whole sum), and a
carry's cotangent usually needs ``v``'s operands, so the loop ran the row sum and ``f`` at every
step. Since both are linear, the sum over the steps commutes with them::

    sum_t f(rowsum(v_t)) = f(rowsum(sum_t v_t))

so the loop accumulates ``v`` itself (a summed output of ``v``'s per-step shape, ``sink.N``:
one add per element, fused with the step's other elementwise work), and ``post`` runs the row
sum and ``f`` once. The chain moves only where nothing else reads it: each of its nodes is read
by the next one alone, the last one only by the summed output.
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, Graph, Program
from rnnc.names import fresh, sunk
from rnnc.passes._graphs import copy_node, downstream, env_names, per_step

ORIGIN = "hoist-sequence"

# Sums over the batch rows (and possibly features) of a per-step value.
ROW_SUMS = (ops.sum_lead, ops.sum_rows)
# Ops linear in one operand, given the others: ``f`` in ``f(rowsum(v))``. A product is linear
# in either operand, a quotient in its numerator (operand 0) only, the rest have one operand.
_LINEAR_IN = {ops.neg: (0,), ops.mul: (0, 1), ops.div: (0,), ops.reshape: (0,),
              ops.sum_: (0,), ops.sum_axis: (0,), ops.sum_lead: (0,), ops.slice_: (0,),
              ops.pad: (0,), ops.expand: (0,)}


def _chain(body: Graph, out: int, varying: set[int]) -> list[int] | None:
    """The nodes ``[rowsum, f..., out]`` of a summed output ``out`` that is a linear map of a
    row sum of a per-step value, each read only by the next; None where ``out`` is not one."""
    chain = [out]
    nid = out
    while True:
        node = body.node(nid)
        if node.op in ROW_SUMS and per_step(body.node(node.inputs[0]).shape):
            return chain[::-1]
        positions = _LINEAR_IN.get(node.op, ())
        moving = [k for k, i in enumerate(node.inputs) if i in varying]
        if len(moving) != 1 or moving[0] not in positions:
            return None
        nid = node.inputs[moving[0]]
        if body.users(nid) != [chain[-1]] or nid in body.outputs.values():
            return None
        chain.append(nid)


def _constant_leaf(post: Graph, body: Graph, nid: int, env: dict, mapping: dict[int, int]
                   ) -> int:
    """The post node of a loop-invariant body value (an input that is a loop constant, a
    constant, or what is computed from them), copied without recursion."""
    stack = [nid]
    while stack:
        top = stack[-1]
        if top in mapping:
            stack.pop()
            continue
        node = body.node(top)
        if node.op is ARG:
            name = node.attrs["name"]
            have = post.input_node(name)
            mapping[top] = have if have is not None else post.arg(name, env[name].shape, ORIGIN)
            stack.pop()
            continue
        pending = [i for i in node.inputs if i not in mapping]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        mapping[top] = copy_node(post, body, top, [mapping[i] for i in node.inputs], ORIGIN)
    return mapping[nid]


def accumulate_rows(p: Program) -> Program:
    """Rule (d): each summed output ``f(rowsum(v))`` becomes a per-row sum of ``v``, finished in
    ``post``; ``p`` itself where there is none."""
    s = p.scan
    body = s.body
    args = body.args()
    varying = downstream(body, {args[n] for n in s.seqs + tuple(c.name for c in s.carries)
                                if n in args})
    varying |= {n.id for n in body.nodes() if n.op.random}
    varying = downstream(body, varying)
    found: dict[str, list[int]] = {}
    for name in s.summed:
        out = body.outputs[name]
        if [n for n, o in body.outputs.items() if o == out] != [name] or body.users(out):
            continue
        chain = _chain(body, out, varying)
        if chain is not None:
            found[name] = chain
    if not found:
        return p
    body, post = body.copy(), p.post.copy()
    env = p.env_types("pre")
    names = fresh(env_names(p), sunk)
    summed = list(s.summed)
    constants: dict[int, int] = {}
    for name, chain in found.items():
        v = body.node(chain[0]).inputs[0]
        acc = next(names)
        body.outputs[acc] = v
        del body.outputs[name]
        summed[summed.index(name)] = acc
        value = post.arg(acc, body.node(v).shape, ORIGIN)
        for nid in chain:
            node = body.node(nid)
            inputs = [value if i in varying or i == v else
                      _constant_leaf(post, body, i, env, constants) for i in node.inputs]
            value = copy_node(post, body, nid, inputs, ORIGIN)
        old = post.input_node(name)
        if old is not None:
            post.replace_all_uses(old, value)
            post.remove(old)
        post.outputs[name] = value
    for n in sorted(body.dead_code(keep_args=True)):
        body.remove(n)
    return replace(p, post=post, scan=replace(s, body=body, summed=tuple(summed)))
