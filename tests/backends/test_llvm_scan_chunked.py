"""The LLVM thread team's split of ``linear_scan`` over its steps (docs/passes.md, parallel-scan).

A scan whose columns of a step are too few to give each thread a page is split into one chunk
of steps per thread (``backends/llvm/scan_chunks.py``): the threads but the first reduce the
chunk before their own, compose their carry-in and scan their chunk. Checked with the steps
form forced (``B = 1``, ``H = 20``): minGRU, minLSTM, SRU and the diagonal linear recurrence
with ``parallel_scan=True`` on teams of 1, 2 and 3 threads, inference, training forward and
every gradient (the backward's scans run reversed and exclusive), forward and reverse, with
and without lengths, ``T`` of 1, 2 (fewer steps than threads), 7 and 40 (not multiples of the
team), against the unoptimized program on the NumPy backend in float64 to 1e-10. Hand-built
scans check every broadcast of ``A`` and ``Bv``, inclusive and exclusive, against a float64
loop. That the steps form ran is checked by its rounding: a team of two reduces the first
chunk by the scan's own operations (bitwise one thread's results), a team of three composes
carries (not bitwise, but the same on every run); the choice itself by ``split.scan_form``
and the runner's decision at the default thresholds.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc import ops  # noqa: E402
from rnnc.backends.llvm import codegen, runtime, scan_chunks, split  # noqa: E402
from rnnc.backends.schedule import LlvmSchedule  # noqa: E402
from rnnc.backends.steps import program_steps  # noqa: E402
from tests.backends import scan_cells  # noqa: E402
from tests.backends import test_llvm_scan_team as scan_team  # noqa: E402
from tests.backends.test_linear_scan_backends import (  # noqa: E402
    ATTRS,
    SHAPES,
    environment,
    loop,
    program,
)

I, H = scan_team.I, scan_team.H  # B = 1: 20 columns, 160 bytes a step in float64
CELLS = ("min_gru", "min_lstm", "sru", "diag_linear")
STEPS = (1, 2, 7, 40)
THREADS = (1, 2, 3)
_compiled: dict[tuple, rnnc.Function] = {}


# Every scan on the team, split over its steps (no thread's columns fill 1 MiB).
OVER_STEPS = LlvmSchedule(scan_team_min_work=0, scan_thread_min_bytes=1 << 20,
                          scan_chunk_min_steps=0, scan_chunk_min_work=0)


def function(name: str, reverse: bool, threads: int | None) -> rnnc.Function:
    """The cell compiled as the oracle (threads None) or by LLVM with parallel-scan."""
    return scan_team.function(name, reverse, threads, _compiled, OVER_STEPS)


def everything(fn: rnnc.Function, name: str, steps: int, lengths) -> dict[str, np.ndarray]:
    """Inference, the training forward's outputs and every gradient at B = 1, by name."""
    return scan_cells.everything(fn, rnnc.cells.PUBLISHED[name](I, H), steps, 1, lengths,
                                 seed=steps)


@pytest.mark.parametrize("lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("name", CELLS)
def test_cells_split_over_steps_match_the_oracle(name, reverse, lengths, team_calls) -> None:
    for steps in STEPS:
        length = np.array([max(1, steps - 3)]) if lengths else None
        want = everything(function(name, reverse, None), name, steps, length)
        results = {}
        for threads in THREADS:
            got = results[threads] = everything(function(name, reverse, threads), name, steps,
                                                length)
            assert sorted(got) == sorted(want)
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{name} {key}, T={steps}, {threads} threads")
        # A team of two: thread 1 reduces the first chunk by the scan's own operations.
        for key in want:
            np.testing.assert_array_equal(results[2][key], results[1][key],
                                          err_msg=f"{name} {key}, T={steps}")
    # Inference, training forward and backward each ran on both teams at every T.
    assert team_calls.count(2) == 3 * len(STEPS) and team_calls.count(3) == 3 * len(STEPS)


def test_three_threads_compose_carries_and_repeat_exactly() -> None:
    """The steps form ran: on three threads chunk 2's carry-in is ``A_2 V_1 + V_2``, which
    rounds unlike one thread's loop somewhere, and every run rounds the same."""
    one = everything(function("min_gru", False, 1), "min_gru", 40, None)
    three = everything(function("min_gru", False, 3), "min_gru", 40, None)
    again = everything(function("min_gru", False, 3), "min_gru", 40, None)
    assert any(not np.array_equal(three[key], one[key]) for key in one)
    for key in one:
        np.testing.assert_array_equal(three[key], again[key], err_msg=key)


@pytest.mark.parametrize("steps", [1, 2, 5, 17])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("row", sorted(SHAPES))
def test_hand_built_scans_split_over_steps(row: str, dtype, steps: int, team_calls) -> None:
    """Every broadcast of ``A`` and ``Bv``, both directions, inclusive and exclusive (B = 3,
    N = 5), against the float64 loop on teams of 2 and 3."""
    env = environment(row, dtype, steps)
    a, b = (np.asarray(env.get(n, s), np.float64) for n, s in zip(("A", "Bv"), SHAPES[row],
                                                                  strict=True))
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for threads in (2, 3):
        runner = rnnc.backends.get("llvm", threads=threads, team=True, cache_dir=False,
                                   schedule=OVER_STEPS).build(
            program(row, "f64" if dtype == np.float64 else "f32"), "inference")
        assert runner.scan_form(3, steps) == "steps"
        got = runner(env, {"T": steps, "B": 3})
        for k, attrs in enumerate(ATTRS):
            want = loop(a, b, np.asarray(env["h"], np.float64), **attrs, steps=steps)
            np.testing.assert_allclose(got[f"C{k}"], want, rtol=tol, atol=tol,
                                       err_msg=f"{attrs}, {threads} threads")
            np.testing.assert_allclose(got[f"last{k}"], want[0 if attrs["reverse"] else -1],
                                       rtol=tol, atol=tol, err_msg=f"{attrs}, {threads}")
    assert team_calls == [2, 3]


@pytest.mark.parametrize("mode", ["inference", "forward", "backward"])
def test_every_scan_of_a_team_build_can_take_the_steps_form(mode: str) -> None:
    program = function("min_lstm", False, 2).program(mode)
    schedule = program_steps(program)
    scans = sum(step.op is ops.linear_scan for graph in (schedule.pre, schedule.post)
                for step in graph.steps)
    assert scans > 0
    # A thread's columns of a step fill 4 KiB nowhere here; with no limit in bytes, they do.
    for schedule, chunked in ((LlvmSchedule(), scans), (LlvmSchedule(scan_thread_min_bytes=0),
                                                        0)):
        lowering = codegen.Lowering(program, "cblas", schedule, team=True)
        lowering.lower()
        assert lowering.team.chunked_scans == chunked


def test_chunk_bounds_weight_the_first_chunk() -> None:
    weight = LlvmSchedule().scan_first_chunk_weight
    assert scan_chunks.chunk_bounds(1000, 1) == [0, 1000]
    bounds = scan_chunks.chunk_bounds(1000, 3)
    assert bounds[0] == 0 and bounds[-1] == 1000 and bounds == sorted(bounds)
    assert bounds[1] == 1000 * weight // (weight + 32)
    assert scan_chunks.chunk_bounds(2, 3)[-1] == 2 and scan_chunks.chunk_bounds(0, 3) == [0] * 4
    assert scan_chunks.chunk_bounds(999, 3, 16) == [0, 333, 666, 999]  # equal chunks


def test_a_schedule_sets_the_first_chunk_s_weight(team_calls) -> None:
    """Equal chunks (a weight of 16 sixteenths) on three threads: the generated bounds are the
    schedule's, and the scan still matches the float64 loop."""
    equal = dataclasses.replace(OVER_STEPS, scan_first_chunk_weight=16)
    env = environment("sequences", np.float64, 17)
    runner = rnnc.backends.get("llvm", threads=3, team=True, cache_dir=False,
                               schedule=equal).build(program("sequences", "f64"), "inference")
    got = runner(env, {"T": 17, "B": 3})
    for k, attrs in enumerate(ATTRS):
        want = loop(env["A"], env["Bv"], env["h"], **attrs, steps=17)
        np.testing.assert_allclose(got[f"C{k}"], want, rtol=1e-12, atol=1e-12, err_msg=attrs)
    assert team_calls == [3]


def test_form_at_the_default_thresholds() -> None:
    """minGRU at B = 1, H = 512, float32 (2 KiB a step) on two threads: split over its steps,
    on the team from T = 16384 (8 Mi multiply-adds), where the split by columns never engaged
    it; at H = 2048 (a page a thread) by columns from T = 1024 (2 Mi), as before."""
    defaults = LlvmSchedule()
    assert (defaults.scan_team_min_work, defaults.scan_thread_min_bytes,
            defaults.scan_chunk_min_steps, defaults.scan_chunk_min_work) == \
        (1 << 21, 4096, 64, 1 << 23)
    limits = (defaults.scan_thread_min_bytes, defaults.scan_chunk_min_steps,
              defaults.scan_workspace_bytes)
    assert split.scan_form(512, 4, 4096, 2, limits) == "steps"
    assert split.scan_form(2048, 4, 4096, 2, limits) == "columns"
    assert split.scan_form(512, 4, 127, 2, limits) is None
    assert split.scan_form(512, 4, 128, 2, limits) == "steps"
    assert split.scan_form(1000, 4, 10**6, 8, limits) == "steps"
    assert split.scan_form(1000, 4, 10**6, 1024, limits) is None  # the workspace too small
    backend = runtime.LlvmBackend(threads=2, team=True, cache_dir=False)
    for hidden, form, first in ((512, "steps", 16384), (2048, "columns", 1024)):
        cell = rnnc.cells.min_gru(hidden, hidden)
        fn = rnnc.compile(cell, backend="llvm", parallel_scan=True, threads=2, cache_dir=False)
        runner = backend.build(fn.program("inference", "f32"), "inference")
        assert runner.scan_form(1, first) == form
        assert runner.team_size(1, first) == 2 and runner.team_size(1, first - 1) == 1
