"""The einsum rule of fuse-gate-matmuls: einsums of one value by several parameters become one.

A member is an einsum of two operands, a shared value and a loop-constant parameter, whose
spec stacks cleanly along the parameter's last axis: that axis (``e`` of
``"...hd,hde->...he"``) is read by no other operand and is the output's last axis too. Members
with the same shared value, the same spec, the parameter at the same place and parameter shapes
equal but for the last axis pack into one parameter block ``(..., sum e)``; the product by it
is one einsum (one batched GEMM), and each member's result is a slice of its last axis. A
member's parameter is then a slice of the block's last axis, the layout
:class:`rnnc.layout.Block` already describes for matmul blocks. Biases fold as for matmuls
when every member's only use is an add of a parameter of its own whose last axis is ``e``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rnnc import ops
from rnnc.ir import ARG, Graph, Program
from rnnc.names import packed
from rnnc.ops_tensor import parse


@dataclass(frozen=True)
class EinsumGroup:
    """Einsums to pack: the shared operand, the spec, where the parameter sits in it, the
    member einsums and their parameters, and each member's (bias add, bias name) when all
    fold (else empty)."""

    shared: int
    spec: str
    place: int
    members: tuple[int, ...]
    names: tuple[str, ...]
    biases: tuple[tuple[int, str], ...]


def _stackable(spec: str, place: int) -> bool:
    """Whether the parameter at ``place`` in ``spec`` stacks along its last axis: a batched
    shared operand, a batched output whose last axis is the parameter's last, read by no other
    operand."""
    inputs, (out_batched, out_letters) = parse(spec)
    if len(inputs) != 2:
        return False
    (param_batched, letters), (shared_batched, shared_letters) = inputs[place], inputs[1 - place]
    return (not param_batched and shared_batched and out_batched and bool(letters)
            and bool(out_letters) and letters[-1] == out_letters[-1]
            and letters[-1] not in shared_letters)


def _candidates(program: Program, params: dict[str, tuple]
                ) -> dict[tuple[int, str, int], list[int]]:
    """Stackable einsums by (shared operand, spec, parameter place), in body order."""
    body = program.scan.body
    by_key: dict[tuple[int, str, int], list[int]] = {}
    for node in body.nodes():
        if node.op is not ops.einsum or len(node.inputs) != 2:
            continue
        for place in (0, 1):
            operand = body.node(node.inputs[place])
            name = operand.attrs.get("name") if operand.op is ARG else None
            if name in params and name in program.scan.consts \
                    and _stackable(node.attrs["spec"], place):
                key = (node.inputs[1 - place], node.attrs["spec"], place)
                by_key.setdefault(key, []).append(node.id)
                break
    return by_key


def added_parameter(body: Graph, member: int, params: dict[str, tuple]
                    ) -> tuple[int, str] | None:
    """(add node, parameter name) when ``member``'s only use is ``add(member, b)``, ``b`` a
    parameter, and the add leaves the member's type as it is (a bias either gate rule folds)."""
    users = body.users(member)
    if len(users) != 1 or member in body.outputs.values():
        return None
    add = body.node(users[0])
    if add.op is not ops.add or add.inputs.count(member) != 1 \
            or add.type != body.node(member).type:
        return None
    other = body.node(add.inputs[1] if add.inputs[0] == member else add.inputs[0])
    name = other.attrs.get("name") if other.op is ARG else None
    return (add.id, name) if name in params else None


def _bias_of(body: Graph, member: int, width: int, params: dict[str, tuple]
             ) -> tuple[int, str] | None:
    """The member's bias when it folds: a parameter whose last axis has the member's
    ``width``."""
    found = added_parameter(body, member, params)
    if found is None or not params[found[1]] or params[found[1]][-1] != width:
        return None
    return found


def _biases(body: Graph, members: list[int], names: list[str], params: dict[str, tuple],
            taken: set[str]) -> tuple[tuple[int, str], ...]:
    """Every member's bias when all fold into one block, else none."""
    found = [_bias_of(body, m, params[n][-1], params)
             for m, n in zip(members, names, strict=True)]
    if None in found:
        return ()
    bias_names = [b[1] for b in found if b is not None]
    if len(set(bias_names)) != len(bias_names) or any(b in taken or b in names
                                                      for b in bias_names) \
            or len({params[b][:-1] for b in bias_names}) != 1:
        return ()
    return tuple(b for b in found if b is not None)


def plan(program: Program, body: Graph, params: dict[str, tuple], merged: set[str]
         ) -> list[EinsumGroup]:
    """The groups of einsums to pack; each parameter joins one block at most (``merged``
    holds those already in one and gains this plan's)."""
    groups = []
    for (shared, spec, place), candidates in _candidates(program, params).items():
        names: list[str] = []
        members: list[int] = []
        for member in candidates:
            name = body.node(body.node(member).inputs[place]).attrs["name"]
            if name not in merged and name not in names:
                names.append(name)
                members.append(member)
        if len(names) < 2 or len({params[n][:-1] for n in names}) != 1:
            continue
        biases = _biases(body, members, names, params, merged)
        merged.update(names + [b[1] for b in biases])
        groups.append(EinsumGroup(shared, spec, place, tuple(members), tuple(names), biases))
    return groups


def pack(body: Graph, groups: list[EinsumGroup], params: dict[str, tuple], origin: str
         ) -> dict[str, tuple]:
    """Replace each group by one einsum (and bias add) of packed blocks and a slice of its
    last axis per member; return each block's members."""
    new_args: dict[str, tuple] = {}
    for group in groups:
        widths = [params[n][-1] for n in group.names]
        wname = packed(group.names)
        new_args[wname] = group.names
        block = body.arg(wname, params[group.names[0]][:-1] + (sum(widths),), origin)
        operands = (block, group.shared) if group.place == 0 else (group.shared, block)
        out = body.add(ops.einsum, operands, {"spec": group.spec}, origin=origin)
        if group.biases:
            bnames = tuple(b[1] for b in group.biases)
            new_args[packed(bnames)] = bnames
            bias = body.arg(packed(bnames), params[bnames[0]][:-1] + (sum(widths),), origin)
            out = body.add(ops.add, (out, bias), origin=origin)
        start = 0
        for k, (member, width) in enumerate(zip(group.members, widths, strict=True)):
            piece = body.add(ops.slice_, (out,), {"start": start, "stop": start + width},
                             origin=origin)
            body.replace_all_uses(group.biases[k][0] if group.biases else member, piece)
            start += width
    return new_args
