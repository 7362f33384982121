"""Save plans: the training forward stacks exactly what the backward reads.

Every autodiff pass records its save plan (``Program.saves``, one plan per autodiff
level); the program that stacks the saved values and the program that reads them carry the
same plans, and ``check_save_plans`` (which ``Function`` runs before building a backward)
rejects a pair that disagrees.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import rnnc
from rnnc import passes
from rnnc.ir import Type
from rnnc.names import Role, is_saved
from rnnc.passes.autodiff import check_save_plans

CELLS = sorted(rnnc.cells.NAMED)
READERS = ("backward", "forward.backward", "backward.backward", "backward.forward")


def _function(name: str, reverse: bool = False) -> rnnc.Function:
    return rnnc.compile(rnnc.cells.NAMED[name](2, 3), reverse=reverse, backend="numpy")


def test_save_writers() -> None:
    assert passes.save_writers("forward") == []
    assert passes.save_writers("backward") == [("forward", 1)]
    assert passes.save_writers("forward.backward") == [("forward.forward", 2)]
    assert passes.save_writers("backward.backward") == [("forward", 1), ("backward.forward", 2)]
    assert passes.save_writers("backward.forward") == [("forward", 1)]


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("masked", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("name", CELLS)
def test_plans_agree_for_the_builtin_cells(name: str, masked: bool, reverse: bool) -> None:
    fn = _function(name, reverse)
    forward = fn.program("forward", lengths=masked)
    (plan,) = forward.saves
    assert plan, "a recurrent cell saves something for its backward"
    assert [n for n, _ in plan] == [n for n in forward.results if is_saved(n)]
    for n, ty in plan:
        assert ty == Type("f32", ("T", "B", ty.shape[-1])), n
    for reader in READERS:
        program = fn.program(reader, lengths=masked)
        for writer, level in passes.save_writers(reader):
            check_save_plans(fn.program(writer, lengths=masked), writer, program, reader, level)
    backward = fn.program("backward", lengths=masked)
    assert backward.saves == (plan,)
    assert {n: backward.args[n] for n, _ in plan} == {n: (Role.SAVED, t) for n, t in plan}


def test_second_order_plans_number_after_the_first() -> None:
    fn = _function("lstm")
    first, second = fn.program("backward.backward").saves
    assert fn.program("backward.forward").saves == (first, second)
    assert first == fn.program("forward").saves[0]
    assert {n for n, _ in first}.isdisjoint(n for n, _ in second)
    top = max(int(n.split(".")[1]) for n, _ in first)
    assert min(int(n.split(".")[1]) for n, _ in second) == top + 1


@pytest.mark.parametrize("masked", [False, True], ids=["full", "lengths"])
def test_oracle_plans_agree(masked: bool) -> None:
    oracle = rnnc.compile(rnnc.cells.gru(2, 3), optimize=False)
    for reader in READERS:
        program = oracle.program(reader, lengths=masked)
        for writer, level in passes.save_writers(reader):
            check_save_plans(oracle.program(writer, lengths=masked), writer, program, reader,
                             level)


def _with_plans(program, plans):
    return replace(program, saves=plans)


def test_a_plan_mismatch_is_detected() -> None:
    fn = _function("gru")
    forward, backward = fn.program("forward"), fn.program("backward")
    (plan,) = backward.saves
    check_save_plans(forward, "forward", backward, "backward", 1)
    with pytest.raises(RuntimeError, match="internal error.*save plans differ"):
        check_save_plans(forward, "forward", _with_plans(backward, (plan[:-1],)),
                         "backward", 1)
    with pytest.raises(RuntimeError, match="save plans differ"):
        check_save_plans(_with_plans(forward, ()), "forward", backward, "backward", 1)
    # Plans that agree but promise a type the forward does not stack.
    name, ty = plan[0]
    wrong = ((name, Type(ty.dtype, ty.shape[:-1] + (ty.shape[-1] + 1,))),) + plan[1:]
    with pytest.raises(RuntimeError, match=f"does not return {name}"):
        check_save_plans(_with_plans(forward, (wrong,)), "forward",
                         _with_plans(backward, (wrong,)), "backward", 1)
    # A backward that takes a saved value under another role.
    args = {**backward.args, name: (Role.COTANGENT, ty)}
    with pytest.raises(RuntimeError, match=f"does not read {name}"):
        check_save_plans(forward, "forward", replace(backward, args=args), "backward", 1)


def test_function_refuses_a_backward_whose_plan_disagrees() -> None:
    fn = _function("rnn")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 2)).astype(np.float32)
    params = fn.cell.init_params()
    _, _, tape = fn.forward(x, params)
    key = ("backward", "f32", False)
    backward = fn.program(*key)
    fn._programs[key] = _with_plans(backward, (backward.saves[0][1:],))
    with pytest.raises(RuntimeError, match="'backward' must read what 'forward' saves"):
        fn.backward(tape)
