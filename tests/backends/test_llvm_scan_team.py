"""The LLVM thread team's split of ``linear_scan`` by columns (docs/threads.md, docs/passes.md).

Cells whose carries are linear, compiled with ``parallel_scan=True``, lose their time loop:
their recurrences are ``linear_scan`` nodes outside it, which a team build runs on every
thread, each its own block of the flattened (rows x features) columns. Checked on teams of 1, 2
and 3 threads, inference, training forward and every gradient, forward and reverse, with and
without lengths: against the unoptimized program on the NumPy backend (float64, 1e-10) and
bitwise against each other. Hand-built scans (no GEMM around them) check every broadcast of
``A`` and ``Bv`` against a float64 loop, and bitwise across team sizes; the runner's decision
to engage the team is checked by counting team calls.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc.backends.llvm import runtime, split  # noqa: E402
from rnnc.backends.schedule import LlvmSchedule  # noqa: E402
from tests.backends import scan_cells  # noqa: E402
from tests.backends.test_linear_scan_backends import (  # noqa: E402
    ATTRS,
    SHAPES,
    environment,
    loop,
    program,
)

T, B, I, H = 6, 3, 3, 20  # B * H = 60 columns: 8 vectors of f64, ragged over 3 threads
LENGTHS = np.array([6, 2, 1])
CELLS = ("min_gru", "min_lstm", "sru", "diag_linear")
THREADS = (1, 2, 3)
_compiled: dict[tuple, rnnc.Function] = {}


# Every scan on the team, split by columns whatever their width.
ON_THE_TEAM = LlvmSchedule(scan_team_min_work=0, scan_thread_min_bytes=0)


def function(name: str, reverse: bool, threads: int | None,
             compiled: dict[tuple, rnnc.Function] = _compiled,
             schedule: LlvmSchedule = ON_THE_TEAM) -> rnnc.Function:
    """The cell compiled as the oracle (threads None) or by LLVM with parallel-scan and
    ``schedule``, once per ``compiled`` (a module whose schedule differs keeps its own)."""
    key = (name, reverse, threads)
    if key not in compiled:
        cell = rnnc.cells.PUBLISHED[name](I, H)
        compiled[key] = rnnc.compile(cell, optimize=False, reverse=reverse) \
            if threads is None else rnnc.compile(cell, backend="llvm", parallel_scan=True,
                                                 reverse=reverse, threads=threads, team=True,
                                                 cache_dir=False, schedule=schedule)
    return compiled[key]


def everything(fn: rnnc.Function, name: str, lengths) -> dict[str, np.ndarray]:
    """Inference, the training forward's outputs and every gradient, by name."""
    return scan_cells.everything(fn, rnnc.cells.PUBLISHED[name](I, H), T, B, lengths)


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("name", CELLS)
def test_cells_on_teams_match_the_oracle_and_each_other(name, reverse, lengths,
                                                        team_calls) -> None:
    want = everything(function(name, reverse, None), name, lengths)
    first = None
    for threads in THREADS:
        got = everything(function(name, reverse, threads), name, lengths)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name} {key}, {threads} threads")
        if first is None:
            first = got
        for key in want:
            np.testing.assert_array_equal(got[key], first[key],
                                          err_msg=f"{name} {key}, {threads} threads")
    # Inference, training forward and backward each ran on both teams.
    assert team_calls.count(2) == 3 and team_calls.count(3) == 3


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("row", sorted(SHAPES))
def test_hand_built_scans_split_by_columns(row: str, dtype, team_calls) -> None:
    """Every broadcast of ``A`` and ``Bv``, both directions, inclusive and exclusive: against
    the float64 loop, and bitwise across teams (one column each to a thread: B = 3, N = 5 is
    two f32 vectors, one f64 vector, so some threads get none)."""
    env = environment(row, dtype)
    first = None
    for threads in THREADS:
        runner = rnnc.backends.get("llvm", threads=threads, team=True, cache_dir=False,
                                   schedule=ON_THE_TEAM).build(
            program(row, "f64" if dtype == np.float64 else "f32"), "inference")
        got = runner(env, {"T": 6, "B": 3})
        first = got if first is None else first
        tol = 1e-12 if dtype == np.float64 else 2e-5
        for k, attrs in enumerate(ATTRS):
            a, b = (np.asarray(env.get(n, s), np.float64) for n, s in zip(("A", "Bv"),
                                                                          SHAPES[row], strict=True))
            want = loop(a, b, np.asarray(env["h"], np.float64), **attrs)
            np.testing.assert_allclose(got[f"C{k}"], want, rtol=tol, atol=tol,
                                       err_msg=f"{attrs}, {threads} threads")
        for key in got:
            np.testing.assert_array_equal(got[key], first[key], err_msg=f"{key}, {threads}")
    assert team_calls == [2, 3]


def test_team_engages_for_a_loop_free_program_above_the_thresholds(team_calls) -> None:
    fn = function("min_gru", False, 2)
    assert fn.op_counts("inference")["loop"] == {}
    inference = fn.program("inference")
    assert split.team_work(inference) == 0 and split.scan_work(inference) == (H, H)
    x = np.zeros((T, B, I))
    params = rnnc.cells.min_gru(I, H).init_params(seed=0, dtype=np.float64)
    # T * B * H = 360 multiply-adds of scans, B * H * 8 = 480 bytes of a step, 240 a thread:
    # on the team at both thresholds, not above either.
    for work, per_thread, team in ((T * B * H, 240, True), (T * B * H + 1, 240, False),
                                   (T * B * H, 241, False)):
        at = LlvmSchedule(scan_team_min_work=work, scan_thread_min_bytes=per_thread)
        team_calls.clear()
        function("min_gru", False, 2, {}, at)(x, params)
        assert team_calls == ([2] if team else [])


def test_programs_without_scans_decide_as_before() -> None:
    """An LSTM keeps its loop: no scan work, and the decision is ``B * team_work`` against
    the schedule's team_min_work whatever ``T`` and the scan thresholds."""
    lstm = rnnc.compile(rnnc.cells.lstm(4, 32), backend="llvm", threads=2, team=True,
                        cache_dir=False).program("inference")
    assert split.scan_work(lstm) == (0, 0)
    runner = runtime.LlvmBackend(threads=2, team=True, cache_dir=False,
                                 schedule=LlvmSchedule(scan_team_min_work=0)
                                 ).build(lstm, "inference")
    assert runner.schedule.team_min_work == 1 << 22  # the default
    work = runner.team_work
    assert work > 0
    for rows in (1, 7, 300):
        for steps in (1, 10**6):
            expected = 2 if rows * work >= runner.schedule.team_min_work else 1
            assert runner.team_size(rows, steps) == expected
