"""``Program.env_types``: the type of every name in a program's environment, stage by stage.

It is checked against what the NumPy interpreter actually returns, and ``verify`` (built on it)
still names the fault of a broken program.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import rnnc
from rnnc.backends.numpy.runtime import run_program
from rnnc.fingerprint import fingerprint
from rnnc.ir import STAGES, Type
from rnnc.names import cotangent, final_state
from rnnc.verify import verify
from tests.passes.common import environment, packed

T, B = 4, 3
MODES = ("inference", "forward", "backward", "backward.backward")


def _concrete(ty: Type) -> tuple:
    return tuple({"T": T, "B": B}.get(d, d) for d in ty.shape)


@pytest.mark.parametrize("mode", MODES)
def test_env_types_match_what_the_interpreter_returns(mode: str) -> None:
    cell = rnnc.cells.lstm(2, 3)
    fn = rnnc.compile(cell, backend="numpy")
    program = fn.program(mode, "f64")
    env = program.env_types()
    assert set(program.results) <= set(env)
    # Fill every arg with random data of its type; the results come back with their types.
    rng = np.random.default_rng(0)
    given = packed(program, environment(cell, T, B))
    data = {n: given[n] if n in given else rng.standard_normal(_concrete(ty))
            for n, (_, ty) in program.args.items()}
    out = run_program(program, data, {"T": T, "B": B})
    for name in program.results:
        assert out[name].shape == _concrete(env[name]), name


def test_stages_fill_the_environment_in_order() -> None:
    program = rnnc.compile(rnnc.cells.gru(2, 3), backend="numpy").program("forward")
    envs = [program.env_types(stage) for stage in STAGES]
    assert set(envs[0]) == set(program.args)
    for before, after in zip(envs, envs[1:], strict=False):
        assert set(before) <= set(after)
    assert set(envs[1]) - set(envs[0]) == set(program.pre.outputs)
    scan = program.scan
    assert set(envs[2]) - set(envs[1]) == set(scan.stacked) | set(scan.summed) | {
        c.final for c in scan.carries}
    assert envs[2][final_state("h")] == envs[0]["h"]
    assert all(envs[2][n].shape[0] == "T" for n in scan.stacked)
    assert set(envs[3]) - set(envs[2]) <= set(program.post.outputs)
    with pytest.raises(rnnc.RnncValueError, match="stage must be one of"):
        program.env_types("loop")


def test_backward_reads_cotangents_of_what_forward_returns() -> None:
    fn = rnnc.compile(rnnc.cells.rnn(2, 3), backend="numpy")
    forward, backward = fn.program("forward").env_types(), fn.program("backward")
    for name in ("y", final_state("h")):
        assert backward.args[cotangent(name)][1] == forward[name]


def test_fingerprint_method_is_the_fingerprint() -> None:
    program = rnnc.compile(rnnc.cells.gru(2, 3), backend="numpy").program("backward")
    assert program.fingerprint() == fingerprint(program)


def test_verify_names_a_missing_stacked_output() -> None:
    program = rnnc.cells.rnn(2, 3).program()
    broken = replace(program, scan=replace(program.scan, stacked=("y", "nowhere")))
    with pytest.raises(AssertionError, match="output 'nowhere' is never computed"):
        verify(broken)
    with pytest.raises(AssertionError, match="result 'nowhere' is never computed"):
        verify(replace(program, results=program.results + ("nowhere",)))
