"""The passes take time linear in the length of a chain of elementwise steps.

Work is counted, not timed: the count is the same on a busy machine, and a walk from every step
to the chain's start (quadratic) shows in it as clearly as in seconds. Four times the steps must
take about four times the work; a quadratic part gives sixteen. The default test counts the
graph look-ups of canonicalize; the slow one counts every Python call (cProfile) of every pass.
"""

from __future__ import annotations

import cProfile
import pstats

import pytest

import rnnc
from rnnc.ir import Graph, Program
from rnnc.passes import PIPELINES, run

SHORT, LONG = 1000, 4000
LINEAR = 5.0  # calls(LONG) / calls(SHORT): 4.0 measured; a quadratic part gives 16


def _sum_chain(steps: int) -> Program:
    """``v = v + b + 0.01 * tanh(v)`` ``steps`` times: every step a sum with one loop-invariant
    term (``b``), which canonicalize regroups, and the chain's start reads the input."""
    c = rnnc.Cell("sum_chain")
    x, h = c.input("x", 3), c.state("h", 4)
    W, b = c.param("W", (3, 4)), c.param("b", (4,))
    v = x @ W + h
    for _ in range(steps):
        v = v + b + rnnc.tanh(v) * 0.01
    c.update(h=v)
    c.output("y", v)
    return c.program()


def _run_counted(program: Program, names: list[str]) -> tuple[Program, int]:
    """``program`` after the passes ``names``, and the Python function calls they took."""
    profile = cProfile.Profile()
    profile.enable()
    after = run(program, names)
    profile.disable()
    return after, pstats.Stats(profile).total_calls


def _graph_reads(program: Program, names: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """How often the passes ``names`` look a node or its users up: a cheaper count of their
    work than every Python call (walks over the graph go through these two)."""
    count = [0]
    for method in ("node", "users"):
        plain = getattr(Graph, method)

        def counted(self, nid, plain=plain):
            count[0] += 1
            return plain(self, nid)

        monkeypatch.setattr(Graph, method, counted)
    run(program, names)
    monkeypatch.undo()
    return count[0]


def test_canonicalize_is_linear_in_a_chain_of_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each sum asked whether its terms are loop-invariant by a walk down to the chain's start:
    # 1,000 / 4,000 / 10,000 steps compiled in 10 / 80 / 355 s.
    short = _graph_reads(_sum_chain(SHORT), ["canonicalize"], monkeypatch)
    long = _graph_reads(_sum_chain(LONG), ["canonicalize"], monkeypatch)
    ratio = long / short
    assert ratio < LINEAR, f"canonicalize: {ratio:.1f}x the work for {LONG // SHORT}x the steps"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_every_pass_is_linear_in_a_chain_of_sums(mode: str) -> None:
    # Besides canonicalize: hoist-sequence named each hoisted value by trying every name from
    # the first, and looked its inputs up in a sorted copy of all of them.
    programs = {SHORT: _sum_chain(SHORT), LONG: _sum_chain(LONG)}
    calls: dict[tuple[str, int, int], int] = {}
    for steps, program in programs.items():
        for k, name in enumerate(PIPELINES[mode]):
            program, calls[name, k, steps] = _run_counted(program, [name])
    for name, k in {(name, k) for name, k, _ in calls}:
        ratio = calls[name, k, LONG] / calls[name, k, SHORT]
        assert ratio < LINEAR, f"{name}: {ratio:.1f}x the work for {LONG // SHORT}x the steps"
