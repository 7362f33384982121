"""Every pass keeps the program's meaning, verifies and is idempotent, on standard and random
cells, at each point of the inference and (when autodiff is present) training pipelines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from rnnc.names import MASK, Role, is_saved
from rnnc.passes import FOLLOW_UPS, pipeline
from rnnc.passes import run as run_passes
from tests.passes.common import check_pass, environment, execute, standard_cells
from tests.strategies import random_cells

T, B = 3, 2
OURS = ("canonicalize", "fuse-gate-matmuls", "hoist-sequence", "fuse-elementwise",
        "mask-lengths", "parallel-scan", "drop-empty-loop", "cse", "prune-outputs")


def _walk(cell, mode: str, masked: bool) -> None:
    """Apply the pipeline pass by pass, checking each of ours against the program before it.

    Training pipelines are checked on both sides of autodiff: before it on the forward
    semantics, after it on the program autodiff made (the backward reads the saved values and
    cotangents, produced here by running the training forward made from the same program)."""
    env = environment(cell, T, B)
    # With every sequence at full length the mask changes nothing.
    env[MASK] = np.ones((T, B, 1))
    program = cell.program()
    skip: tuple[str, ...] = ()  # follow-ups of a pass that changed nothing: the manager skips them
    for name in pipeline(mode, masked):
        if skip:
            assert name == skip[0], (name, skip)
            skip = skip[1:]
            continue
        before = program
        if name == "mask-lengths":
            program = check_pass(program, name, env, T, B)
            env[MASK] = np.ones((T, B, 1))
            env[MASK][T - 1, 0] = 0.0
        elif name in OURS:
            program = check_pass(program, name, env, T, B)
        else:
            assert name in ("autodiff-forward", "autodiff-backward"), name
            if name == "autodiff-backward":
                env = _backward_environment(program, env)
            program = run_passes(program, [name])
        if program is before:
            skip = FOLLOW_UPS.get(name, ())


def _backward_environment(program, env: dict) -> dict:
    """``env`` plus what the backward of ``program`` reads: saved values and cotangents."""
    forward = run_passes(program, ["autodiff-forward"])
    out = execute(forward, env, T, B)
    env = {**env, **{n: v for n, v in out.items() if is_saved(n)}}
    rng = np.random.default_rng(7)
    backward = run_passes(program, ["autodiff-backward"])
    for name, (role, ty) in backward.args.items():
        if role == Role.COTANGENT:
            env[name] = rng.standard_normal(tuple({"T": T, "B": B}.get(d, d) for d in ty.shape))
    return env


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("name", sorted(standard_cells()))
@pytest.mark.parametrize("masked", [False, True])
def test_standard_cells_training(name: str, mode: str, masked: bool) -> None:
    _walk(standard_cells()[name], mode, masked)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck),
          database=None, derandomize=True)
@given(random_cells())
def test_random_cells_backward(cell) -> None:
    _walk(cell, "backward", True)


@pytest.mark.parametrize("name", sorted(standard_cells()))
@pytest.mark.parametrize("masked", [False, True])
def test_standard_cells_inference(name: str, masked: bool) -> None:
    _walk(standard_cells()[name], "inference", masked)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck),
          database=None, derandomize=True)
@given(random_cells())
def test_random_cells_inference(cell) -> None:
    _walk(cell, "inference", False)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck),
          database=None, derandomize=True)
@given(random_cells())
def test_random_cells_masked(cell) -> None:
    _walk(cell, "inference", True)
