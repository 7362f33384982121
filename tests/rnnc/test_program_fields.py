"""What a program says about itself is typed fields, not string keys: the cell's name, the
inputs without gradient, the packed parameter layout and the save plans; an ``arg`` node holds
only its name, and every arg's role is a ``Role``. Each field is part of the fingerprint, and a
program pickles with all of them."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

import rnnc
from rnnc import passes
from rnnc.ir import ARG, Program, Type
from rnnc.layout import Block
from rnnc.names import Role
from rnnc.verify import verify


def _gated() -> rnnc.Cell:
    c = rnnc.Cell("gated")
    x, m = c.input("x", 2), c.input("m", 1, grad=False)
    h = c.state("h", 3)
    W, U = c.param("W", (2, 3)), c.param("U", (3, 3))
    c.update(h=m * rnnc.tanh(x @ W + h @ U) + (1 - m) * h)
    c.output("y", h)
    return c


def test_a_traced_program_has_typed_fields() -> None:
    traced = _gated().program()
    assert not hasattr(Program, "meta") and "meta" not in {f.name for f in
                                                           dataclasses.fields(Program)}
    assert (traced.cell, traced.no_grad, traced.layout, traced.saves) == ("gated", ("m",), (), ())
    assert all(isinstance(role, Role) and isinstance(ty, Type)
               for role, ty in traced.args.values())


def test_passes_fill_the_layout_and_the_save_plans() -> None:
    fn = rnnc.compile(rnnc.cells.gru(2, 3), backend="numpy")
    inference = fn.program("inference")
    assert inference.layout and all(isinstance(b, Block) for b in inference.layout)
    assert {m[0] for b in inference.layout for m in b.members} == set(fn.params)
    (plan,) = fn.program("forward").saves
    assert plan and all(isinstance(name, str) and isinstance(ty, Type) for name, ty in plan)
    assert fn.program("backward").saves == (plan,)
    assert fn.program("backward.backward").saves[0] == plan


def test_arg_nodes_hold_only_their_name() -> None:
    fn = rnnc.compile(rnnc.cells.lstm(2, 3), backend="numpy")
    for mode in ("inference", "forward", "backward"):
        for graph in fn.program(mode).graphs():
            for node in graph.nodes():
                if node.op is ARG:
                    assert dict(node.attrs) == {"name": node.attrs["name"]}, (mode, node)


def test_each_field_is_part_of_the_identity_and_survives_pickling() -> None:
    program = rnnc.compile(_gated(), backend="numpy").program("forward")
    block = Block("W", (2, 3), (("W", 0, 3),))
    variants = [dataclasses.replace(program, cell="other"),
                dataclasses.replace(program, no_grad=()),
                dataclasses.replace(program, layout=(block,)),
                dataclasses.replace(program, saves=program.saves + ((),))]
    prints = {program.fingerprint(), *(v.fingerprint() for v in variants)}
    assert len(prints) == 1 + len(variants)
    again = pickle.loads(pickle.dumps(program))
    assert (again.cell, again.no_grad, again.layout, again.saves) == (
        program.cell, program.no_grad, program.layout, program.saves)
    assert again.fingerprint() == program.fingerprint()
    assert passes.run(again, []).fingerprint() == program.fingerprint()


def test_the_verifier_refuses_a_role_that_is_not_a_role() -> None:
    program = _gated().program()
    args = {**program.args, "x": ("input", program.args["x"][1])}
    with pytest.raises(AssertionError, match="arg 'x': role 'input' is not a Role"):
        verify(dataclasses.replace(program, args=args))
    verify(program)
