"""fuse-gate-matmuls: matmuls of one value by several parameters become one matmul and slices.

The member parameters are replaced by one packed parameter block (named by joining the member
names with "|"), laid out row-major ``(K, sum N)`` so each member is a column slice of the flat
buffer; ``program.meta["layout"]`` records every block. A bias add on every member folds into
one add of a packed bias block::

    before                                  after
    %0 = matmul(x, W_i)                     %0 = matmul(x, W_i|W_f)
    %1 = add(%0, b_i)                       %1 = add(%0, b_i|b_f)
    %2 = matmul(x, W_f)                     %2 = slice[start=0, stop=4](%1)
    %3 = add(%2, b_f)                       %3 = slice[start=4, stop=8](%1)
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, Graph, Program, Type
from rnnc.layout import Block
from rnnc.passes import register

ORIGIN = "fuse-gate-matmuls"


def _params(p: Program) -> dict[str, tuple]:
    return {n: t.shape for n, (r, t) in p.args.items() if r == "param"}


def _current_layout(p: Program) -> dict[str, Block]:
    if "layout" in p.meta:
        return {b.name: b for b in p.meta["layout"]}
    return {n: Block(n, tuple(s), ((n, 0, s[-1]),)) for n, s in _params(p).items()}


def _groups(p: Program) -> list[tuple[int, list[int]]]:
    """(left operand, member matmuls) for each left operand with >= 2 fusable matmuls."""
    body = p.scan.body
    params = _params(p)
    by_left: dict[int, list[int]] = {}
    for node in body.nodes():
        if node.op is not ops.matmul or node.attrs.get("transpose_a") or \
                node.attrs.get("transpose_b"):
            continue
        right = body.node(node.inputs[1])
        if right.op is ARG and right.attrs["name"] in params \
                and right.attrs["name"] in p.scan.consts and len(right.shape) == 2:
            by_left.setdefault(node.inputs[0], []).append(node.id)
    return [(left, mms) for left, mms in by_left.items()]


def _bias_of(body: Graph, mm: int, params: dict[str, tuple]) -> tuple[int, str] | None:
    """(add node, bias name) when the matmul's only use is ``add(mm, b)`` with b a vector param."""
    users = body.users(mm)
    if len(users) != 1 or mm in body.outputs.values():
        return None
    add = body.node(users[0])
    if add.op is not ops.add or add.inputs.count(mm) != 1:
        return None
    other = body.node(add.inputs[1] if add.inputs[0] == mm else add.inputs[0])
    if other.op is not ARG or other.attrs["name"] not in params or len(other.shape) != 1 \
            or add.type != body.node(mm).type:
        return None
    return add.id, other.attrs["name"]


def _read_members(g: Graph, offsets: dict[str, tuple[str, int, int]],
                  new_args: dict[str, tuple], params: dict[str, tuple]) -> None:
    """Make ``g`` read each member parameter as a slice of its block."""
    for name, (block, start, stop) in offsets.items():
        args = g.args()
        if name not in args:
            continue
        if block in args:
            barg = args[block]
        else:
            members = new_args[block]
            shape = params[members[0]][:-1] + (sum(params[m][-1] for m in members),)
            barg = g.arg(block, shape, "const", ORIGIN)
        piece = g.add(ops.slice_, (barg,), {"start": start, "stop": stop}, origin=ORIGIN)
        g.replace_all_uses(args[name], piece)
        g.remove(args[name])


@register("fuse-gate-matmuls")
def fuse_gate_matmuls(program: Program) -> Program:
    """Pack the parameters of matmuls sharing a left operand into one block."""
    params = _params(program)
    body = program.scan.body.copy()
    blocks = _current_layout(program)
    merged: set[str] = set()  # parameters already in a block
    plans = []
    for left, mms in _groups(program):
        names: list[str] = []
        members = []
        for mm in mms:
            name = body.node(body.node(mm).inputs[1]).attrs["name"]
            if name in merged or name in names:
                continue
            names.append(name)
            members.append(mm)
        rows = {params[n][0] for n in names}
        if len(names) < 2 or len(rows) != 1:
            continue
        biases = [_bias_of(body, mm, params) for mm in members]
        bias_names = [b[1] for b in biases if b is not None]
        if None in biases or len(set(bias_names)) != len(bias_names) \
                or any(b in merged or b in names for b in bias_names) \
                or any(params[b][0] != params[n][1]
                       for b, n in zip(bias_names, names, strict=True)):
            biases = []
        merged.update(names + [b[1] for b in biases])
        plans.append((left, members, names, biases))
    if not plans:
        return program

    new_args: dict[str, tuple] = {}
    for left, members, names, biases in plans:
        wname = "|".join(names)
        new_args[wname] = tuple(names)
        warg = body.arg(wname, (params[names[0]][0], sum(params[n][1] for n in names)),
                        "const", ORIGIN)
        out = body.add(ops.matmul, (left, warg), origin=ORIGIN)
        if biases:
            bnames = [b[1] for b in biases]
            bname = "|".join(bnames)
            new_args[bname] = tuple(bnames)
            barg = body.arg(bname, (sum(params[b][0] for b in bnames),), "const", ORIGIN)
            out = body.add(ops.add, (out, barg), origin=ORIGIN)
        start = 0
        for k, (mm, name) in enumerate(zip(members, names, strict=True)):
            stop = start + params[name][1]
            piece = body.add(ops.slice_, (out,), {"start": start, "stop": stop}, origin=ORIGIN)
            body.replace_all_uses(biases[k][0] if biases else mm, piece)
            start = stop

    # Any other use of a member parameter reads its columns of the block.
    offsets: dict[str, tuple[str, int, int]] = {}
    for block, member_names in new_args.items():
        start = 0
        for n in member_names:
            offsets[n] = (block, start, start + params[n][-1])
            start += params[n][-1]
    pre, post = program.pre.copy(), program.post.copy()
    for g in (body, pre, post):
        _read_members(g, offsets, new_args, params)
    for n in sorted(body.dead_code(keep_args=True)):
        body.remove(n)

    dtype = program.dtype
    prog_args: dict[str, tuple] = {}
    consts: list[str] = []
    layout: list[Block] = []
    for name, (role, ty) in program.args.items():
        target = offsets[name][0] if name in offsets else name
        if target in prog_args:
            continue
        if target in new_args:
            shape = body.node(body.args()[target]).shape
            prog_args[target] = ("param", Type(dtype, shape))
        else:
            prog_args[target] = (role, ty)
    for name in program.scan.consts:
        target = offsets[name][0] if name in offsets else name
        if target not in consts:
            consts.append(target)
    for name in prog_args:
        if prog_args[name][0] != "param":
            continue
        if name in new_args:
            cols, col = [], 0
            for member in new_args[name]:
                for user, a, b in blocks[member].members:
                    cols.append((user, col + a, col + b))
                col += params[member][-1]
            layout.append(Block(name, tuple(prog_args[name][1].shape), tuple(cols)))
        else:
            layout.append(blocks[name])
    scan = replace(program.scan, body=body, consts=tuple(consts))
    return replace(program, args=prog_args, scan=scan, pre=pre, post=post,
                   meta={**program.meta, "layout": tuple(layout)})
