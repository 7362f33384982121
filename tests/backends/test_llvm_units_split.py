"""The LLVM thread team's split of a step by hidden units (backends/llvm/split.py): each thread
computes every gate's product columns of its units, then the fused epilogue of the same units,
with no barrier in between.

Every gated cell of ``rnnc.cells`` with the hidden size a multiple of the panel width (2 x 16
floats, 2 x 8 doubles) and more than one panel per gate, inference and training, with and
without lengths, on 1 thread (no team), 2 and 3: against the NumPy oracle (the unoptimized
program), and bitwise between teams of 2 and 3 (each element is summed in the same order by
one thread). The barriers of one step are counted where the team build is lowered.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc.backends.llvm import codegen  # noqa: E402
from rnnc.backends.schedule import LlvmSchedule  # noqa: E402
from rnnc.tools.bench.configs import ln_lstm  # noqa: E402
from tests.strategies import random_data  # noqa: E402

TOL = {np.float32: 2e-5, np.float64: 1e-10}
GRAD_TOL = {np.float32: 2e-4, np.float64: 1e-9}
CELLS = {"lstm": rnnc.cells.lstm, "gru": rnnc.cells.gru,
         "peephole_lstm": rnnc.cells.peephole_lstm, "mgu": rnnc.cells.mgu, "ln_lstm": ln_lstm}
_compiled: dict[tuple, rnnc.Function] = {}


def function(name: str, size: tuple[int, int], threads: int | None) -> rnnc.Function:
    """The cell compiled by the oracle (threads None) or by LLVM at a thread count."""
    key = (name, size, threads)
    if key not in _compiled:
        cell = CELLS[name](*size)
        _compiled[key] = rnnc.compile(cell, optimize=False) if threads is None else \
            rnnc.compile(cell, backend="llvm", threads=threads, team=True, cache_dir=False,
                         schedule=LlvmSchedule(team_split="units", team_min_work=0))
    return _compiled[key]


def run(f: rnnc.Function, name: str, size: tuple, T: int, B: int, dtype: type,
        lengths: bool) -> list[np.ndarray]:
    """Inference, then training forward and backward, of one seeded sequence: a flat list."""
    x, params, states = random_data(CELLS[name](*size), T, B, 3, dtype)
    kw = {"lengths": np.arange(B, 0, -1) % T + 1} if lengths else {}
    ys, st = f(x, params, states=states, **kw)
    inference = [ys[k] for k in sorted(ys)] + [st[k] for k in sorted(st)]
    ys, st, tape = f.forward(x, params, states=states, **kw)
    rng = np.random.default_rng(4)
    d_out = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in ys.items()}
    g = f.backward(tape, d_outputs=d_out)
    return inference + [ys[k] for k in sorted(ys)] + [st[k] for k in sorted(st)] + [g.x] + \
        [g.params[k] for k in sorted(g.params)] + [g.states[k] for k in sorted(g.states)]


def close(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


CASES = [  # cell, (input, hidden), T, B, dtype, variable lengths
    ("lstm", (5, 64), 4, 7, np.float32, False),  # two panels per gate
    ("lstm", (5, 64), 5, 9, np.float32, True),
    ("lstm", (3, 48), 3, 13, np.float64, True),  # three panels per gate
    ("gru", (4, 64), 4, 6, np.float32, True),
    ("gru", (4, 48), 3, 5, np.float64, False),
    ("peephole_lstm", (3, 64), 4, 7, np.float32, True),
    ("peephole_lstm", (6, 32), 3, 4, np.float64, False),
    ("mgu", (3, 48), 4, 8, np.float64, True),  # two products per step, each with its reader
    ("mgu", (5, 64), 3, 7, np.float32, False),
    ("lstm", (5, 48), 3, 7, np.float32, True),  # H not a multiple of 32: split by columns
]


@pytest.mark.parametrize("name, size, T, B, dtype, lengths", CASES)
def test_unit_split_matches_oracle_and_is_bitwise_across_teams(name, size, T, B, dtype,
                                                              lengths) -> None:
    expected = run(function(name, size, None), name, size, T, B, dtype, lengths)
    results = {}
    for threads in (1, 2, 3):
        got = run(function(name, size, threads), name, size, T, B, dtype, lengths)
        for a, e in zip(got, expected, strict=True):
            close(a, e, GRAD_TOL[dtype])
        results[threads] = got
    for a, b in zip(results[2], results[3], strict=True):
        np.testing.assert_array_equal(a, b)


def step_barriers(name: str, hidden: int, mode: str, lengths: bool = False,
                  dtype: str = "f32") -> int:
    """The barriers one step of the team build of ``mode`` emits."""
    program = rnnc.compile(CELLS[name](8, hidden), backend="numpy").program(mode, dtype,
                                                                             lengths)
    lowering = codegen.Lowering(program, "cblas", LlvmSchedule(team_split="units"), team=True)
    lowering.lower()
    return lowering.team.step_barriers


@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm"])
def test_gated_cell_step_has_one_barrier(name) -> None:
    for mode in ("inference", "forward"):
        for lengths in (False, True):
            assert step_barriers(name, 64, mode, lengths) == 1, (mode, lengths)
    assert step_barriers(name, 48, "inference", dtype="f64") == 1


def test_barrier_counts_of_other_steps() -> None:
    # Layer norm over the gates reads every column: product by columns, barrier, epilogue by
    # rows, barrier.
    assert step_barriers("ln_lstm", 64, "inference") == 2
    # 48 units are not whole panels of 32 floats: the same two barriers.
    assert step_barriers("lstm", 48, "inference") == 2
    # MGU's second product reads the first epilogue's every unit: one barrier between.
    assert step_barriers("mgu", 64, "inference") == 2
    # Backward: gate gradients by rows, barrier, dG @ U^T (with its reader by units), barrier.
    assert step_barriers("lstm", 64, "backward") == 2
    assert step_barriers("gru", 64, "backward") == 2


def test_the_default_columns_split_keeps_two_barriers() -> None:
    program = rnnc.compile(CELLS["lstm"](8, 64), backend="numpy").program("inference", "f32",
                                                                           False)
    lowering = codegen.Lowering(program, "cblas", team=True)
    lowering.lower()
    assert lowering.team.step_barriers == 2


def test_a_bad_team_split_names_the_choices() -> None:
    with pytest.raises(rnnc.RnncValueError, match="'columns', 'units'.*'gates'"):
        rnnc.compile(CELLS["lstm"](8, 64), backend="llvm", team_split="gates")
