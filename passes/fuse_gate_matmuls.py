"""fuse-gate-matmuls: matmuls of one value by several parameters become one matmul and slices.

The member parameters are replaced by one packed parameter block (named by joining the member
names with "|"), laid out row-major ``(K, sum N)`` so each member is a column slice of the flat
buffer; ``program.layout`` records every block. When each member matmul's only use is
an add of its own bias vector, the biases fold into one add of a packed bias block, and the
slices are taken after it.

Einsums of one value by several parameters pack the same way (``passes/_gate_einsums.py``):
with one spec whose parameter's last axis is output-only and the output's last
(``"...hd,hde->...he"``), the per-gate parameters ``(H, d, e)`` become one block
``(H, d, sum e)`` and the per-gate products one einsum, sliced on its last axis: the gates of
all heads are one batched product.

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("gates")
    x, h = c.input("x", 2), c.state("h", 2)
    Wz, Wn = c.param("Wz", (2, 2)), c.param("Wn", (2, 2))
    bz, bn = c.param("bz", (2,)), c.param("bn", (2,))
    z = rnnc.sigmoid(x @ Wz + bz)
    new = z * h + rnnc.tanh(x @ Wn + bn)
    c.update(h=new)
    c.output("y", new)

Before (after canonicalize): two matmuls of ``x``, each with its bias::

    program gates inference: after canonicalize (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: Wz: f32[2,2], Wn: f32[2,2], bz: f32[2], bn: f32[2]
      scan forward seqs(x) consts(Wz, Wn, bz, bn) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(x, Wz)
        %1: f32[B,2] = add(%0, bz)
        %2: f32[B,2] = sigmoid(%1)
        %3: f32[B,2] = mul(%2, h)
        %4: f32[B,2] = matmul(x, Wn)
        %5: f32[B,2] = add(%4, bn)
        %6: f32[B,2] = tanh(%5)
        %7: f32[B,2] = add(%3, %6)
        yield h=%7, y=%7
      }
      results: y, h.final
    }

After: one matmul by ``Wz|Wn`` and one add of ``bz|bn``, then a slice per gate::

    program gates inference: after fuse-gate-matmuls (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: Wz|Wn: f32[2,4], bz|bn: f32[4]
      scan forward seqs(x) consts(Wz|Wn, bz|bn) carries(h=h->h.final) stacked(y) {
        %0: f32[B,4] = matmul(x, Wz|Wn)  # fuse-gate-matmuls
        %1: f32[B,4] = add(%0, bz|bn)  # fuse-gate-matmuls
        %2: f32[B,2] = slice[start=0, stop=2](%1)  # fuse-gate-matmuls
        %3: f32[B,2] = sigmoid(%2)
        %4: f32[B,2] = mul(%3, h)
        %5: f32[B,2] = slice[start=2, stop=4](%1)  # fuse-gate-matmuls
        %6: f32[B,2] = tanh(%5)
        %7: f32[B,2] = add(%4, %6)
        yield h=%7, y=%7
      }
      results: y, h.final
    }
"""

from __future__ import annotations

from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, Graph, Program, Type
from rnnc.layout import Block
from rnnc.names import Role, packed
from rnnc.passes import _gate_einsums as gate_einsums
from rnnc.passes import register
from rnnc.precision import matmul_attrs

ORIGIN = "fuse-gate-matmuls"


def _params(p: Program) -> dict[str, tuple]:
    return {n: t.shape for n, (r, t) in p.args.items() if r == Role.PARAM}


def _current_layout(p: Program) -> dict[str, Block]:
    if p.layout:
        return {b.name: b for b in p.layout}
    return {n: Block(n, tuple(s), ((n, 0, s[-1]),)) for n, s in _params(p).items()}


def _groups(p: Program) -> list[tuple[int, list[int]]]:
    """(left operand, member matmuls) for each left operand and precision with >= 2 fusable
    matmuls: a bfloat16 and a float32 product never share one GEMM."""
    body = p.scan.body
    params = _params(p)
    by_left: dict[tuple[int, str | None], list[int]] = {}
    for node in body.nodes():
        if node.op is not ops.matmul or node.attrs.get("transpose_a") or \
                node.attrs.get("transpose_b"):
            continue
        right = body.node(node.inputs[1])
        if right.op is ARG and right.attrs["name"] in params \
                and right.attrs["name"] in p.scan.consts and len(right.shape) == 2:
            key = (node.inputs[0], node.attrs.get("precision"))
            by_left.setdefault(key, []).append(node.id)
    return [(left, mms) for (left, _), mms in by_left.items()]


def _bias_of(body: Graph, mm: int, params: dict[str, tuple]) -> tuple[int, str] | None:
    """(add node, bias name) when the matmul's only use is ``add(mm, b)`` with b a vector param."""
    found = gate_einsums.added_parameter(body, mm, params)
    return found if found is not None and len(params[found[1]]) == 1 else None


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
            barg = g.arg(block, shape, ORIGIN)
        piece = g.add(ops.slice_, (barg,), {"start": start, "stop": stop}, origin=ORIGIN)
        g.replace_all_uses(args[name], piece)
        g.remove(args[name])


# One group of matmuls to pack: (shared left operand, member matmuls, their parameters, and
# per member (bias add, bias name) when every member's only use is a bias add, else empty).
_Group = tuple[int, list[int], list[str], list[tuple[int, str]]]


def _plan(program: Program, body: Graph, params: dict[str, tuple], merged: set[str]
          ) -> list[_Group]:
    """The groups of matmuls to pack, each parameter in one group at most (``merged`` holds
    the parameters already in a block and gains this plan's)."""
    groups = []
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
        groups.append((left, members, names, biases))
    return groups


def _pack(body: Graph, groups: list[_Group], params: dict[str, tuple]) -> dict[str, tuple]:
    """Replace each group by one matmul (and bias add) of packed blocks and a slice per
    member; return each block's members."""
    new_args: dict[str, tuple] = {}
    for left, members, names, biases in groups:
        wname = packed(names)
        new_args[wname] = tuple(names)
        warg = body.arg(wname, (params[names[0]][0], sum(params[n][1] for n in names)), ORIGIN)
        precision = body.node(members[0]).attrs.get("precision")
        out = body.add(ops.matmul, (left, warg), matmul_attrs(precision), origin=ORIGIN)
        if biases:
            bnames = [b[1] for b in biases]
            bname = packed(bnames)
            new_args[bname] = tuple(bnames)
            barg = body.arg(bname, (sum(params[b][0] for b in bnames),), ORIGIN)
            out = body.add(ops.add, (out, barg), origin=ORIGIN)
        start = 0
        for k, (mm, name) in enumerate(zip(members, names, strict=True)):
            stop = start + params[name][1]
            piece = body.add(ops.slice_, (out,), {"start": start, "stop": stop}, origin=ORIGIN)
            body.replace_all_uses(biases[k][0] if biases else mm, piece)
            start = stop
    return new_args


def _offsets(new_args: dict[str, tuple], params: dict[str, tuple]
             ) -> dict[str, tuple[str, int, int]]:
    """Member parameter -> (its block, first column, one past its last column)."""
    offsets: dict[str, tuple[str, int, int]] = {}
    for block, member_names in new_args.items():
        start = 0
        for n in member_names:
            offsets[n] = (block, start, start + params[n][-1])
            start += params[n][-1]
    return offsets


def _packed_args(program: Program, body: Graph, offsets: dict[str, tuple[str, int, int]],
                 new_args: dict[str, tuple]) -> dict[str, tuple]:
    """The program's args with each block in place of its first member, the others gone."""
    prog_args: dict[str, tuple] = {}
    for name, (role, ty) in program.args.items():
        target = offsets[name][0] if name in offsets else name
        if target in prog_args:
            continue
        if target in new_args:
            shape = body.node(body.args()[target]).shape
            prog_args[target] = (Role.PARAM, Type(program.dtype, shape))
        else:
            prog_args[target] = (role, ty)
    return prog_args


def _layout(prog_args: dict[str, tuple], new_args: dict[str, tuple], blocks: dict[str, Block],
            params: dict[str, tuple]) -> tuple[Block, ...]:
    """The parameter blocks of the packed program, each with the user parameters it holds."""
    layout: list[Block] = []
    for name, (role, ty) in prog_args.items():
        if role != Role.PARAM:
            continue
        if name in new_args:
            cols, col = [], 0
            for member in new_args[name]:
                for user, a, b in blocks[member].members:
                    cols.append((user, col + a, col + b))
                col += params[member][-1]
            layout.append(Block(name, tuple(ty.shape), tuple(cols)))
        else:
            layout.append(blocks[name])
    return tuple(layout)


@register("fuse-gate-matmuls")
def fuse_gate_matmuls(program: Program) -> Program:
    """Pack the parameters of matmuls sharing a left operand into one block."""
    params = _params(program)
    body = program.scan.body.copy()
    merged: set[str] = set()  # parameters already in a block
    groups = _plan(program, body, params, merged)
    einsum_groups = gate_einsums.plan(program, body, params, merged)
    if not groups and not einsum_groups:
        return program
    new_args = _pack(body, groups, params)
    new_args.update(gate_einsums.pack(body, einsum_groups, params, ORIGIN))
    # Any other use of a member parameter reads its columns of the block.
    offsets = _offsets(new_args, params)
    pre, post = program.pre.copy(), program.post.copy()
    for g in (body, pre, post):
        _read_members(g, offsets, new_args, params)
    for n in sorted(body.dead_code(keep_args=True)):
        body.remove(n)
    prog_args = _packed_args(program, body, offsets, new_args)
    consts: list[str] = []
    for name in program.scan.consts:
        target = offsets[name][0] if name in offsets else name
        if target not in consts:
            consts.append(target)
    layout = _layout(prog_args, new_args, _current_layout(program), params)
    scan = replace(program.scan, body=body, consts=tuple(consts))
    return replace(program, args=prog_args, scan=scan, pre=pre, post=post,
                   layout=layout)
