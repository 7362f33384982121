"""The LLVM backend's thread team (docs/threads.md): every team size against the NumPy oracle
and bitwise against a team of one, forward and backward."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc.backends.llvm import pool, runtime, split  # noqa: E402
from rnnc.backends.schedule import LlvmSchedule  # noqa: E402
from rnnc.tools.bench.configs import ln_lstm  # noqa: E402
from tests.strategies import random_data  # noqa: E402

TOL = {np.float32: 2e-5, np.float64: 1e-10}
GRAD_TOL = {np.float32: 2e-4, np.float64: 1e-9}
CELLS = {"lstm": rnnc.cells.lstm, "gru": rnnc.cells.gru, "ln_lstm": ln_lstm,
         "mgu": rnnc.cells.mgu, "slstm": lambda i, h: rnnc.cells.slstm(i, h, heads=4)}
_compiled: dict[tuple, rnnc.Function] = {}


# Every sequence on the team, whatever its size.
ALWAYS_TEAM = LlvmSchedule(team_min_work=0)


def function(name: str, size: tuple[int, int], threads: int | None,
             schedule: LlvmSchedule = ALWAYS_TEAM) -> rnnc.Function:
    """The cell compiled by the oracle (threads None) or by LLVM at a thread count."""
    key = (name, size, threads, schedule if threads else None)
    if key not in _compiled:
        cell = CELLS[name](*size)
        _compiled[key] = rnnc.compile(cell, optimize=False) if threads is None else \
            rnnc.compile(cell, backend="llvm", threads=threads, team=True, cache_dir=False,
                         schedule=schedule)
    return _compiled[key]


def run(f: rnnc.Function, name: str, size: tuple, T: int, B: int, dtype: type,
        lengths: bool) -> list[np.ndarray]:
    """Forward and backward of one seeded sequence, as a flat list of arrays."""
    x, params, states = random_data(CELLS[name](*size), T, B, 3, dtype)
    kw = {"lengths": np.arange(B, 0, -1) % T + 1} if lengths else {}
    ys, st, tape = f.forward(x, params, states=states, **kw)
    rng = np.random.default_rng(4)
    d_out = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in ys.items()}
    g = f.backward(tape, d_outputs=d_out)
    return [ys[k] for k in sorted(ys)] + [st[k] for k in sorted(st)] + [g.x] + \
        [g.params[k] for k in sorted(g.params)] + [g.states[k] for k in sorted(g.states)]


def close(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


CASES = [  # cell, (input, hidden), T, B, dtype, variable lengths
    ("lstm", (5, 16), 4, 7, np.float32, False),
    ("lstm", (5, 16), 1, 1, np.float64, False),
    ("lstm", (3, 8), 3, 13, np.float64, True),
    ("gru", (4, 32), 5, 6, np.float32, True),
    ("ln_lstm", (6, 16), 4, 5, np.float32, False),
    ("mgu", (3, 5), 3, 4, np.float64, False),  # odd H: products on thread 0
    ("lstm", (5, 16), 6, 2, np.float32, True),
    ("lstm", (4, 272), 2, 7, np.float64, False),  # K = 272: two K chunks of the panel kernel
    # B * N * K above panel_max_work: the BLAS in a one-thread build of a backend of several
    # threads, the panel kernel in the team's and one thread's (one_core_panel_max_work)
    ("lstm", (4, 256), 2, 49, np.float32, False),
    # head-wise products split by heads: 4 heads on 2, 3 and 8 threads
    ("slstm", (5, 16), 4, 5, np.float64, True),
]
# B * N * K above panel_max_work: with the team's panel-kernel limit lowered to it
# (one_core_panel_max_work), a one-thread BLAS call on each thread's columns, whose rounding
# may depend on how many columns the call gets: checked against the oracle only.
BLAS_CASES = [
    ("lstm", (4, 256), 3, 49, np.float32, True),
    ("gru", (3, 256), 2, 70, np.float64, False),
]


@pytest.mark.parametrize("name, size, T, B, dtype, lengths", CASES + BLAS_CASES)
def test_team_sizes_match_oracle_and_each_other(name, size, T, B, dtype, lengths) -> None:
    bitwise = (name, size, T, B, dtype, lengths) not in BLAS_CASES
    schedule = ALWAYS_TEAM if bitwise else dataclasses.replace(
        ALWAYS_TEAM, one_core_panel_max_work=ALWAYS_TEAM.panel_max_work)
    expected = run(function(name, size, None), name, size, T, B, dtype, lengths)
    first = None
    for threads in (1, 2, 3, 8):  # 8: more threads than column panels and batch rows
        got = run(function(name, size, threads, schedule), name, size, T, B, dtype, lengths)
        for a, e in zip(got, expected, strict=True):
            close(a, e, (GRAD_TOL if a is not got[0] else TOL)[dtype])
        if threads == 2:
            first = got
        elif first is not None and bitwise:
            for a, b in zip(got, first, strict=True):
                np.testing.assert_array_equal(a, b)


def test_team_is_used_and_heuristic_keeps_small_sizes_on_one_thread(monkeypatch) -> None:
    cell = rnnc.cells.lstm(4, 16)
    assert split.team_work(rnnc.compile(cell, backend="llvm", threads=2, team=True,
                                          cache_dir=False).program("forward")) > 0
    calls = []
    original = pool.run_team

    def counting(*args):
        calls.append(args[2])
        return original(*args)

    monkeypatch.setattr(pool, "run_team", counting)
    f = function("lstm", (5, 16), 2)
    run(f, "lstm", (5, 16), 3, 4, np.float32, False)
    assert calls and set(calls) == {2}
    calls.clear()
    f = function("lstm", (5, 16), 2, LlvmSchedule())  # the default team_min_work: 4 Mi
    run(f, "lstm", (5, 16), 3, 4, np.float32, False)
    assert calls == []


def test_head_wise_products_count_as_team_work() -> None:
    # sLSTM's one recurrent product is an einsum: a team splits it by heads, so its
    # multiply-adds (heads * d * 4d per row) decide whether a sequence runs on the team.
    program = rnnc.compile(rnnc.cells.slstm(8, 16, heads=4), backend="llvm", threads=2,
                           team=True, cache_dir=False).program("forward")
    assert split.team_work(program) == 4 * 4 * 16
    one_head = rnnc.compile(rnnc.cells.slstm(8, 16, heads=1), backend="llvm", threads=2,
                            team=True, cache_dir=False).program("forward")
    assert split.team_work(one_head) == 0  # one head: no team work (a team splits it by rows)


def test_team_is_on_unless_turned_off(monkeypatch) -> None:
    monkeypatch.delenv("RNNC_TEAM", raising=False)
    assert runtime.LlvmBackend(threads=2, cache_dir=False).base_schedule.team
    monkeypatch.setenv("RNNC_TEAM", "0")
    assert not runtime.LlvmBackend(threads=2, cache_dir=False).base_schedule.team
    assert runtime.LlvmBackend(threads=2, cache_dir=False, team=True).base_schedule.team
    monkeypatch.setenv("RNNC_TEAM", "1")
    assert runtime.LlvmBackend(threads=2, cache_dir=False).base_schedule.team
    with pytest.raises(rnnc.RnncError):
        runtime.LlvmBackend(team="yes")


def test_busy_team_falls_back_to_one_thread() -> None:
    f = function("lstm", (5, 16), 2)
    expected = run(function("lstm", (5, 16), None), "lstm", (5, 16), 3, 4, np.float32, False)
    with pool._team_lock:  # another team call in progress
        got = run(f, "lstm", (5, 16), 3, 4, np.float32, False)
    for a, e in zip(got, expected, strict=True):
        close(a, e, GRAD_TOL[np.float32])
