"""A program's identity: a SHA-256 over its structure, with exact constants.

Printed text is for people: the printer rounds floats to 9 significant digits, so two programs
that differ in a constant beyond that print alike. Every cache of compiled code keys programs
by :func:`fingerprint` instead, which encodes

- each graph (pre-loop, scan body, post-loop, and the region of every fused node) node by
  node in its deterministic topological order, with ops by name, operands as positions in
  that order (node ids come from a process-wide counter, so two equal programs built one
  after the other have different ids but the same fingerprint), attributes, and types;
- the scan's sequences, constants, carries, stacked and summed outputs and direction;
- the program's arguments (name, role, type, in order), results, dtype, cell name, inputs
  without gradient, parameter layout and save plans.

Floats are encoded with ``float.hex`` (every bit), arrays by dtype, shape and bytes. Every
value is normalized to plain ``None``/``bool``/``int``/``str`` or a ``(tag, payload)`` pair,
so no two different structures share an encoding, and hashed as its ``repr``, one record per
line. A value of a kind this module does not know raises ``TypeError``: guessing at an
encoding could make two different programs share compiled code.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rnnc.ir import Graph, Program, TupleType, Type
from rnnc.ops import Op

# Changed whenever the encoding changes, so old fingerprints never match new ones.
VERSION = b"rnnc-fingerprint-3\n"
_ATOMS = (type(None), bool, int, str)


def fingerprint(program: Program) -> str:
    """The hex SHA-256 of ``program``'s structure (equal programs, equal fingerprints)."""
    return _digest(_program_records(program))


def _digest(records: Iterator[tuple]) -> str:
    digest = hashlib.sha256(VERSION)
    for record in records:
        # A record is normalized (atoms and tagged pairs): its repr is exact and one line.
        digest.update(repr(record).encode("utf-8", "surrogatepass") + b"\n")
    return digest.hexdigest()


def _program_records(p: Program) -> Iterator[tuple]:
    # Argument order is the native call's buffer order, so it is part of the identity.
    yield ("program", p.dtype, tuple((_norm(name), _norm(role), _type(ty))
                                     for name, (role, ty) in p.args.items()))
    for label, g in (("pre", p.pre), ("body", p.scan.body), ("post", p.post)):
        yield (label,)
        yield from _graph_records(g)
    s = p.scan
    yield ("scan", _norm(s.seqs), _norm(s.consts), _norm(s.stacked), _norm(s.summed),
           s.reverse, tuple((_norm(c.name), _norm(c.init), _norm(c.final)) for c in s.carries))
    yield ("results", _norm(tuple(p.results)))
    yield ("fields", _norm(p.cell), _norm(p.no_grad), _norm(p.layout), _norm(p.saves))


def _graph_records(g: Graph) -> Iterator[tuple]:
    nodes = g.nodes()  # deterministic topological order
    position = {node.id: k for k, node in enumerate(nodes)}
    yield ("graph", g.dtype, len(nodes))
    for node in nodes:
        yield (node.op.name, tuple(position[i] for i in node.inputs),
               _norm(node.attrs) if node.attrs else None, _type(node.type))
    # Output order matters: a fused node's results are indexed by it.
    yield ("outputs", tuple((_norm(name), position[nid]) for name, nid in g.outputs.items()))


def _type(ty: Any) -> tuple:
    if isinstance(ty, Type):
        return ("type", ty.dtype, _norm(tuple(ty.shape)))
    if isinstance(ty, TupleType):
        return ("types", tuple(_type(item) for item in ty.items))
    raise TypeError(f"fingerprint: {ty!r} is not an IR type")


def _norm(v: Any) -> Any:
    """``v`` as atoms and ``(tag, payload)`` pairs, exactly."""
    kind = type(v)
    if kind in _ATOMS:
        return v
    if kind is float:
        return ("float", v.hex())
    if kind is tuple:
        if all(type(item) in _ATOMS for item in v):
            return ("tuple", v)
        return ("tuple", tuple(_norm(item) for item in v))
    return _norm_other(v)


def _norm_other(v: Any) -> Any:
    if isinstance(v, str) and isinstance(v, enum.Enum):
        return v.value  # a string enum (a Role) equals its value, so it encodes as it
    if isinstance(v, enum.Enum):
        return ("enum", type(v).__qualname__, _norm(v.value))
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, int | np.integer):
        return int(v)
    if isinstance(v, float | np.floating):
        return ("float", float(v).hex())  # float32 widens exactly
    if isinstance(v, str):
        return ("str", str(v))
    if isinstance(v, bytes):
        return ("bytes", bytes(v))
    if isinstance(v, Type | TupleType):
        return _type(v)
    if isinstance(v, Graph):
        return ("graph", _digest(_graph_records(v)))
    if isinstance(v, Op):
        return ("op", v.name)
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes())
    if isinstance(v, tuple | list):
        return (type(v).__name__, tuple(_norm(item) for item in v))
    if isinstance(v, Mapping):
        items = [(_norm(key), _norm(item)) for key, item in v.items()]
        return ("map", tuple(sorted(items, key=lambda pair: repr(pair[0]))))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return ("dataclass", type(v).__qualname__,
                tuple((f.name, _norm(getattr(v, f.name))) for f in dataclasses.fields(v)))
    raise TypeError(f"fingerprint: no exact encoding for a {type(v).__name__} ({v!r}); "
                    "add one to rnnc/fingerprint.py")
