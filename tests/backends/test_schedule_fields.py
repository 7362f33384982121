"""Each schedule field that was a module constant takes effect when a schedule changes it.

A non-default value of each field changes the generated code (LLVM IR, CUDA source) or the
path a runner takes, and the results still match the unoptimized program on the NumPy backend
(float64, to rounding); the code cache key covers every field a build compiles in.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rnnc
from rnnc.backends.schedule import CudaSchedule, LlvmSchedule


def _inputs(cell: rnnc.Cell, T: int, B: int, seed: int = 0):
    x = np.random.default_rng(seed).standard_normal((T, B, 3))  # every cell here takes 3
    return x, cell.init_params(seed=seed + 1, dtype=np.float64)


def _matches_oracle(cell: rnnc.Cell, fn: rnnc.Function, T: int, B: int) -> None:
    x, params = _inputs(cell, T, B)
    want, want_finals = rnnc.compile(cell, optimize=False)(x, params)
    got, finals = fn(x, params)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12)
    for name in want_finals:
        np.testing.assert_allclose(finals[name], want_finals[name], rtol=1e-10, atol=1e-12)


# field, value, batch rows that reach the code it changes, whether a team build reads it.
LLVM_FIELDS = [
    ("gemm_small_rows", 0, 2, False),  # two rows go to the panel kernel, not the axpy form
    ("gemm_row_block", 4, 7, False),  # tiles of 4 rows and a leftover of 3
    ("gemm_k_chunk", 8, 5, False),  # K = 32 in chunks of 8
    ("kernel_nodes", 4, 5, False),  # the step's region cut into loops of 4 nodes
    ("inline_call_sites", 0, 5, False),  # every shared kernel stays a call
    ("scan_workspace_bytes", 1024, 5, True),  # a smaller workspace for scans over steps
]


@pytest.mark.parametrize("name, value, batch, team", LLVM_FIELDS,
                         ids=[row[0] for row in LLVM_FIELDS])
def test_an_llvm_field_changes_the_code_and_keeps_the_results(name, value, batch, team) -> None:
    pytest.importorskip("llvmlite")
    from rnnc.backends.llvm import codegen

    cell = rnnc.cells.min_gru(3, 32) if team else rnnc.cells.lstm(3, 32)
    # A team build runs at every size (its other thresholds at 0), the one-thread build alone.
    default = LlvmSchedule(team_min_work=0, scan_team_min_work=0, scan_chunk_min_work=0,
                           scan_chunk_min_steps=1) if team else LlvmSchedule()
    schedule = dataclasses.replace(default, **{name: value})
    # The build that reads the field keys it; the other build does not see it.
    assert schedule.for_build(team).key() != default.for_build(team).key()
    fn = rnnc.compile(cell, backend="llvm", threads=2 if team else 1, team=team,
                      parallel_scan=team, cache_dir=False, schedule=schedule)
    program = fn.program("inference")
    changed, _ = codegen.lower(program, "cblas", schedule, team)
    same, _ = codegen.lower(program, "cblas", default, team)
    assert changed != same
    _matches_oracle(cell, fn, 4, batch)


def test_the_scan_workspace_bounds_the_split_over_steps() -> None:
    """A team of two splits a narrow scan over its steps while its chunks fit the workspace:
    at 16 KiB, 4 vectors of 512 float32 per thread; at 1 KiB, not."""
    pytest.importorskip("llvmlite")
    from rnnc.backends.llvm import split

    for workspace, form in ((LlvmSchedule().scan_workspace_bytes, "steps"), (16 << 10, "steps"),
                            (1024, None)):
        assert split.scan_form(512, 4, 4096, 2, (4096, 64, workspace)) == form


def test_the_blas_search_bounds_choose_one_or_all_threads_unmeasured() -> None:
    """Below blas_one_thread_max_work multiply-adds a GEMM site takes a library at one thread,
    from blas_all_threads_min_work at all of them, without timing either; the results match."""
    pytest.importorskip("llvmlite")
    cell = rnnc.cells.lstm(3, 4)  # no panel kernel (4 gates x 4 units): GEMMs on the BLAS
    for bounds, suffix in (((1 << 40, 1 << 41), "@1"), ((0, 0), "@2")):
        schedule = LlvmSchedule(blas_one_thread_max_work=bounds[0],
                                blas_all_threads_min_work=bounds[1], panel_max_work=0)
        fn = rnnc.compile(cell, backend="llvm", blas="openblas", threads=2, team=False,
                          cache_dir=False, schedule=schedule)
        _matches_oracle(cell, fn, 4, 5)
        (runner,) = fn._runners.values()
        choice = runner.gemm_choice(4, 5)
        assert choice and all(name.endswith(suffix) for name in choice), choice


TILE = CudaSchedule(tile_row_threads=4, tile_max_units=8, tile_depths=(4, 1))


def test_the_fused_step_tile_follows_the_schedule() -> None:
    """A fused step and a persistent kernel take the schedule's rows of threads, most units
    and stage depths: other kernel source, the oracle's results in emulation."""
    from rnnc.backends.cuda.codegen import render

    cell = rnnc.cells.lstm(3, 32)
    program = rnnc.compile(cell, backend="numpy").program("inference", "f64")
    default, tiled = render(program, "k_", "auto"), render(program, "k_", "auto", TILE)
    (pair,) = [step.tile for step in tiled.steps["body"] if hasattr(step, "tile")]
    assert (pair.row_threads, pair.units, pair.depth) == (4, 8, 4)
    assert tiled.persistent.tile.units <= 8 and tiled.persistent.tile.row_threads == 4
    assert tiled.source != default.source
    assert tiled.persistent.source != default.persistent.source
    for fused_step in ("always", "persistent"):
        fn = rnnc.compile(cell, backend="cuda", emulate=True,
                          schedule=dataclasses.replace(TILE, fused_step=fused_step))
        _matches_oracle(cell, fn, 3, 5)
