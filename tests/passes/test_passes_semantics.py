"""Every pass keeps the program's meaning, verifies and is idempotent, on standard and random
cells, at each point of the inference and (when autodiff is present) training pipelines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from rnnc.passes import PASSES, pipeline
from rnnc.passes import run as run_passes
from tests.passes.common import check_pass, environment, standard_cells
from tests.strategies import random_cells

T, B = 3, 2
OURS = ("canonicalize", "fuse-gate-matmuls", "hoist-sequence", "fuse-elementwise",
        "mask-lengths")


def _walk(cell, mode: str, masked: bool) -> None:
    """Apply the pipeline pass by pass, checking each of ours against the program before it."""
    env = environment(cell, T, B)
    # With every sequence at full length the mask changes nothing.
    env["mask"] = np.ones((T, B, 1))
    program = cell.program()
    for name in pipeline(mode, masked):
        if name == "mask-lengths":
            program = check_pass(program, name, env, T, B)
            env["mask"] = np.ones((T, B, 1))
            env["mask"][T - 1, 0] = 0.0
        elif name in OURS:
            program = check_pass(program, name, env, T, B)
        else:
            if name not in PASSES:
                return
            program = run_passes(program, [name])
            # Autodiff adds inputs (cotangents, saved values); stop at the first one.
            return


@pytest.mark.parametrize("name", sorted(standard_cells()))
@pytest.mark.parametrize("masked", [False, True])
def test_standard_cells_inference(name: str, masked: bool) -> None:
    _walk(standard_cells()[name], "inference", masked)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck),
          database=None)
@given(random_cells())
def test_random_cells_inference(cell) -> None:
    _walk(cell, "inference", False)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck),
          database=None)
@given(random_cells())
def test_random_cells_masked(cell) -> None:
    _walk(cell, "inference", True)
